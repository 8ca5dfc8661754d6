"""Checks for problem 04, gradient compression: FP16, 1-bit compression, 1-bit Adam, top-k.

The story: one launch of real ranks on a modelled 1 Gb/s link runs everything. First the codec
alone on one rank: signs packed 8 per byte, one mean-|x| scale per chunk, an error that carries what
each compression lost. Then each reducer on p ranks (4, and a hidden 2 or 3): its values against a
single-process simulation computed here, and its bytes on the wire against float32's. Then 1-bit
Adam for a few steps on known gradients, with one worker slowed down: its parameters must be what
1-bit Adam computes, step by step. Then real training of a small click-through-rate model on 4
ranks, FP16 and 1-bit Adam, judged by the AUC of the held-out clicks against float32 Adam
simulated here, and by the volume the whole run sent. Last, the virtual clock: the 1-bit allreduce
of a 4 MiB vector within 25% of its alpha-beta bound.

Bytes on the wire are comm.stats' point-to-point bytes plus, for a built-in collective, the bytes
its ring algorithm sends per rank (an Allreduce of n bytes: 2(p-1)/p n), which is also what the
virtual clock charges for it.

Hidden variants: the data, the model's initial weights and the reducers' inputs come from the
seed, and so do the extra rank count (2 or 3), the vector lengths, the warmup fraction (15, 20 or
25% of the steps) and the slow worker.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from distlab.grading import CheckContext, Checklist, check_part

models = check_part(__file__, "models")  # the click model, the simulations, the byte counts
cases = check_part(__file__, "cases")  # the scenario's numbers and the hidden variants
programs = check_part(__file__, "programs")  # what runs on the ranks, in one launch
judging = check_part(__file__, "judging")  # comparisons, descriptions, symptoms

main = programs.main  # the free run: distlab run 04, mpirun, torchrun


# -- the checks ----------------------------------------------------------------------------------

CHECKS = Checklist()


@CHECKS.check("compressor: signs packed 8 per byte, a mean-|x| scale per chunk, error feedback",
              points=3)
def codec_round_trip(t: CheckContext) -> None:
    plan, run = programs.launch_all(t)
    case, result = plan.codec, judging.runs_of(run, cases.CodecCase)[0].values[0]
    t.say("compress / decompress on 3 vectors (chunks of very different magnitudes, lengths not "
          "multiples of 8), decompress alone, 3 calls of compress_with_feedback")
    for (x, chunks, what), packed, roundtrip in zip(case.vectors, result.compressed,
                                                     result.roundtrip):
        judging.judge_compress(t, x, chunks, what, packed, roundtrip)
    signs, scales, n = case.given
    want = models.sim_decompress(signs, scales, n)
    if not judging.close(result.decompressed, want, rtol=1e-6):
        t.fail(f"decompress(signs, scales, {n}) with 4 given chunks: "
               f"{judging.describe(result.decompressed, want)}")

    x, error0, chunks = case.feedback
    error = error0.copy()
    for call, (rebuilt, got_error) in enumerate(result.feedback, start=1):
        before = error.copy()
        # moves `error` on, as the learner's should
        want_out = models.sim_feedback(x, error, chunks)
        head = f"compress_with_feedback(x, error, {chunks}), call {call} of 3 on the same x"
        if not judging.close(rebuilt, want_out, rtol=1e-5):
            without_error = models.sim_decompress(*models.sim_compress(x, chunks), x.size)
            if judging.close(rebuilt, without_error, rtol=1e-5):
                t.fail(f"{head}: what it sent is compress(x), without the error: compress "
                       "x + error, so that what earlier calls lost is sent now")
            t.fail(f"{head}: decompressing what it returned gives "
                   f"{judging.describe(rebuilt, want_out)}")
        got_error = judging.as_array(got_error)
        if got_error is not None and np.array_equal(got_error, before):
            t.fail(f"{head}: error feedback does not carry the residual: error is unchanged by "
                   "the call; it must become (x + error) - decompress(compressed), in place")
        if not judging.close(got_error, error, rtol=1e-4, atol=1e-6):
            t.fail(f"{head}: the error after the call holds "
                   f"{judging.describe(got_error, error)}; "
                   "expected (x + error) - decompress(compressed)")
    t.say("signs, scales, round trips and the carried error all as expected")


@CHECKS.check("FP16 allreduce: the mean within float16 precision, half the bytes of FP32 (2%)",
              points=2)
def fp16_allreduce(t: CheckContext) -> None:
    _, run = programs.launch_all(t)
    for task_run in judging.runs_of(run, cases.WireCase):
        case: cases.WireCase = task_run.task.args[0]
        p, n = case.p, case.n
        for what in ("fp16", "fp16 large"):
            inputs = [cases.wire_input(case.seed, r, n, what).astype(np.float64) for r in range(p)]
            mean = np.sum(inputs, axis=0) / p
            # Each value rounded to float16 (2^-11 relative), then p - 1 float16 additions.
            tol = 2.0**-10 * (p + 1) * np.sum(np.abs(inputs), axis=0) / p + 2.0**-23 * p
            label = f"p = {p}, n = {n}" + (", values near 30000 on every rank"
                                           if what == "fp16 large" else "")
            for rank, results in enumerate(task_run.values):
                got = judging.as_array(results[what].value)
                if got is None or got.shape != mean.shape:
                    t.fail(f"fp16_allreduce, {label}: rank {rank} holds "
                           f"{judging.describe(results[what].value, mean)}")
                if np.array_equal(got, inputs[rank].astype(np.float32)):
                    t.fail(f"fp16_allreduce, {label}: rank {rank} still holds its own gradient: "
                           "no reduction happened")
                if not np.isfinite(got).all():
                    t.fail(f"fp16_allreduce, {label}: rank {rank} holds inf where the float16 "
                           "sum of the ranks' values passes 65504, float16's largest: divide by "
                           "p before casting (PyTorch's fp16 compression hook does)")
                if not (np.abs(got - mean) <= tol).all():
                    t.fail(f"fp16_allreduce, {label}: rank {rank} holds "
                           f"{judging.describe(got, mean)}; "
                           "expected the mean over the ranks within float16 precision")
        half = models.fp32_ring_bytes(n, p) / 2
        sent = [models.wire_bytes(results["fp16"].stats, p) for results in task_run.values]
        for rank, nbytes in enumerate(sent):
            if abs(nbytes / half - 2) <= 2 * cases.FP16_TOLERANCE:
                t.fail(f"fp16_allreduce, p = {p}, n = {n}: rank {rank} sent "
                       f"{judging.bytes_line(nbytes, half)}: float32 went on the wire; cast the "
                       "buffer to float16 before the allreduce")
            t.expect(abs(nbytes / half - 1) <= cases.FP16_TOLERANCE,
                     f"about {half:.0f} bytes per rank, half of a float32 ring allreduce "
                     f"2(p-1)/p * 4n (within {cases.FP16_TOLERANCE:.0%})",
                     f"fp16_allreduce, p = {p}, n = {n}: rank {rank} sent "
                     f"{judging.bytes_line(nbytes, half)}")
        ratio = max(sent) / models.fp32_ring_bytes(n, p)
        t.say(f"p = {p}, n = {n}: the mean within float16 precision, also with values near "
              f"30000; {max(sent):.0f} bytes per rank = {ratio:.3f} of FP32")
        t.metric(f"fp16_over_fp32_p{p}", round(ratio, 4))


@CHECKS.check("1-bit allreduce: DeepSpeed's exchange, within 1/30 of FP32's bytes plus scales",
              points=3)
def onebit_allreduce(t: CheckContext) -> None:
    _, run = programs.launch_all(t)
    for task_run in judging.runs_of(run, cases.WireCase):
        case: cases.WireCase = task_run.task.args[0]
        p, n = case.p, case.n
        for call, (want, werr, serr) in enumerate(judging.onebit_expected(case), start=1):
            name = f"onebit {call}"
            head = f"onebit_allreduce, p = {p}, n = {n}, call {call} of 2"
            values = [results[name].value for results in task_run.values]
            for rank, got in enumerate(values):
                mine = cases.wire_input(case.seed, rank, n, name)
                if judging.as_array(got) is not None and np.array_equal(got, mine):
                    t.fail(f"{head}: rank {rank} still holds its own input: no reduction happened")
                if not judging.close(got, want, share=0.999):
                    right = [r for r in range(p)
                             if r != rank and judging.close(values[r], want, share=0.999)]
                    hint = (f" (ranks {right} are right: the allgather of the servers' chunks "
                            "went wrong)" if right
                            else judging.onebit_symptom(case, call, judging.as_array(got)))
                    t.fail(f"{head}: rank {rank} holds {judging.describe(got, want)}{hint}")
            for rank, results in enumerate(task_run.values):
                state = results[name].state
                got_w, got_s = state if len(state) == 2 else (None, None)
                for side, got_e in (("worker_error", got_w), ("server_error", got_s)):
                    array = judging.as_array(got_e)
                    if array is not None and array.size and not array.any():
                        t.fail(f"{head}: rank {rank}'s {side} is still all zeros: without error "
                               "feedback what each compression loses is gone for good; keep it "
                               "in the error (in place) and add it to the next vector")
                if not judging.close(got_w, werr[rank], rtol=1e-3, atol=1e-5, share=0.999):
                    t.fail(f"{head}: rank {rank}'s worker_error holds "
                           f"{judging.describe(got_w, werr[rank])}; "
                           "expected (x + worker_error) - what the worker sent, in place")
                if not judging.close(got_s, serr[rank], rtol=1e-3, atol=1e-5, share=0.999):
                    t.fail(f"{head}: rank {rank}'s server_error holds "
                           f"{judging.describe(got_s, serr[rank])}; "
                           "expected (average + server_error) - what the server sent, in place")
        bound, fp32 = models.onebit_bytes_bound(n, p), models.fp32_ring_bytes(n, p)
        sent = [models.wire_bytes(results["onebit 1"].stats, p) for results in task_run.values]
        for rank, nbytes in enumerate(sent):
            if nbytes > bound:
                t.fail(f"onebit_allreduce, p = {p}, n = {n}: rank {rank} sent {nbytes:.0f} bytes, "
                       f"{nbytes / fp32:.4f} of a float32 ring allreduce ({fp32:.0f}); expected at "
                       f"most {bound:.0f} (1/30 of it plus {models.SCALE_BYTES} bytes of scale per "
                       f"message){judging.onebit_bytes_symptom(nbytes / fp32, p)}")
        t.say(f"p = {p}, n = {n}: equal to the simulation in both calls, errors carried; "
              f"{max(sent):.0f} bytes per rank = 1/{fp32 / max(max(sent), 1):.1f} of FP32")
        t.metric(f"onebit_over_fp32_p{p}", round(max(sent) / fp32, 5))


@CHECKS.check("top-k allreduce: the k largest of gradient + error, 8 bytes per kept value",
              points=2)
def topk_allreduce(t: CheckContext) -> None:
    _, run = programs.launch_all(t)
    for task_run in judging.runs_of(run, cases.WireCase):
        case: cases.WireCase = task_run.task.args[0]
        for keep in case.keeps:
            judging.judge_topk(t, task_run, case, keep)
        t.say(f"p = {case.p}, n = {case.n}: keep {', '.join(f'{k:g}' for k in case.keeps)} with "
              "and without error feedback equal the simulation; bytes within (p-1) k 8")


@CHECKS.check("1-bit Adam: warmup, frozen variance, compressed momentum (a slow worker too)",
              points=3)
def onebit_adam_updates(t: CheckContext) -> None:
    plan, run = programs.launch_all(t)
    case, task_run = plan.adam, judging.runs_of(run, cases.AdamCase)[0]
    grads = cases.adam_gradients(case)
    params0 = np.random.default_rng([case.seed, 8]).standard_normal(case.n).astype(np.float32)
    t.say(f"p = {case.p}, n = {case.n}, {case.steps} steps, warmup_steps = {case.warmup}, "
          f"lr = {case.lr}; every send of rank {plan.slow_worker} leaves 5 ms late")
    want = models.sim_onebit_adam(params0, grads, case.lr, case.warmup)
    trajectories = [[judging.as_array(x) for x in traj] for traj in task_run.values]

    def agrees(got: Any, expected: np.ndarray) -> bool:
        return judging.close(got, expected, rtol=1e-4, atol=1e-6, share=0.995)

    for step in range(case.steps):
        stage = ("warmup (plain Adam)" if step < case.warmup
                 else f"the {judging.ordinal(step - case.warmup + 1)} compressed step")
        for rank, traj in enumerate(trajectories):
            if len(traj) <= step:
                t.fail(f"rank {rank} returned no parameters for step {step + 1}")
            if agrees(traj[step], want[step][rank]):
                continue
            head = (f"1-bit Adam, warmup_steps = {case.warmup}: rank {rank}'s parameters after "
                    f"step {step + 1}, {stage}, hold "
                    f"{judging.describe(task_run.values[rank][step], want[step][rank])}")
            if all(x is not None and np.array_equal(x, params0) for x in traj):
                t.fail(f"{head}: the parameters never changed: step() must update params in place")
            for variant, advice in models.ADAM_VARIANTS.items():
                if variant == "correct":
                    continue
                other = models.sim_onebit_adam(params0, grads, case.lr, case.warmup, variant)
                if all(agrees(traj[s], other[s][rank]) for s in range(step + 1)):
                    t.fail(f"{head}: they match 1-bit Adam with this mistake: {advice}")
            right = [r for r in range(case.p)
                     if r != rank and agrees(trajectories[r][step], want[step][r])]
            t.fail(head + (f" (ranks {right} are right)" if right else ""))
    final = [traj[-1] for traj in trajectories if traj[-1] is not None]
    spread = max(float(np.max(np.abs(f - final[0]))) for f in final)
    t.metric("max_param_spread", spread)
    t.say(f"every step on every rank equals the simulation; ranks agree within {spread:.1e}")


@CHECKS.check("trained AUC: FP16 within 0.005 of FP32, 1-bit Adam within 0.01", points=3)
def trained_auc(t: CheckContext) -> None:
    plan, run = programs.launch_all(t)
    case, task_run = plan.train, judging.runs_of(run, cases.TrainCase)[0]
    t.say(f"a {models.N_PARAMS}-parameter click model: {case.label()}")
    baseline = models.held_out_auc(case.seed,
                                   models.simulate_fp32_training(case.seed, case.p, case.steps))
    untrained = models.held_out_auc(case.seed, models.init_params(case.seed))
    results: list[cases.TrainResult] = task_run.values
    for what, key, limit in (("FP16", "fp16", cases.AUC_FP16),
                             ("1-bit Adam", "onebit", cases.AUC_ONEBIT)):
        params: list[np.ndarray] = []
        for rank, result in enumerate(results):
            theta = judging.as_array(getattr(result, f"{key}_params"))
            if theta is None or theta.shape != (models.N_PARAMS,):
                t.fail(f"{what}: rank {rank} ended with "
                       + judging.describe(getattr(result, f"{key}_params"), models.init_params(0)))
            params.append(theta)
            gap = float(np.abs(theta.astype(np.float64) - params[0]).max())
            if gap > 1e-4 * (1 + float(np.abs(params[0]).max())):
                lonely = key == "fp16" and sum(results[rank].fp16_bytes) == 0
                t.fail(f"{what} ({case.label()}): rank {rank}'s weights differ from rank 0's by "
                       f"up to {gap:.3g}: every rank must apply the same update"
                       + (" (fp16_allreduce sent nothing: each rank trained on its own clicks)"
                          if lonely else ""))
        got = models.held_out_auc(case.seed, params[0])
        t.metric(f"auc_{key}", round(got, 4))
        t.say(f"{what}: held-out AUC {got:.4f} (FP32 Adam {baseline:.4f}, "
              f"untrained {untrained:.4f})")
        if not baseline - got <= limit:
            why = ""
            if np.array_equal(params[0], models.init_params(case.seed)):
                why = ": the weights never moved"
            elif key == "onebit":
                why = (": 1-bit compression costs quality here; error feedback on both sides and "
                       "one scale per chunk are what keep it")
            shown = "nan (non-finite weights)" if math.isnan(got) else f"{got:.4f}"
            t.fail(f"{what} ({case.label()}): held-out AUC {shown}, {baseline - got:.4f} below "
                   f"FP32 Adam's {baseline:.4f}; expected within {limit}{why}")
    t.metric("auc_fp32", round(baseline, 4))


@CHECKS.check("1-bit Adam's volume: w + (1-w)/32 of FP32's (within 5%)", points=2)
def onebit_adam_volume(t: CheckContext) -> None:
    plan, run = programs.launch_all(t)
    case, task_run = plan.train, judging.runs_of(run, cases.TrainCase)[0]
    fp32 = models.fp32_ring_bytes(models.N_PARAMS, case.p)
    bound = models.onebit_bytes_bound(models.N_PARAMS, case.p)
    w = case.warmup / case.steps
    want = models.volume_ratio(w)
    for rank, result in enumerate(task_run.values):
        steps = result.onebit_bytes
        for i, nbytes in enumerate(steps[: case.warmup]):
            if abs(nbytes / fp32 - 1) > cases.FP16_TOLERANCE:
                t.fail(f"1-bit Adam ({case.label()}): rank {rank} sent "
                       f"{judging.bytes_line(nbytes, fp32)} in warmup step {i + 1}; "
                       "expected the float32 allreduce of the gradient, full precision while the "
                       "variance settles")
        for i, nbytes in enumerate(steps[case.warmup :]):
            if nbytes > bound:
                t.fail(f"1-bit Adam ({case.label()}): rank {rank} sent {nbytes:.0f} bytes in step "
                       f"{case.warmup + i + 1}, after the warmup; expected at most {bound:.0f} "
                       f"(1/30 of float32's {fp32:.0f} plus the scales): only the 1-bit momentum "
                       "may travel once the variance is frozen")
        ratio = sum(steps) / (fp32 * case.steps)
        t.expect(abs(ratio / want - 1) <= cases.VOLUME_TOLERANCE,
                 f"a volume of w + (1-w)/32 = {want:.4f} of float32 Adam's for w = {w:.2f} "
                 f"(within {cases.VOLUME_TOLERANCE:.0%})",
                 f"{ratio:.4f} on rank {rank} ({case.label()})")
    ratio = sum(task_run.values[0].onebit_bytes) / (fp32 * case.steps)
    t.metric("volume_ratio", round(ratio, 4))
    t.metric("volume_formula", round(want, 4))
    t.say(f"w = {w:.2f}: volume {ratio:.4f} of FP32 (formula {want:.4f}): {1 / ratio:.2f}x less "
          f"traffic, {1 / want:.2f}x by the formula 1/(w + (1-w)/32)")


@CHECKS.check("on the 1 Gb/s link: 1-bit allreduce within 25% of its alpha-beta cost", points=2)
def onebit_time(t: CheckContext) -> None:
    _, run = programs.launch_all(t)
    timed = {r.task.args[0].method: r for r in judging.runs_of(run, cases.TimedCase)}
    case: cases.TimedCase = timed["onebit"].task.args[0]
    p, n, a, b = case.p, case.n, cases.SLOW_ALPHA_S, cases.SLOW_BETA
    bounds = models.chunk_bounds(n, p)
    want = models.sim_onebit_allreduce(
        [cases.wire_input(case.seed, r, n, "timed") for r in range(p)],
        [np.zeros(n, np.float32) for _ in range(p)],
        [np.zeros(bounds[j + 1] - bounds[j], np.float32) for j in range(p)])
    for rank, got in enumerate(timed["onebit"].values):
        if not judging.close(got, want[:: max(1, n // 4096)], share=0.999):
            t.fail(f"the timed 1-bit allreduce (p = {p}, n = {n}): rank {rank} holds a wrong "
                   "result (see the 1-bit allreduce check)")
    fp32_cost = 2 * (p - 1) * a + models.fp32_ring_bytes(n, p) * b
    fp16_cost = 2 * (p - 1) * a + models.fp32_ring_bytes(n, p) / 2 * b
    cost = 2 * (p - 1) * a + 2 * (p - 1) / p * (n / 8) * b
    fp16_time, measured = t.measured_time(timed["fp16"]), t.measured_time(timed["onebit"])
    t.say(f"p = {p}, n = {n} float32 on 50 us, 1 Gb/s routes ({t.clock} clock): FP32 ring "
          f"{fp32_cost * 1e3:.2f} ms; FP16 {fp16_time * 1e3:.2f} ms (cost {fp16_cost * 1e3:.2f}); "
          f"1-bit {measured * 1e3:.2f} ms (cost {cost * 1e3:.2f}): "
          f"{fp32_cost / max(measured, 1e-12):.1f}x faster than FP32")
    t.performance(measured, cost, timed["onebit"])
    t.metric("fp16_s", fp16_time)
    t.metric("speedup_over_fp32", round(fp32_cost / max(measured, 1e-12), 2))
    t.expect(measured <= cases.TIME_SLACK * cost,
             f"at most {cases.TIME_SLACK * cost * 1e3:.2f} ms, 25% over 2(p-1) alpha + "
             "2(p-1)/p (n/8) beta",
             f"{measured * 1e3:.2f} ms ({measured / cost:.2f}x): are the p-1 exchanges of each "
             "phase one message each (signs and scale together), overlapped by Sendrecv or "
             "Isend/Irecv?")
