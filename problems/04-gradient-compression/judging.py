"""How problem 04 judges what the ranks returned: a verdict names the case, what was expected and what
was seen, and the mistake it recognises (1-bit Adam's are variants of one simulation)."""

import functools
from dataclasses import replace
from typing import Any

import numpy as np

from distlab.grading import CaseRun, CheckContext, FaultPlan, faults, first_mismatch

from . import cases
from .cases import OpResult, wire_bytes
from .programs import Adam, Raised, gradient, held_out_auc, marks_set


def slow_worker(plan: cases.Plan, seed: int) -> FaultPlan:
    """1-bit Adam's straggler: one worker's sends leave 5 ms late, in wall time too."""
    return faults.plan(faults.delay(src=plan.slow_worker, latency_s=cases.SLOW_WORKER_DELAY_S, wall=True,
                                    note="a straggling worker: its sends leave 5 ms late"),
                       seed=seed, where="04 slow-worker case")


def as_array(value: Any) -> np.ndarray | None:
    """A learner's array of numbers, else None (strings, objects, complex numbers: not an answer)."""
    return value if isinstance(value, np.ndarray) and value.dtype.kind in "biuf" else None


# -- what the ranks returned, checked for its shape: anything the learner process returns is its own ------
def op_results(t: CheckContext, values: list[Any], states: dict[str, int], head: str) -> list[dict[str, OpResult]]:
    """Each rank's results of a reducer task: a dict with an OpResult of ``states[name]`` state values per
    name; else the check fails naming what came back (the harness's run_wire was replaced)."""
    for rank, results in enumerate(values):
        for name, count in states.items():
            got = results.get(name) if isinstance(results, dict) else None
            if not (isinstance(got, OpResult) and isinstance(got.state, tuple) and len(got.state) == count):
                t.fail(f"{head}: rank {rank} returned no result of {name!r} as the harness makes it (saw "
                       f"{type(results).__name__ if got is None else type(got).__name__}): was run_wire replaced?")
    return values


def phase_counts(t: CheckContext, task: Any, rank: int, phase: str, head: str) -> Any:
    """The rank's counts in its phase ``phase``; the check fails if the rank set no such mark, or marks of the
    harness's names other than the harness's (harness_marks)."""
    try:
        counts = task.counts(rank, phase)
    except KeyError:
        t.fail(f"{head}: rank {rank} set no mark {phase!r}, so its bytes cannot be counted: was the harness "
               "replaced?")
    harness_marks(t, task, head, (rank,))
    return counts


def harness_marks(t: CheckContext, task: Any, head: str, ranks: Any = None) -> None:
    """Fails the check if a rank set a mark of one of the harness's names (Task.marks) more or fewer times than
    run_case does: the phases of those names, which the checks read, would then end early or begin late."""
    want = marks_set(task.spec.case)
    for rank in range(task.spec.ranks) if ranks is None else ranks:
        for name in dict.fromkeys(want):
            if (got := len(task.phases(rank, name))) != want.count(name):
                t.fail(f"{head}: rank {rank} set {got} marks {name!r}; the harness sets {want.count(name)} (your "
                       "own marks may have other names), so the phases its bytes are counted in cannot be read")
    # As many, but where the harness does not set them (code of the learner's held some back and
    # set them mid-step): the bytes between would be counted in the wrong phases.
    if moved := task.marks_differ(want):
        t.fail(f"{moved}: the harness's marks were moved, so the phases its bytes are counted in cannot be read")


def own_marks_note(task: Any, rank: int) -> str:
    """A note naming the marks the rank set besides the harness's (its learner's code's), or ''."""
    own = sorted({name for name, _ in task.timeline().marks(rank) if name not in task.spec.marks})
    if not own:
        return ""
    return (f": your own mark(s) {', '.join(map(repr, own[:3]))} do not end the harness's phases; every byte from "
            "one harness mark to the next counts")


def received_bytes(counts: Any, p: int) -> float:
    """Bytes a rank took off the wire: point-to-point bytes received and their envelopes (a tag's bits,
    cases.ENVELOPE_BYTES a message) plus what each of its collectives brings a rank by its algorithm
    (cases.collectives_moved; an Alltoall's or Allgatherv's as an Allreduce's)."""
    envelopes = cases.ENVELOPE_BYTES * sum(counts.recv_msgs.values())
    return float(counts.bytes_received) + envelopes + cases.collectives_moved(counts, p)[1]


def unfed(t: CheckContext, head: str, rank: int, received: float, floor: float, needs: str) -> None:
    """Fails a right result that cannot have come from messages: the inputs of the other ranks reach a
    rank only in messages (its program is handed its own, Case.for_rank), and random values do not
    compress below ``floor`` bytes."""
    if received < floor:
        t.fail(f"{head}: rank {rank} received {received:.0f} bytes, but its result needs {needs}, at least "
               f"{floor:.0f} bytes of messages: the result did not come from them")


def close(got: Any, want: np.ndarray, rtol: float = 1e-4, atol: float = 1e-7, share: float = 1.0) -> bool:
    """got matches want element-wise, on at least ``share`` of the elements (a sign decided by a value
    within rounding of zero may flip between two correct programs)."""
    got = as_array(got)
    if got is None or got.shape != want.shape or not np.isfinite(got).all():
        return False
    return bool(np.isclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol).mean() >= share)


def describe(value: Any, want: np.ndarray) -> str:
    """What a learner's array holds (a string: as it says), against what was expected, in one phrase."""
    got = as_array(value)
    if got is None:
        return f"{value}" if isinstance(value, str) else f"a {type(value).__name__}"
    if got.shape != want.shape:
        return f"an array of shape {got.shape} (expected {want.shape})"
    finite = np.isfinite(got)
    if not finite.all():
        return f"{int((~finite).sum())} non-finite values (inf or nan), the first at element {int(np.argmin(finite))}"
    i = int(np.argmax(np.abs(got.astype(np.float64) - want)))
    wrong = int((~np.isclose(got, want, rtol=1e-4, atol=1e-7)).sum())
    return (f"element {i} = {got.flat[i]:.6g} where {want.flat[i]:.6g} was expected "
            f"({wrong} of {want.size} elements differ)")


def bytes_line(sent: float, want: float) -> str:
    return f"{sent:.0f} bytes ({sent / want:.3f}x the expected {want:.0f})"


def numbers(values: Any) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in np.asarray(values).ravel()) + "]"


def ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def fp32_ring_bytes(n: int, p: int) -> float:
    """What a float32 ring allreduce of n elements sends per rank: 2(p-1)/p * 4n."""
    return 2 * (p - 1) / p * 4 * n


def onebit_bytes_bound(n: int, p: int) -> float:
    """The catalog's bound for the 1-bit stage: 1/30 of float32, plus a scale per message."""
    return fp32_ring_bytes(n, p) / 30 + 2 * (p - 1) * cases.SCALE_BYTES


def simulate_onebit_training(seed: int, p: int, steps: int, warmup: int, feedback: bool = True) -> np.ndarray:
    """1-bit Adam trained as the ranks train it (each rank's gradient on its own shard; after the
    warmup the variance frozen and each rank's momentum through DeepSpeed's compressed allreduce),
    with or without error feedback on both sides, in one process. Returns the weights."""
    b1, b2 = cases.BETAS
    shards = [cases.examples(seed, r, steps * cases.BATCH) for r in range(p)]
    theta = cases.init_params(seed)
    m, v, v_hat = np.zeros_like(theta), np.zeros_like(theta), np.zeros_like(theta)
    worker_errors = [np.zeros_like(theta) for _ in range(p)] if feedback else None
    server_errors = cases.server_errors(theta.size, p) if feedback else None
    for t in range(1, steps + 1):
        batch = slice((t - 1) * cases.BATCH, t * cases.BATCH)
        local = [gradient(theta, x[batch], y[batch]) for x, y in shards]
        if t <= warmup:  # plain Adam on the mean gradient while the variance settles
            g = (np.sum(local, axis=0) / p).astype(np.float32)
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            v_hat = v / (1 - b2**t)
        else:
            m = sim_onebit_allreduce([(b1 * m + (1 - b1) * g).astype(np.float32) for g in local],
                                     worker_errors, server_errors)
        theta = theta - (cases.LR * (m / (1 - b1**t)) / (np.sqrt(v_hat) + cases.EPS)).astype(np.float32)
    return theta


def auc_loss(train: cases.TrainCase, weights: np.ndarray) -> float:
    """How far below FP32 Adam's held-out AUC these weights land (negative: above it)."""
    fp32 = simulate_fp32_training(train.seed, train.p, train.steps)
    return held_out_auc(train.seed, fp32) - held_out_auc(train.seed, weights)


def vetted_training(train: cases.TrainCase) -> cases.TrainCase:
    """The training case with its data drawn again (from its own seed, so --seed replays it) until
    1-bit Adam without error feedback, the mistake the AUC check exists for, lands at least twice
    the tolerance below FP32 Adam: on a few draws in a hundred it does not (seeds 6 and 36 of
    0-36: 0.0139 and 0.0130)."""
    for k in range(1, 100):
        without = simulate_onebit_training(train.seed, train.p, train.steps, train.warmup, feedback=False)
        if auc_loss(train, without) >= 2 * cases.AUC_ONEBIT:
            return train
        train = replace(train, seed=int(np.random.default_rng([train.seed, k]).integers(1 << 63)))
    raise AssertionError("no training data in 100 draws separates 1-bit Adam from its mistake")


def simulate_fp32_training(seed: int, p: int, steps: int) -> np.ndarray:
    """The AUC baseline: float32 Adam on the mean gradient of the p shards, in one process."""
    return _fp32_training(seed, p, steps).copy()


@functools.lru_cache(maxsize=4)  # the vetting of the draw and the AUC check ask for the same one
def _fp32_training(seed: int, p: int, steps: int) -> np.ndarray:
    shards = [cases.examples(seed, r, steps * cases.BATCH) for r in range(p)]
    theta = cases.init_params(seed)
    adam = Adam(theta, cases.LR)
    for t in range(steps):
        batch = slice(t * cases.BATCH, (t + 1) * cases.BATCH)
        adam.step(np.sum([gradient(theta, x[batch], y[batch]) for x, y in shards], axis=0) / p)
    return theta


# -- the codec and the reducers, simulated in one process (hidden from the ranks: the expected values) -
def sim_compress(x: np.ndarray, chunks: int) -> tuple[np.ndarray, np.ndarray]:
    parts = cases.chunks_of(x, chunks)
    signs = np.concatenate([np.packbits(part >= 0) for part in parts]).astype(np.uint8)
    scales = [np.abs(part).mean() if part.size else 0.0 for part in parts]
    return signs, np.array(scales, dtype=np.float32)


def sim_decompress(signs: np.ndarray, scales: np.ndarray, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.float32)
    offset = 0
    for part, scale in zip(cases.chunks_of(out, scales.size), scales):
        packed = (part.size + 7) // 8  # each chunk's signs start on a new byte
        part[:] = np.where(np.unpackbits(signs[offset : offset + packed], count=part.size) == 1, scale, -scale)
        offset += packed
    return out


def sim_feedback(x: np.ndarray, error: np.ndarray | None, chunks: int) -> np.ndarray:
    """Compress-decompress of x + error; error (in place) keeps what was lost. None: no feedback."""
    corrected = (x + error).astype(np.float32) if error is not None else x.astype(np.float32)
    out = sim_decompress(*sim_compress(corrected, chunks), corrected.size)
    if error is not None:
        error[:] = corrected - out
    return out


def sim_onebit_allreduce(xs: list[np.ndarray], worker_errors: list[np.ndarray] | None,
                         server_errors: list[np.ndarray] | None) -> np.ndarray:
    """DeepSpeed's compressed allreduce of the p ranks' xs; the errors are updated in place
    (None: that side has no error feedback). Returns the result every rank gets."""
    p = len(xs)
    sent = [cases.chunks_of(sim_feedback(x, worker_errors[i] if worker_errors else None, p), p) for i, x in enumerate(xs)]
    averages = [(np.sum([s[j] for s in sent], axis=0) / p).astype(np.float32) for j in range(p)]
    return np.concatenate([sim_feedback(average, server_errors[j] if server_errors else None, 1)
                           for j, average in enumerate(averages)])


def sim_topk(grads: list[np.ndarray], errors: list[np.ndarray] | None, keep: float) -> np.ndarray:
    p, n = len(grads), grads[0].size
    k = cases.topk_count(n, keep)
    total = np.zeros(n, dtype=np.float64)
    for i in range(p):
        corrected = grads[i] + errors[i] if errors is not None else grads[i].copy()
        index = np.argpartition(np.abs(corrected), n - k)[n - k :]
        total[index] += corrected[index]
        if errors is not None:
            errors[i][:] = corrected
            errors[i][index] = 0
    return (total / p).astype(np.float32)


# -- the compressor --------------------------------------------------------------------------------
def judge_compress(t: CheckContext, x: np.ndarray, chunks: int, what: str, packed: Any,
                   roundtrip: Any) -> None:
    head = f"compress(x, {chunks}) with {what}"
    want_signs, want_scales = sim_compress(x, chunks)
    if isinstance(packed, Raised):
        t.fail(f"{head} {packed}")
    if isinstance(packed, str):
        t.fail(f"{head} returned {packed}; expected a pair (signs, scales)")
    signs, scales = as_array(packed[0]), as_array(packed[1])
    if signs is None or signs.size == 0:
        t.fail(f"{head}: signs is {packed[0] if signs is None else 'empty'}; expected {want_signs.size} "
               "bytes, each chunk's signs packed 8 per byte (np.packbits)")
    if signs.size == x.size and want_signs.size != x.size:
        t.fail(f"{head}: signs take {signs.size} bytes, one per element, 8x the {want_signs.size} bytes of "
               "signs packed 8 per byte: use np.packbits")
    if signs.dtype != np.uint8 or signs.shape != want_signs.shape:
        t.fail(f"{head}: expected signs as {want_signs.size} uint8 bytes (each chunk packed on its own: "
               f"ceil(len/8) bytes per chunk); saw {signs.size} of {signs.dtype}")
    wrong = first_mismatch(signs, want_signs)
    if wrong:
        t.fail(f"{head}: sign byte {wrong.index} is {wrong.seen}, expected {wrong.expected} "
               "(bit 1 where x >= 0, np.packbits of each chunk, chunk after chunk)")
    got = None if scales is None else scales.astype(np.float64).ravel()
    if got is None or got.size != chunks:
        t.fail(f"{head}: expected {chunks} scales, one per chunk; saw {'none' if got is None else got.size}: "
               "without a scale per chunk the magnitudes cannot be rebuilt")
    if not np.allclose(got, want_scales, rtol=1e-4, atol=1e-12):
        whole, want = float(np.abs(x).mean()), numbers(want_scales)
        if chunks > 1 and np.allclose(got, whole, rtol=1e-4):
            t.fail(f"{head}: every chunk got the scale {whole:.4g}, the mean |x| of the whole vector; "
                   f"expected one scale per chunk, {want}: a global scale gives small chunks huge magnitudes "
                   "and big ones tiny ones")
        rms = [np.sqrt(np.mean(part.astype(np.float64) ** 2)) for part in cases.chunks_of(x, chunks)]
        if np.allclose(got, rms, rtol=1e-4):
            t.fail(f"{head}: the scales are each chunk's RMS (DeepSpeed's choice); this problem asks for the "
                   "mean |x| of each chunk, the scale that makes scale * sign(x) closest to x")
        if np.allclose(got, 1.0):
            t.fail(f"{head}: every scale is 1: the magnitudes are lost; expected the mean |x| of each "
                   f"chunk, {want}")
        t.fail(f"{head}: scales {numbers(got)}, expected the mean |x| of each chunk, {want}")
    rebuilt = sim_decompress(want_signs, want_scales, x.size)
    if not close(roundtrip, rebuilt, rtol=1e-5):
        t.fail(f"decompress(compress(x, {chunks})) with {what}: {describe(roundtrip, rebuilt)}; expected "
               "+scale where the bit is 1 and -scale where it is 0")


# -- the reducers ----------------------------------------------------------------------------------
def judge_onebit(t: CheckContext, case: cases.WireCase, results: list[dict[str, OpResult]]) -> None:
    """Both calls of onebit_allreduce: what every rank holds, and both of its errors."""
    p, n = case.p, case.n
    werr, serr = [np.zeros(n, np.float32) for _ in range(p)], cases.server_errors(n, p)
    for call in (1, 2):  # the simulation's errors move on with the calls, as the ranks' do
        name, head = f"onebit {call}", f"onebit_allreduce, p = {p}, n = {n}, call {call} of 2"
        xs = [cases.wire_input(case.seed, r, n, name) for r in range(p)]
        want, values = sim_onebit_allreduce(xs, werr, serr), [r[name].value for r in results]
        for rank, got in enumerate(values):
            if as_array(got) is not None and np.array_equal(got, xs[rank]):
                t.fail(f"{head}: rank {rank} still holds its own input: no reduction happened")
            if not close(got, want, share=0.999):
                right = [r for r in range(p) if r != rank and close(values[r], want, share=0.999)]
                hint = (f" (ranks {right} are right: the allgather of the servers' chunks went wrong)"
                        if right else onebit_symptom(xs, call, as_array(got)))
                t.fail(f"{head}: rank {rank} holds {describe(got, want)}{hint}")
        for rank, result in enumerate(results):
            got_w, got_s = result[name].state
            for side, got_e in (("worker_error", got_w), ("server_error", got_s)):
                array = as_array(got_e)
                if array is not None and array.size and not array.any():
                    t.fail(f"{head}: rank {rank}'s {side} is still all zeros: without error feedback what "
                           "each compression loses is gone for good; keep it in the error (in place) and add "
                           "it to the next vector")
            for side, got_e, want_e, should in (
                    ("worker_error", got_w, werr[rank], "(x + worker_error) - what the worker sent"),
                    ("server_error", got_s, serr[rank], "(average + server_error) - what the server sent")):
                if not close(got_e, want_e, rtol=1e-3, atol=1e-5, share=0.999):
                    t.fail(f"{head}: rank {rank}'s {side} holds {describe(got_e, want_e)}; "
                           f"expected {should}, in place")


def onebit_symptom(xs: list[np.ndarray], call: int, got: np.ndarray | None) -> str:
    """Names what a wrong result matches, if anything we know."""
    p, mean = len(xs), np.sum(xs, axis=0) / len(xs)
    if close(got, mean, rtol=1e-4):
        return ": it is the exact mean, nothing was compressed"
    if got is not None and got.shape == mean.shape and np.allclose(np.abs(got), 1):
        return ": every value is +1 or -1: the scales are missing"
    if call == 2:
        if close(got, sim_onebit_allreduce(xs, None, None), share=0.999):
            return (": it matches a compressed allreduce without error feedback (call 1 was right): add "
                    "worker_error and server_error, and update both in place")
        return ""
    if close(got, np.sum([sim_feedback(x, None, p) for x in xs], axis=0) / p, share=0.999):
        return (": it is the average of the workers' compressed vectors: the server side, compressing its "
                "averaged chunk once more before the allgather, is missing")
    one_scale = [cases.chunks_of(sim_feedback(x, None, 1), p) for x in xs]
    served = [sim_feedback(np.sum([s[j] for s in one_scale], axis=0) / p, None, 1) for j in range(p)]
    if close(got, np.concatenate(served), share=0.999):
        return (": it matches workers that compress with one scale for the whole vector; use one scale per "
                "server chunk (compress(x, p))")
    return ""


def judge_onebit_bytes(t: CheckContext, wire: CaseRun[cases.WireCase], head: str) -> float:
    """Fails a call of onebit_allreduce that sent more than its bound from a rank, or a rank that received
    too little for its result; both calls are read (a second one may not go dense once the first has
    shown the exchange). Returns the most a rank sent in one call."""
    p, n = wire.case.p, wire.case.n
    bound, fp32, bounds = onebit_bytes_bound(n, p), fp32_ring_bytes(n, p), cases.chunk_bounds(n, p)
    sent: dict[int, list[float]] = {}
    for call in (1, 2):
        counts = [phase_counts(t, wire.task, rank, f"onebit {call}", head) for rank in range(p)]
        sent[call] = [wire_bytes(c, p) for c in counts]
        for rank, nbytes in enumerate(sent[call]):
            if nbytes > bound:
                t.fail(f"{head}{'' if call == 1 else ', call 2 of 2'}: rank {rank} sent {nbytes:.0f} bytes, "
                       f"{nbytes / fp32:.4f} of a float32 ring allreduce ({fp32:.0f}); expected at most "
                       f"{bound:.0f} (1/30 of it plus {cases.SCALE_BYTES} bytes per message: scale, envelope)"
                       + onebit_call_symptom(wire.task, rank, call, sent[1][rank] <= bound, nbytes / fp32, p))
            if p > 1:  # the signs of every element outside its own chunk come from the other servers
                unfed(t, f"{head}, call {call}", rank, received_bytes(counts[rank], p),
                      (n - (bounds[rank + 1] - bounds[rank])) / 8,
                      "the servers' signs of every element outside its own chunk, 1 bit each")
    return max(max(per_rank) for per_rank in sent.values())


def onebit_call_symptom(task: Any, rank: int, call: int, first_within: bool, ratio: float, p: int) -> str:
    """What a call of onebit_allreduce over its bytes shows: the rank's own marks, a second call over where
    the first was within (its exchange known, its bytes not: the symptoms of sizes say nothing then), or
    what the ratio to float32 matches."""
    if note := own_marks_note(task, rank):
        return note
    if call == 2 and first_within:
        return (": call 1 of 2 stayed within it, so the exchange is known; every call must send the "
                "compressed signs and scales alone, its errors carried from the call before")
    return onebit_bytes_symptom(ratio, p)


def onebit_bytes_symptom(ratio: float, p: int) -> str:
    if 6 / 32 <= ratio <= 10 / 32:
        return ": about 8x the packed size: are the signs sent one per byte?"
    if abs(ratio - p / 64) <= 0.1 * p / 64:
        return (": an allgather of every rank's whole compressed vector sends (p-1) n/8 bytes; let rank j "
                "serve chunk j (scatter, then allgather) to send 2(p-1)/p n/8")
    if ratio >= 0.9:
        return ": as much as float32: is anything compressed on the wire?"
    return ""


def judge_topk(t: CheckContext, wire: CaseRun[cases.WireCase], keep: float) -> None:
    case, values = wire.case, wire.values
    p, n, k = case.p, case.n, cases.topk_count(case.n, keep)
    errors = [np.zeros(n, np.float32) for _ in range(p)]  # the simulation's, moved on per call
    calls = [(f"topk {keep} ef 1", "with error feedback, call 1 of 2", errors, "1"),
             (f"topk {keep} ef 2", "with error feedback, call 2 of 2", errors, "2"),
             (f"topk {keep} plain", "without error feedback (error=None)", None, "1")]
    wants = {}
    for name, what, errs, call in calls:
        grads = [cases.wire_input(case.seed, r, n, f"topk {keep} {call}") for r in range(p)]
        before = [e.copy() for e in errs] if errs is not None else []
        want = wants[name] = sim_topk(grads, errs, keep)
        head = f"topk_allreduce, p = {p}, n = {n}, keep {keep:g} (k = {k}), {what}"
        for rank, results in enumerate(values):
            got = results[name].value
            if as_array(got) is not None and np.array_equal(got, grads[rank]):
                t.fail(f"{head}: rank {rank} still holds its own gradient: no reduction happened")
            if not close(got, want, rtol=1e-4, atol=1e-6):
                alone = call == "2" and close(got, sim_topk(grads, None, keep), rtol=1e-4, atol=1e-6)
                t.fail(f"{head}: rank {rank} holds {describe(got, want)}" + (
                    ": it matches top-k of the gradient alone: select from gradient + error, so "
                    "the residual gets its turn" if alone else ""))
            if errs is None:
                continue
            got_error = as_array(results[name].state[1])
            if got_error is not None and np.array_equal(got_error, before[rank]):
                t.fail(f"{head}: rank {rank}'s error is unchanged: error feedback must keep what was not "
                       "sent, (gradient + error) off the top k")
            if not close(got_error, errs[rank], rtol=1e-4, atol=1e-6):
                t.fail(f"{head}: rank {rank}'s error holds {describe(got_error, errs[rank])}")
    bound = (p - 1) * k * 8 + 16 * (p - 1)
    first: list[float] = []  # the first call's bytes of each rank
    for name, what, _, _ in calls:  # every call: a later one may not go dense once the first has shown the pairs
        others = int(np.count_nonzero(wants[name])) - k  # indices a rank did not keep itself
        later = "" if name == calls[0][0] else f", {what}"
        for rank in range(p):
            counts = phase_counts(t, wire.task, rank, name, f"topk_allreduce, p = {p}, n = {n}")
            nbytes = wire_bytes(counts, p)
            if not later:
                first.append(nbytes)
            if nbytes > bound:
                why = ""
                if later and first[rank] <= bound:
                    why = (": the first call with error feedback stayed within it, so the pairs are known; every "
                           "call must send its k pairs alone")
                elif nbytes >= 0.9 * fp32_ring_bytes(n, p):
                    why = ": as much as the dense float32 allreduce; send only the k pairs"
                elif abs(nbytes / ((p - 1) * k * 12) - 1) < 0.05:
                    why = ": 12 bytes per kept value; send int32 indices, not int64"
                t.fail(f"topk_allreduce, p = {p}, n = {n}, keep {keep:g}{later}: rank {rank} sent {nbytes:.0f} "
                       f"bytes; expected at most {bound:.0f}, (p-1) k (4 + 4) for k = {k} int32 indices and "
                       f"float32 values from every rank{why}")
            if p > 1:  # the values it did not select itself come from the other ranks, 2 bytes each at the least
                unfed(t, f"topk_allreduce, p = {p}, n = {n}, keep {keep:g}, {'call 1' if not later else what}",
                      rank, received_bytes(counts, p), 2 * others,
                      f"the other ranks' values at {others} indices it did not keep itself")


def codec_shape(t: CheckContext, case: cases.CodecCase, result: Any) -> None:
    """The codec task's result as the harness makes it, else a failed check naming what came back."""
    shaped = isinstance(result, cases.CodecResult) and all(
        isinstance(part, list) and len(part) == size for part, size in (
            (result.compressed, len(case.vectors)), (result.roundtrip, len(case.vectors)), (result.feedback, 3)))
    shaped = shaped and all(isinstance(packed, str) or (isinstance(packed, tuple) and len(packed) == 2)
                            for packed in result.compressed)
    if not (shaped and all(isinstance(pair, tuple) and len(pair) == 2 for pair in result.feedback)):
        t.fail(f"the codec task returned {type(result).__name__}, not the harness's results of every call: was "
               "run_codec replaced?")


def adam_fed(t: CheckContext, case: cases.AdamCase, task: Any) -> None:
    """Each step's parameters need the other ranks' gradients (the warmup's mean, then the compressed
    momenta): a rank that received fewer bytes than carry them did not get them from messages."""
    p, n = case.p, case.n
    if p == 1:
        return
    bounds = cases.chunk_bounds(n, p)
    for rank in range(p):
        steps = task.phases(rank, "step")
        if len(steps) != case.steps:
            t.fail(f"1-bit Adam: rank {rank} set {len(steps)} marks 'step' in {case.steps} steps: was run_adam "
                   "replaced? (the harness sets one per step; your own marks may have other names)")
        for i, counts in enumerate(steps):
            if i < case.warmup:
                floor, needs = n, f"the other ranks' gradients of {n} values, a byte each at the least"
            else:
                floor = (n - (bounds[rank + 1] - bounds[rank])) / 8
                needs = "the servers' signs of every element outside its own chunk, 1 bit each"
            unfed(t, f"1-bit Adam, step {i + 1}", rank, received_bytes(counts, p), floor, needs)


def training_fed(t: CheckContext, case: cases.TrainCase, task: Any) -> None:
    """The same for the training runs: every step's update needs the other ranks' gradients."""
    p, n = case.p, cases.N_PARAMS
    if p == 1:
        return
    bounds = cases.chunk_bounds(n, p)
    harness_marks(t, task, f"the training runs ({case.label()})")
    for rank in range(p):
        own = bounds[rank + 1] - bounds[rank]
        for how, floor, needs in (
                ("fp16", case.steps * n, f"the other ranks' gradients, {n} values a step, a byte each at the least"),
                ("onebit", case.warmup * n + (case.steps - case.warmup) * (n - own) / 8,
                 "the other ranks' gradients in the warmup, a byte a value, then the servers' signs, a bit a value")):
            got = sum(received_bytes(c, p) for c in task.phases(rank, how))
            unfed(t, f"{what_of(how)} ({case.label()})", rank, got, floor, needs)


def uncompressed_training(task: Any, case: cases.TrainCase) -> list[str]:
    """What went on the wire uncompressed in the two training runs, a sentence per run: a step of
    FP16's over half of float32's ring bytes, or one of 1-bit Adam's after its warmup over the
    1-bit allreduce's bound. The AUC is graded for what compressed training reaches: float32 Adam
    under both names reached it with ten lines of the starter (an outside tester's 3/20)."""
    p, n = case.p, cases.N_PARAMS
    if p == 1:
        return []
    limits = {"fp16": (fp32_ring_bytes(n, p) / 2 * (1 + cases.FP16_TOLERANCE), 0, "float16's",
                       "its gradients travel as float16"),
              "onebit": (onebit_bytes_bound(n, p), case.warmup, "the 1-bit allreduce's",
                         "after the warmup its momentum travels as signs")}
    found = []
    for how, (most, first, whose, rule) in limits.items():
        over = next(((rank, step, nbytes) for rank in range(p)
                     for step, counts in enumerate(task.phases(rank, how))
                     if step >= first and (nbytes := wire_bytes(counts, p)) > most), None)
        if over is not None:
            rank, step, nbytes = over
            found.append(f"{what_of(how)} ({case.label()}): rank {rank} sent {nbytes:.0f} bytes in step {step + 1}, "
                         f"more than {whose} {most:.0f}: the AUC is graded for training where {rule}")
    return found


def what_of(how: str) -> str:
    return {"fp16": "FP16", "onebit": "1-bit Adam"}[how]


# -- 1-bit Adam, and the mistakes people make with it, as variants of one simulation ---------------

ADAM_VARIANTS = {  # variant of sim_onebit_adam -> what the check tells a solution that matches it
    "correct": "",
    "variance not frozen": "the variance keeps being updated after the warmup (with each rank's own "
                           "gradient): freeze it at the end of the warmup",
    "no error feedback": "1-bit Adam without error feedback on either side: add what each compression lost "
                         "to the next vector",
    "no worker error feedback": "the worker side has no error feedback (worker_error unused)",
    "no server error feedback": "the server side has no error feedback (server_error unused)",
    "gradient compressed": "the gradient is compressed and averaged instead of the momentum: update the "
                           "momentum with the local gradient, then average the momentum",
    "warmup one step short": "compression starts one step early: steps 1..warmup_steps are plain Adam",
    "warmup one step long": "compression starts one step late: step warmup_steps + 1 is compressed",
    "no bias correction": "the update lacks Adam's bias correction m / (1 - b1^t), v / (1 - b2^t)",
    "never compresses": "the momentum is never compressed: after the warmup only the 1-bit allreduce of "
                        "the momentum may travel",
}


def sim_onebit_adam(params0: np.ndarray, grads: list[list[np.ndarray]], lr: float, warmup: int,
                    variant: str = "correct") -> list[np.ndarray]:
    """1-bit Adam on p ranks; grads[t][r] is rank r's gradient at step t+1. Returns the
    parameters of every rank after every step, out[t][r]: row r of each state is rank r's."""
    b1, b2 = cases.BETAS
    p, n = len(grads[0]), params0.size
    params = np.tile(params0.astype(np.float32), (p, 1))
    m, v, v_hat = (np.zeros((p, n), np.float32) for _ in range(3))
    werr, serr = [np.zeros(n, np.float32) for _ in range(p)], cases.server_errors(n, p)
    shift = {"warmup one step short": -1, "warmup one step long": 1}.get(variant, 0)
    last_warm = len(grads) if variant == "never compresses" else warmup + shift
    out = []
    for t, step_grads in enumerate(grads, start=1):
        local = np.array(step_grads)
        if t <= last_warm:
            g = (np.sum(step_grads, axis=0) / p).astype(np.float32)
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            v_hat = v / (1 - b2**t)
        elif variant == "gradient compressed":
            m = (b1 * m + (1 - b1) * sim_onebit_allreduce(step_grads, werr, serr)).astype(np.float32)
        else:
            if variant == "variance not frozen":  # each rank's own gradient
                v = b2 * v + (1 - b2) * local * local
                v_hat = v / (1 - b2**t)
            worker = None if variant in ("no error feedback", "no worker error feedback") else werr
            server = None if variant in ("no error feedback", "no server error feedback") else serr
            momenta = (b1 * m + (1 - b1) * local).astype(np.float32)
            m = np.tile(sim_onebit_allreduce(list(momenta), worker, server), (p, 1))
        if variant == "no bias correction":
            update = lr * m / (np.sqrt(v) + cases.EPS)
        else:
            update = lr * (m / (1 - b1**t)) / (np.sqrt(v_hat) + cases.EPS)
        params = params - update.astype(np.float32)
        out.append(params)
    return out


def timed_onebit_wrong(case: Any, values: list[Any]) -> str | None:
    """The first rank of the timed 1-bit allreduce whose result is not the simulation's, or None."""
    p, n = case.p, case.n
    want = sim_onebit_allreduce([cases.wire_input(case.seed, r, n, "timed") for r in range(p)],
                                [np.zeros(n, np.float32) for _ in range(p)], cases.server_errors(n, p))
    for rank, got in enumerate(values):
        if not close(got, want, share=0.999):
            return (f"the timed 1-bit allreduce (p = {p}, n = {n}): rank {rank} holds a wrong result (see "
                    "the 1-bit allreduce check)")
    return None


def onebit_volumes(task: Any, p: int) -> tuple[list[list[float]], list[float]]:
    """Each rank's bytes on the wire in each 1-bit Adam step, envelopes counted (as every bound counts
    them), and its payload over all the steps (what the volume formula w + (1-w)/32 speaks of)."""
    phases = [task.phases(rank, "onebit") for rank in range(p)]
    return ([[wire_bytes(c, p) for c in steps] for steps in phases],
            [sum(wire_bytes(c, p, envelopes=False) for c in steps) for steps in phases])


def timed_volume(t: CheckContext, timed: CaseRun[Any]) -> None:
    """Fails the timed 1-bit allreduce where a rank sent more than the 1-bit allreduce check allows, the
    envelopes of its messages counted: the time is graded for that volume only (empty messages, which the
    replay overlaps by the thousand at alpha each, carried an outside tester's whole vectors in their tags)."""
    p, n = timed.case.p, timed.case.n
    bound = onebit_bytes_bound(n, p)
    for rank in range(p):
        counts = timed.task.counts(rank)
        if (nbytes := wire_bytes(counts, p)) > bound:
            t.fail(f"the timed 1-bit allreduce (p = {p}, n = {n}): rank {rank} sent {nbytes:.0f} bytes, "
                   f"{wire_bytes(counts, p, envelopes=False):.0f} of payload and {counts.messages_sent} "
                   f"point-to-point messages of {cases.ENVELOPE_BYTES} bytes of envelope (a tag) each; expected "
                   f"at most {bound:.0f}, as in the 1-bit allreduce check: its time is graded for that volume only")
