"""Checks for problem 07, the gradient sync storm: tensor fusion.

The story: a click-through-rate model hands the learner's ``Fusion`` several hundred small gradient
tensors per step, in three dtypes, for two training steps on 1 to 5 ranks. Here, outside the ranks, the
same gradients are summed tensor by tensor, as one Allreduce per tensor would; the learner's sums must
equal them, and training must follow single-process training on the global batch. The same run is then
read for how it got there: the collectives per step (at most ceil(bytes / threshold) + dtypes), the size
of every buffer (at most threshold + one tensor) and the memory the fusion allocated. Last, on a cluster
with 50 us of latency per hop, the fused step must be at least 10x faster than one Allreduce per tensor.

Hidden variants (from the seed): the number of fields (70-110, so 140-340 tensors), table sizes, embedding
width, the dtypes a step carries, one table larger than the threshold, the threshold, the rank counts
(1, 2, 4 and one of 3, 5) and the bandwidth of the 50-us cluster.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from distlab.grading import CheckContext, Checklist, Run, Task, uniform

from . import cases, judging
from .cases import STEPS, Case, Plan, Timed
from .judging import human
from .programs import run_task

ALPHA_S = 50e-6  # per-hop latency of the cluster the speed-up is graded on
SPEEDUP = 10.0  # the fused step must be at least this much faster than one Allreduce per tensor

CHECKS = Checklist()


@CHECKS.run
def plan(t: CheckContext) -> Plan:
    return cases.plan_for(t.seed)


@CHECKS.run
def storm(t: CheckContext, plan: Plan) -> Run:
    """One launch on the 50-us cluster: the training cases, then for each timed case the learner's fused
    step and one Allreduce per tensor."""
    # tracemalloc in a rank whose gloo threads free tensors crashes the process (torch 2.x):
    # the allocation probe runs on MPI only; the size of every buffer is read on both engines.
    probe = t.backend == "mpi"
    tasks = [Task(ranks=c.p, case=dataclasses.replace(c, probe=probe), label=f"training with {c.label()}")
             for c in plan.cases]
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
                 f"{case.label()}: the ranks end {STEPS} steps with {len(digests)} different sets of "
                 "parameters: did a later step reduce different tensors on different ranks?")
        for i, (g, w) in enumerate(zip(result.values[0].final, want)):
            if not np.allclose(g, w, rtol=1e-4, atol=1e-6):
                t.fail(f"{case.label()}: after {STEPS} steps parameter #{i} differs from single-process "
                       f"training on the global batch (max difference {float(np.abs(g - w).max()):.2e}): "
                       "steps after the first were not reduced right; does flush() leave the fusion "
                       "empty for the next step?")
    t.say(f"{STEPS} steps of training land on the single-process parameters in every case")


@CHECKS.check("collectives per step at most ceil(bytes / threshold) + dtypes", points=2)
def collectives_per_step(t: CheckContext, storm: Run, wrong_sum: str | None) -> None:
    require_right_sums(t, wrong_sum)
    worst = 0.0
    for result in storm.cases(Case):
        case = result.case
        budget, by_dtype = case.collective_budget(), case.nbytes_by_dtype()
        total = sum(by_dtype.values())
        for rank, value in enumerate(result.values):
            for s, step in enumerate(value.steps):
                count = sum(step.collectives.values())
                calls = ", ".join(f"{k} x{v}" for k, v in sorted(step.collectives.items()))
                why = (": one collective per tensor; pack tensors into a buffer and reduce it once"
                       if count >= case.tensors else
                       ": is each buffer sent as soon as it holds threshold bytes (not sooner)?")
                t.expect(count <= budget,
                         f"at most {budget} collectives per step (ceil({total} / {case.threshold}) "
                         f"= {budget - len(by_dtype)} + {len(by_dtype)} dtypes)",
                         f"{case.label()}, step {s}: rank {rank} made {count} ({calls}){why}")
                t.expect(step.p2p_messages == 0 or case.p == 1, "collectives only",
                         f"{case.label()}, step {s}: rank {rank} sent {step.p2p_messages} point-to-point "
                         "messages besides its collectives")
                worst = max(worst, count / budget)
        t.say(f"p = {case.p}: {sum(result.values[0].steps[0].collectives.values())} collectives per step "
              f"for {case.tensors} tensors ({human(total)}), budget {budget}")
    t.metric("worst_collectives_over_budget", round(worst, 3))


@CHECKS.check("step at least 10x faster than one Allreduce per tensor at 50 us latency", points=3)
def fused_step_is_faster(t: CheckContext, plan: Plan, storm: Run, wrong_sum: str | None) -> None:
    require_right_sums(t, wrong_sum)
    worst = math.inf
    timed = storm.cases(Timed)
    for fused_run, base_run in zip(timed[::2], timed[1::2]):
        case = fused_run.case.case
        want = judging.first_step(case)[1]
        for rank, sample in enumerate(fused_run.values):
            for i, (g, w) in enumerate(zip(sample, want)):
                t.expect(judging.right(g, w[: len(g)]), "a correct result before its time is graded",
                         f"{case.label()}: rank {rank}'s tensor #{i} is wrong in the timed step")
        fused, base = t.measured_time(fused_run.task), t.measured_time(base_run.task)
        ratio = base / fused if fused > 0 else math.inf
        t.say(f"p = {case.p}, {case.tensors} tensors, alpha 50 us, {1 / plan.beta / 1e9:.1f} GB/s: "
              f"per-tensor {base * 1e3:.2f} ms, fused {fused * 1e3:.3f} ms ({ratio:.1f}x) {t.clock}")
        if ratio < worst:
            worst = ratio
            t.performance(fused, base / SPEEDUP, fused_run.task)
        hint = (": about as slow as one Allreduce per tensor; are the tensors fused at all?"
                if ratio < 2 else ": fewer, larger buffers pay the latency fewer times")
        t.expect(ratio >= SPEEDUP,
                 f"the fused step at most {base / SPEEDUP * 1e3:.3f} ms (10x faster than the per-tensor "
                 f"{base * 1e3:.2f} ms)", f"{fused * 1e3:.3f} ms for {case.label()}, {ratio:.1f}x{hint}")
    t.metric("worst_speedup", round(worst, 2))


@CHECKS.check("buffer memory bounded: threshold + one tensor", points=2)
def memory_bounded(t: CheckContext, storm: Run, wrong_sum: str | None) -> None:
    require_right_sums(t, wrong_sum)
    worst = 0.0
    for result in storm.cases(Case):
        case, by_dtype = result.case, result.case.nbytes_by_dtype()
        for rank, value in enumerate(result.values):
            for s, step in enumerate(value.steps):
                budget = case.memory_budget(sum(step.collectives.values()))
                for dtype, nbytes in step.allreduces:
                    limit = case.threshold + case.largest(dtype) if dtype in by_dtype else 0
                    if nbytes > limit:
                        t.fail(f"{case.label()}, step {s}: rank {rank} reduced a {dtype} buffer of {nbytes} "
                               "bytes in one Allreduce; a buffer may hold at most threshold + its largest "
                               f"tensor = {limit} bytes: {judging.why_too_big(case, dtype, nbytes, limit)}")
                if step.peak_bytes < 0:
                    continue  # not measured on this engine
                t.expect(step.peak_bytes <= budget,
                         f"at most {budget} bytes allocated while add() ... flush() ran (one buffer per "
                         f"dtype of threshold + one tensor, one receive copy, {cases.MEMORY_SLACK // 1024} "
                         f"KiB + {cases.SLACK_PER_CALL} B per collective of bookkeeping)",
                         f"{case.label()}, step {s}: rank {rank} allocated up to {step.peak_bytes} bytes at "
                         f"once (the step's tensors are {sum(by_dtype.values())} bytes): are tensors copied "
                         "long before their buffer is due, or buffers allocated larger than they need?")
                worst = max(worst, step.peak_bytes / budget)
        first = result.values[0].steps[0]
        peak = max(s.peak_bytes for value in result.values for s in value.steps)
        budget = case.memory_budget(sum(first.collectives.values()))
        measured = (f"peak allocation {human(peak)} (budget {human(budget)})" if peak >= 0
                    else "allocations not probed on this engine")
        t.say(f"p = {case.p}: largest buffer {max((n for _, n in first.allreduces), default=0)} B "
              f"(threshold {case.threshold} B), {measured}")
    t.metric("worst_memory_over_budget", round(worst, 3))
