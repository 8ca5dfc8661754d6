"""Checks for problem 06, DDP from scratch: buckets and overlap.

The story: a small MLP (built here, its init seeded differently on every rank) is handed to the
learner's ``DataParallel`` and trained with plain SGD for a few steps, every rank on its own shard
of a synthetic regression batch. Each layer declares its work on the virtual clock (forward, and
twice that in backward, in proportion to its parameters), so the replay shows whether the
gradient allreduces run while backward computes. Four cases run in one launch: caps giving one
bucket, two buckets, many buckets (a cap below the largest tensor) and the overlap case (4-6
buckets, backward compute about equal to the communication). The checks read that launch:
weights equal single-process SGD on the global batch (computed here, with torch); every rank
started from rank 0's weights and ends with the same ones; one allreduce per bucket per step; at
least half of the communication hidden behind backward. A second launch trains a model whose
side head is skipped in some steps: the wrapper must cope or say clearly why not.

Hidden variants: layer widths, seeds (weights, data), caps, rank counts, learning rate, step count
and which steps skip the side head all come from the session seed.
"""

from __future__ import annotations

import math

import numpy as np

from distlab.grading import CheckContext, CheckFailed, Checklist, Task, check_part

# The parts, beside this file: the model, its data and both training loops (the rank program and
# single-process SGD); the bucket rule, the ring's cost and the overlap accounting; the hidden
# variants; the expected weights with the messages that name a symptom.
training = check_part(__file__, "training")
costs = check_part(__file__, "costs")
variants = check_part(__file__, "variants")
diagnoses = check_part(__file__, "diagnoses")

HIDDEN_TARGET = 0.5  # the catalog's "at least half of the communication hidden"


def launch_main(t: CheckContext):
    cases = variants.main_cases(t)
    return cases, t.launch(training.train,
                           [Task(ranks=c.p, args=(c,), label=c.label) for c in cases])


CHECKS = Checklist()


@CHECKS.check("weights after several steps equal single-process SGD on the global batch", points=4)
def weights_match(t: CheckContext) -> None:
    cases, run = launch_main(t)
    t.say(f"{len(cases)} cases, {cases[0].steps} SGD steps each, {training.PER_RANK_BATCH} samples "
          "per rank per step; expected weights computed here by one process on the global batch")
    for case, task_run in zip(cases, run.tasks):
        problem = diagnoses.diagnose_weights(case, task_run.values)
        if problem:
            t.fail(problem)
        t.say(f"{case.label}: every rank matches (widths {list(case.widths)})")


@CHECKS.check("every rank starts from rank 0's weights and ends with the same weights", points=2)
def replicas_agree(t: CheckContext) -> None:
    cases, run = launch_main(t)
    for case, task_run in zip(cases, run.tasks):
        results: list[training.RankResult] = task_run.values
        want = diagnoses.start_weights(case)
        for rank, res in enumerate(results):
            t.expect(np.array_equal(res.start, want),
                     "every rank to hold rank 0's initial weights once DataParallel(...) returns",
                     f"{case.label}: rank {rank} still held different weights (largest difference "
                     f"{float(np.max(np.abs(res.start - want))):.3g}): were they broadcast from rank 0?")
        for rank, res in enumerate(results[1:], start=1):
            t.expect(res.final.shape == results[0].final.shape
                     and bool(np.allclose(res.final, results[0].final, rtol=1e-6, atol=1e-7)),
                     f"rank {rank}'s weights after {case.steps} steps to equal rank 0's",
                     f"{case.label}: they differ "
                     f"({diagnoses.worst_parameter(case, res.final, results[0].final)}): "
                     "the replicas drifted apart")
    t.say("every case: all ranks started from rank 0's weights and ended in agreement")


@CHECKS.check("one allreduce per bucket per step, for caps giving 1, 2 and 3+ buckets", points=3)
def one_collective_per_bucket(t: CheckContext) -> None:
    cases, run = launch_main(t)
    for case, task_run in zip(cases, run.tasks):
        sizes = [n for _, _, n in reversed(training.layout(case))]
        buckets = costs.plan_buckets(sizes, case.cap_bytes)
        total = sum(sizes)
        where = (f"{case.label}: cap {case.cap_bytes} bytes over {len(sizes)} gradients of "
                 f"{total} bytes in all makes {len(buckets)} bucket(s)")
        for rank, res in enumerate(task_run.values):
            for step, count in enumerate(res.steps):
                if count.collectives == len(buckets) and count.allreduce_bytes == total:
                    continue
                seen = (f"{where}, so {len(buckets)} allreduce(s) per step; rank {rank} made "
                        f"{count.collectives} collective call(s) in step {step} "
                        f"({', '.join(f'{op} x{n}' for op, n in sorted(count.calls.items())) or 'none'}), "
                        f"carrying {count.allreduce_bytes} bytes")
                if count.allreduce_bytes > total:
                    t.fail(f"{seen}: more than the gradients hold, so a bucket was launched twice")
                if count.allreduce_bytes < total:
                    t.fail(f"{seen}: fewer bytes than the gradients hold, so some gradients were "
                           "never reduced")
                t.fail(f"{seen}: the gradients are cut into buckets differently; walk the "
                       "parameters in reverse order and start a new bucket only when the next "
                       "gradient would take the current one past the cap")
        t.say(f"{where}: {len(buckets)} allreduce(s) per step on every rank")
    t.metric("buckets", [len(costs.plan_buckets([n for _, _, n in reversed(training.layout(c))],
                                                c.cap_bytes))
                         for c in cases])


@CHECKS.check("at least half of the communication hidden behind backward compute", points=3)
def overlap(t: CheckContext) -> None:
    cases, run = launch_main(t)
    case, task_run = cases[-1], run.tasks[-1]
    played = task_run.replay()
    traces = task_run.traces
    per_rank = {r: costs.windows(traces[r], played.spans[r]) for r in traces}
    sizes = [n for _, _, n in reversed(training.layout(case))]
    nbuckets = len(costs.plan_buckets(sizes, case.cap_bytes))
    worst, worst_step, slowest = 1.0, 0, 0.0
    for step in range(case.steps):
        ws = [per_rank[r][step] for r in sorted(per_rank) if len(per_rank[r]) > step]
        if len(ws) < case.p:
            t.fail(f"{case.label}: step {step} did not reach the end of finish_gradient_sync on every rank")
        begin, end = min(w.begin for w in ws), max(w.end for w in ws)
        comm_s = costs.union_length([(f.posted, f.end) for f in played.flows
                               if f.op == "Allreduce" and begin <= f.posted <= end])
        exposed = max(w.end - w.begin - w.compute_s for w in ws)
        backward = max(w.compute_s for w in ws)
        head = (f"{case.label}, step {step}: backward computes {backward * 1e6:.1f} us and the "
                f"{nbuckets} buckets' allreduces take {comm_s * 1e6:.1f} us")
        if comm_s <= 0:
            t.fail(f"{head.split(' and ')[0]}, but no allreduce ran between loss.backward() and the "
                   "end of finish_gradient_sync()")
        hidden = costs.hidden_fraction(exposed, comm_s)
        slowest = max(slowest, max(w.end - w.begin for w in ws))
        if hidden < worst:
            worst, worst_step = hidden, step
        if hidden >= HIDDEN_TARGET:
            continue
        w0 = ws[0]
        seen = (f"{head}; the ranks sat {exposed * 1e6:.1f} us in communication after or besides "
                f"it, so only {hidden:.0%} of it was hidden")
        late = [x for x in w0.launches if x < w0.compute_end - 1e-12]
        if not late:
            t.fail(f"expected at least {HIDDEN_TARGET:.0%} hidden; saw {seen}: every allreduce "
                   "started only after backward had ended. Backward produces the gradients of "
                   "the last layer first: put them in the first bucket (reverse parameter "
                   "order) and start each bucket as soon as it is full")
        if w0.blocked_in_backward > 0.5 * comm_s:
            t.fail(f"expected at least {HIDDEN_TARGET:.0%} hidden; saw {seen}: the allreduces "
                   f"start during backward, but rank 0 waited {w0.blocked_in_backward * 1e6:.1f} us "
                   "for them before backward ended (a blocking Allreduce, or a Wait right after "
                   "each launch), so backward stood still. Start each bucket with comm.Iallreduce "
                   "and wait for them all once, at the end of backward (finish_gradient_sync)")
        t.fail(f"expected at least {HIDDEN_TARGET:.0%} hidden; saw {seen}")
    bound = max(w.compute_s for ws in per_rank.values() for w in ws)
    t.performance(slowest, bound, task_run)
    t.metric("hidden_fraction", round(worst, 4))
    t.say(f"{case.label}: {nbuckets} buckets; at worst {worst:.0%} of the communication hidden "
          f"(step {worst_step}); backward + sync {slowest * 1e6:.1f} us against "
          f"{bound * 1e6:.1f} us of backward compute")


@CHECKS.check("a parameter without a gradient in a step: handled, or a clear error", points=2)
def unused_parameter(t: CheckContext) -> None:
    case = variants.side_case(t)
    skipped = [s for s in range(case.steps) if not case.side_used[s]]
    t.say(f"{case.label}: in those steps the side head's parameters get no gradient")
    try:
        run = t.launch(training.train, [Task(ranks=case.p, args=(case,), label=case.label)],
                       stall_s=3.0)
    except CheckFailed as failed:
        result = getattr(failed, "result", None)
        if result is None:
            raise
        if result.status != "error":
            t.fail(f"{case.label}: the run ended in a {result.status} ({result.message}); when a "
                   "parameter gets no gradient, finish it (count the gradient as zero) or raise "
                   "an error that says so, but never wait for a gradient that cannot come")
        if "NoneType" in result.message or result.message.rstrip().endswith(":"):
            t.fail(f"{case.label}: the run failed with {result.message!r}, an accident rather "
                   "than an explanation: when a parameter gets no gradient in a step, either "
                   "treat its gradient as zero or raise an error naming the problem")
        t.say(f"a clear error: {result.message.splitlines()[0]}")
        t.metric("outcome", "error")
        return
    results: list[training.RankResult] = run.tasks[0].values
    problem = diagnoses.diagnose_weights(case, results)
    if problem:
        total = sum(n for _, _, n in training.layout(case))
        short = [(s, c.allreduce_bytes) for s, c in enumerate(results[0].steps)
                 if c.allreduce_bytes < total]
        if short:
            step, carried = short[0]
            problem += (f"; in step {step} the allreduces carried only {carried} of the {total} "
                        "bytes of gradients, so a bucket that never filled was never reduced")
        t.fail(f"{problem}; the side head had no gradient in steps {skipped}: silently wrong "
               "weights are the one outcome that is not allowed")
    t.metric("outcome", "handled")
    t.say(f"handled: the weights equal single-process SGD, with the side head skipped in steps {skipped}")


# -- the free run (distlab run 06, mpirun) --------------------------------------------------------


def main(comm, solution, steps="40", cap_kib="64", width="128", lr="0.5"):
    """A free run (distlab run 06 --param cap_kib=16): trains the MLP on every rank; rank 0
    reports the loss over the global batch, the collectives per step and whether replicas agree.

    Each layer declares 1 ns of forward work per parameter (2 ns backward): change cap_kib and
    watch the step time (P50) in the metrics."""
    from distlab import MAX, SUM

    p, rank = comm.Get_size(), comm.Get_rank()
    w = int(width)
    case = training.Case("free run", p, (32, w, w, w, 8), 606, int(float(cap_kib) * 1024),
                         int(steps), float(lr), 1e-9)
    result = training.train(comm, solution, case)
    # The loss over the global batch: the mean of the ranks' shard losses (equal shards).
    losses = np.array(result.losses)
    comm.Allreduce(comm.IN_PLACE, losses, SUM)
    losses /= p
    digest = float(np.abs(result.final).sum())
    spread = np.array([digest, -digest])  # max and -min of the ranks' digests in one call
    comm.Allreduce(comm.IN_PLACE, spread, MAX)
    if rank != 0:
        return None
    same = math.isclose(spread[0], -spread[1], rel_tol=1e-6)
    buckets = len(costs.plan_buckets([n for _, _, n in reversed(training.layout(case))],
                                     case.cap_bytes))
    k = max(1, min(5, case.steps // 4))
    return (f"{case.steps} steps on {p} ranks: global-batch loss {losses[:k].mean():.4f} (first "
            f"{k} steps) -> {losses[-k:].mean():.4f} (last {k}); {buckets} bucket(s) by the card's "
            f"rule, {result.steps[-1].collectives} collective(s) in the last step; weights "
            f"{'agree' if same else 'DIFFER'} across ranks")
