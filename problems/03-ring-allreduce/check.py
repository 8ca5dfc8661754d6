"""Checks for problem 03, ring allreduce by hand: the learner's allreduce on 1 to 8 real ranks, on
every length that trips people up, three dtypes and two ops, against a reduction computed here. The
same runs are read for what went over the wire (no built-in collective, at most the ring's
2(p-1)/p * n * itemsize bytes per rank) and for time. Last, one slow rank must not deadlock."""

import numpy as np

from distlab import grading
from distlab.grading import (
    CheckContext,
    CheckFailed,
    Checklist,
    Run,
    Task,
    Widener,
    faults,
)

from .judging import byte_bound, diagnose, unfed
from .programs import Case, Timed, draw, run_cases

CHECKS = Checklist()


@CHECKS.run
def every_case(t: CheckContext) -> Run:
    """Every case, plus one timed case per rank count at the end: one launch serves four checks."""
    groups, timed = draw(t.seed)  # the card's rank counts and a hidden one; three timed cases
    # Each case's counters are those of its phase, from the program's mark "case" to the next: marks
    # the learner's code sets of other names cut nothing (Task.marks).
    tasks = [Task(ranks=batch[0].p, cases=batch, label=label, marks=("case",))
             for cases in groups for batch, label in batches(cases)]
    tasks += [Task(ranks=case.p, cases=[case], label=f"the timed case with p = {case.p}", marks=("case",))
              for case in timed]
    return t.launch(run_cases, tasks)


def batches(cases: list[Case]) -> list[tuple[list[Case], str]]:
    """The tasks of one rank count's cases. A rank is handed every case of its task at once: with
    the cases after it in hand, a rank reduced them all during an empty one and then sent junk of
    the ring's size in their own phases, or spread an unbalanced algorithm's bytes over several
    phases. So a case with more than a few bytes to move is a task of its own; the few with n < p
    share one (their phases, the empty ones too, still each within its own bound)."""
    p = cases[0].p
    if p == 1:  # nothing travels
        return [(cases, "the cases with p = 1")]
    return [([c for c in cases if c.n < p], f"the cases with p = {p}, n < p"),
            *(([c], f"the case {c.label()}") for c in cases if c.n >= p)]


@CHECKS.check("results equal the built-in Allreduce", points=4)
def results_match(t: CheckContext, every_case: Run) -> None:
    ranks = [*dict.fromkeys(r.case.p for r in every_case.cases() if not isinstance(r.case, Timed)),
             *(r.case.p for r in every_case.cases(Timed))]
    t.say(f"p = {', '.join(map(str, ranks))}; float32, float64, "
          "int64; SUM and MAX; n = 0, 1, < p, not divisible by p, ~1 MiB")
    phases = case_counts(every_case)
    for result in every_case.cases():
        if wrong := diagnose(result):
            t.fail(wrong)
    for case, counts in phases:
        if wrong := unfed(case, counts):
            t.fail(wrong)
    t.metric("cases", len(every_case.cases()))
    t.say(f"{len(every_case.cases())} cases agree on every rank")


@CHECKS.check("point-to-point calls only: no built-in collective", points=2)
def point_to_point_only(t: CheckContext, every_case: Run) -> None:
    barriers = 0
    for case, counts in case_counts(every_case):
        for rank, count in enumerate(counts):
            # Barrier moves no data, so it replaces nothing the ring must do: allowed, and counted.
            used = [op for op in count.collectives_used() if op != "Barrier"]
            barriers += count.calls.get("Barrier", 0)
            t.expect(not used, "only Send/Recv/Isend/Irecv/Sendrecv (and Barrier, which moves no data)",
                     f"{case.label()}: rank {rank} called the built-in {', '.join(used)}")
            t.expect(count.messages_sent > 0 or case.p == 1 or case.n == 0, "every rank to send its data",
                     f"{case.label()}: rank {rank} sent no message at all")
    t.metric("barriers", barriers)
    t.say("every case used point-to-point messages only" + (f" (and {barriers} Barrier calls, allowed)" if barriers else ""))


@CHECKS.check("bandwidth-optimal: at most 2(p-1)/p * n * itemsize bytes sent per rank", points=2)
def bytes_within_ring_bound(t: CheckContext, every_case: Run) -> None:
    worst = 0.0
    for case, counts in case_counts(every_case):
        if case.p == 1:
            continue
        bound, slack = byte_bound(case)  # n = 0 too: its phase could carry the other cases' bytes
        sent = [count.bytes_sent for count in counts]
        for rank, nbytes in enumerate(sent):
            why = f"{nbytes / bound:.2f}x the bound" if bound else "with nothing to reduce: other cases' bytes?"
            t.expect(nbytes <= bound + slack, f"at most {bound + slack:.0f} bytes from each rank (the ring bound)",
                     f"{case.label()}: rank {rank} sent {nbytes} bytes ({why})")
        # Any correct allreduce moves every element at least 2(p-1) times in all.
        floor = 2 * (case.p - 1) * case.n * np.dtype(case.dtype).itemsize
        t.expect(sum(sent) >= floor, f"at least {floor} bytes in all (each element reduced and spread)",
                 f"{case.label()}: {sum(sent)} bytes sent by all ranks together")
        if case.shape == "large":
            worst = max(worst, max(sent) / bound)
    t.metric("worst_bytes_over_bound", round(worst, 4))
    t.say(f"largest per-rank volume {worst:.3f}x the ring bound")


@CHECKS.check("time within 5% of the ring bound 2(p-1)a + 2(p-1)/p n b", points=2)
def time_within_ring_bound(t: CheckContext, every_case: Run) -> None:
    worst = 0.0
    for result in every_case.cases(Timed):
        case = result.case
        t.expect(diagnose(result) is None, "a correct result before its time is graded",
                 f"{case.label()}: a rank holds a wrong result (see the first check)")
        if wrong := unfed(case, tuple(phases[0] for phases in case_phases(result.task))):
            t.fail(wrong)
        measured, bound = t.measured_time(result.task), ring_bound(t, case.p, case.n * 8)
        t.say(f"p = {case.p}, n = {case.n} float64 on {t.platform.name}: "
              f"{measured * 1e3:.3f} ms {t.clock}, bound {bound * 1e3:.3f} ms ({measured / bound:.3f}x)")
        if measured / bound >= worst:
            worst = measured / bound
            t.performance(measured, bound, result.task)
        if t.learner_faults:  # delays and caps the bound knows nothing of: a figure, not a grade
            t.say("with your fault plan in force the bound does not hold: reported, not graded")
            continue
        barriers = result.task.counts(0).calls.get("Barrier", 0)
        why = (f"each of the {barriers} Barrier calls of rank 0 waits for every rank: drop them" if barriers
               else "are sends and receives of a step overlapped (Sendrecv or Isend/Irecv)?")
        t.expect(measured <= 1.05 * bound, f"at most {1.05 * bound * 1e3:.3f} ms (5% over the ring bound)",
                 f"{measured * 1e3:.3f} ms for p = {case.p}, {measured / bound:.2f}x the bound: {why}")
    t.metric("worst_time_over_bound", round(worst, 4))


@CHECKS.run
def one_slow_rank(t: CheckContext) -> Run:
    p, slow = 4, int(t.rng.integers(4))
    # About 1 MiB of float64, past the eager limit.
    case = Case(p, (1 << 17) + int(t.rng.integers(1, 1024)), "float64", "SUM",
                Widener(t.seed, 3, 2)(int(t.rng.integers(1 << 31))), "large")
    t.say(f"p = {p}, n = {case.n} float64; every send of rank {slow} is delayed by 20 ms")
    slow_link = faults.delay(src=slow, latency_s=0.02, wall=True, note="a slow link out of one rank, in real time too")
    plan = faults.plan(slow_link, seed=t.seed, where="03 slow-rank check")
    task = Task(ranks=p, cases=[case], faults=plan, label=f"the slow-rank case (rank {slow} slow)", marks=("case",))
    return t.launch(run_cases, [task])


@CHECKS.check("no deadlock when one rank is slow", points=2)
def survives_slow_rank(t: CheckContext, one_slow_rank: Run) -> None:
    (result,) = one_slow_rank.cases()
    if wrong := diagnose(result) or unfed(*case_counts(one_slow_rank)[0]):
        t.fail(wrong)
    t.metric("wall_s", round(one_slow_rank.wall_s, 3))
    t.say(f"finished correctly in {one_slow_rank.wall_s:.2f} s of wall time")


# -- reading the runs: the bytes of each case, the ring's time bound (the symptoms: judging.py) --


def case_counts(run: Run) -> list[tuple[Case, tuple[grading.Counts, ...]]]:
    """Each case of ``run`` with every rank's calls and bytes over it: the phase of its mark "case"."""
    return [pair for task in run.tasks for pair in zip(task.spec.cases, zip(*case_phases(task)))]


def case_phases(task: grading.TaskRun) -> list[list[grading.Counts]]:
    """Every rank's "case" phases, one per case (the program sets one mark a case; a rank with more
    or fewer fails the check that reads them)."""
    phases = [task.phases(rank, "case") for rank in range(task.spec.ranks)]
    for rank, found in enumerate(phases):
        if len(found) != len(task.spec.cases):
            raise CheckFailed(f"{task.spec.label}: rank {rank} set {len(found)} marks \"case\" for "
                              f"{len(task.spec.cases)} cases; the harness sets one per case (your own marks "
                              "may have other names)")
    return phases


def ring_bound(t: CheckContext, p: int, nbytes: int) -> float:
    """2(p-1) alpha + 2(p-1)/p n beta on the platform's slowest ring link; off the card's platform, where
    ring neighbours may share links (PCIe switches, sockets), the built-in ring replayed there if slower."""
    routes = [t.platform.route(r, (r + 1) % p) for r in range(p)]
    alpha, beta = max(r.alpha_s for r in routes), max(r.beta_s_per_byte for r in routes)
    formula = 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta
    return formula if t.on_card_setting else max(formula, t.collective_time("Allreduce", p, nbytes))
