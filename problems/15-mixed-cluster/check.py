"""Checks for problem 15, a mixed cluster of A100, V100 and Ascend 910 accelerators.

One launch serves every check. Rank 0 first answers a hidden table: split_batch on 24 global
batches over device mixes (the training jobs'; random ones of the lab's devices, small batches and
large, none divisible by the rank count; three of another lab's devices, with speeds of their own)
and place on 16 layer lists and devices. Then each of two hidden training jobs (3-4 and 5-6 of the
lab's devices, at least one A100, V100 and Ascend, in a random rank order, on the lab's own links)
runs twice: one step with the checker's split, which grades sync_gradients alone against the
gradient one process computes on the global batch; then 4 SGD steps with the learner's split,
placement and sync, whose weights must be that one process's, and whose idle time (ranks waiting
for the slowest one's compute) is read from the replay on the virtual clock. Every expected value
is computed here, in the checker.

Each rank's process holds its own samples only (Training.for_rank), and what it returns is
evidence, checked against the agents' records: every rank must move at least the model's gradients
(as float32) while it syncs, and the compute it declares on the virtual clock must be what the
harness declares for its batch on its device.
"""

from typing import Any

from distlab.grading import CheckContext, Checklist, Run, Task, TaskRun

from . import cases, judging, programs
from .cases import Table, Training

IDLE_LIMIT = 0.05  # over 2000 seeds: the card's split idles at most 1.2%, an equal split 18-50%, a FLOP/s one 14.9-38%

CHECKS = Checklist()


@CHECKS.run
def one_launch(t: CheckContext) -> Run:
    table, trainings = cases.hidden(t.seed)
    t.say(f"{len(table.jobs)} splits and {len(table.places)} placements on rank 0; training on "
          + " and ".join(training.job.label() for training in trainings))
    return t.launch(programs.run_cases, [
        Task(ranks=1, cases=[table], label="the table of split_batch and place calls"),
        # The training first: the one-step case hands each rank its batch of the checker's split,
        # which its code must not have seen before it splits the job itself.
        *(Task(ranks=tr.job.p, cases=[tr, cases.gradient_case(tr)], platform=tr.job.platform(),
               label=f"the {tr.label()}") for tr in trainings)])


def case_runs(t: CheckContext, one_launch: Run, kind: type) -> list:
    """The cases of ``kind`` with what each rank returned, once every rank of their tasks is seen to
    have returned one value per case (a rank's process builds that list)."""
    for task_run in one_launch.tasks:
        spec = task_run.spec
        if isinstance(task_run, TaskRun) and spec.cases is not None and any(isinstance(c, kind) for c in spec.cases):
            for rank, value in enumerate(task_run.values):
                if not (isinstance(value, list) and len(value) == len(spec.cases)):
                    t.fail(f"{spec.label}: rank {rank} returned {judging.shown(value)}, not one value for each of "
                           f"its {len(spec.cases)} cases")
    return one_launch.cases(kind)


def runs_of(t: CheckContext, one_launch: Run, one_step: bool) -> list:
    """The one-step gradient cases (the checker's split), or the training runs."""
    return [result for result in case_runs(t, one_launch, Training)
            if (result.case.given_split is not None) == one_step]


def table_of(t: CheckContext, one_launch: Run) -> tuple[Table, Any]:
    """The table and rank 0's answers, well formed."""
    (result,) = case_runs(t, one_launch, Table)
    answers, why = judging.table_answers(result.case, result.values[0])
    if answers is None:
        t.fail(why)
    return result.case, answers


def trained_of(t: CheckContext, result: Any) -> list:
    values, why = judging.trained_values(result.case, result.values)
    if values is None:
        t.fail(why)
    return values


@CHECKS.check("split_batch: whole samples in proportion to samples/s, summing exactly to the global batch", points=3)
def split_follows_speed(t: CheckContext, one_launch: Run) -> None:
    table, answers = table_of(t, one_launch)
    if message := judging.split_message(table.jobs, answers.splits):
        t.fail(message)
    t.say(f"all {len(table.jobs)} splits sum to their global batch, every rank within 1 sample of its share")


@CHECKS.check("place: a layer runs on the host only where the device lacks its op", points=2)
def unsupported_ops_stay_off(t: CheckContext, one_launch: Run) -> None:
    table, answers = table_of(t, one_launch)
    for case, (placement, error) in zip(table.places, answers.places):
        if message := judging.place_message(case, placement, error):
            t.fail(message)
    t.say(f"all {len(table.places)} placements keep each device's missing ops on the host, and only those")


@CHECKS.check("sync_gradients: every rank holds the global batch's gradient (within 1e-6)", points=3)
def gradient_is_the_global_batchs(t: CheckContext, one_launch: Run) -> None:
    for result in runs_of(t, one_launch, one_step=True):
        values, why = judging.gradient_values(result.case, result.values)
        if values is None:
            t.fail(why)
        message, worst = judging.gradient_message(result.case, values)
        if message:
            t.fail(message)
        if message := judging.exchange_message(result.case, result.task, "sync", "its sync_gradients"):
            t.fail(message)
        t.metric(f"worst_error_p{result.case.job.p}", worst)
        t.say(f"batches {list(result.case.given_split or ())}: the global batch's gradient on every rank "
              f"(worst relative error {worst:.1e})")


@CHECKS.check("4 SGD steps on the hidden mixes end with one process's weights", points=2)
def training_matches_one_process(t: CheckContext, one_launch: Run) -> None:
    for result in runs_of(t, one_launch, one_step=False):
        message, losses = judging.training_message(result.case, trained_of(t, result))
        if message:
            t.fail(message)
        if message := judging.exchange_message(result.case, result.task, "step", "training step"):
            t.fail(message)
        t.say(f"{result.case.label()}: loss {judging.fmt(losses)}, as one process on the global batch")


@CHECKS.check(f"idle time at most {IDLE_LIMIT:.0%} of the compute phase (an equal split idles about 40%)", points=3)
def idle_time_is_small(t: CheckContext, one_launch: Run) -> None:
    for result in runs_of(t, one_launch, one_step=False):
        job, values = result.case.job, trained_of(t, result)
        if values[0].split_error:
            t.fail(f"{result.case.label()}: no training step ran: {values[0].split_error} (see the split_batch check)")
        if message := judging.compute_message(result.case, values, result.task):
            t.fail(message)
        if (compute := judging.compute_per_step(result.task, job.p)) is None or compute.max() <= 0:
            t.fail(f"{result.case.label()}: batches {values[0].split}: no rank computed any sample (see the "
                   "split_batch check)")
        idle, equal = judging.idle_of(compute), cases.idle_share(job, cases.equal_split(job))
        t.metric(f"idle_p{job.p}", {"yours": round(idle, 5), "equal split": round(equal, 5)})
        t.say(f"{job.label()}: batches {values[0].split}, {idle:.2%} idle on the virtual clock "
              f"(an equal split: {equal:.1%})")
        t.performance(t.measured_time(result.task), judging.time_bound(result.case, judging.gradient_nbytes(result.case)),
                      result.task)
        if idle > IDLE_LIMIT:
            t.fail(judging.idle_message(result.case, values, compute, idle, IDLE_LIMIT))
