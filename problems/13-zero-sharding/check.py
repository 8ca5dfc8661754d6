"""Checks for problem 13, Adam with sharded moments (ZeRO stages 1 and 2).

One launch serves every check. Two hidden training cases (4 ranks, then 2 or 3; an MLP whose
parameter count never divides by p; hidden lr, betas and eps) each run 10 steps of the learner's
ShardedAdam, every rank on its own batches; then plain data parallel's allreduce on the same model
and ranks, the baseline of the byte check; rank 0 then answers the memory calculator's questions.
Every expected value is computed here: plain data-parallel Adam in float64 on the global batch
(judging.plain_adam) and the ZeRO paper's closed forms (judging.zero_gb).

How the state is measured. The moments themselves: after training, the harness asks the optimizer
for its state (where its shard starts, its m and v); their VALUES are compared with the right slice
of plain Adam's moments, their sizes with 1/p of the whole, the shards with a partition of the
parameters. A rank cannot pass by reporting a number: it must hold the right values, and only its
share. And its peers must depend on it: after every step its agent must have seen it send its own
updated shard of the weights (or the update), which no other rank can compute without its moments.
Each rank is handed only its own batches (cases.RankData), so a rank that updates every parameter
itself got the whole mean gradient from an allreduce and keeps whole moments, wherever.
What it keeps anywhere (a global, a cache, a closure, an mmap) the memory probe counts, in the
same training the other checks grade: a model of about 10^6 parameters, so that whole moments are
megabytes more than a shard's (a separate, larger probe model could be told apart, and an outside
tester's optimizer kept whole moments in a module global wherever the model was small). Each
rank's agent reads from /proc what its learner process holds (runtime/rank/memory.py): before the
learner's file is imported, when the optimizer is about to be made, and in a pause after each
step, sampled while no code of the learner's runs (a reading at a mark alone, an outside tester
showed, lets a wrapper of comm.mark drop whole-size scratch buffers just then). The rank's own walk
of its optimizer object can convict (a whole moment allocated and written only in the rank's slice,
whose other pages the kernel never backs), never clear. The process reports no number of its own: tracemalloc, which an
earlier probe read, was the learner's to stop or rewrite.

Bytes are the replay's: every flow each rank sent (its collectives run as their ring algorithms),
per step, against the same ranks' data-parallel allreduce of the same gradient.
"""

import numpy as np

from distlab.grading import CheckContext, Checklist, Run, Task

from . import cases, judging, programs
from .cases import Baseline, Memory, Training

CHECKS = Checklist()


@CHECKS.run
def one_launch(t: CheckContext) -> Run:
    trainings = cases.trainings(t.seed)
    t.say("training: " + "; ".join(c.label() for c in trainings))
    # The trainings first: what the learner process holds then is the harness's and the learner's
    # file's alone, nothing left over from other tasks.
    tasks = [Task(ranks=case.p, case=case, label=f"ShardedAdam, {case.label()}", record_sent=True, memory=True,
                  memory_sampled=("rest",), marks=judging.MARK_NAMES) for case in trainings]
    tasks += [Task(ranks=case.p, case=Baseline(case), label=f"the data-parallel baseline, p = {case.p}")
              for case in trainings]
    tasks.append(Task(ranks=1, cases=cases.memory_cases(t.seed), label="the memory calculator's questions"))
    return t.launch(programs.run_case, tasks)


@CHECKS.check(f"the weights equal plain data-parallel Adam's after {cases.STEPS} steps, on every rank", points=4)
def same_weights(t: CheckContext, one_launch: Run) -> None:
    for run in one_launch.cases(Training):
        case = run.case
        if problem := judging.run_weights_problem(run):
            t.fail(f"{case.label()}: {problem}")
        before, after = (cases.held_out_loss(case, w) for w in (cases.initial_weights(case), run.values[0].weights))
        t.say(f"{case.label()}: every rank within {judging.WEIGHT_TOL:g} x lr of plain Adam; "
              f"held-out loss {before:.4f} -> {after:.4f}")
        t.metric(f"loss_p{case.p}", [round(before, 5), round(after, 5)])


@CHECKS.check(f"each rank holds its 1/p shard of Adam's moments (within {judging.STATE_SLACK:.0%})", points=4)
def sharded_state(t: CheckContext, one_launch: Run) -> None:
    for index, run in enumerate(one_launch.cases(Training)):
        case, values = run.case, list(run.values)
        if problem := judging.evidence_problem(run):
            t.fail(f"{case.label()}: {problem}")
        for rank, value in enumerate(values):
            if isinstance(value.state, str):
                t.fail(f"{case.label()}: rank {rank}: {value.state}")
        states = [v.state for v in values]
        if problem := judging.coverage_problem(case, states):
            t.fail(f"{case.label()}: {problem}")
        for rank, state in enumerate(states):
            if problem := judging.state_size_problem(case, rank, state):
                t.fail(f"{case.label()}: {problem}")
        # The moments follow the weights: a run with a known mistake in its arithmetic has its own
        # trajectory, graded here for its sharding; any other wrong trajectory leaves the values ungraded.
        adam = judging.trajectory_of(case, values[0].weights)
        # The rank's own walk of its optimizer object: a whole moment found there convicts (np.zeros
        # whose untouched pages the kernel never backs); nothing found clears nothing.
        for rank, (value, state) in enumerate(zip(values, states)):
            if problem := judging.hidden_copies(case, judging.owned(state, case.size), value.reachable,
                                                adam or judging.plain_adam(case)):
                t.fail(f"{case.label()}: rank {rank}: {problem}")
        graded = adam is not None and all(np.array_equal(v.weights, values[0].weights) for v in values)
        if graded:
            for rank, state in enumerate(states):
                if problem := judging.values_problem(case, rank, state, adam):
                    t.fail(f"{case.label()}: {problem}")
            # What each rank's agent saw it send: its own updated shard, after every step.
            for rank, state in enumerate(states):
                shard = judging.owned(state, case.size)
                if problem := judging.unshared_update(case, rank, shard, run.task.sent(rank), adam):
                    t.fail(f"{case.label()}: {problem}")
        # What each rank's process kept between steps, wherever, as its agent read it: the verdict.
        if moved := run.task.marks_differ(judging.train_marks(case)):
            t.fail(f"{moved}: the memory probe reads at the program's marks")
        held = [run.task.memory(r) if t.sealed else judging.without_log(run.task.memory(r), run.task.sent(r))
                for r in range(case.p)]
        for rank in range(case.p):
            if problem := judging.footprint_problem(case, rank, held[rank], first=index == 0):
                t.fail(f"{case.label()}: {problem}")
        kept = max(judging.kept_between_steps(case, readings) for readings in held)
        t.metric(f"kept_over_shard_p{case.p}", round(kept / case.shard_bytes(), 3))
        t.say(f"{case.label()}: the memory probe: each rank's process holds at most {judging.mib(kept)} more "
              f"between its optimizer's steps (sampled from /proc by its agent), its shard's moments are "
              f"{judging.mib(case.shard_bytes())}")
        if not graded:
            t.say(f"{case.label()}: shards and sizes right; the values are not graded (the weights are wrong)")
            continue
        most = max(s["nbytes"] for s in states)
        t.metric(f"state_share_p{case.p}", round(most / (2 * case.size * judging.MOMENT_BYTES), 5))
        t.say(f"{case.label()}: the largest shard holds {most:,} bytes of moments, "
              f"{most / (2 * case.size * judging.MOMENT_BYTES):.4f} of the whole (1/p = {1 / case.p:.4f})")


@CHECKS.check(f"bytes per step equal data parallel's (within {judging.BYTES_SLACK:.0%})", points=2)
def same_bytes(t: CheckContext, one_launch: Run) -> None:
    for run in one_launch.cases(Training):
        case = run.case
        mine = judging.sent_per_step(run.task, case.steps)
        baseline = next(b for b in one_launch.cases(Baseline) if b.case.training == case)
        dp = judging.sent_per_step(baseline.task, case.steps)
        for rank in range(case.p):
            if problem := judging.bytes_problem(case, rank, mine.get(rank, 0.0), dp.get(rank, 0.0)):
                t.fail(problem)
        ratios = [mine.get(r, 0.0) / dp[r] for r in range(case.p)]
        t.metric(f"bytes_over_dp_p{case.p}", round(max(ratios), 5))
        t.say(f"p = {case.p}: {np.mean(list(mine.values())):,.0f} bytes per rank and step, "
              f"{min(ratios):.4f}-{max(ratios):.4f}x data parallel's allreduce")


@CHECKS.check("the memory calculator: 120 / 31.4 / 16.6 / 1.9 GB for 7.5B on 64 ranks, and hidden sizes", points=2)
def calculator(t: CheckContext, one_launch: Run) -> None:
    runs = one_launch.cases(Memory)
    questions, answers = [r.case for r in runs], [r.values[0] for r in runs]
    classic = [a for q, a in zip(questions, answers) if q in cases.CLASSIC]
    t.say("7.5B on 64 ranks, stages 0-3: " + " / ".join(f"{a:.1f}" if isinstance(a, float) else "?" for a in classic)
          + " GB (the paper: 120 / 31.4 / 16.6 / 1.9)")
    if wrong := judging.calculator_problems(questions, answers):
        t.fail(f"{len(wrong)} of {len(questions)} answers off by more than {judging.GB_RTOL:.1%}; " + "; ".join(wrong[:3]))
    t.say(f"{len(questions) - 4} hidden sizes and rank counts within {judging.GB_RTOL:.1%} of the closed forms")
