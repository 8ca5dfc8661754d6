"""Checks for problem 16, float16 gradients with dynamic loss scaling across ranks.

One launch trains two hidden cases (4 ranks, then 2 or 3), each with its own loss-scale policy
(initial scale, growth factor and interval, backoff factor) and three faults: inf, -inf or nan
written by the harness into one element of one rank's gradient at hidden steps, after the backward
and before train_step sees it. The checker replays the same training itself (cases.trace: the
float16 sums, the unscaled float32 updates, the policy, the natural overflows of a scale grown
too large) and compares every rank with it step by step: which steps were skipped, the scale after
each step, and the weights. The first divergence is named with its step and its cause. The wire
is read off the ranks' agents: every byte of every call, counted from one harness "step" mark to
the next, and a copy of what each rank's reduce-scatter carried, against its own scaled gradient.
"""

import numpy as np

from distlab.grading import CheckContext, Checklist, Run, Task

from . import cases, judging, programs

CHECKS = Checklist()


@CHECKS.run
def hidden(t: CheckContext) -> list[cases.Case]:
    return cases.hidden_cases(t.seed)


@CHECKS.run
def trainings(t: CheckContext, hidden: list[cases.Case]) -> Run:
    for case in hidden:
        t.say(f"{case.label()}: " + "; ".join(f"step {i.step}: {i.label(case.p)}" for i in case.injections))
    return t.launch(programs.run_training, [Task(ranks=c.p, case=c, label=f"the training, {c.label()}", record_sent=True)
                                            for c in hidden])


@CHECKS.run
def traces(t: CheckContext, hidden: list[cases.Case]) -> list[cases.Trace]:
    return [cases.trace(case) for case in hidden]


@CHECKS.check("every rank skips the same steps: the injected faults and the natural overflows", points=4)
def same_steps_skipped(t: CheckContext, trainings: Run, traces: list[cases.Trace]) -> None:
    for result, trace in zip(trainings.cases(), traces):
        if problem := judging.skip_problem(result.case, trace, result.values):
            t.fail(problem)
        natural = [s for s, n in enumerate(trace.natural) if n]
        t.say(f"p = {result.case.p}: every rank skipped steps {judging.steps_list(trace.overflow)}: the faults at "
              f"{[i.step for i in result.case.injections]}, natural overflows at {natural}")


@CHECKS.check("the scale follows the policy after every step, on every rank", points=3)
def scale_follows_policy(t: CheckContext, trainings: Run, traces: list[cases.Trace]) -> None:
    for result, trace in zip(trainings.cases(), traces):
        if problem := judging.scale_problem(result.case, trace, result.values):
            t.fail(problem)
        t.say(f"p = {result.case.p}: scale " + " ".join(f"{np.log2(s):g}" for s in trace.scale_after)
              + " (log2, after each step), as the policy's trace")


@CHECKS.check(f"the weights: the same on every rank, the trace's within {judging.WEIGHT_TOLERANCE:g} of each "
              "weight's path", points=3)
def weights_follow_trace(t: CheckContext, trainings: Run, traces: list[cases.Trace]) -> None:
    for result, trace in zip(trainings.cases(), traces):
        case = result.case
        if problem := judging.losses_problem(case, result.values):
            t.fail(problem)
        problem, worst = judging.weight_problem(case, trace, result.values)
        if problem:
            t.fail(problem)
        t.metric(f"worst_weight_error_p{case.p}", float(f"{worst:.3g}"))
        losses = np.mean([v.losses for v in result.values], axis=0)  # what the ranks' batches gave
        t.metric(f"loss_p{case.p}", [round(float(losses[:6].mean()), 4), round(float(losses[-6:].mean()), 4)])
        t.say(f"p = {case.p}: identical replicas, within {worst:.2g} of the trace's path; the ranks' batch loss "
              f"{losses[:6].mean():.3f} over the first 6 steps, {losses[-6:].mean():.3f} over the last 6")


@CHECKS.check("gradients travel as float16 in a reduce-scatter: at most 2 bytes a weight per step, plus the flag",
              points=1)
def float16_on_the_wire(t: CheckContext, trainings: Run) -> None:
    # Every step's bytes, from one harness "step" mark to the next, as the ranks' agents counted them:
    # a mark the learner sets ends no step, and no call (Alltoall, Send, the store...) goes uncounted.
    limit = 2 * cases.PARAMS + judging.WIRE_SLACK
    for result in trainings.cases():
        most: list[int] = []  # each rank's largest step, in bytes reduced
        for rank in range(result.case.p):
            steps = judging.step_counts(result.task, rank)
            if isinstance(steps, str):
                t.fail(steps)
            moved = judging.wire_bytes(steps)
            most.append(max(moved, default=0))
            if not moved or not 0 < max(moved) <= limit:
                own = judging.own_marks(result.task, rank)
                t.fail(f"{result.case.label()}: rank {rank} reduced {max(moved, default=0)} bytes in a step; expected "
                       f"at most {limit} (2 bytes for each of the {cases.PARAMS} gradients, float16, and the flag)"
                       + ("" if moved and max(moved) else ": no reduction at all")
                       + (f" (counted from one harness \"step\" mark to the next: your own marks {own} do not end "
                          "a step)" if own else ""))
            # Float16 and few bytes, but which collective, and what else travels: the card's design.
            if problem := judging.wire_problem(result.case, rank, steps):
                t.fail(problem)
            if problem := judging.sent_bytes(result.case, rank, steps):
                t.fail(problem)
            # And what the reduce-scatter carried: the rank's own scaled float16 gradient, every step.
            if problem := judging.scatter_problem(result.case, rank, result.task, result.values[rank]):
                t.fail(problem)
        t.say(f"p = {result.case.p}: at most {most[0]} bytes reduced a step on rank 0; each rank's reduce-scatter "
              "carried its own scaled float16 gradient, every step")
