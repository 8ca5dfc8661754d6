"""Checks for problem 01, a synchronous parameter server (the card tells the story): one launch runs every
case; in the last, one worker's messages leave 50 ms late, in real time too. Hidden variants, from the seed: S
and W of three cases, the number of keys (never a multiple of S), the batch sizes (never all equal), K, the
rate, the data, the initial weights, the late worker. A right model counts only with the agents' evidence that
the workers trained it: the bytes each server took in, the compute each worker declared, and what every pull
and push carried (each rank's sends are recorded), step by step against the checker's own synchronous SGD."""

from distlab.grading import CaseRun, CheckContext, Checklist, Run, Task, faults

from . import cases, judging, programs
from .judging import fmt, model_problem

BALANCE_LIMIT = 1.1  # largest shard at most 1.1x the smallest
LATE_S = 0.05  # the late worker's messages leave 50 ms late, in real time and on the virtual clock

CHECKS = Checklist()


def wrong(t: CheckContext, run: CaseRun) -> str | None:
    """What is wrong with a case's model, or with the agents' evidence that the workers trained it."""
    return model_problem(run, t.platform, bool(t.learner_faults))


@CHECKS.run
def every_case(t: CheckContext) -> Run:
    *others, late = cases.sweep(t.seed)
    note = "a worker on a congested host: its pushes reach the servers after the others' next ones"
    plan = faults.plan(faults.delay(src=late.late, latency_s=LATE_S, wall=True, note=note), seed=t.seed,
                       where="the 01 late-worker case")
    return t.launch(programs.run_ps, [Task(c.servers + c.workers, c, faults=plan if c is late else None,
                                           label=c.label(), record_sent=True) for c in [*others, late]])


@CHECKS.check("the model after K steps equals gradient descent on the global batch", points=4)
def model_matches(t: CheckContext, every_case: Run) -> None:
    main = every_case.cases()[0]
    t.say(f"{main.case.label()}, lr {main.case.lr}")
    if problem := wrong(t, main):
        t.fail(problem)
    t.say(f"every key within rtol {cases.RTOL:g} of single-process gradient descent; {judging.latencies(t, main)}")


@CHECKS.check("works for every (S, W): one server, one worker, eight ranks", points=2)
def every_pair(t: CheckContext, every_case: Run) -> None:
    more = every_case.cases()[1:-1]  # the edges, the hidden pair and the timed case
    t.say("(S, W) = " + ", ".join(f"({r.case.servers}, {r.case.workers})" for r in more))
    for run in more:
        if problem := wrong(t, run):
            t.fail(problem)
    t.say(f"{len(more)} more cases agree with single-process gradient descent")


@CHECKS.check(f"bytes per worker per step = one pull + one push of the model (within {judging.BYTES_TOLERANCE:.0%})",
              points=2)
def bytes_per_worker(t: CheckContext, every_case: Run) -> None:
    worst, per_server = 1.0, {}
    for k, run in enumerate(every_case.cases()):
        case = run.case
        for i, rank in enumerate(case.worker_ranks):
            ratio, problem = judging.worker_bytes_problem(case, i, run.task.counts(rank))
            if problem is not None:
                t.fail(problem)
            worst = max(worst, ratio, key=lambda r: abs(r - 1.0))
        if k == 0:  # the main case: what each server's port carries
            per_server = {str(s): run.task.counts(s).bytes_sent + run.task.counts(s).bytes_received
                          for s in range(case.servers)}
            t.say(f"{case.label()}: bytes per server " +
                  ", ".join(f"{s}: {n / case.steps:,.0f}/step" for s, n in per_server.items()))
    t.metric("worst_bytes_over_model", round(worst, 4))
    t.metric("bytes_per_server", per_server)
    t.say(f"every worker within {abs(worst - 1):.1%} of 2 x model bytes per step")


@CHECKS.check("shards balanced: each server holds about 1/S of the keys", points=1)
def shards_balanced(t: CheckContext, every_case: Run) -> None:
    worst = 1.0
    for run in every_case.cases():
        case = run.case
        layout, problem = judging.shard_layout(case, run.values)
        if problem is not None:
            t.fail(problem)
        sizes = [hi - lo for lo, hi in layout]
        if (ratio := judging.balance(sizes)) > BALANCE_LIMIT:
            t.fail(f"{case.label()}: shards of {', '.join(f'server {s}: {n}' for s, n in enumerate(sizes))} keys; "
                   f"expected about D/S = {case.keys / case.servers:.0f} each (largest at most {BALANCE_LIMIT}x "
                   "the smallest): split the key range into S nearly equal parts")
        worst = max(worst, ratio)
    t.metric("worst_shard_ratio", round(worst, 4))
    t.say(f"largest shard at most {worst:.3f}x the smallest")


@CHECKS.check("a late worker does not make a server mix steps", points=3)
def late_worker(t: CheckContext, every_case: Run) -> None:
    *others, late = every_case.cases()
    rank = late.case.late
    t.say(f"{late.case.label()}; every message of worker rank {rank} leaves {LATE_S * 1e3:.0f} ms late, "
          "in real time too")
    problem = wrong(t, late)
    if problem is None:
        wall = late.task.wall_s()
        t.metric("late_case_wall_s", round(wall, 3))
        t.say(f"the model is right with rank {rank} late ({wall:.2f} s of wall time)")
        return
    evidence = any(phrase in problem for phrase in judging.EVIDENCE)
    if "mixed two steps" not in problem and not evidence and all(wrong(t, r) is None for r in others):
        problem += ("; the same code is right when no worker is late, so a server took a message into the "
                    f"wrong step: {judging.IN_STEP}")
    t.fail(f"with worker rank {rank} late: {problem}")


@CHECKS.check("virtual time per step near the bound: every worker computes at once", points=2)
def time_per_step(t: CheckContext, every_case: Run) -> None:
    (run,) = every_case.cases(cases.Timed)
    case, b = run.case, judging.step_bound(run.case, t.platform, slowest=not t.on_card_setting)
    if problem := wrong(t, run):  # a right model before its time is graded
        t.fail(problem)
    measured = t.measured_time(run.task) / case.steps
    t.performance(measured * case.steps, b.bound * case.steps, run.task)
    t.metric("bound_per_step_s", b.bound)
    t.say(f"{case.label()} on {t.platform.name}: {fmt(measured)} per step {t.clock}, bound "
          f"{fmt(b.bound)} ({measured / b.bound:.3f}x), allowed {fmt(b.limit)}")
    if t.learner_faults:  # delays the bound knows nothing of: a figure, not a grade
        t.say("with your fault plan in force the bound does not hold: reported, not graded")
        return
    seen = f"{fmt(measured)} per step, {measured / b.bound:.2f}x the bound {fmt(b.bound)}"
    if measured > b.limit and case.workers > 1 and 0.9 * b.serial <= measured <= 1.5 * b.serial:
        t.fail(f"{case.label()}: {seen}, about the workers' compute times added up ({fmt(b.compute_sum)}) "
               f"rather than the longest ({fmt(b.compute)}): the workers waited for each other's compute; "
               "does a server send its shard to one worker and wait for that worker's push before it serves "
               "the next?")
    t.expect(measured <= b.limit, f"at most {fmt(b.limit)} per step (10% over the bound, plus one latency "
             "per rank)", f"{seen}: does each server send its W shards at once, and each worker push to "
             "every server at once?")
