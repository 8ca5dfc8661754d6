"""Checks for problem 04, gradient compression: FP16, 1-bit compression, 1-bit Adam, top-k.

One launch of real ranks on a modelled 1 Gb/s link runs everything. The codec alone on one rank; each
reducer on 4 and a hidden 2 or 3 ranks, against a simulation computed here, and its bytes on the wire (the
task's counts of each call's phase, envelopes included: cases.wire_bytes) against float32's; 1-bit Adam step
by step on known gradients, one worker slowed down; a click-through-rate model trained on 4 ranks, FP16 and
1-bit Adam: the held-out AUC against float32 Adam simulated here (graded for training whose every step
went compressed), and the volume sent; last, the 1-bit
allreduce of 4 MiB within 5% of its alpha-beta bound, and within the 1-bit allreduce's bytes.
"""

import math
from dataclasses import replace

import numpy as np

from distlab.grading import CheckContext, Checklist, Run, Task, uniform

from . import cases, judging
from .cases import N_PARAMS
from .judging import as_array, bytes_line, close, describe, fp32_ring_bytes, wire_bytes
from .programs import held_out_auc, run_case, task_marks

CHECKS = Checklist()


@CHECKS.run
def plan(t: CheckContext) -> cases.Plan:
    drawn = cases.plan_for(t.seed)
    return replace(drawn, train=judging.vetted_training(drawn.train))


@CHECKS.run
def everything(t: CheckContext, plan: cases.Plan) -> Run:
    """One launch for every check, its tasks in the order of the checks."""
    slow = judging.slow_worker(plan, t.seed)
    # Phases begin and end at the harness's marks only (Task.marks; judging.harness_marks counts them).
    tasks = [Task(ranks=1, case=plan.codec, label="the compressor unit cases")]
    tasks += [Task(ranks=w.p, case=w, label=f"the reducers with p = {w.p}, n = {w.n}", marks=task_marks(w))
              for w in plan.wires]
    tasks.append(Task(ranks=plan.adam.p, case=plan.adam, faults=slow, marks=task_marks(plan.adam),
                      label=f"1-bit Adam on known gradients (rank {plan.slow_worker} slow)"))
    tasks.append(Task(ranks=plan.train.p, case=plan.train, label="the training runs", marks=task_marks(plan.train)))
    tasks += [Task(ranks=c.p, case=c, label=f"the timed {c.method} allreduce") for c in plan.timed]
    switch = uniform(max(task.ranks for task in tasks), cases.SLOW_ALPHA_S, cases.SLOW_BETA)
    return t.launch(run_case, tasks, platform=switch)


@CHECKS.check("compressor: signs packed 8 per byte, a mean-|x| scale per chunk, error feedback", points=3)
def codec_round_trip(t: CheckContext, everything: Run) -> None:
    (codec,) = everything.cases(cases.CodecCase)
    case, result = codec.case, codec.values[0]
    judging.codec_shape(t, case, result)
    t.say("compress / decompress on 3 vectors (chunks of very different magnitudes, lengths not "
          "multiples of 8), decompress alone, 3 calls of compress_with_feedback")
    for (x, chunks, what), packed, roundtrip in zip(case.vectors, result.compressed, result.roundtrip):
        judging.judge_compress(t, x, chunks, what, packed, roundtrip)
    want = judging.sim_decompress(*case.given)
    if not close(result.decompressed, want, rtol=1e-6):
        t.fail(f"decompress(signs, scales, {case.given[2]}) with 4 given chunks: {describe(result.decompressed, want)}")
    x, error0, chunks = case.feedback
    error = error0.copy()
    for call, (rebuilt, got_error) in enumerate(result.feedback, start=1):
        before = error.copy()
        want = judging.sim_feedback(x, error, chunks)  # moves `error` on, as the learner's should
        head = f"compress_with_feedback(x, error, {chunks}), call {call} of 3 on the same x"
        if not close(rebuilt, want, rtol=1e-5):
            if close(rebuilt, judging.sim_feedback(x, None, chunks), rtol=1e-5):
                t.fail(f"{head}: what it sent is compress(x), without the error: compress x + error, so "
                       "that what earlier calls lost is sent now")
            t.fail(f"{head}: decompressing what it returned gives {describe(rebuilt, want)}")
        got_error = as_array(got_error)
        if got_error is not None and np.array_equal(got_error, before):
            t.fail(f"{head}: error feedback does not carry the residual: error is unchanged by the call; it "
                   "must become (x + error) - decompress(compressed), in place")
        if not close(got_error, error, rtol=1e-4, atol=1e-6):
            t.fail(f"{head}: the error after the call holds {describe(got_error, error)}; expected "
                   "(x + error) - decompress(compressed)")
    t.say("signs, scales, round trips and the carried error all as expected")


@CHECKS.check("FP16 allreduce: the mean within float16 precision, half the bytes of FP32 (2%)", points=2)
def fp16_allreduce(t: CheckContext, everything: Run) -> None:
    for wire in everything.cases(cases.WireCase):
        p, n = wire.case.p, wire.case.n
        judging.op_results(t, wire.values, {"fp16": 0, "fp16 large": 0}, f"fp16_allreduce, p = {p}, n = {n}")
        for what in ("fp16", "fp16 large"):
            inputs = [cases.wire_input(wire.case.seed, r, n, what).astype(np.float64) for r in range(p)]
            mean = np.sum(inputs, axis=0) / p
            # Each value rounded to float16 (2^-11 relative), then p - 1 float16 additions.
            tol = 2.0**-10 * (p + 1) * np.sum(np.abs(inputs), axis=0) / p + 2.0**-23 * p
            large = ", values near 30000 on every rank" if what == "fp16 large" else ""
            head = f"fp16_allreduce, p = {p}, n = {n}{large}"
            for rank, value in enumerate(results[what].value for results in wire.values):
                got = as_array(value)
                if got is None or got.shape != mean.shape:
                    t.fail(f"{head}: rank {rank} holds {describe(value, mean)}")
                if np.array_equal(got, inputs[rank].astype(np.float32)):
                    t.fail(f"{head}: rank {rank} still holds its own gradient: no reduction happened")
                if not np.isfinite(got).all():
                    t.fail(f"{head}: rank {rank} holds inf where the float16 sum of the ranks' values "
                           "passes 65504, float16's largest: divide by p before casting (PyTorch's fp16 "
                           "compression hook does)")
                if not (np.abs(got - mean) <= tol).all():
                    t.fail(f"{head}: rank {rank} holds {describe(got, mean)}; expected the mean over the "
                           "ranks within float16 precision")
        half, slack = fp32_ring_bytes(n, p) / 2, cases.FP16_TOLERANCE
        counts = [judging.phase_counts(t, wire.task, rank, "fp16", f"fp16_allreduce, p = {p}, n = {n}")
                  for rank in range(p)]
        sent = [wire_bytes(c, p) for c in counts]
        for rank, nbytes in enumerate(sent):
            seen = f"fp16_allreduce, p = {p}, n = {n}: rank {rank} sent {bytes_line(nbytes, half)}"
            if abs(nbytes / half - 2) <= 2 * slack:
                t.fail(f"{seen}: float32 went on the wire; cast the buffer to float16 before the allreduce")
            t.expect(abs(nbytes / half - 1) <= slack, f"about {half:.0f} bytes per rank, half of a float32 "
                     f"ring allreduce 2(p-1)/p * 4n (within {slack:.0%})", seen)
            if p > 1:
                judging.unfed(t, f"fp16_allreduce, p = {p}, n = {n}", rank, judging.received_bytes(counts[rank], p),
                              n, f"the other ranks' {n} values, a byte each at the least")
        ratio = max(sent) / fp32_ring_bytes(n, p)
        t.say(f"p = {p}, n = {n}: the mean within float16 precision, also with values near 30000; "
              f"{max(sent):.0f} bytes per rank = {ratio:.3f} of FP32")
        t.metric(f"fp16_over_fp32_p{p}", round(ratio, 4))


@CHECKS.check("1-bit allreduce: DeepSpeed's exchange, within 1/30 of FP32's bytes plus scales", points=3)
def onebit_allreduce(t: CheckContext, everything: Run) -> None:
    for wire in everything.cases(cases.WireCase):
        p, n = wire.case.p, wire.case.n
        head = f"onebit_allreduce, p = {p}, n = {n}"
        judging.op_results(t, wire.values, {"onebit 1": 2, "onebit 2": 2}, head)
        judging.judge_onebit(t, wire.case, wire.values)
        fp32, most = fp32_ring_bytes(n, p), judging.judge_onebit_bytes(t, wire, head)
        t.say(f"p = {p}, n = {n}: equal to the simulation in both calls, errors carried; "
              f"{most:.0f} bytes per rank (the larger call) = 1/{fp32 / max(most, 1):.1f} of FP32")
        t.metric(f"onebit_over_fp32_p{p}", round(most / fp32, 5))


@CHECKS.check("top-k allreduce: the k largest of gradient + error, 8 bytes per kept value", points=2)
def topk_allreduce(t: CheckContext, everything: Run) -> None:
    for wire in everything.cases(cases.WireCase):
        states = {f"topk {keep} {how}": 2 for keep in wire.case.keeps for how in ("ef 1", "ef 2", "plain")}
        judging.op_results(t, wire.values, states, f"topk_allreduce, p = {wire.case.p}, n = {wire.case.n}")
        for keep in wire.case.keeps:
            judging.judge_topk(t, wire, keep)
        keeps = ", ".join(f"{k:g}" for k in wire.case.keeps)
        t.say(f"p = {wire.case.p}, n = {wire.case.n}: keep {keeps} with and without error feedback equal "
              "the simulation; bytes within (p-1) k 8")


@CHECKS.check("1-bit Adam: warmup, frozen variance, compressed momentum (a slow worker too)", points=3)
def onebit_adam_updates(t: CheckContext, plan: cases.Plan, everything: Run) -> None:
    (adam,) = everything.cases(cases.AdamCase)
    case, values = adam.case, adam.values
    t.say(f"p = {case.p}, n = {case.n}, {case.steps} steps, warmup_steps = {case.warmup}, "
          f"lr = {case.lr}; every send of rank {plan.slow_worker} leaves 5 ms late")
    grads, params0 = cases.adam_gradients(case), case.start()
    want = judging.sim_onebit_adam(params0, grads, case.lr, case.warmup)
    for rank, traj in enumerate(values):
        if not isinstance(traj, list):
            t.fail(f"rank {rank} returned {type(traj).__name__}, not the harness's list of parameters per step: "
                   "was run_adam replaced?")
    trajectories = [[as_array(x) for x in traj] for traj in values]

    def agrees(got: np.ndarray | None, expected: np.ndarray) -> bool:
        return close(got, expected, rtol=1e-4, atol=1e-6, share=0.995)

    for step in range(case.steps):
        stage = ("warmup (plain Adam)" if step < case.warmup
                 else f"the {judging.ordinal(step - case.warmup + 1)} compressed step")
        for rank, traj in enumerate(trajectories):
            if len(traj) <= step:
                t.fail(f"rank {rank} returned no parameters for step {step + 1}")
            if agrees(traj[step], want[step][rank]):
                continue
            head = (f"1-bit Adam, warmup_steps = {case.warmup}: rank {rank}'s parameters after step "
                    f"{step + 1}, {stage}, hold {describe(values[rank][step], want[step][rank])}")
            if all(x is not None and np.array_equal(x, params0) for x in traj):
                t.fail(f"{head}: the parameters never changed: step() must update params in place")
            for variant, advice in list(judging.ADAM_VARIANTS.items())[1:]:  # the mistakes, past "correct"
                other = judging.sim_onebit_adam(params0, grads, case.lr, case.warmup, variant)
                if all(agrees(traj[s], other[s][rank]) for s in range(step + 1)):
                    t.fail(f"{head}: they match 1-bit Adam with this mistake: {advice}")
            right = [r for r in range(case.p) if r != rank and agrees(trajectories[r][step], want[step][r])]
            t.fail(head + (f" (ranks {right} are right)" if right else ""))
    judging.adam_fed(t, case, adam.task)
    final = [traj[case.steps - 1] for traj in trajectories]  # each one checked above
    spread = max(float(np.max(np.abs(f - final[0]))) for f in final)
    t.metric("max_param_spread", spread)
    t.say(f"every step on every rank equals the simulation; ranks agree within {spread:.1e}")


@CHECKS.check("trained AUC: FP16 within 0.005 of FP32, 1-bit Adam within 0.01", points=3)
def trained_auc(t: CheckContext, everything: Run) -> None:
    (training,) = everything.cases(cases.TrainCase)
    case, results = training.case, training.values
    for rank, result in enumerate(results):
        if not (isinstance(result, dict) and {"fp16", "onebit"} <= set(result)):
            t.fail(f"rank {rank} returned {type(result).__name__}, not the harness's weights of both runs: was "
                   "run_training replaced?")
    t.say(f"a {N_PARAMS}-parameter click model: {case.label()}")
    if uncompressed := judging.uncompressed_training(training.task, case):
        t.fail("; ".join(uncompressed))
    baseline = held_out_auc(case.seed, judging.simulate_fp32_training(case.seed, case.p, case.steps))
    untrained = held_out_auc(case.seed, cases.init_params(case.seed))
    for what, key, limit in (("FP16", "fp16", cases.AUC_FP16), ("1-bit Adam", "onebit", cases.AUC_ONEBIT)):
        params = [as_array(result[key]) for result in results]
        for rank, theta in enumerate(params):
            if theta is None or theta.shape != (N_PARAMS,):
                t.fail(f"{what}: rank {rank} ended with " + describe(results[rank][key], cases.init_params(0)))
            gap = float(np.abs(theta.astype(np.float64) - params[0]).max())
            if gap > 1e-4 * (1 + float(np.abs(params[0]).max())):
                lonely = key == "fp16" and sum(wire_bytes(c, case.p) for c in training.task.phases(rank, key)) == 0
                t.fail(f"{what} ({case.label()}): rank {rank}'s weights differ from rank 0's by up to "
                       f"{gap:.3g}: every rank must apply the same update"
                       + (" (fp16_allreduce sent nothing: each rank trained on its own clicks)"
                          if lonely else ""))
        got = held_out_auc(case.seed, params[0])
        t.metric(f"auc_{key}", round(got, 4))
        t.say(f"{what}: held-out AUC {got:.4f} (FP32 Adam {baseline:.4f}, untrained {untrained:.4f})")
        if not baseline - got <= limit:
            why = ""
            if np.array_equal(params[0], cases.init_params(case.seed)):
                why = ": the weights never moved"
            elif key == "onebit":
                why = (": 1-bit compression costs quality here; error feedback on both sides and one scale "
                       "per chunk are what keep it")
            shown = "nan (non-finite weights)" if math.isnan(got) else f"{got:.4f}"
            t.fail(f"{what} ({case.label()}): held-out AUC {shown}, {baseline - got:.4f} below FP32 Adam's "
                   f"{baseline:.4f}; expected within {limit}{why}")
    t.metric("auc_fp32", round(baseline, 4))
    judging.training_fed(t, case, training.task)


@CHECKS.check("1-bit Adam's volume: w + (1-w)/32 of FP32's (within 5%)", points=2)
def onebit_adam_volume(t: CheckContext, everything: Run) -> None:
    (training,) = everything.cases(cases.TrainCase)
    case = training.case
    fp32, bound = fp32_ring_bytes(N_PARAMS, case.p), judging.onebit_bytes_bound(N_PARAMS, case.p)
    w, want = case.warmup / case.steps, cases.volume_ratio(case.warmup / case.steps)
    judging.harness_marks(t, training.task, f"1-bit Adam ({case.label()})")
    sent, payload = judging.onebit_volumes(training.task, case.p)
    for rank, steps in enumerate(sent):
        for i, nbytes in enumerate(steps):  # the warmup's steps first, then the compressed ones
            if i < case.warmup and abs(nbytes / fp32 - 1) > cases.FP16_TOLERANCE:
                t.fail(f"1-bit Adam ({case.label()}): rank {rank} sent {bytes_line(nbytes, fp32)} in warmup "
                       f"step {i + 1}; expected the float32 allreduce of the gradient, full precision "
                       "while the variance settles")
            if i >= case.warmup and nbytes > bound:
                t.fail(f"1-bit Adam ({case.label()}): rank {rank} sent {nbytes:.0f} bytes in step "
                       f"{i + 1}, after the warmup; expected at most {bound:.0f} (1/30 of "
                       f"float32's {fp32:.0f} plus the scales): only the 1-bit momentum may travel once "
                       "the variance is frozen" + judging.own_marks_note(training.task, rank))
        ratio = payload[rank] / (fp32 * case.steps)
        t.expect(abs(ratio / want - 1) <= cases.VOLUME_TOLERANCE, f"a volume of w + (1-w)/32 = {want:.4f} "
                 f"of float32 Adam's for w = {w:.2f} (within {cases.VOLUME_TOLERANCE:.0%})",
                 f"{ratio:.4f} on rank {rank} ({case.label()})")
    ratio = payload[0] / (fp32 * case.steps)
    t.metric("volume_ratio", round(ratio, 4))
    t.metric("volume_formula", round(want, 4))
    t.say(f"w = {w:.2f}: volume {ratio:.4f} of FP32 (formula {want:.4f}): {1 / ratio:.2f}x less "
          f"traffic, {1 / want:.2f}x by the formula 1/(w + (1-w)/32)")


@CHECKS.check("on the 1 Gb/s link: 1-bit allreduce within 5% of its alpha-beta cost", points=2)
def onebit_time(t: CheckContext, everything: Run) -> None:
    timed = {r.case.method: r for r in everything.cases(cases.TimedCase)}
    (p, n), a, b = (timed["onebit"].case.p, timed["onebit"].case.n), cases.SLOW_ALPHA_S, cases.SLOW_BETA
    if wrong := judging.timed_onebit_wrong(timed["onebit"].case, timed["onebit"].values):
        t.fail(wrong)
    ring = fp32_ring_bytes(n, p)  # the alpha-beta cost of float32's, float16's and packed signs' volumes:
    fp32_cost, fp16_cost, cost = (2 * (p - 1) * a + sent * b for sent in (ring, ring / 2, 2 * (p - 1) / p * (n / 8)))
    fp16_time, measured = t.measured_time(timed["fp16"].task), t.measured_time(timed["onebit"].task)
    t.say(f"p = {p}, n = {n} float32 on 50 us, 1 Gb/s routes ({t.clock} clock): FP32 ring "
          f"{fp32_cost * 1e3:.2f} ms; FP16 {fp16_time * 1e3:.2f} ms (cost {fp16_cost * 1e3:.2f}); "
          f"1-bit {measured * 1e3:.2f} ms (cost {cost * 1e3:.2f}): {fp32_cost / max(measured, 1e-12):.1f}x "
          "faster than FP32")
    t.performance(measured, cost, timed["onebit"].task)
    if not t.on_card_setting:  # --platform or --faults: the switch is this check's own, said so
        t.say(f"timed on this check's own 50 us, 1 Gb/s switch, whatever the platform ({t.platform.name})")
    t.metric("fp16_s", fp16_time)
    t.metric("speedup_over_fp32", round(fp32_cost / max(measured, 1e-12), 2))
    if t.learner_faults:  # delays and caps the cost knows nothing of: a figure, not a grade
        t.say("with your fault plan in force the alpha-beta cost does not hold: reported, not graded")
    else:
        t.expect(measured <= cases.TIME_SLACK * cost,
                 f"at most {cases.TIME_SLACK * cost * 1e3:.2f} ms, 5% over 2(p-1) alpha + 2(p-1)/p (n/8) beta",
                 f"{measured * 1e3:.2f} ms ({measured / cost:.2f}x): are the p-1 exchanges of each phase one "
                 "message each (signs and scale together), overlapped by Sendrecv or Isend/Irecv?")
    judging.timed_volume(t, timed["onebit"])
