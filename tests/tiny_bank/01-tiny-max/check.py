"""Checks of the tiny problem: the results of a batch of cases, then the same run read for its
messages and its time, then a run of its own under a fault plan."""

from __future__ import annotations

from distlab.grading import CheckContext, Checklist, Run, Task, faults

from . import cases, programs

CHECKS = Checklist()
MADE: list[int] = []  # the declared runs made in this process, for tests/test_contract.py


@CHECKS.run
def batches(t: CheckContext) -> Run:
    MADE.append(t.seed)
    return t.launch(programs.run_batch, [Task(ranks=p, cases=cases.batch(t.rng, p),
                                              label=f"the batch with p = {p}") for p in (2, 3)])


@CHECKS.check("two ranks agree on the largest value", points=1)
def two_ranks_agree(t: CheckContext, batches: Run) -> None:
    pair = batches.tasks[0]  # the batch with p = 2: graded even when the other batch failed
    for i, case in enumerate(pair.spec.cases or []):
        t.expect(pair.values[0][i] == pair.values[1][i] == max(case.values), f"{max(case.values)} twice",
                 f"{[value[i] for value in pair.values]} ({case.label()})")


@CHECKS.check("every rank holds the largest value", points=2)
def every_rank_holds_the_max(t: CheckContext, batches: Run) -> None:
    for result in batches.cases():
        for rank, got in enumerate(result.values):
            t.expect(got == max(result.case.values), f"{max(result.case.values)} on every rank",
                     f"{got!r} on rank {rank} ({result.case.label()})")
    t.metric("cases", len(batches.cases()))


@CHECKS.check("point-to-point calls only", points=1)
def point_to_point_only(t: CheckContext, batches: Run) -> None:
    for task in batches.tasks:
        for rank in range(task.spec.ranks):
            used = task.counts(rank).collectives_used()
            t.expect(not used, "only Send/Recv/Sendrecv", f"rank {rank} called {', '.join(used)} ({task.spec.label})")


@CHECKS.check("the timed cases take virtual time", points=1)
def timed(t: CheckContext, batches: Run) -> None:
    timed_cases = batches.cases(cases.Timed)
    t.expect(len(timed_cases) == 2, "one timed case per batch", f"{len(timed_cases)}")
    for result in timed_cases:
        t.expect(batches.task_of(result.case) is result.task, "the case's own task", "another")
        t.expect(t.measured_time(result.task) > 0, "some virtual time", "none")


@CHECKS.run
def slow_rank(t: CheckContext) -> Run:
    plan = faults.plan(faults.delay(src=0, latency_s=0.005, wall=True), seed=t.seed)
    return t.launch(programs.run_one, [Task(ranks=2, case=cases.Case((1.0, 2.0)), faults=plan,
                                            label="two ranks, rank 0 slow")])


@CHECKS.check("no deadlock when one rank is slow", points=1)
def survives_slow_rank(t: CheckContext, slow_rank: Run) -> None:
    (result,) = slow_rank.cases()
    t.expect(result.values == [2.0, 2.0], "2.0 on both ranks", f"{result.values}")
