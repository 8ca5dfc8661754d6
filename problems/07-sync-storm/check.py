"""Checks for problem 07, the gradient sync storm: tensor fusion.

A click-through-rate model hands the learner's ``Fusion`` hundreds of small gradient tensors in three dtypes for
two training steps on 1 to 5 ranks (cases.plan_for). The sums must equal one Allreduce per tensor and training
must follow single-process training; the same run is then read for the collectives of each "step" phase and
the size of every buffer. Last, at 50 us of latency per hop, the fused step must be at least 10x faster than
one Allreduce per tensor.

Memory is read by each rank's agent, from /proc, in every training case: sampled every few milliseconds from
the step's mark "fuse" (its tensors made) to "added" (every one added). A fusion may hold one buffer per dtype
of threshold + its largest tensor; one that copies every tensor as it is added holds the whole step, which
shows in the memory case (cases.memory_case): a training case drawn like the others, of 12-16 MiB a step. An
earlier probe read tracemalloc in the learner's process, which the learner's code could stop or rewrite; a
later one ran on a task of its own (2-3 MiB thresholds, constant tensors), which a fusion told apart by its
threshold and was honest on alone."""

import math

import numpy as np

from distlab.grading import CheckContext, Checklist, Run, Task, uniform

from . import cases, judging
from .cases import STEPS, Case, Plan, Timed
from .judging import collectives, human
from .programs import run_task

ALPHA_S = 50e-6  # per-hop latency of the cluster the speed-up is graded on
SPEEDUP = 10.0  # the fused step must be at least this much faster than one Allreduce per tensor

CHECKS = Checklist()


@CHECKS.run
def plan(t: CheckContext) -> Plan:
    return cases.plan_for(t.seed)


@CHECKS.run
def storm(t: CheckContext, plan: Plan) -> Run:
    """One launch on the 50-us cluster: the training cases, the memory case, then for each timed case the
    learner's fused step and one Allreduce per tensor."""
    # A step's counters are those of its phase, from the harness's mark "step" to the next: marks the learner's
    # code sets of other names cut nothing (Task.marks; judging.unreduced counts the "step" marks). Every
    # training case reads memory alike: none is told apart as the one measured but by its size.
    tasks = [Task(ranks=c.p, case=c, label=f"training with {c.label()}", marks=judging.MARKS, memory=True,
                  memory_sampled=("fuse",)) for c in plan.cases + (plan.memory,)]
    for c in plan.perf:
        tasks += [Task(ranks=c.p, case=Timed(c, True), label=f"the timed fused step, p = {c.p}"),
                  Task(ranks=c.p, case=Timed(c, False), label=f"the timed per-tensor baseline, p = {c.p}")]
    return t.launch(run_task, tasks, platform=uniform(plan.world, ALPHA_S, plan.beta))


@CHECKS.run
def wrong_sum(t: CheckContext, storm: Run) -> str | None:
    """The first wrong sum of any case, or None: until it is None, only the first check grades."""
    return judging.first_wrong(storm.cases(Case))


def require_right_sums(t: CheckContext, wrong_sum: str | None) -> None:
    if wrong_sum:
        t.fail("not graded until the sums are right: see the first check")


@CHECKS.check("results equal one Allreduce per tensor", points=4)
def results_match(t: CheckContext, plan: Plan, wrong_sum: str | None) -> None:
    t.say("; ".join(c.label() for c in plan.cases))
    if wrong_sum:
        t.fail(wrong_sum)
    tensors = sum(c.tensors * c.p for c in plan.cases)
    t.metric("tensors_checked", tensors)
    t.say(f"every tensor of step 0 equals its per-tensor sum on every rank ({tensors} in all)")


@CHECKS.check("training with fusion equals single-process training", points=2)
def training_matches(t: CheckContext, storm: Run, wrong_sum: str | None) -> None:
    require_right_sums(t, wrong_sum)
    for result in storm.cases(Case):
        case, want = result.case, judging.single_process_training(result.case)
        digests = {value.final_digest for value in result.values}
        t.expect(len(digests) == 1, "identical parameters on every rank",
                 f"{case.label()}: the ranks end {STEPS} steps with {len(digests)} different sets of parameters: "
                 "did a later step reduce different tensors on different ranks?")
        for i, (g, w) in enumerate(zip(result.values[0].final, want)):
            if not np.allclose(g, w, rtol=1e-4, atol=1e-6):
                t.fail(f"{case.label()}: after {STEPS} steps parameter #{i} differs from single-process training "
                       f"on the global batch (max difference {float(np.abs(g - w).max()):.2e}): steps after the "
                       "first were not reduced right; does flush() leave the fusion empty for the next step?")
    t.say(f"{STEPS} steps of training land on the single-process parameters in every case")


@CHECKS.check("collectives per step at most ceil(bytes / threshold) + dtypes", points=2)
def collectives_per_step(t: CheckContext, storm: Run, wrong_sum: str | None) -> None:
    require_right_sums(t, wrong_sum)
    worst = 0.0
    for result in storm.cases(Case):
        case, budget, by_dtype = result.case, result.case.collective_budget(), result.case.nbytes_by_dtype()
        total = sum(by_dtype.values())
        for rank in range(case.p):
            for s, step in enumerate(result.task.phases(rank, "step")):
                count, calls = collectives(step)
                why = (judging.own_marks_note(result.task, rank) or
                       (": one collective per tensor; pack tensors into a buffer and reduce it once"
                        if count >= case.tensors else
                        ": is each buffer sent as soon as it holds threshold bytes (not sooner)?"))
                t.expect(count <= budget, f"at most {budget} collectives per step (ceil({total} / {case.threshold}) "
                         f"= {budget - len(by_dtype)} + {len(by_dtype)} dtypes)",
                         f"{case.label()}, step {s}: rank {rank} made {count} ({calls}){why}")
                t.expect(step.messages_sent == 0 or case.p == 1, "collectives only",
                         f"{case.label()}, step {s}: rank {rank} sent {step.messages_sent} point-to-point messages "
                         "besides its collectives")
                sent, total_bytes = judging.carried(step), sum(by_dtype.values())
                t.expect(sent >= total_bytes, f"at least the step's {total_bytes} bytes through collectives",
                         f"{case.label()}, step {s}: rank {rank}'s collectives carried {sent} bytes ({calls or 'none'}): "
                         "every tensor must be reduced across the ranks")
                worst = max(worst, count / budget)
        t.say(f"p = {case.p}: {collectives(result.task.counts(0, 'step'))[0]} collectives per step "
              f"for {case.tensors} tensors ({human(total)}), budget {budget}")
    t.metric("worst_collectives_over_budget", round(worst, 3))


@CHECKS.check("step at least 10x faster than one Allreduce per tensor at 50 us latency", points=3)
def fused_step_is_faster(t: CheckContext, plan: Plan, storm: Run, wrong_sum: str | None) -> None:
    require_right_sums(t, wrong_sum)
    worst = math.inf
    timed = storm.cases(Timed)
    for fused_run, base_run in zip(timed[::2], timed[1::2]):
        case = fused_run.case.case
        for rank, sample in enumerate(fused_run.values):
            wrong = judging.timed_wrong(case, rank, sample)
            t.expect(wrong is None, "a correct result before its time is graded", wrong or "")
        if evidence := judging.timed_evidence(case, fused_run.task, base_run.task):
            t.fail(evidence)
        fused, base = t.measured_time(fused_run.task), t.measured_time(base_run.task)
        if not fused > 0:
            t.fail(f"{case.label()}: the timed fused step took {fused} s on the virtual clock: no time is no "
                   "speed-up to grade")
        ratio = base / fused
        t.say(f"p = {case.p}, {case.tensors} tensors, alpha 50 us, {1 / plan.beta / 1e9:.1f} GB/s: "
              f"per-tensor {base * 1e3:.2f} ms, fused {fused * 1e3:.3f} ms ({ratio:.1f}x) {t.clock}")
        if ratio < worst:
            worst = ratio
            t.performance(fused, base / SPEEDUP, fused_run.task)
        hint = (": about as slow as one Allreduce per tensor; are the tensors fused at all?" if ratio < 2
                else ": fewer, larger buffers pay the latency fewer times")
        t.expect(ratio >= SPEEDUP, f"the fused step at most {base / SPEEDUP * 1e3:.3f} ms (10x faster than the "
                 f"per-tensor {base * 1e3:.2f} ms)", f"{fused * 1e3:.3f} ms for {case.label()}, {ratio:.1f}x{hint}")
    if not t.on_card_setting:  # --platform or --faults: the cluster is this check's own, said so
        faults = "; your message faults do not touch the built-in Allreduce" if t.learner_faults else ""
        t.say(f"timed on this check's own 50 us cluster, whatever the platform ({t.platform.name}){faults}")
    t.metric("worst_speedup", round(worst, 2))


@CHECKS.check("buffer memory bounded: threshold + one tensor", points=2)
def memory_bounded(t: CheckContext, storm: Run, wrong_sum: str | None) -> None:
    require_right_sums(t, wrong_sum)
    # The buffers' sizes, as the agents traced them, and what each rank's learner process held while add()
    # ran, as its agent read it from /proc: the learner's code reports neither.
    results = storm.cases(Case)
    seen = {id(result): judging.buffers_seen(result) for result in results}
    held = judging.memory_problem(results)
    if too_big := (judging.unnoted_buffer(results)
                   or judging.too_big_buffer(results, lambda result: seen[id(result)])):
        # The excess held is named beside a buffer too large only where its own buffers were right.
        t.fail(f"{too_big}; and the memory probe: {held}" if held and judging.COPIED_EARLY in held else too_big)
    if held:
        t.fail(held)
    for result in results:
        case, task = result.case, result.task
        most = max(task.memory(r).peak_to("added", s) - task.memory(r).at("fuse", s)
                   for r in range(case.p) for s in range(case.steps))
        t.say(f"p = {case.p}: largest buffer {max((n for _, n in seen[id(result)][0][0]), default=0)} B "
              f"(threshold {case.threshold} B), at most {judging.mib(most)} held while add() ran (read from /proc "
              f"by each rank's agent), budget {judging.mib(judging.budget(case))}")
    t.metric("memory_case_held_over_budget", round(most / judging.budget(case), 3))
