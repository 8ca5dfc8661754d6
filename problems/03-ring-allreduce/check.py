"""Checks for problem 03, ring allreduce by hand.

The story: the learner's allreduce runs on 1 to 8 real ranks, on every length that trips people up
(0, 1, fewer elements than ranks, not a multiple of p, large), on three dtypes and two ops. The
results are compared with a reduction computed here, outside the ranks. The same runs are then
read for what went over the wire: no built-in collective, and no more than the ring's
2(p-1)/p * n * itemsize bytes per rank. Last, a run with one slow rank must not deadlock.
"""

from __future__ import annotations

import numpy as np

from distlab.grading import CheckContext, Checklist, Run, Task, faults

from . import cases, programs
from .judging import ring_bound, spread_missing, wrong_result

BYTES_SLACK = 64  # bytes per rank allowed above the ring bound, besides uneven chunks

CHECKS = Checklist()


@CHECKS.run
def every_case(t: CheckContext) -> Run:
    """Every case, plus one timed case per rank count at the end: one launch serves four checks."""
    rng = np.random.default_rng([t.seed, 3])
    tasks = [Task(ranks=p, cases=cases.cases_for(p, rng), label=f"the cases with p = {p}")
             for p in cases.rank_counts(rng)]
    for p in (4, 8, int(rng.choice([3, 5, 6, 7]))):
        tasks.append(Task(ranks=p, cases=[cases.timed_case(p, rng)], label=f"the timed case with p = {p}"))
    return t.launch(programs.run_cases, tasks)


@CHECKS.check("results equal the built-in Allreduce", points=4)
def results_match(t: CheckContext, every_case: Run) -> None:
    t.say(f"p = {', '.join(str(task.spec.ranks) for task in every_case.tasks)}; float32, float64, "
          "int64; SUM and MAX; n = 0, 1, < p, not divisible by p, ~1 MiB")
    for result in every_case.cases():
        case, want = result.case, result.case.expected()
        if spread_missing(case, result.values, want):
            t.fail(f"{case.label()}: every element is right on some rank but not on all: "
                   "the reduce-scatter ran but the allgather phase is missing or wrong")
        for rank, value in enumerate(result.values):
            wrong = wrong_result(case, rank, value, want)
            if wrong:
                t.fail(wrong)
    t.metric("cases", len(every_case.cases()))
    t.say(f"{len(every_case.cases())} cases agree on every rank")


@CHECKS.check("point-to-point calls only: no built-in collective", points=2)
def point_to_point_only(t: CheckContext, every_case: Run) -> None:
    for result in every_case.cases():
        case = result.case
        for rank, value in enumerate(result.values):
            used = value.stats.collectives_used()
            t.expect(not used, "only Send/Recv/Isend/Irecv/Sendrecv",
                     f"{case.label()}: rank {rank} called the built-in {', '.join(used)}")
            if case.p > 1 and case.n > 0:
                t.expect(value.stats.messages_sent > 0, "every rank to send its data",
                         f"{case.label()}: rank {rank} sent no message at all")
    t.say("every case used point-to-point messages only")


@CHECKS.check("bandwidth-optimal: at most 2(p-1)/p * n * itemsize bytes sent per rank", points=2)
def bytes_within_ring_bound(t: CheckContext, every_case: Run) -> None:
    worst = 0.0
    for result in every_case.cases():
        case = result.case
        if case.p == 1 or case.n == 0:
            continue
        itemsize = np.dtype(case.dtype).itemsize
        bound = 2 * (case.p - 1) / case.p * case.n * itemsize
        # Chunks of ceil(n/p) elements may exceed n/p by one element on each of 2(p-1) sends.
        slack = 2 * (case.p - 1) * itemsize + BYTES_SLACK
        sent = [value.stats.bytes_sent for value in result.values]
        for rank, nbytes in enumerate(sent):
            t.expect(nbytes <= bound + slack,
                     f"at most {bound + slack:.0f} bytes from each rank (the ring bound)",
                     f"{case.label()}: rank {rank} sent {nbytes} bytes ({nbytes / max(bound, 1):.2f}x the bound)")
        # Any correct allreduce moves every element at least 2(p-1) times in all.
        floor = 2 * (case.p - 1) * case.n * itemsize
        t.expect(sum(sent) >= floor, f"at least {floor} bytes in all (each element reduced and spread)",
                 f"{case.label()}: {sum(sent)} bytes sent by all ranks together")
        if case.shape == "large":
            worst = max(worst, max(sent) / bound)
    t.metric("worst_bytes_over_bound", round(worst, 4))
    t.say(f"largest per-rank volume {worst:.3f}x the ring bound")


@CHECKS.check("time within 5% of the ring bound 2(p-1)a + 2(p-1)/p n b", points=2)
def time_within_ring_bound(t: CheckContext, every_case: Run) -> None:
    worst = 0.0
    for result in every_case.cases(cases.Timed):
        case, want = result.case, result.case.expected()
        for rank, value in enumerate(result.values):
            t.expect(wrong_result(case, rank, value, want) is None, "a correct result before its time is graded",
                     f"{case.label()}: rank {rank} holds a wrong result (see the first check)")
        measured, bound = t.measured_time(result.task), ring_bound(t, case.p, case.n * 8)
        t.say(f"p = {case.p}, n = {case.n} float64 on {t.platform.name}: "
              f"{measured * 1e3:.3f} ms {t.clock}, bound {bound * 1e3:.3f} ms ({measured / bound:.3f}x)")
        if measured / bound >= worst:
            worst = measured / bound
            t.performance(measured, bound, result.task)
        if t.learner_faults:  # delays and caps the bound knows nothing of: a figure, not a grade
            t.say("with your fault plan in force the bound does not hold: reported, not graded")
            continue
        t.expect(measured <= 1.05 * bound, f"at most {1.05 * bound * 1e3:.3f} ms (5% over the ring bound)",
                 f"{measured * 1e3:.3f} ms for p = {case.p}, {measured / bound:.2f}x the bound: "
                 "are sends and receives of a step overlapped (Sendrecv or Isend/Irecv)?")
    t.metric("worst_time_over_bound", round(worst, 4))


@CHECKS.run
def one_slow_rank(t: CheckContext) -> Run:
    """p = 4 and about 1 MiB of float64, with every send of one hidden rank 20 ms late."""
    p, slow = 4, int(t.rng.integers(4))
    n = (1 << 17) + int(t.rng.integers(1, 1024))
    case = cases.Case(p, n, "float64", "SUM", int(t.rng.integers(1 << 31)), "large", 0)
    t.say(f"p = {p}, n = {n} float64; every send of rank {slow} is delayed by 20 ms")
    plan = faults.plan(faults.delay(src=slow, latency_s=0.02, wall=True,
                                    note="a slow link out of one rank, in real time too"),
                       seed=t.seed, where="03 slow-rank check")
    return t.launch(programs.run_cases, [Task(ranks=p, cases=[case], faults=plan,
                                              label=f"the slow-rank case (rank {slow} slow)")])


@CHECKS.check("no deadlock when one rank is slow", points=2)
def survives_slow_rank(t: CheckContext, one_slow_rank: Run) -> None:
    (result,) = one_slow_rank.cases()
    want = result.case.expected()
    for rank, value in enumerate(result.values):
        wrong = wrong_result(result.case, rank, value, want)
        if wrong:
            t.fail(wrong)
    t.metric("wall_s", round(one_slow_rank.wall_s, 3))
    t.say(f"finished correctly in {one_slow_rank.wall_s:.2f} s of wall time")
