"""Checks for problem 03, ring allreduce by hand: the learner's allreduce on 1 to 8 real ranks, on
every length that trips people up, three dtypes and two ops, against a reduction computed here. The
same runs are read for what went over the wire (no built-in collective, at most the ring's
2(p-1)/p * n * itemsize bytes per rank) and for time. Last, one slow rank must not deadlock."""

import numpy as np

from distlab import grading
from distlab.grading import CheckContext, Checklist, Run, Task, faults

from .programs import Case, CaseResult, Timed, cases_for, run_cases

# Exact for ints; floats allow for the ring's other order of additions.
RTOL = {"float32": 1e-4, "float64": 1e-9, "int64": 0.0}

CHECKS = Checklist()


@CHECKS.run
def every_case(t: CheckContext) -> Run:
    """Every case, plus one timed case per rank count at the end: one launch serves four checks."""
    rng = np.random.default_rng([t.seed, 3])
    tasks = [Task(ranks=p, cases=cases_for(p, rng), label=f"the cases with p = {p}")
             for p in [1, 2, 3, 4, 5, 8, int(rng.choice([6, 7]))]]  # the card's rank counts and a hidden one
    for p in (4, 8, int(rng.choice([3, 5, 6, 7]))):
        timed = Timed(p, 2**18 + int(rng.integers(1, 4096)), "float64", "SUM", int(rng.integers(1 << 31)), "large", 0)
        tasks.append(Task(ranks=p, cases=[timed], label=f"the timed case with p = {p}"))
    return t.launch(run_cases, tasks)


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
            if wrong := wrong_result(case, rank, value, want):
                t.fail(wrong)
    t.metric("cases", len(every_case.cases()))
    t.say(f"{len(every_case.cases())} cases agree on every rank")


@CHECKS.check("point-to-point calls only: no built-in collective", points=2)
def point_to_point_only(t: CheckContext, every_case: Run) -> None:
    for case, counts in case_counts(every_case):
        for rank, count in enumerate(counts):
            used = count.collectives_used()
            t.expect(not used, "only Send/Recv/Isend/Irecv/Sendrecv",
                     f"{case.label()}: rank {rank} called the built-in {', '.join(used)}")
            t.expect(count.messages_sent > 0 or case.p == 1 or case.n == 0, "every rank to send its data",
                     f"{case.label()}: rank {rank} sent no message at all")
    t.say("every case used point-to-point messages only")


@CHECKS.check("bandwidth-optimal: at most 2(p-1)/p * n * itemsize bytes sent per rank", points=2)
def bytes_within_ring_bound(t: CheckContext, every_case: Run) -> None:
    worst = 0.0
    for case, counts in case_counts(every_case):
        if case.p == 1 or case.n == 0:
            continue
        itemsize = np.dtype(case.dtype).itemsize
        bound = 2 * (case.p - 1) / case.p * case.n * itemsize
        # Chunks of ceil(n/p) elements may exceed n/p by one element on each of 2(p-1) sends; and
        # 64 bytes per rank of headroom besides.
        slack = 2 * (case.p - 1) * itemsize + 64
        sent = [count.bytes_sent for count in counts]
        for rank, nbytes in enumerate(sent):
            t.expect(nbytes <= bound + slack, f"at most {bound + slack:.0f} bytes from each rank (the ring bound)",
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
    for result in every_case.cases(Timed):
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
    p, slow = 4, int(t.rng.integers(4))
    # About 1 MiB of float64, past the eager limit.
    case = Case(p, (1 << 17) + int(t.rng.integers(1, 1024)), "float64", "SUM", int(t.rng.integers(1 << 31)), "large", 0)
    t.say(f"p = {p}, n = {case.n} float64; every send of rank {slow} is delayed by 20 ms")
    slow_link = faults.delay(src=slow, latency_s=0.02, wall=True, note="a slow link out of one rank, in real time too")
    plan = faults.plan(slow_link, seed=t.seed, where="03 slow-rank check")
    task = Task(ranks=p, cases=[case], faults=plan, label=f"the slow-rank case (rank {slow} slow)")
    return t.launch(run_cases, [task])


@CHECKS.check("no deadlock when one rank is slow", points=2)
def survives_slow_rank(t: CheckContext, one_slow_rank: Run) -> None:
    (result,) = one_slow_rank.cases()
    for rank, value in enumerate(result.values):
        if wrong := wrong_result(result.case, rank, value, result.case.expected()):
            t.fail(wrong)
    t.metric("wall_s", round(one_slow_rank.wall_s, 3))
    t.say(f"finished correctly in {one_slow_rank.wall_s:.2f} s of wall time")


# -- reading the runs: the symptom of a wrong result, the bytes of each case, the ring's time bound --


def tolerance(case: Case) -> dict[str, float]:
    return {"rtol": RTOL[case.dtype], "atol": RTOL[case.dtype] * case.p}


def wrong_result(case: Case, rank: int, result: CaseResult, want: np.ndarray) -> str | None:
    """None when ``rank`` holds the reduction, else the symptom named the way a reviewer would."""
    got, indices = result.sample, case.kept(rank)
    mismatch = grading.first_mismatch(got, want[indices], **tolerance(case))
    if mismatch is None:
        return None
    head = f"{case.label()}: rank {rank}"
    if mismatch.index < 0:
        return f"{head} {mismatch.describe()}"
    if np.array_equal(got, case.input(rank)[indices]) and case.p > 1:
        if result.returned != "NoneType":
            return (f"{head} left buf unchanged and returned an {result.returned}: allreduce must "
                    "write the result into buf in place")
        return f"{head} still holds its own input: no reduction reached this rank"
    # The indices ascend: every wrong element lies in the last n % p when the first one does.
    if case.n % case.p and indices[mismatch.index] >= case.n - case.n % case.p:
        return (f"{head}: only the last n % p = {case.n % case.p} elements are wrong, so they "
                "were never reduced: give the first n % p chunks one element more")
    right, total = mismatch.total - mismatch.wrong, mismatch.total
    if 0 < right < total and case.p > 1 and right / total <= 1 / case.p + 0.01:
        return (f"{head} holds the right values in only {right} of {total} elements (one chunk): "
                "the reduce-scatter ran but the allgather phase is missing or wrong")
    return f"{head}, {mismatch.describe(at=int(indices[mismatch.index]))}"


def spread_missing(case: Case, results: list[CaseResult], want: np.ndarray) -> bool:
    """Every element is right on some rank but not on all: the reduction ran, the spreading did not."""
    indices = case.kept()  # the sample that every rank but the full one sent
    got = [result.sample[indices] if rank == case.full_rank else result.sample for rank, result in enumerate(results)]
    right_on = sum(grading.agreement(g, want[indices], **tolerance(case)) for g in got)
    # With p = 1 or n = 0 no element can be right on some rank and wrong on another.
    return all(g.shape == indices.shape for g in got) and bool((right_on >= 1).all() and (right_on < case.p).any())


def case_counts(run: Run) -> list[tuple[Case, tuple[grading.Counts, ...]]]:
    """Each case of ``run`` with every rank's calls and bytes over it: the phase of its mark "case"."""
    return [pair for task in run.tasks
            for pair in zip(task.spec.cases, zip(*(task.phases(rank, "case") for rank in range(task.spec.ranks))))]


def ring_bound(t: CheckContext, p: int, nbytes: int) -> float:
    """2(p-1) alpha + 2(p-1)/p n beta on the platform's slowest ring link; off the card's platform, where
    ring neighbours may share links (PCIe switches, sockets), the built-in ring replayed there if slower."""
    routes = [t.platform.route(r, (r + 1) % p) for r in range(p)]
    alpha, beta = max(r.alpha_s for r in routes), max(r.beta_s_per_byte for r in routes)
    formula = 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta
    return formula if t.on_card_setting else max(formula, t.collective_time("Allreduce", p, nbytes))
