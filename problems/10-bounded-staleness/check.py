"""Checks for problem 10, a parameter server with bounded staleness (stale-synchronous parallel).

One launch runs four tasks, one server and three workers each, every worker's step declared on
the virtual clock, stragglers 2-5x slow (hidden: who, when, how much, the data, the rate):
s = 0 and s = 3 under the card's stragglers (each worker slow once every three steps, at a random
step), a hidden s in 1-2 with one worker slow for a long stretch (the others run into the bound),
and workers that finish at different times (the first to finish holds every other one's read until
its last push; then one of the two left is slow, so the bound still binds, and every read it frees
must be answered when freed).

Why the staleness is measured from the trace: the staleness a read saw is a fact about the order
of the server's messages, which its proxy records as they happen (the agent's, outside the
learner's process when sealed): every receive of a worker's push and every model sent back, in
program order. The checker counts, at each model sent to worker j (the m-th: its read at clock
m), the gradients each worker had in by then; the staleness is m minus the fewest. Nothing the
learner's code reports enters it. Neither do the messages: every rank's agent keeps a copy of
each buffer it sends (record_sent), and every check first holds the workers to the harness's
protocol (judging.messages: the calls, their sizes, each push the gradient of the worker's own
batch at the model it received) before it reads the models the server sent from those copies.
The workers' programs run in the learner's process, so where they declare their compute (before
each push) is checked as well as how long. Each rank is handed only its part of the case
(Case.for_rank: no seed, no other worker's data). The server's final model is testimony, held to
the gradients it received; the times are the replay's.
"""

from distlab.grading import CheckContext, Checklist, Run, Task, first_mismatch

from . import cases, judging, programs
from .judging import fmt_s

SPEEDUP = 1.5  # s = 3 under the card's stragglers: at least 1.5x the synchronous throughput
LOSS_TOLERANCE = 0.05  # its held-out loss within 5% of synchronous training's

CHECKS = Checklist()


@CHECKS.run
def plan(t: CheckContext) -> cases.Session:
    return cases.session(t.seed)


@CHECKS.run
def every_case(t: CheckContext, plan: cases.Session) -> Run:
    return t.launch(programs.run_case, [Task(c.workers + 1, case=c, label=c.label(), record_sent=True)
                                        for c in plan.all()], online_clock=True)


@CHECKS.check("s = 0 reproduces synchronous training exactly", points=3)
def zero_is_synchronous(t: CheckContext, every_case: Run) -> None:
    run = every_case.cases(cases.Training)[0]
    case, models = run.case, cases.synchronous(run.case)
    t.say(f"{case.label()}; lr {case.lr}")
    sent = judging.messages(run)  # the models the server sent, as its agent copied them
    for problem in (sent.problem, judging.answer_problem(run)):
        if problem:
            t.fail(problem)
    for c in range(len(models) - 1):  # the earliest wrong read: every gradient before it is synchronous
        for j in range(case.workers):
            got = sent.models[j][c]
            if (wrong := first_mismatch(got, models[c], rtol=cases.RTOL, atol=1e-12)) is not None:
                t.fail(judging.sync_read_problem(case, j + 1, c, got, models, wrong.describe()))
    if (wrong := first_mismatch(run.values[0], models[-1], rtol=cases.RTOL, atol=1e-12)) is not None:
        t.fail(f"{case.label()}: the server's final model is not synchronous training's after {len(models) - 1} "
               f"steps: {wrong.describe()}")
    t.say(f"every read and the final model equal gradient descent in one process (rtol {cases.RTOL:g}); held-out loss "
          f"{cases.loss(case, models[0]):.4f} -> {cases.loss(case, models[-1]):.4f}")


@CHECKS.check("observed staleness never exceeds s (read from the server's trace)", points=4)
def staleness_bounded(t: CheckContext, every_case: Run) -> None:
    runs = every_case.cases(cases.Training)  # s = 0, s = 3, the long straggler: in this order
    for run in runs:
        if problem := judging.messages(run).problem or judging.declared_problem(run):
            t.fail(problem)
    reads = [judging.reads_of(run) for run in runs]
    for run, got in zip(runs, reads):
        if problem := judging.reads_count_problem(run.case, got, judging.worker_ranks(run.case)):
            t.fail(problem)
    excess = [judging.worst(got).staleness - run.case.staleness for run, got in zip(runs, reads)]
    for run, got in zip(runs, reads):
        if problem := judging.over_bound(run.case, got, judging.worker_ranks(run.case)):
            t.fail(problem + judging.staleness_cause(excess))
        t.say(f"{run.case.label()}: {len(got)} reads, staleness at most {judging.worst(got).staleness:g}"
              + " (the bound reached)" * (judging.worst(got).staleness == run.case.staleness > 0))
    t.metric("max_staleness", {run.case.what: float(judging.worst(got).staleness) for run, got in zip(runs, reads)})


@CHECKS.check(f"throughput with s = 3 under stragglers at least {SPEEDUP}x the synchronous", points=3)
def stale_is_faster(t: CheckContext, plan: cases.Session, every_case: Run) -> None:
    run = every_case.cases(cases.Training)[1]
    case = run.case
    if problem := judging.messages(run).problem or judging.declared_problem(run):
        t.fail(problem)
    samples = sum(case.steps) * cases.BATCH
    measured, sync = t.measured_time(run.task), cases.simulate(plan.synchronous).makespan
    ideal = cases.simulate(case).makespan
    t.performance(measured, ideal, run.task)
    speedup = sync / measured
    t.metric("samples_per_s", round(samples / measured, 1))
    t.metric("sync_samples_per_s", round(samples / sync, 1))
    t.metric("speedup", round(speedup, 3))
    t.say(f"{case.label()}: {fmt_s(measured)} {t.clock} for {samples} samples ({samples / measured:,.0f}/s); "
          f"synchronous training waits for every straggler: {fmt_s(sync)} ({samples / sync:,.0f}/s); "
          f"the card's server reaches {fmt_s(ideal)}")
    if not t.on_card_setting or t.clock == "wall":
        t.say("on another platform, under a fault plan of yours or on the wall clock, the synchronous time "
              "simulated here does not hold: reported, not graded")
        return
    if speedup < SPEEDUP:
        worst = judging.worst(judging.reads_of(run))
        t.fail(f"{case.label()}: {speedup:.2f}x the synchronous throughput, expected at least {SPEEDUP}x"
               + judging.slow_reason(case, worst))
    t.say(f"{speedup:.2f}x the synchronous throughput")


@CHECKS.check(f"the final loss with s = 3 within {LOSS_TOLERANCE:.0%} of synchronous training's", points=2)
def loss_close(t: CheckContext, every_case: Run) -> None:
    run = every_case.cases(cases.Training)[1]
    case, sent = run.case, judging.messages(run)
    for problem in (sent.problem, judging.answer_problem(run)):
        if problem:
            t.fail(problem)
    workers = judging.worker_ranks(case)
    if problem := judging.applied_problem(case, judging.reads_of(run), sent.models, run.values[0], workers):
        t.fail(problem)
    t.say("every model sent, and the final one, is the initial model minus lr x the gradients in by then")
    start, sync = cases.loss(case, cases.initial_weights(case)), cases.loss(case, cases.synchronous(case)[-1])
    got = cases.loss(case, run.values[0])
    t.metric("loss", {"start": round(start, 4), "synchronous": round(sync, 4), "stale": round(got, 4)})
    t.expect(abs(got - sync) <= LOSS_TOLERANCE * sync,
             f"a held-out loss within {LOSS_TOLERANCE:.0%} of synchronous training's {sync:.4f} (from {start:.4f})",
             f"{got:.4f} after the same {sum(case.steps) * cases.BATCH} samples ({case.label()})"
             + judging.loss_reason(got, start))
    t.say(f"held-out loss {start:.4f} -> {got:.4f} with s = 3, {sync:.4f} synchronous, at equal samples")


@CHECKS.check("no deadlock, and the bound kept, when workers finish at different times", points=2)
def finishers_released(t: CheckContext, every_case: Run) -> None:
    (run,) = every_case.cases(cases.Finishing)
    case, workers = run.case, judging.worker_ranks(run.case)
    t.say(case.label())
    for problem in (judging.messages(run).problem, judging.answer_problem(run), judging.declared_problem(run)):
        if problem:
            t.fail(problem)
    reads = judging.reads_of(run)
    for problem in (judging.caught_stuck(run.task), judging.reads_count_problem(case, reads, workers),
                    judging.over_bound(case, reads, workers),
                    judging.late_read(judging.server_events(run.task), case, workers, last_only=True),
                    judging.late_after_finish(judging.server_events(run.task), case, workers)):
        if problem:
            t.fail(problem)
    t.say(f"every worker read the model as often as it has steps ({', '.join(map(str, case.steps))}), staleness at "
          f"most {judging.worst(reads).staleness:g}, every read freed after a worker finished answered at once; the server "
          f"returned after the last push, at {fmt_s(run.task.timeline().makespan)} on the virtual clock")
