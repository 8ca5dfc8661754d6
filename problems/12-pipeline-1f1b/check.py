"""Checks for problem 12, pipeline parallelism with GPipe and 1F1B.

One launch of four ranks, one stage each, runs three tasks: GPipe on three hidden pipelines, 1F1B
on three more (for each, two with equal stages and m >= p micro-batches, one with unequal stage
times), and both schedules with m < p. Every pipeline trains two SGD steps of a real torch MLP.
The checks then read, in the supervisor:

- the gradients every stage hands back, against one process training the whole batch here (no
  stage holds the others' weights or data: cases.Pipe.for_rank), with the messages that carried
  the other stages' part: m each way between neighbours, one micro-batch's activation or gradient each;
- the bubble (idle over total) from the replay on the virtual clock, against (p-1)/(m+p-1) for
  equal stages, or, for unequal stages where no formula holds, the critical path of the schedule's
  canonical order replayed here with the same stage times;
- the stashed activations, counted from the forwards and backwards the harness's Stage declared,
  in each stage's program order, on every step: m on every stage for GPipe, at most p for 1F1B.

The spans the bubble and the stash are read from are declared from the learner's process, so each
check that reads them first compares them with what the harness's Stage declares for the case
(judging.declared_message): its labels, its stage times, one forward and one backward per
micro-batch (none declared is a stash of none: no pass), each after the message it needs. Junk of
the right sizes in that order would still pass them, so they also hold what every message carried
(the task keeps a copy of each, taken by the rank's agent) against the pipeline computed here on
the whole case (judging.carried_message): each activation sent on is the stage's output of a
micro-batch, each gradient sent back the stage's backward of one.
"""

from typing import Any, NamedTuple

from distlab.grading import CheckContext, Checklist, Run, Task

from . import cases, judging, programs
from .cases import MICRO, STEPS, WIDTH

BUBBLE_TOLERANCE = 0.10  # relative; one micro-batch at a time stands at least 25% off (tests/test_problem12.py)

CHECKS = Checklist()


@CHECKS.run
def plan(t: CheckContext) -> cases.Session:
    return cases.hidden(t.seed)


@CHECKS.run
def pipelines(t: CheckContext, plan: cases.Session) -> Run:
    for pipe in plan.gpipe + plan.one_f_one_b + plan.small:
        t.say(pipe.label())
    # A step's window runs from one of the program's marks to the next: marks the learner's code sets
    # of other names cut nothing (Task.marks), and a rank that set one of the program's names itself
    # fails the checks that read the steps (judging.marks_message).
    return t.launch(programs.run_cases, [
        Task(cases.STAGES, cases=list(plan.gpipe), label="GPipe with m >= p", record_sent=True,
             marks=judging.task_marks(len(plan.gpipe))),
        Task(cases.STAGES, cases=list(plan.one_f_one_b), label="1F1B with m >= p", record_sent=True,
             marks=judging.task_marks(len(plan.one_f_one_b))),
        Task(cases.STAGES, cases=list(plan.small), label="GPipe and 1F1B with m < p", record_sent=True,
             marks=judging.task_marks(len(plan.small)))])


GPIPE_TASK, ONE_F_ONE_B_TASK, SMALL_TASK = range(3)  # the tasks of the launch, in order


class Ran(NamedTuple):
    case: cases.Pipe
    values: list  # rank -> what train() returned
    task: Any  # the TaskRun
    number: int  # the case's position in its task: its marks say "case <number> step <k>"


def of(pipelines: Run, *tasks: int) -> list[Ran]:
    """The pipelines of the given tasks. Only these are read: a task that failed (a deadlock, an
    exception) fails the checks that read it, with its story, and no other."""
    return [Ran(case, [nth(value, n) for value in task.values], task, n)
            for task in (pipelines.tasks[k] for k in tasks) for n, case in enumerate(task.spec.cases)]


def nth(value: Any, n: int) -> Any:
    """What a rank's run_cases returned for its ``n``-th case, None if it returned no such thing."""
    return value[n] if isinstance(value, list) and n < len(value) else None


def step_of(t: CheckContext, result: Ran, k: int) -> judging.Step:
    """Training step ``k`` of the pipeline on the virtual clock; a failed check if its marks are not
    in the trace, or not the program's alone (they are the harness's, but set from the learner's
    process, which may call comm.mark itself)."""
    if message := judging.marks_message(result.task):
        t.fail(message)
    try:
        return judging.Step(result.task, result.number, k, result.case.p)
    except ValueError as error:
        t.fail(f"{result.case.label()}, step {k}: {error}")


def gradients(t: CheckContext, runs: list) -> None:
    for result in runs:
        pipe = result.case
        expected, losses = judging.one_process(pipe)
        message = judging.gradient_message(pipe, result.values, expected, lambda k: step_of(t, result, k))
        if message:
            t.fail(message)
        for k in range(STEPS):  # right gradients need the other stages' part: the messages that carried it
            if message := judging.traffic_message(pipe, step_of(t, result, k)):
                t.fail(f"{message} (step {k})")
        got = judging.batch_losses(pipe, result.values)
        said = "?" if got is None else " -> ".join(f"{x:.4f}" for x in got)
        t.say(f"{pipe.label()}: every stage's gradients are one process's on both steps; the batch's loss "
              f"{said} (one process: {' -> '.join(f'{x:.4f}' for x in losses)})")
    for task in {id(result.task): result.task for result in runs}.values():
        if message := judging.task_traffic_message(task, list(task.spec.cases)):
            t.fail(message)


@CHECKS.check("GPipe: every stage's gradients are one process's on the whole batch", points=3)
def gpipe_gradients(t: CheckContext, pipelines: Run) -> None:
    gradients(t, of(pipelines, GPIPE_TASK))


@CHECKS.check("1F1B: every stage's gradients are one process's on the whole batch", points=3)
def one_f_one_b_gradients(t: CheckContext, pipelines: Run) -> None:
    gradients(t, of(pipelines, ONE_F_ONE_B_TASK))


def message_s(t: CheckContext) -> float:
    """One activation's or gradient's trip between neighbouring stages on the platform in force."""
    route = t.platform.route(0, 1)
    return route.alpha_s + MICRO * WIDTH * 8 * route.beta_s_per_byte


@CHECKS.check(f"bubble within {BUBBLE_TOLERANCE:.0%} of (p-1)/(m+p-1), or of the critical path for unequal stages",
              points=3)
def bubble_is_the_schedules(t: CheckContext, pipelines: Run) -> None:
    figures = {}
    for result in of(pipelines, GPIPE_TASK, ONE_F_ONE_B_TASK):
        pipe = result.case
        bound = cases.expected_bubble(pipe, message_s(t))
        for k in range(STEPS):
            step = step_of(t, result, k)
            if message := (judging.declared_message(pipe, step, times=not t.learner_faults)
                           or judging.carried_message(pipe, result.task, step, k, result.values)):
                t.fail(message)
            if t.learner_faults:
                t.say(f"{pipe.label()}: bubble {step.bubble} under your fault plan (not graded)")
                continue
            if message := judging.bubble_message(pipe, step, bound, BUBBLE_TOLERANCE):
                t.fail(message)
        figures[f"{pipe.schedule} m={pipe.m}{'' if pipe.equal else ' unequal'}"] = [round(step.bubble or 0, 4),
                                                                                    round(bound, 4)]
        formula = f"(p-1)/(m+p-1) = {cases.formula_bubble(pipe.p, pipe.m):.3f}"
        t.say(f"{pipe.label()}: bubble {step.bubble or 0:.3f}, "
              + (formula if pipe.equal else f"the critical path's {bound:.3f} (the formula would say {formula})"))
    t.metric("bubble_measured_expected", figures)
    last = of(pipelines, ONE_F_ONE_B_TASK)[1]  # the headline: 1F1B's longest equal pipeline
    steps = [step_of(t, last, k) for k in range(STEPS)]
    t.performance(sum(s.end - s.start for s in steps), cases.replay(last.case, message_s(t))[0] * STEPS, last.task)


@CHECKS.check("stashed activations: m on every stage for GPipe, at most p for 1F1B; messages point to point",
              points=2)
def stash_is_bounded(t: CheckContext, pipelines: Run) -> None:
    for result in of(pipelines, GPIPE_TASK, ONE_F_ONE_B_TASK):
        pipe = result.case
        for k in range(STEPS):  # every step: step 0 alone was read, and a schedule hid its spans there
            step = step_of(t, result, k)
            if message := (judging.declared_message(pipe, step, times=not t.learner_faults)
                           or judging.stash_message(pipe, step) or judging.traffic_message(pipe, step)
                           or judging.carried_message(pipe, result.task, step, k, result.values)):
                t.fail(message)
        t.metric(f"stash {pipe.schedule} m={pipe.m}", step.peaks)
        t.say(f"{pipe.label()}: peak stash per stage {step.peaks}")
    t.say("every stage sent one message per micro-batch to each neighbour; 1F1B holds min(p - stage, m) "
          "activations, GPipe all m: the same bubble, far less memory")


@CHECKS.check("works for m < p: both schedules, right gradients, bubble and stash", points=2)
def fewer_micro_batches_than_stages(t: CheckContext, pipelines: Run) -> None:
    runs = of(pipelines, SMALL_TASK)
    gradients(t, runs)
    for result in runs:
        pipe = result.case
        for k in range(STEPS):
            step = step_of(t, result, k)
            problem = (judging.declared_message(pipe, step, times=not t.learner_faults)
                       or judging.stash_message(pipe, step) or judging.traffic_message(pipe, step)
                       or judging.carried_message(pipe, result.task, step, k, result.values)) or (
                None if t.learner_faults else
                judging.bubble_message(pipe, step, cases.expected_bubble(pipe, message_s(t)), BUBBLE_TOLERANCE))
            if problem:
                t.fail(problem)
        t.say(f"{pipe.label()}: bubble {step.bubble or 0:.3f} ((p-1)/(m+p-1) = "
              f"{cases.formula_bubble(pipe.p, pipe.m):.3f}), peak stash per stage {step.peaks}")
