"""Checks for problem 03, ring allreduce by hand.

The story: the learner's allreduce runs on 1 to 8 real ranks, on every length that trips people up
(0, 1, fewer elements than ranks, not a multiple of p, large), on three dtypes and two ops. The
results are compared with a reduction computed here, outside the ranks. The same runs are then
read for what went over the wire: no built-in collective, and no more than the ring's
2(p-1)/p * n * itemsize bytes per rank. Last, a run with one slow rank must not deadlock.

Hidden variants: the input values, the large length and one extra rank count come from the seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distlab import MAX, SUM
from distlab.grading import CheckContext, Checklist, Task
from distlab.runtime.stats import CommStats

OPS = {"SUM": SUM, "MAX": MAX}
DTYPES = ("float32", "float64", "int64")
SAMPLE = 4096  # elements kept per rank and case for comparison (the chosen rank keeps all)
BYTES_SLACK = 64  # bytes per rank allowed above the ring bound, besides uneven chunks


@dataclass(frozen=True)
class Case:
    p: int
    n: int
    dtype: str
    op: str
    seed: int
    shape: str  # which edge this length probes
    full_rank: int  # the rank whose whole result comes back (others send a sample)

    def label(self) -> str:
        return f"p = {self.p}, n = {self.n} ({self.shape}), {self.dtype}, {self.op}"


@dataclass
class CaseResult:
    sample: np.ndarray
    returned: str  # type name of what allreduce returned ("NoneType" when it followed the rules)
    stats: CommStats


def case_input(case: Case, rank: int) -> np.ndarray:
    """Rank ``rank``'s input for ``case``: the same array in the rank and in the checker."""
    rng = np.random.default_rng([case.seed, rank])
    if case.dtype == "int64":
        return rng.integers(-1000, 1000, size=case.n).astype(np.int64)
    return rng.standard_normal(case.n).astype(case.dtype)


def sample_indices(n: int) -> np.ndarray:
    return np.arange(0, n, max(1, n // SAMPLE))


# -- what runs on every rank ----------------------------------------------------------------------


def run_cases(comm, solution, cases):
    """Runs the learner's allreduce on each case; returns what each left in its buffer."""
    results = []
    for case in cases:
        rank = comm.Get_rank()
        buf = case_input(case, rank)
        before = comm.stats.snapshot()
        returned = solution.allreduce(comm, buf, OPS[case.op])
        kept = buf if rank == case.full_rank else buf[sample_indices(case.n)]
        results.append(CaseResult(kept.copy(), type(returned).__name__, comm.stats.since(before)))
    return results


def main(comm, solution, n="1048576"):
    """A free run (distlab run, mpirun, torchrun): one float64 allreduce, checked against the built-in."""
    import time

    n = int(n)
    buf = np.random.default_rng(comm.Get_rank()).standard_normal(n)
    want = np.empty_like(buf)
    comm.Allreduce(buf, want, SUM)
    comm.Barrier()
    start = time.perf_counter()
    solution.allreduce(comm, buf, SUM)
    elapsed = time.perf_counter() - start
    ok = np.allclose(buf, want)
    return f"n={n} float64: {'matches' if ok else 'DIFFERS FROM'} the built-in; {elapsed * 1e3:.2f} ms on rank {comm.Get_rank()}"


# -- building the cases -------------------------------------------------------------------------


def cases_for(p: int, rng: np.random.Generator) -> list[Case]:
    large = (1 << 17) + int(rng.integers(1, 4096))  # about 1 MiB of float64: past the eager limit
    lengths = [
        (0, "empty"),
        (1, "one element"),
        (max(p - 1, 1), "fewer than p" if p > 1 else "one element"),
        (p * int(rng.integers(3, 9)) + int(rng.integers(1, p)) if p > 1 else 7, "not divisible by p"),
        (large, "large"),
    ]
    cases = []
    for n, shape in lengths:
        for dtype in DTYPES:
            for op in OPS:
                seed = int(rng.integers(1 << 31))
                cases.append(Case(p, n, dtype, op, seed, shape, int(rng.integers(p))))
    return cases


def rank_counts(rng: np.random.Generator) -> list[int]:
    """The catalog's rank counts plus one hidden extra."""
    return [1, 2, 3, 4, 5, 8, int(rng.choice([6, 7]))]


def correctness_tasks(t: CheckContext) -> list[Task]:
    rng = np.random.default_rng([t.seed, 3])  # the same tasks for every check that reads them
    return [
        Task(ranks=p, args=(cases_for(p, rng),), label=f"the cases with p = {p}")
        for p in rank_counts(rng)
    ]


# -- judging ------------------------------------------------------------------------------------


def expected(case: Case) -> np.ndarray:
    inputs = [case_input(case, r) for r in range(case.p)]
    ufunc = np.add if case.op == "SUM" else np.maximum
    result = inputs[0].copy()
    for x in inputs[1:]:
        ufunc(result, x, out=result)
    return result


def close(got: np.ndarray, want: np.ndarray, case: Case) -> np.ndarray:
    """Element-wise agreement: exact for ints, allclose for floats (ring order differs)."""
    if got.shape != want.shape:
        return np.zeros(want.shape, dtype=bool)
    if case.dtype == "int64":
        return got == want
    rtol = 1e-4 if case.dtype == "float32" else 1e-9
    return np.isclose(got, want, rtol=rtol, atol=rtol * case.p)


def diagnose(case: Case, rank: int, got: np.ndarray, want: np.ndarray, returned: str) -> str:
    """Names the symptom of a wrong result the way a reviewer would."""
    inputs = case_input(case, rank)
    if rank != case.full_rank:
        inputs = inputs[sample_indices(case.n)]
    ok = close(got, want, case)
    head = f"{case.label()}: rank {rank}"
    if returned != "NoneType":
        return (f"{head} left buf unchanged and returned a {returned}: allreduce must write "
                "the result into buf in place")
    if got.shape != want.shape:
        return f"{head} holds {got.shape} elements, expected {want.shape}"
    if np.array_equal(got, inputs) and case.p > 1:
        return f"{head} still holds its own input: no reduction reached this rank"
    right = int(ok.sum())
    if 0 < right < ok.size and case.p > 1 and right / ok.size <= 1 / case.p + 0.01:
        return (f"{head} holds the right values in only {right} of {ok.size} elements (one chunk): "
                "the reduce-scatter ran but the allgather phase is missing or wrong")
    first_bad = int(np.argmin(ok))
    return (f"{head}, element {first_bad}: expected {want[first_bad]!r}, saw {got[first_bad]!r} "
            f"({ok.size - right} of {ok.size} elements wrong)")


CHECKS = Checklist()


@CHECKS.check("results equal the built-in Allreduce", points=4)
def results_match(t: CheckContext) -> None:
    tasks = correctness_tasks(t)
    t.say(f"p = {', '.join(str(task.ranks) for task in tasks)}; float32, float64, int64; "
          "SUM and MAX; n = 0, 1, < p, not divisible by p, ~1 MiB")
    run = t.launch(run_cases, tasks)
    checked = 0
    for task_run in run.tasks:
        cases = task_run.task.args[0]
        for i, case in enumerate(cases):
            want = expected(case)
            for rank, rank_results in enumerate(task_run.values):
                result: CaseResult = rank_results[i]
                ref = want if rank == case.full_rank else want[sample_indices(case.n)]
                if not close(result.sample, ref, case).all() or result.returned != "NoneType":
                    t.fail(diagnose(case, rank, result.sample, ref, result.returned))
            checked += 1
    t.metric("cases", checked)
    t.say(f"{checked} cases agree on every rank")


@CHECKS.check("point-to-point calls only: no built-in collective", points=2)
def point_to_point_only(t: CheckContext) -> None:
    run = t.launch(run_cases, correctness_tasks(t))
    for task_run in run.tasks:
        for i, case in enumerate(task_run.task.args[0]):
            for rank, rank_results in enumerate(task_run.values):
                stats: CommStats = rank_results[i].stats
                used = stats.collectives_used()
                t.expect(not used, "only Send/Recv/Isend/Irecv/Sendrecv",
                         f"{case.label()}: rank {rank} called the built-in {', '.join(used)}")
                if case.p > 1 and case.n > 0:
                    t.expect(stats.messages_sent > 0, "every rank to send its data",
                             f"{case.label()}: rank {rank} sent no message at all")
    t.say("every case used point-to-point messages only")


@CHECKS.check("bandwidth-optimal: at most 2(p-1)/p * n * itemsize bytes sent per rank", points=2)
def bytes_within_ring_bound(t: CheckContext) -> None:
    run = t.launch(run_cases, correctness_tasks(t))
    worst = 0.0
    for task_run in run.tasks:
        for i, case in enumerate(task_run.task.args[0]):
            if case.p == 1 or case.n == 0:
                continue
            itemsize = np.dtype(case.dtype).itemsize
            bound = 2 * (case.p - 1) / case.p * case.n * itemsize
            # Chunks of ceil(n/p) elements may exceed n/p by one element on each of 2(p-1) sends.
            slack = 2 * (case.p - 1) * itemsize + BYTES_SLACK
            sent = [rank_results[i].stats.bytes_sent for rank_results in task_run.values]
            for rank, nbytes in enumerate(sent):
                t.expect(nbytes <= bound + slack,
                         f"at most {bound + slack:.0f} bytes from each rank (the ring bound)",
                         f"{case.label()}: rank {rank} sent {nbytes} bytes "
                         f"({nbytes / max(bound, 1):.2f}x the bound)")
            # Any correct allreduce moves every element at least 2(p-1) times in all.
            floor = 2 * (case.p - 1) * case.n * itemsize
            t.expect(sum(sent) >= floor,
                     f"at least {floor} bytes in all (each element reduced and spread)",
                     f"{case.label()}: {sum(sent)} bytes sent by all ranks together")
            if case.shape == "large":
                worst = max(worst, max(sent) / bound)
    t.metric("worst_bytes_over_bound", round(worst, 4))
    t.say(f"largest per-rank volume {worst:.3f}x the ring bound")


@CHECKS.check("no deadlock when one rank is slow", points=2)
def survives_slow_rank(t: CheckContext) -> None:
    p = 4
    slow = int(t.rng.integers(p))
    n = (1 << 17) + int(t.rng.integers(1, 1024))
    case = Case(p, n, "float64", "SUM", int(t.rng.integers(1 << 31)), "large", 0)
    t.say(f"p = {p}, n = {n} float64; every send of rank {slow} is delayed by 20 ms")
    run = t.launch(run_cases, [Task(ranks=p, args=([case],), send_delay_s={slow: 0.02},
                                    label=f"the slow-rank case (rank {slow} slow)")])
    want = expected(case)
    for rank, rank_results in enumerate(run.tasks[0].values):
        result: CaseResult = rank_results[0]
        ref = want if rank == case.full_rank else want[sample_indices(case.n)]
        if not close(result.sample, ref, case).all():
            t.fail(diagnose(case, rank, result.sample, ref, result.returned))
    t.metric("wall_s", round(run.wall_s, 3))
    t.say(f"finished correctly in {run.wall_s:.2f} s of wall time")
