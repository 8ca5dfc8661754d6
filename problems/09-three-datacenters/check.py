"""Checks for problem 09, training across three data centers: the learner's hierarchical allreduce
on the card's 3 data centers x 4 ranks and on a hidden cluster (2 or 4 data centers of 3 or 4 ranks,
numbered round-robin across them), on every length that trips a hierarchy up, against sums computed
here; a data-parallel training run whose gradients it sums over a congested WAN; then one allreduce
of about 1 MiB per cluster on the virtual clock: the bytes that crossed data centers against the
optimum 2 (D-1) n, the time against the flat ring. Last, the cost answers against the bills.

A rank is handed only its own data (cases.py, ``for_rank``) and the answers stay in judging.py: a
sum is right only with the other ranks' data, and the checks ask the replay for the bytes that
brought it across the WAN, not the ranks."""

import numpy as np

from distlab import grading
from distlab.grading import CheckContext, Checklist, Run, Task, faults

from .cases import (
    CARD,
    CARD_BILL,
    Bill,
    Buffer,
    Training,
    buffers,
    hidden_bills,
    hidden_cluster,
    timed_buffer,
)
from .judging import (
    bad_training,
    breakeven_params,
    per_step,
    rounds_of,
    shown,
    too_few_wan_bytes,
    too_many_wan_bytes,
    trained,
    wan_bytes,
    wan_bytes_into,
    wrong_breakeven,
    wrong_costs,
    wrong_sums,
)
from .programs import run_case

CHECKS = Checklist()


@CHECKS.run
def every_case(t: CheckContext) -> Run:
    """One launch for every check: each cluster's buffers, then its timed buffer alone in a task
    (its replay is that one allreduce), the training run, and the cost questions on one rank."""
    tasks, clusters, widen = [], (CARD, hidden_cluster(t.rng)), grading.Widener(t.seed, 9)
    for cluster in clusters:
        platform = cluster.platform()
        tasks += [Task(ranks=cluster.p, cases=buffers(cluster, t.rng, widen), platform=platform, label=cluster.label()),
                  Task(ranks=cluster.p, cases=[timed_buffer(cluster, t.rng, widen)], platform=platform,
                       label=f"the timed allreduce on {cluster.label()}")]
    datacenters = [[r for r, dc in enumerate(CARD.datacenter_of()) if dc == d] for d in range(CARD.dcs)]
    congested = faults.plan(faults.bandwidth(factor=0.5, groups=datacenters), seed=t.seed,
                            where="09's congested WAN")
    training = Training(CARD, 6, 32, 8, 0.05, widen(int(t.rng.integers(1 << 31))))
    tasks += [Task(ranks=CARD.p, case=training, platform=CARD.platform(), faults=congested, label=training.label()),
              Task(ranks=1, cases=[CARD_BILL, *hidden_bills(t.rng)], label="the cost questions")]
    # Every task models its own cluster; the launch's platform seats the largest (up to 16 ranks).
    return t.launch(run_case, tasks, platform=max(clusters, key=lambda c: c.p).platform())


@CHECKS.check("the sum is right on every rank, on both clusters", points=3)
def sums_are_right(t: CheckContext, every_case: Run) -> None:
    clusters = sorted({result.case.cluster.label() for result in cases_of(t, every_case, Buffer)})
    t.say("; ".join(clusters) + ": n = 1, fewer than a data center's ranks, not a multiple of "
          "them or of all ranks, 32 Ki; float32, float64, int64")
    for result in cases_of(t, every_case, Buffer):
        if wrong := wrong_sums(result.case, result.values):
            t.fail(wrong)
    # The sums hold the other data centers' data: the replay must show it arriving.
    for task in {id(result.task): result.task for result in cases_of(t, every_case, Buffer)}.values():
        batch = task.spec.cases
        needed = sum(b.n * np.dtype(b.dtype).itemsize for b in batch)
        what = f"{batch[0].cluster.label()}: the {len(batch)} allreduce(s) of one task"
        if wrong := too_few_wan_bytes(what, batch[0].cluster, wan_bytes_into(task, batch[0].cluster), needed):
            t.fail(wrong)
    t.say(f"{len(cases_of(t, every_case, Buffer))} allreduces right on every rank")


@CHECKS.check("training with your allreduce matches one process, over a congested WAN", points=2)
def training_matches(t: CheckContext, every_case: Run) -> None:
    (result,) = cases_of(t, every_case, Training)
    want_w, want_losses = trained(result.case)
    t.say(f"{result.case.label()}, the WAN at half its bandwidth; loss {want_losses[0]:.3f} -> {want_losses[-1]:.3f}")
    for rank, value in enumerate(result.values):
        if wrong := bad_training(result.case, rank, value):
            t.fail(wrong)
        w, losses = value
        wrong = grading.first_mismatch(np.asarray(w), want_w, rtol=1e-9, atol=1e-12)
        t.expect(wrong is None, "the weights of full-batch gradient descent on one process",
                 f"rank {rank}'s weights after {result.case.steps} steps: {wrong.describe() if wrong else ''}")
        t.expect(np.allclose(losses, want_losses, rtol=1e-9), f"the losses {np.round(want_losses, 4).tolist()}",
                 f"rank {rank} saw {np.round(losses, 4).tolist()}")
    # Each step's sum holds every rank's gradient and loss: the replay must show them arriving.
    training, cluster = result.case, result.case.cluster
    needed = training.steps * (training.features + 1) * 8
    if wrong := too_few_wan_bytes(training.label(), cluster, wan_bytes_into(result.task, cluster), needed):
        t.fail(wrong)


@CHECKS.check("bytes across data centers within 5% of the optimum 2 (D-1) n", points=2)
def wan_bytes_optimal(t: CheckContext, every_case: Run) -> None:
    card_passed = True
    for result in timed(t, every_case):
        buffer, task = result.case, result.task
        t.expect(wrong_sums(buffer, result.values) is None, "a right sum before its bytes are counted",
                 f"{buffer.label()}: a rank holds a wrong sum (see the first check)")
        seen, best = wan_bytes(task, task.platform), buffer.cluster.optimal_wan_bytes(buffer.n * 4)
        flat = buffer.cluster.flat_ring_wan_bytes(buffer.n * 4)
        t.say(f"{buffer.label()}: {seen / 2**20:.2f} MiB crossed data centers (optimum {best / 2**20:.2f}, "
              f"flat ring {flat / 2**20:.2f}); ${task.timeline().money:.6f} of WAN traffic")
        t.metric(f"wan_mib {buffer.cluster.label()}", round(seen / 2**20, 3))
        t.metric(f"flat_ring_wan_mib {buffer.cluster.label()}", round(flat / 2**20, 3))
        if wrong := too_few_wan_bytes(buffer.label(), buffer.cluster, wan_bytes_into(task, buffer.cluster),
                                      buffer.n * 4):
            t.fail(wrong)
        if seen > 1.05 * best:
            t.fail(too_many_wan_bytes(buffer, seen, card_passed))
        card_passed = card_passed and not buffer.cluster.round_robin


@CHECKS.check("at least 3x faster than the flat ring on the virtual clock", points=2)
def faster_than_flat(t: CheckContext, every_case: Run) -> None:
    for result in timed(t, every_case):
        buffer, task = result.case, result.task
        t.expect(wrong_sums(buffer, result.values) is None, "a right sum before its time is graded",
                 f"{buffer.label()}: a rank holds a wrong sum (see the first check)")
        if wrong := too_few_wan_bytes(buffer.label(), buffer.cluster, wan_bytes_into(task, buffer.cluster),
                                      buffer.n * 4):
            t.fail(wrong)
        measured = t.measured_time(task)
        if not measured > 0:
            t.fail(f"{buffer.label()}: the allreduce took {measured} s on the clock: no time at all, "
                   "though the other data centers' data must cross the WAN (2 ms a crossing)")
        flat = grading.collective_time(task.platform, "Allreduce", buffer.cluster.p, buffer.n * 4)
        t.say(f"{buffer.label()}: yours {measured * 1e3:.2f} ms, the flat ring {flat * 1e3:.2f} ms "
              f"({flat / measured:.1f}x faster)")
        t.metric(f"yours_ms {buffer.cluster.label()}", round(measured * 1e3, 3))
        t.metric(f"flat_ring_ms {buffer.cluster.label()}", round(flat * 1e3, 3))
        if buffer.cluster == CARD:
            t.performance(measured, flat / 3, task)
        t.expect(measured <= flat / 3, f"at most {flat / 3 * 1e3:.2f} ms (a third of the flat ring's)",
                 f"{measured * 1e3:.2f} ms, {flat / measured:.2f}x faster than the flat ring: a "
                 f"hierarchical allreduce pays {rounds_of(buffer.cluster)}")


@CHECKS.check("cost per step and per epoch match the bill", points=2)
def costs_match(t: CheckContext, every_case: Run) -> None:
    for result in cases_of(t, every_case, Bill):
        if wrong := wrong_costs(result.case, result.values[0]):
            t.fail(wrong)
    wan, compute = per_step(CARD_BILL, 1.3e9)
    steps, gradient = CARD_BILL.steps_per_epoch, 1.3e9 * CARD_BILL.bytes_per_param
    flat = CARD.flat_ring_wan_bytes(gradient) * CARD_BILL.wan_price_per_gb / 1e9 * steps
    t.say(f"the card's bill for 1.3B parameters: ${wan:.4f} WAN + ${compute:.4f} compute per step, "
          f"${(wan + compute) * steps:.2f} per epoch; a flat ring's WAN would cost ${flat:.2f} per epoch, "
          f"the hierarchy's ${wan * steps:.2f}")
    t.metric("card_dollars_per_epoch_1.3B", round((wan + compute) * steps, 2))
    t.metric("wan_dollars_per_epoch_1.3B hierarchical", round(wan * steps, 2))
    t.metric("wan_dollars_per_epoch_1.3B flat_ring", round(flat, 2))


@CHECKS.check("the model size at which the WAN costs 40% of the compute bill", points=1)
def breakeven_size(t: CheckContext, every_case: Run) -> None:
    for result in cases_of(t, every_case, Bill):
        if wrong := wrong_breakeven(result.case, result.values[0]):
            t.fail(wrong)
    t.say(f"on the card's bill: {breakeven_params(CARD_BILL, 0.4) / 1e9:.2f} billion parameters")
    t.metric("card_breakeven_params", breakeven_params(CARD_BILL, 0.4))


def timed(t: CheckContext, run: Run) -> list[grading.CaseRun]:
    """The timed allreduce of each cluster, the card's first."""
    return [result for result in cases_of(t, run, Buffer) if result.case.timed]


def cases_of(t: CheckContext, run: Run, kind: type) -> list[grading.CaseRun]:
    """``run.cases(kind)``, once each rank of a batch of cases is seen to have returned one value
    per case (the harness's list, which the learner's process could replace with anything)."""
    for task in run.tasks:
        if not isinstance(task, grading.TaskRun) or task.spec.cases is None:
            continue  # a failed task reports itself when its cases are read
        if not any(isinstance(case, kind) for case in task.spec.cases):
            continue
        for rank, value in enumerate(task.values):
            if not isinstance(value, (list, tuple)) or len(value) != len(task.spec.cases):
                t.fail(f"while running {task.spec.label}: rank {rank} returned {shown(value)}, not "
                       f"one value for each of its {len(task.spec.cases)} cases")
    return run.cases(kind)

