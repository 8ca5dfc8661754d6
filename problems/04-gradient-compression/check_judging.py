"""Problem 04's judging: how a rank's result is compared with the model, and described.

The comparisons every check uses (as_array, close, describe), and the longer verdicts of three
checks: the compressor's cases, the 1-bit allreduce's expected values and the symptoms a wrong
result matches, and the top-k allreduce. A verdict names the case, what was expected and what
was seen, and the mistake it recognises.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from distlab.grading import CheckContext, check_part

models = check_part(__file__, "models")
cases = check_part(__file__, "cases")
programs = check_part(__file__, "programs")

# -- judging ------------------------------------------------------------------------------------


def as_array(value: Any) -> np.ndarray | None:
    return value if isinstance(value, np.ndarray) and value.dtype != object else None


def close(got: Any, want: np.ndarray, rtol: float = 1e-4, atol: float = 1e-7,
          share: float = 1.0) -> bool:
    """got matches want element-wise, on at least ``share`` of the elements (a sign decided by a
    value within rounding of zero may flip between two correct programs)."""
    got = as_array(got)
    if got is None or got.shape != want.shape or not np.isfinite(got).all():
        return False
    if want.size == 0:
        return True
    ok = np.isclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)
    return bool(ok.mean() >= share)


def describe(value: Any, want: np.ndarray) -> str:
    """What a learner's array holds, against what was expected, in one phrase."""
    if isinstance(value, programs.Raised):
        return str(value)
    got = as_array(value)
    if got is None:
        return f"{value}" if isinstance(value, str) else f"a {type(value).__name__}"
    if got.shape != want.shape:
        return f"an array of shape {got.shape} (expected {want.shape})"
    finite = np.isfinite(got)
    if not finite.all():
        return (f"{int((~finite).sum())} non-finite values (inf or nan), the first at element "
                f"{int(np.argmin(finite))}")
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


def runs_of(run: Any, kind: type) -> list[Any]:
    return [task_run for task_run in run.tasks if isinstance(task_run.task.args[0], kind)]


def judge_compress(t: CheckContext, x: np.ndarray, chunks: int, what: str, packed: Any,
                   roundtrip: Any) -> None:
    head = f"compress(x, {chunks}) with {what}"
    want_signs, want_scales = models.sim_compress(x, chunks)
    if isinstance(packed, programs.Raised):
        t.fail(f"{head} {packed}")
    if isinstance(packed, str):
        t.fail(f"{head} returned {packed}; expected a pair (signs, scales)")
    signs, scales = as_array(packed[0]), as_array(packed[1])
    if signs is None or signs.size == 0:
        t.fail(f"{head}: signs is {packed[0] if signs is None else 'empty'}; expected "
               f"{want_signs.size} bytes, each chunk's signs packed 8 per byte (np.packbits)")
    if signs.size == x.size and want_signs.size != x.size:
        t.fail(f"{head}: signs take {signs.size} bytes, one per element, 8x the "
               f"{want_signs.size} bytes of signs packed 8 per byte: use np.packbits")
    if signs.dtype != np.uint8 or signs.shape != want_signs.shape:
        t.fail(f"{head}: expected signs as {want_signs.size} uint8 bytes (each chunk packed on "
               f"its own: ceil(len/8) bytes per chunk); saw {signs.size} of {signs.dtype}")
    if not np.array_equal(signs, want_signs):
        byte = int(np.argmax(signs != want_signs))
        t.fail(f"{head}: sign byte {byte} is {signs[byte]}, expected {want_signs[byte]} "
               "(bit 1 where x >= 0, np.packbits of each chunk, chunk after chunk)")
    got = None if scales is None else scales.astype(np.float64).ravel()
    if got is None or got.size != chunks:
        t.fail(f"{head}: expected {chunks} scales, one per chunk; saw "
               f"{'none' if got is None else got.size}: without a scale per chunk the "
               "magnitudes cannot be rebuilt")
    if not np.allclose(got, want_scales, rtol=1e-4, atol=1e-12):
        bounds = models.chunk_bounds(x.size, chunks)
        parts = [x[bounds[c] : bounds[c + 1]].astype(np.float64) for c in range(chunks)]
        whole = float(np.abs(x).mean())
        if chunks > 1 and np.allclose(got, whole, rtol=1e-4):
            t.fail(f"{head}: every chunk got the scale {whole:.4g}, the mean |x| of the whole "
                   f"vector; expected one scale per chunk, {numbers(want_scales)}: a global "
                   "scale gives small chunks huge magnitudes and big ones tiny ones")
        if np.allclose(got, [np.sqrt(np.mean(part**2)) for part in parts], rtol=1e-4):
            t.fail(f"{head}: the scales are each chunk's RMS (DeepSpeed's choice); this problem "
                   "asks for the mean |x| of each chunk, the scale that makes scale * sign(x) "
                   "closest to x")
        if np.allclose(got, 1.0):
            t.fail(f"{head}: every scale is 1: the magnitudes are lost; expected the mean |x| "
                   f"of each chunk, {numbers(want_scales)}")
        t.fail(f"{head}: scales {numbers(got)}, expected the mean |x| of each chunk, "
               f"{numbers(want_scales)}")
    want = models.sim_decompress(want_signs, want_scales, x.size)
    if not close(roundtrip, want, rtol=1e-5):
        t.fail(f"decompress(compress(x, {chunks})) with {what}: {describe(roundtrip, want)}; "
               "expected +scale where the bit is 1 and -scale where it is 0")


def onebit_expected(
        case: cases.WireCase) -> list[tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]]:
    """Result, worker errors and server errors after each of the two calls."""
    p, n = case.p, case.n
    bounds = models.chunk_bounds(n, p)
    werr = [np.zeros(n, np.float32) for _ in range(p)]
    serr = [np.zeros(bounds[j + 1] - bounds[j], np.float32) for j in range(p)]
    calls = []
    for call in (1, 2):
        xs = [cases.wire_input(case.seed, r, n, f"onebit {call}") for r in range(p)]
        out = models.sim_onebit_allreduce(xs, werr, serr)
        calls.append((out, [e.copy() for e in werr], [e.copy() for e in serr]))
    return calls


def onebit_symptom(case: cases.WireCase, call: int, got: np.ndarray | None) -> str:
    """Names what a wrong result matches, if anything we know."""
    p, n = case.p, case.n
    xs = [cases.wire_input(case.seed, r, n, f"onebit {call}") for r in range(p)]
    mean = np.sum(xs, axis=0) / p
    if close(got, mean, rtol=1e-4):
        return ": it is the exact mean, nothing was compressed"
    if got is not None and got.shape == mean.shape and np.allclose(np.abs(got), 1):
        return ": every value is +1 or -1: the scales are missing"
    if call == 2:
        if close(got, models.sim_onebit_allreduce(xs, None, None), share=0.999):
            return (": it matches a compressed allreduce without error feedback (call 1 was "
                    "right): add worker_error and server_error, and update both in place")
        return ""
    bounds = models.chunk_bounds(n, p)
    workers = [models.sim_feedback(x, None, p) for x in xs]
    if close(got, np.sum(workers, axis=0) / p, share=0.999):
        return (": it is the average of the workers' compressed vectors: the server side, "
                "compressing its averaged chunk once more before the allgather, is missing")
    one_scale = [models.sim_feedback(x, None, 1) for x in xs]
    out = np.empty(n, np.float32)
    for j in range(p):
        part = slice(bounds[j], bounds[j + 1])
        out[part] = models.sim_feedback(np.sum([s[part] for s in one_scale], axis=0) / p, None, 1)
    if close(got, out, share=0.999):
        return (": it matches workers that compress with one scale for the whole vector; use "
                "one scale per server chunk (compress(x, p))")
    return ""


def onebit_bytes_symptom(ratio: float, p: int) -> str:
    if 6 / 32 <= ratio <= 10 / 32:
        return ": about 8x the packed size: are the signs sent one per byte?"
    if abs(ratio - p / 64) <= 0.1 * p / 64:
        return (": an allgather of every rank's whole compressed vector sends (p-1) n/8 bytes; "
                "let rank j serve chunk j (scatter, then allgather) to send 2(p-1)/p n/8")
    if ratio >= 0.9:
        return ": as much as float32: is anything compressed on the wire?"
    return ""


def judge_topk(t: CheckContext, task_run: Any, case: cases.WireCase, keep: float) -> None:
    p, n, k = case.p, case.n, models.topk_count(case.n, keep)
    errors = [np.zeros(n, np.float32) for _ in range(p)]  # the simulation's, moved on per call
    calls = [(f"topk {keep} ef 1", "with error feedback, call 1 of 2", errors, "1"),
             (f"topk {keep} ef 2", "with error feedback, call 2 of 2", errors, "2"),
             (f"topk {keep} plain", "without error feedback (error=None)", None, "1")]
    for name, what, errs, call in calls:
        grads = [cases.wire_input(case.seed, r, n, f"topk {keep} {call}") for r in range(p)]
        before = [e.copy() for e in errs] if errs is not None else []
        want = models.sim_topk(grads, errs, keep)
        head = f"topk_allreduce, p = {p}, n = {n}, keep {keep:g} (k = {k}), {what}"
        for rank, results in enumerate(task_run.values):
            got = results[name].value
            if as_array(got) is not None and np.array_equal(got, grads[rank]):
                t.fail(f"{head}: rank {rank} still holds its own gradient: no reduction happened")
            if not close(got, want, rtol=1e-4, atol=1e-6):
                hint = ""
                if call == "2" and errs is not None and close(
                        got, models.sim_topk(grads, None, keep), rtol=1e-4, atol=1e-6):
                    hint = (": it matches top-k of the gradient alone: select from gradient + "
                            "error, so the residual gets its turn")
                t.fail(f"{head}: rank {rank} holds {describe(got, want)}{hint}")
            if errs is None:
                continue
            state = results[name].state
            got_error = as_array(state[1]) if len(state) == 2 else None
            if got_error is not None and np.array_equal(got_error, before[rank]):
                t.fail(f"{head}: rank {rank}'s error is unchanged: error feedback must keep what "
                       "was not sent, (gradient + error) off the top k")
            if not close(got_error, errs[rank], rtol=1e-4, atol=1e-6):
                t.fail(f"{head}: rank {rank}'s error holds {describe(got_error, errs[rank])}")
    bound = (p - 1) * k * 8 + 16 * (p - 1)
    for rank, results in enumerate(task_run.values):
        nbytes = models.wire_bytes(results[f"topk {keep} ef 1"].stats, p)
        if nbytes > bound:
            why = ""
            if nbytes >= 0.9 * models.fp32_ring_bytes(n, p):
                why = ": as much as the dense float32 allreduce; send only the k pairs"
            elif abs(nbytes / ((p - 1) * k * 12) - 1) < 0.05:
                why = ": 12 bytes per kept value; send int32 indices, not int64"
            t.fail(f"topk_allreduce, p = {p}, n = {n}, keep {keep:g}: rank {rank} sent "
                   f"{nbytes:.0f} bytes; expected at most {bound:.0f}, (p-1) k (4 + 4) for "
                   f"k = {k} int32 indices and float32 values from every rank{why}")
