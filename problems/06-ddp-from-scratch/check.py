"""Checks for problem 06, DDP from scratch: buckets and overlap.

The story: a small MLP, its init seeded differently on every rank, is handed to the learner's ``DataParallel`` and
trained with plain SGD for a few steps, every rank on its own shard of a synthetic regression batch; its layers declare
their work on the virtual clock, so the replay shows whether the gradient allreduces run while backward computes. One
launch runs four cases (caps giving one bucket, two, a cap below the largest tensor, and the overlap case: 6-8 buckets,
backward about as long as the communication) for the first four checks; last, a model whose side head is skipped in
some steps must be coped with or refused clearly. Widths, seeds, caps, rank counts, learning rate, step count and the
skipped steps come from the session seed (cases.py).
"""

from __future__ import annotations

import numpy as np

from distlab.grading import CheckContext, Checklist, Run, RunFailed, Task

from . import cases, judging
from .programs import train

CHECKS = Checklist()


@CHECKS.run
def trained(t: CheckContext) -> Run:
    """The four cases of the main launch, one task each: one launch serves four checks. Each rank's agent keeps
    a copy of what it sends: the allreduces must carry the rank's own gradients, not just their bytes."""
    return t.launch(train, [Task(ranks=c.p, case=c, label=c.label, record_sent=True) for c in cases.main_cases(t)])


@CHECKS.check("weights after several steps equal single-process SGD on the global batch", points=4)
def weights_match(t: CheckContext, trained: Run) -> None:
    t.say(f"{len(trained.tasks)} cases, {trained.tasks[0].case.steps} SGD steps each, {cases.PER_RANK_BATCH} "
          "samples per rank per step; expected weights computed here by one process on the global batch")
    for result in trained.cases():
        problem = (judging.malformed(result) or judging.diagnose_weights(result) or judging.unexchanged(result)
                   or judging.uncarried(result))
        if problem:
            t.fail(problem)
        t.say(f"{result.case.label}: every rank matches (widths {list(result.case.widths)})")


@CHECKS.check("every rank starts from rank 0's weights and ends with the same weights", points=2)
def replicas_agree(t: CheckContext, trained: Run) -> None:
    for result in trained.cases():
        problem = judging.malformed(result)
        if problem:
            t.fail(problem)
        case, want = result.case, judging.start_weights(result.case)
        starts = [judging.weights(res, "start") for res in result.values]
        finals = [judging.weights(res, "final") for res in result.values]
        for rank, start in enumerate(starts):
            t.expect(np.array_equal(start, want),
                     "every rank to hold rank 0's initial weights once DataParallel(...) returns",
                     f"{case.label}: rank {rank} still held different weights (largest difference "
                     f"{float(np.max(np.abs(start - want))):.3g}): were they broadcast from rank 0?")
        for rank, final in enumerate(finals[1:], start=1):
            t.expect(judging.close(final, finals[0], rtol=1e-6, atol=1e-7),
                     f"rank {rank}'s weights after {case.steps} steps to equal rank 0's",
                     f"{case.label}: they differ ({judging.worst_parameter(case, final, finals[0])}): "
                     "the replicas drifted apart")
        # The weights are the learner process's word; the bytes the replay delivered are evidence.
        timeline, total = result.task.timeline(), sum(case.backward_sizes())
        for rank in range(1, result.ranks):
            got = judging.received_before_training(timeline, rank)
            t.expect(got >= total, f"rank {rank} to receive rank 0's {total} bytes of weights before its first step",
                     f"{case.label}: it received {got} bytes while DataParallel(...) ran, so its start weights "
                     "did not come from rank 0 (comm.Bcast them in the constructor)")
    t.say("every case: all ranks started from rank 0's weights and ended in agreement")


@CHECKS.check("one allreduce per bucket per step, for caps giving 1, 2 and 3+ buckets", points=3)
def one_collective_per_bucket(t: CheckContext, trained: Run) -> None:
    for result in trained.cases():
        case, sizes, buckets = result.case, result.case.backward_sizes(), len(result.case.buckets())
        where = (f"{case.label}: cap {case.cap_bytes} bytes over {len(sizes)} gradients of "
                 f"{sum(sizes)} bytes in all makes {buckets} bucket(s)")
        for rank in range(result.ranks):
            for step, count in enumerate(judging.step_counts(result.task, rank)):
                wrong = judging.miscounted(where, buckets, sum(sizes), rank, step, count)
                if wrong:
                    t.fail(wrong)
        # Right counts of the wrong values are no buckets; judged where the weights are right (check 1 names the rest).
        if not (judging.malformed(result) or judging.diagnose_weights(result)):
            wrong = judging.uncarried(result)
            if wrong:
                t.fail(wrong)
        t.say(f"{where}: {buckets} allreduce(s) per step on every rank")
    t.metric("buckets", [len(result.case.buckets()) for result in trained.cases()])


@CHECKS.check("at least half of the communication hidden behind backward compute", points=3)
def overlap(t: CheckContext, trained: Run) -> None:
    task_run = trained.tasks[-1]  # the overlap case comes last
    case, timeline = task_run.case, task_run.timeline()
    for rank, trace in task_run.traces.items():  # each window ends where the agents saw its traffic done
        unsettled = judging.unsettled(trace, rank, case.label, case.steps)
        if unsettled:
            t.fail(unsettled)
    per_rank = {r: judging.windows(timeline.events(r)) for r in timeline.ranks}
    nbuckets = len(case.buckets())
    worst, worst_step = 1.0, 0
    for step in range(case.steps):
        ws = [per_rank[r][step] for r in sorted(per_rank) if len(per_rank[r]) > step]
        if len(ws) < case.p:
            t.fail(f"{case.label}: step {step} did not reach the end of finish_gradient_sync on every rank")
        # The allreduces posted between the first rank's backward and the last rank's sync.
        begin, end = min(w.begin for w in ws), max(w.end for w in ws)
        comm_s = judging.union_length([(m.posted, m.end) for m in timeline.messages
                                       if m.op == "Allreduce" and begin <= m.posted <= end])
        backward = f"{case.label}, step {step}: backward computes {max(w.compute_s for w in ws) * 1e6:.1f} us"
        if comm_s <= 0:
            t.fail(f"{backward}, but no allreduce ran between loss.backward() and the end of finish_gradient_sync()")
        for rank, w in enumerate(ws):
            forged = judging.forged_compute(case, rank, step, w)
            if forged:
                t.fail(forged)
        exposed = max(w.end - w.begin - w.compute_s for w in ws)
        hidden = judging.hidden_fraction(exposed, comm_s)
        if hidden < worst:
            worst, worst_step = hidden, step
        if hidden < judging.HIDDEN_TARGET:
            head = f"{backward} and the {nbuckets} buckets' allreduces take {comm_s * 1e6:.1f} us"
            t.fail(judging.too_little_hidden(head, ws[0], exposed, comm_s, hidden))
    slowest = max(w.end - w.begin for ws in per_rank.values() for w in ws[:case.steps])
    bound = max(w.compute_s for ws in per_rank.values() for w in ws)
    t.performance(slowest, bound, task_run)
    t.metric("hidden_fraction", round(worst, 4))
    t.say(f"{case.label}: {nbuckets} buckets; at worst {worst:.0%} of the communication hidden (step {worst_step}); "
          f"backward + sync {slowest * 1e6:.1f} us against {bound * 1e6:.1f} us of backward compute")


@CHECKS.check("a parameter without a gradient in a step: handled, or a clear error", points=2)
def unused_parameter(t: CheckContext) -> None:
    case = cases.side_case(t)
    skipped = [s for s in range(case.steps) if not case.side_used[s]]
    t.say(f"{case.label}: in those steps the side head's parameters get no gradient")
    try:  # a run of its own: an error is a fair answer here, a hang is not
        run = t.launch(train, [Task(ranks=case.p, case=case, label=case.label, record_sent=True)], stall_s=3.0)
    except RunFailed as failed:
        result = failed.result
        if result.status != "error":
            t.fail(f"{case.label}: the run ended in a {result.status} ({result.message}); when a "
                   "parameter gets no gradient, finish it (count the gradient as zero) or raise "
                   "an error that says so, but never wait for a gradient that cannot come")
        if "NoneType" in result.message or result.message.rstrip().endswith(":"):
            t.fail(f"{case.label}: the run failed with {result.message!r}, an accident rather "
                   "than an explanation: when a parameter gets no gradient in a step, either "
                   "treat its gradient as zero or raise an error naming the problem")
        # Where the error came, as the failing rank's agent saw its marks: in the gradient sync of a
        # step whose side head got no gradient (an outside tester's code refused the side head in
        # DataParallel(...) itself, before any gradient was missing, and scored 2/2).
        if early := judging.error_before_a_missing_gradient(case, result):
            t.fail(early)
        t.say(f"a clear error: {result.message.splitlines()[0]}")
        t.metric("outcome", "error")
        return
    malformed = judging.malformed(run.cases()[0])
    if malformed:
        t.fail(malformed)
    problem = judging.diagnose_weights(run.cases()[0])
    forged = None if problem else judging.uncarried(run.cases()[0])  # the ranks' own gradients, a missing one zero?
    if forged:
        t.fail(forged)
    if problem:
        total = sum(case.backward_sizes())
        carried = [c.op_bytes.get("Allreduce", 0) for c in judging.step_counts(run.tasks[0], 0)]
        short = [(step, n) for step, n in enumerate(carried) if n < total]
        if short:
            step, n = short[0]
            problem += (f"; in step {step} the allreduces carried only {n} of the {total} "
                        "bytes of gradients, so a bucket that never filled was never reduced")
        t.fail(f"{problem}; the side head had no gradient in steps {skipped}: silently wrong "
               "weights are the one outcome that is not allowed")
    t.metric("outcome", "handled")
    t.say(f"handled: the weights equal single-process SGD, with the side head skipped in steps {skipped}")
