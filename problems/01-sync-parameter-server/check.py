"""Checks for problem 01, a synchronous parameter server.

The story: a click-through-rate model (logistic regression over hashed features) is trained by S
server ranks, which hold key-range shards of the weights, and W worker ranks, which hold the click
logs. Ranks 0 .. S-1 run the learner's ``server``, ranks S .. S+W-1 the learner's ``worker``. After
K steps the servers hand back their shards, and the model they add up to must be the one that
plain gradient descent reaches on the concatenated global batch, computed here in the supervisor.

The same runs are then read for what went over the wire (one pull and one push of the model per
worker per step, no more), for how the keys were split (about 1/S per server), and for every
(S, W) pair, S = 1 and W = 1 included. Last, one worker's messages are held back for real
(50 ms each), so that a server that answers pulls before its step is complete, or that takes
"the next W pushes" whatever their step, mixes two steps and ends with the wrong model.

Hidden variants: S and W of the main case and of two more pairs, the number of keys (never a
multiple of S), the workers' batch sizes (never all equal), the number of steps, the learning
rate, the data and the initial weights; the late worker. All from the session seed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from distlab.grading import CheckContext, Checklist, Task, check_part

if TYPE_CHECKING:
    from distlab.grading import TaskRun

cases = check_part(__file__, "cases")  # the scenario's numbers, the data, the hidden variants
programs = check_part(__file__, "programs")  # what runs on the ranks: the learner's server, worker
models = check_part(__file__, "models")  # the expected model, the known mistakes, the step bound
readings = check_part(__file__, "readings")  # a run read: shards, bytes, pushes, latencies
fmt = models.fmt  # 12.3 us, 4.56 ms


# -- the one launch: every case of the session, the late worker's last ----------------------------


def sweep(t: CheckContext) -> list[TaskRun]:
    tasks = [Task(ranks=c.servers + c.workers, args=(c,), label=c.label(),
                  faults=cases.late_plan(c, t.seed) if c.late is not None else None)
             for c in cases.sweep_cases(t)]
    return t.launch(programs.run_ps, tasks).tasks


# -- the checks -----------------------------------------------------------------------------------

CHECKS = Checklist()


@CHECKS.check("the model after K steps equals gradient descent on the global batch", points=4)
def model_matches(t: CheckContext) -> None:
    task_run = sweep(t)[0]
    case: cases.Case = task_run.task.args[0]
    t.say(f"{case.label()}, lr {case.lr}")
    problem = readings.model_problem(task_run)
    if problem is not None:
        t.fail(problem)
    lat = readings.latencies(task_run, case)
    t.metric("pull_p50_s", float(np.percentile(lat.pull_s, 50)) if lat.pull_s else None)
    t.metric("push_p50_s", float(np.percentile(lat.push_s, 50)) if lat.push_s else None)
    t.metric("sync_compute_ratio", round(lat.sync_compute, 4) if np.isfinite(lat.sync_compute) else None)
    t.say(f"every key within rtol {cases.RTOL:g} of single-process gradient descent; {lat.describe()}")


@CHECKS.check("works for every (S, W): one server, one worker, eight ranks", points=2)
def every_pair(t: CheckContext) -> None:
    runs = sweep(t)[1:-1]  # the edges, the hidden pair and the timed case
    t.say("(S, W) = " + ", ".join(f"({r.task.args[0].servers}, {r.task.args[0].workers})" for r in runs))
    for task_run in runs:
        problem = readings.model_problem(task_run)
        if problem is not None:
            t.fail(problem)
    t.say(f"{len(runs)} more cases agree with single-process gradient descent")


@CHECKS.check("bytes per worker per step = one pull + one push of the model (within 5%)", points=2)
def bytes_per_worker(t: CheckContext) -> None:
    worst = 1.0
    per_server: dict[str, int] = {}
    for task_run in sweep(t):
        case: cases.Case = task_run.task.args[0]
        for i, result in enumerate(task_run.values[case.servers:]):
            ratio, problem = readings.worker_bytes_problem(case, i, result.stats)
            if problem is not None:
                t.fail(problem)
            worst = max(worst, ratio, key=lambda r: abs(r - 1.0))
        if case.what == "the main case":
            for s, result in enumerate(task_run.values[: case.servers]):
                per_server[str(s)] = result.stats.bytes_sent + result.stats.bytes_received
            t.say(f"{case.label()}: bytes per server " +
                  ", ".join(f"{s}: {n / case.steps:,.0f}/step" for s, n in per_server.items()))
    t.metric("worst_bytes_over_model", round(worst, 4))
    t.metric("bytes_per_server", per_server)
    t.say(f"every worker within {abs(worst - 1):.1%} of 2 x model bytes per step")


@CHECKS.check("shards balanced: each server holds about 1/S of the keys", points=1)
def shards_balanced(t: CheckContext) -> None:
    worst = 1.0
    for task_run in sweep(t):
        case: cases.Case = task_run.task.args[0]
        layout, problem = readings.shard_layout(case, task_run.values)
        if problem is not None:
            t.fail(problem if not layout else f"{case.label()}: {problem}")
        sizes = [hi - lo for lo, hi in layout]
        ratio = readings.balance(sizes)
        if ratio > cases.BALANCE_LIMIT:
            listed = ", ".join(f"server {s}: {n}" for s, n in enumerate(sizes))
            t.fail(f"{case.label()}: shards of {listed} keys; expected about D/S = "
                   f"{case.keys / case.servers:.0f} each (largest at most {cases.BALANCE_LIMIT}x the "
                   "smallest): split the key range into S nearly equal parts")
        worst = max(worst, ratio)
    t.metric("worst_shard_ratio", round(worst, 4))
    t.say(f"largest shard at most {worst:.3f}x the smallest")


@CHECKS.check("a late worker does not make a server mix steps", points=3)
def late_worker(t: CheckContext) -> None:
    runs = sweep(t)
    task_run = runs[-1]
    case: cases.Case = task_run.task.args[0]
    t.say(f"{case.label()}; every message of worker rank {case.late} leaves "
          f"{cases.LATE_S * 1e3:.0f} ms late, in real time too")
    problem = readings.model_problem(task_run)
    if problem is None:
        wall = max(o.wall_s for o in task_run.outcomes)
        t.metric("late_case_wall_s", round(wall, 3))
        t.say(f"the model is right with rank {case.late} late ({wall:.2f} s of wall time)")
        return
    if "mixed two steps" not in problem and all(readings.model_problem(r) is None for r in runs[:-1]):
        problem += ("; the same code is right when no worker is late, so a server took a message "
                    "into the wrong step: answer the pull of step k only after applying step "
                    "k - 1, and count a push only in the step it is tagged with")
    t.fail(f"with worker rank {case.late} late: {problem}")


@CHECKS.check("virtual time per step near the bound: every worker computes at once", points=2)
def time_per_step(t: CheckContext) -> None:
    task_run = next(r for r in sweep(t) if r.task.args[0].what == "the timed case")
    case: cases.Case = task_run.task.args[0]
    problem = readings.model_problem(task_run)  # a right model before its time is graded
    if problem is not None:
        t.fail(problem)
    b = models.step_bound(case, t.platform)
    measured = t.measured_time(task_run) / case.steps
    t.performance(measured * case.steps, b.bound * case.steps, task_run)
    t.metric("bound_per_step_s", b.bound)
    t.say(f"{case.label()} on {t.platform.name}: {fmt(measured)} per step {t.clock}, bound "
          f"{fmt(b.bound)} ({measured / b.bound:.3f}x), allowed {fmt(b.limit)}")
    if measured <= b.limit:
        return
    seen = f"{fmt(measured)} per step, {measured / b.bound:.2f}x the bound {fmt(b.bound)}"
    if case.workers > 1 and measured >= 0.9 * b.compute_sum:
        t.fail(f"{case.label()}: {seen}, about the workers' compute times added up "
               f"({fmt(b.compute_sum)}) rather than the longest ({fmt(b.compute)}): the workers "
               "waited for each other's compute; does a server send its shard to one worker and "
               "wait for that worker's push before it serves the next?")
    t.fail(f"expected at most {fmt(b.limit)} per step (10% over the bound, plus one latency per "
           f"rank); saw {seen}: does each server send its W shards at once, and each worker push "
           "to every server at once?")


# -- the free run (distlab run, mpirun) -----------------------------------------------------------


def main(comm, solution, servers="auto", keys="4096", batch="512", steps="30", lr="2.0", seed="1"):
    """A free run (distlab run, mpirun): S servers and p - S workers train the CTR model.

    Afterwards (outside the learner's code) the servers send their shards to rank 0, which
    reports the log loss before and after, the AUC on held-out impressions, and whether the model
    equals single-process gradient descent on the global batch."""
    p, rank = comm.Get_size(), comm.Get_rank()
    S = max(1, p // 2) if servers == "auto" else int(servers)
    if not 1 <= S < p:
        raise ValueError(f"need 1 <= servers < ranks; got servers={S} with {p} ranks")
    W, D, n = p - S, int(keys), int(batch)
    case = cases.Case(S, W, D, (n,) * W, int(steps), float(lr), int(seed), "free run")
    result = programs.run_ps(comm, solution, case)
    comm.mark("gather")  # not the learner's: collect the shards on rank 0 for the report
    if rank == 0:
        model = np.full(D, np.nan)
        shards = [(result.lo, result.shard)]
        for s in range(1, S):
            head = np.empty(2)
            comm.Recv(head, source=s, tag=90)
            values = np.empty(int(head[1]))
            comm.Recv(values, source=s, tag=91)
            shards.append((int(head[0]), values))
        for lo, values in shards:
            if lo is not None and values is not None:
                model[lo:lo + len(values)] = values
    elif rank < S:
        lo, values = result.lo or 0, result.shard if result.shard is not None else np.empty(0)
        comm.Send(np.array([lo, len(values)], dtype=np.float64), dest=0, tag=90)
        comm.Send(values, dest=0, tag=91)
    if rank != 0:
        return None
    train = programs.Batch(*models.global_batch(case))
    held_out = programs.Batch(*cases.impressions(case.seed, 1, 4 * n, D))
    verdict = ("equals" if np.allclose(model, models.sgd(case), rtol=cases.RTOL, atol=cases.ATOL)
               else "DIFFERS FROM")
    return (f"S={S} W={W} keys={D} batch={W}x{n} steps={case.steps}: train log loss "
            f"{train.loss(cases.initial_weights(case)):.4f} -> {train.loss(np.nan_to_num(model)):.4f}, "
            f"held-out AUC {models.auc(held_out.y, held_out.X @ np.nan_to_num(model)):.3f}; the model "
            f"{verdict} single-process gradient descent")
