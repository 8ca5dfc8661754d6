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
from distlab.grading import CheckContext, Checklist, CommStats, Task, parse_fault_plan

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
    """A free run (distlab run, mpirun, torchrun): one float64 allreduce of n elements.

    Rank 0 checks the result by regenerating every rank's input itself, so the run holds nothing
    but the learner's allreduce (its virtual time is the allreduce's)."""
    import time

    n, rank, p = int(n), comm.Get_rank(), comm.Get_size()
    buf = np.random.default_rng(rank).standard_normal(n)
    start = time.perf_counter()
    solution.allreduce(comm, buf, SUM)
    elapsed = time.perf_counter() - start
    if rank != 0:
        return None
    want = sum(np.random.default_rng(r).standard_normal(n) for r in range(p))
    verdict = "matches" if np.allclose(buf, want) else "DIFFERS FROM"
    return f"n={n} float64: {verdict} the sum of all inputs; {elapsed * 1e3:.2f} ms wall on rank 0"


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


def perf_case(p: int, rng: np.random.Generator) -> Case:
    n = (1 << 18) + int(rng.integers(1, 1 << 12))  # about 2 MiB of float64: bandwidth-bound
    return Case(p, n, "float64", "SUM", int(rng.integers(1 << 31)), "large", 0)


def correctness_tasks(t: CheckContext) -> list[Task]:
    """Every case, plus one timed case per rank count at the end; one launch serves every check."""
    rng = np.random.default_rng([t.seed, 3])  # the same tasks for every check that reads them
    tasks = [
        Task(ranks=p, args=(cases_for(p, rng),), label=f"the cases with p = {p}")
        for p in rank_counts(rng)
    ]
    for p in (4, 8, int(rng.choice([3, 5, 6, 7]))):
        tasks.append(Task(ranks=p, args=([perf_case(p, rng)],), label=f"the timed case with p = {p}"))
    return tasks


def ring_bound(t: CheckContext, p: int, nbytes: int) -> float:
    """2(p-1) alpha + 2(p-1)/p n beta, with the slowest ring link of the platform. On another
    platform than the card's, ring neighbours may share links (PCIe switches, sockets), which the
    formula ignores: there the bound is the built-in ring replayed on it, if that is slower."""
    routes = [t.platform.route(r, (r + 1) % p) for r in range(p)]
    alpha = max(r.alpha_s for r in routes)
    beta = max(r.beta_s_per_byte for r in routes)
    formula = 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta
    if t.on_card_setting:
        return formula
    return max(formula, t.collective_time("Allreduce", p, nbytes))


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
    indices = np.arange(case.n) if rank == case.full_rank else sample_indices(case.n)
    inputs = case_input(case, rank)[indices]
    ok = close(got, want, case)
    head = f"{case.label()}: rank {rank}"
    if got.shape != want.shape:
        return f"{head} holds {got.shape} elements, expected {want.shape}"
    if np.array_equal(got, inputs) and case.p > 1:
        if returned != "NoneType":
            return (f"{head} left buf unchanged and returned an {returned}: allreduce must write "
                    "the result into buf in place")
        return f"{head} still holds its own input: no reduction reached this rank"
    wrong = indices[~ok]
    right = int(ok.sum())
    tail = case.n - case.n % case.p
    if case.n % case.p and wrong.size and (wrong >= tail).all():
        return (f"{head}: only the last n % p = {case.n % case.p} elements are wrong, so they "
                "were never reduced: give the first n % p chunks one element more")
    if 0 < right < ok.size and case.p > 1 and right / ok.size <= 1 / case.p + 0.01:
        return (f"{head} holds the right values in only {right} of {ok.size} elements (one chunk): "
                "the reduce-scatter ran but the allgather phase is missing or wrong")
    first_bad = int(np.argmin(ok))
    return (f"{head}, element {indices[first_bad]}: expected {want[first_bad].item()!r}, "
            f"saw {got[first_bad].item()!r} ({ok.size - right} of {ok.size} elements wrong)")


def spread_missing(case: Case, results: list[CaseResult], want: np.ndarray) -> bool:
    """Every element is right on some rank but not on all: the reduction ran, the spreading did not."""
    if case.p == 1 or case.n == 0:
        return False
    indices = sample_indices(case.n)
    right_on = np.zeros(indices.size, dtype=int)
    for rank, result in enumerate(results):
        got = result.sample[indices] if rank == case.full_rank else result.sample
        if got.shape != indices.shape:
            return False
        right_on += close(got, want[indices], case)
    return bool((right_on >= 1).all() and (right_on < case.p).any())


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
            results = [rank_results[i] for rank_results in task_run.values]
            if spread_missing(case, results, want):
                t.fail(f"{case.label()}: every element is right on some rank but not on all: "
                       "the reduce-scatter ran but the allgather phase is missing or wrong")
            for rank, result in enumerate(results):
                ref = want if rank == case.full_rank else want[sample_indices(case.n)]
                if not close(result.sample, ref, case).all():
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


@CHECKS.check("time within 5% of the ring bound 2(p-1)a + 2(p-1)/p n b", points=2)
def time_within_ring_bound(t: CheckContext) -> None:
    run = t.launch(run_cases, correctness_tasks(t))
    timed = [task_run for task_run in run.tasks if task_run.task.label.startswith("the timed")]
    worst = 0.0
    for task_run in timed:
        case = task_run.task.args[0][0]
        want = expected(case)
        for rank, rank_results in enumerate(task_run.values):
            ref = want if rank == case.full_rank else want[sample_indices(case.n)]
            t.expect(close(rank_results[0].sample, ref, case).all(),
                     "a correct result before its time is graded",
                     f"{case.label()}: rank {rank} holds a wrong result (see the first check)")
        measured = t.measured_time(task_run)
        bound = ring_bound(t, case.p, case.n * 8)
        t.say(f"p = {case.p}, n = {case.n} float64 on {t.platform.name}: "
              f"{measured * 1e3:.3f} ms {t.clock}, bound {bound * 1e3:.3f} ms ({measured / bound:.3f}x)")
        if measured / bound >= worst:
            worst = measured / bound
            t.performance(measured, bound, task_run)
        if t.learner_faults:  # delays and caps the bound knows nothing of: a figure, not a grade
            t.say("with your fault plan in force the bound does not hold: reported, not graded")
            continue
        t.expect(measured <= 1.05 * bound,
                 f"at most {1.05 * bound * 1e3:.3f} ms (5% over the ring bound)",
                 f"{measured * 1e3:.3f} ms for p = {case.p}, {measured / bound:.2f}x the bound: "
                 "are sends and receives of a step overlapped (Sendrecv or Isend/Irecv)?")
    t.metric("worst_time_over_bound", round(worst, 4))


@CHECKS.check("no deadlock when one rank is slow", points=2)
def survives_slow_rank(t: CheckContext) -> None:
    p = 4
    slow = int(t.rng.integers(p))
    n = (1 << 17) + int(t.rng.integers(1, 1024))
    case = Case(p, n, "float64", "SUM", int(t.rng.integers(1 << 31)), "large", 0)
    t.say(f"p = {p}, n = {n} float64; every send of rank {slow} is delayed by 20 ms")
    plan = parse_fault_plan({"format_version": 1, "seed": t.seed, "fault": [
        {"kind": "delay", "src": slow, "latency_s": 0.02, "wall": True,
         "note": "a slow link out of one rank, in real time too"},
    ]}, where="03 slow-rank check")
    run = t.launch(run_cases, [Task(ranks=p, args=([case],), faults=plan,
                                    label=f"the slow-rank case (rank {slow} slow)")])
    want = expected(case)
    for rank, rank_results in enumerate(run.tasks[0].values):
        result: CaseResult = rank_results[0]
        ref = want if rank == case.full_rank else want[sample_indices(case.n)]
        if not close(result.sample, ref, case).all():
            t.fail(diagnose(case, rank, result.sample, ref, result.returned))
    t.metric("wall_s", round(run.wall_s, 3))
    t.say(f"finished correctly in {run.wall_s:.2f} s of wall time")
