"""Problem 03, reading a wrong result: each symptom is named only on evidence that rules out its
look-alikes (a tail never reduced, chunks never gathered, a rounding difference, a copy returned)."""

import numpy as np

from distlab import grading

from .programs import Case, CaseResult

# Exact for ints; floats allow for the ring's other order of additions.
RTOL = {"float32": 1e-4, "float64": 1e-9, "int64": 0.0}
ULPS = 4  # per rank: a float32 reduction's error, whatever the order of its additions


def tolerance(case: Case) -> dict[str, float]:
    return {"rtol": RTOL[case.dtype], "atol": RTOL[case.dtype] * case.p}


def byte_bound(case: Case) -> tuple[float, int]:
    """The ring's bytes per rank, 2(p-1)/p * n * itemsize, and the slack allowed over it: chunks of
    ceil(n/p) may exceed n/p by one element on each of 2(p-1) sends; 64 bytes of headroom besides."""
    itemsize = np.dtype(case.dtype).itemsize
    return 2 * (case.p - 1) / case.p * case.n * itemsize, 2 * (case.p - 1) * itemsize + 64


def inputs(case: Case, indices: np.ndarray) -> np.ndarray:
    """Every rank's input at ``indices``: one row per rank."""
    return np.stack([case.input(rank)[indices] for rank in range(case.p)])


def segments(case: Case, rank: int, got: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per element: does ``got`` equal the op over a proper ring segment of ranks that holds ``rank``
    (its own input alone is one); over one rank (its input); over any proper segment."""
    rows, fold = inputs(case, indices), np.add if case.op == "SUM" else np.maximum
    holds, single, some = (np.zeros(indices.shape, dtype=bool) for _ in range(3))
    for length in range(1, case.p):
        for first in range(case.p):
            members = [(first + k) % case.p for k in range(length)]
            match = grading.agreement(got, fold.reduce(rows[members]), **tolerance(case))
            holds, single, some = holds | match & (rank in members), single | match & (length == 1), some | match
    return holds, single, some


def rounding_only(case: Case, got: np.ndarray, want: np.ndarray, indices: np.ndarray) -> bool:
    """Every element within a few float32 ulps (per rank) of the reduction: no term lost or extra."""
    if case.dtype == "int64":
        return False
    scale = np.abs(inputs(case, indices)).sum(axis=0) * ULPS * case.p * np.finfo(np.float32).eps
    return bool((np.abs(got.astype(np.float64) - want) <= scale).all())


def diagnose(result: grading.CaseRun) -> str | None:
    """None when every rank holds the reduction, else the first symptom, named from every rank's
    values (a reduction never spread) or one rank's (with the messages it sent, the proxy's count)."""
    case, want, task = result.case, result.case.expected(), result.task
    for rank, value in enumerate(result.values):  # the program ran in the solution's process
        if not (type(value) is CaseResult and isinstance(value.buf, np.ndarray) and value.buf.dtype.kind in "biuf"
                and isinstance(value.returned, str)):
            numbers = type(value) is CaseResult and isinstance(value.buf, np.ndarray)
            seen = f"a buffer of {value.buf.dtype}" if numbers else f"a {type(value).__name__}"
            return (f"{case.label()}: rank {rank}'s program handed back {seen} where it hands back its buffer of "
                    "numbers: was run_cases replaced?")
    if spread_missing(case, result.values, want):
        return (f"{case.label()}: every element is right on some rank but not on all, and the wrong ones are "
                "partial reductions: the reduce-scatter ran but the allgather phase is missing or wrong")
    nth = next(i for i, c in enumerate(task.spec.cases) if c is case)
    for rank, value in enumerate(result.values):
        if wrong := wrong_result(case, rank, value, want, task.phases(rank, "case")[nth].messages_sent):
            return wrong
    return None


def wrong_result(case: Case, rank: int, result: CaseResult, want: np.ndarray, sent: int) -> str | None:
    """None when ``rank`` holds the reduction, else the symptom named the way a reviewer would."""
    got, indices = result.buf, np.arange(case.n)
    mismatch = grading.first_mismatch(got, want[indices], **tolerance(case))
    if mismatch is None:
        return None
    head = f"{case.label()}: rank {rank}"
    if mismatch.index < 0:
        return f"{head} {mismatch.describe()}"
    seen = mismatch.describe(at=int(indices[mismatch.index]))
    if rounding_only(case, got, want[indices], indices):
        return (f"{head}, {seen}: values differ by a few ulps: summation order or precision (all within "
                f"float32 rounding of the reduction: was the {case.dtype} buffer reduced in a narrower type?)")
    own, ok = case.input(rank)[indices], grading.agreement(got, want[indices], **tolerance(case))
    if case.op == "MAX" and grading.agreement(got, inputs(case, indices).sum(axis=0), **tolerance(case)).all():
        return (f"{head}, {seen}: every element is the SUM of the inputs, not their MAX: the op was "
                "ignored (fold with op.Reduce_local(received, mine), not +=)")
    if np.array_equal(got, own) and case.p > 1:
        if result.returned not in ("NoneType", "buf"):
            return (f"{head} left buf unchanged and returned an {result.returned}: allreduce must "
                    "write the result into buf in place")
        if sent:
            return (f"{head} still holds its own input though it sent {sent} message(s): the ring "
                    "ran on a copy of buf (flatten(), copy(), astype()), not on a view of it")
        return f"{head} still holds its own input: no reduction reached this rank"
    cut = case.n - case.n % case.p  # where an even split into p chunks of n // p ends
    tail = indices >= cut
    if case.n >= case.p and case.n % case.p and ok[~tail].all() and np.array_equal(got[tail], own[tail]):
        return (f"{head}: only the last n % p = {case.n % case.p} elements (from {cut} on) are wrong "
                "and still hold this rank's input, so they were never reduced: give the first n % p "
                "chunks one element more")
    holds, single, some = segments(case, rank, got, indices)
    if ok.any() and holds[~ok].all():
        return (f"{head} holds the right values in only {ok.sum()} of {ok.size} elements and partial "
                f"reductions (of fewer than {case.p} ranks, its own among them) in the rest: the "
                "reduce-scatter ran but the allgather phase is missing or wrong")
    if case.op == "SUM" and single[~ok].all():
        return (f"{head}, {seen}: every wrong element is one rank's input, never added to: "
                "op.Reduce_local(received, mine) folds into its second argument")
    if case.op == "SUM" and some[~ok].all():
        return (f"{head}, {seen}: every wrong element is a sum over fewer than {case.p} ranks: a ring "
                "step is missing (p - 1 in each phase), or a chunk is folded or sent at the wrong step")
    return f"{head}, {seen}"


def spread_missing(case: Case, results: list[CaseResult], want: np.ndarray) -> bool:
    """Every element is right on some rank but not on all, and every wrong one is a partial
    reduction that holds its rank's input: the reduction ran, the spreading did not."""
    indices, got = np.arange(case.n), [result.buf for result in results]
    if case.p == 1 or any(g.shape != indices.shape for g in got):
        return False
    ok = [grading.agreement(g, want[indices], **tolerance(case)) for g in got]
    if not ((sum(ok) >= 1).all() and (sum(ok) < case.p).any()):
        return False
    # With MAX, ranks that kept their input where wrong (no reduction, a tail never sent) also have
    # each element right on some rank: the one whose input is the max.
    rows = inputs(case, indices)
    if case.op == "MAX" and all(np.array_equal(g[~right], row[~right]) for g, row, right in zip(got, rows, ok)):
        return False
    return all(segments(case, rank, g, indices)[0][~right].all() for rank, (g, right) in enumerate(zip(got, ok)))


def unfed(case: Case, counts: tuple[grading.Counts, ...]) -> str | None:
    """A rank whose float sum cannot have come from messages: it received fewer bytes than the n
    values it did not have (random floats do not compress), or None. The inputs reach a rank in
    messages only: its program is handed its own (Case.for_rank)."""
    if case.p == 1 or case.n == 0 or case.op != "SUM" or case.dtype == "int64":
        return None
    floor = case.n * np.dtype(case.dtype).itemsize
    for rank, count in enumerate(counts):
        received = count.bytes_received + sum(v for op, v in count.op_bytes.items() if op in grading.COLLECTIVES)
        if received < floor:
            return (f"{case.label()}: rank {rank} received {received} bytes, but its sum needs the other "
                    f"ranks' {case.n} values, at least {floor} bytes of messages: the result did not come from them")
    return None
