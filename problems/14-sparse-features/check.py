"""Checks for problem 14, large sparse features: a parameter server or an allreduce?

One launch runs every case (cases.py draws them from the seed): both paths train a factorization
machine's table (the parameter server with one worker 5 ms late), against single-process SGD
simulated in judging.py from every worker's data (a rank is handed only its own: cases.Run.for_rank),
with the traffic a right table must have come through (each worker's rows pulled and their
gradients pushed, from the counters, never from what a rank returned); one step shows each row's
update where a batch repeats an id; the harness's counters give every worker's bytes (its touched
rows each way with each server at least, the card's limit at most); a hidden grid
of 4 dimensions x 4 touched fractions times one step of each path, against the card's cost and
against the learner's cost model, both read off a replay whose declared hash-table work is checked
against what the harness's shard declares."""

from dataclasses import replace

import numpy as np

from distlab.grading import CheckContext, Checklist, Run, Task, faults, uniform

from . import cases, judging, programs
from .cases import initial_table
from .judging import fmt

SPARSE_SLACK, DENSE_SLACK = 1.25, 1.10  # a step at most this much over the card's cost
MODEL_TOLERANCE, MODEL_SHARE = 0.20, 0.90  # the cost model within 20% of both times on 90% of the points

CHECKS = Checklist()


@CHECKS.run
def plan(t: CheckContext) -> cases.Session:
    return cases.session(t.seed)


@CHECKS.run
def everything(t: CheckContext, plan: cases.Session) -> Run:
    main, grid = plan.sparse[0], plan.grid
    late = faults.plan(faults.delay(src=main.late, latency_s=cases.LATE_S, wall=True,
                                    note="a worker on a congested host: its messages leave 5 ms late"),
                       seed=t.seed, where="the 14 parameter-server cases")
    cluster, dense = uniform(grid.servers + grid.workers, grid.alpha, grid.beta), replace(grid, mode="dense")
    # Each step's counters and each grid point's time run from one of the program's marks to the
    # next: marks the learner's code sets of other names cut nothing (Task.marks), and a rank that
    # set one of the program's names itself fails the checks that read them (judging.marks_problem).
    marks = judging.task_marks
    return t.launch(programs.run_case, [
        Task(main.servers + main.workers, cases=list(plan.sparse), faults=late, label="the parameter server's cases",
             marks=marks(list(plan.sparse))),
        Task(main.workers, cases=list(plan.dense), label="the allreduce baseline's cases", marks=marks(list(plan.dense))),
        Task(grid.servers + grid.workers, case=grid, platform=cluster, label="the grid, parameter server",
             marks=marks(grid)),
        Task(grid.workers, case=dense, platform=cluster, label="the grid, allreduce", marks=marks(dense)),
        Task(1, case=replace(grid, mode="model"), label="the cost model on the grid")])


@CHECKS.check("both paths train the table of single-process SGD, a worker 5 ms late", points=4)
def same_embeddings(t: CheckContext, everything: Run) -> None:
    sparse, dense = everything.cases()[0], everything.cases()[3]
    case, data = sparse.case, sparse.case.data
    t.say(f"{case.label()}; every message of worker rank {case.late} leaves {cases.LATE_S * 1e3:.0f} ms late")
    got, problem = judging.table_of(sparse)
    if problem or (problem := judging.table_problem(data, case.workers, got, "the servers' table after training")):
        t.fail(problem if got is None else f"{case.label()}: {problem}")
    replicas, problem = judging.dense_tables(dense)
    if problem:
        t.fail(problem)
    for w, table in enumerate(replicas):
        if w and not np.array_equal(table, replicas[0]) and judging.close(replicas[0], judging.train(data, case.workers)):
            t.fail(f"{dense.case.label()}: worker {w}'s table differs from worker 0's, which is right: every worker "
                   "must apply the same summed gradient; is the allreduce missing?")
        if problem := judging.table_problem(data, case.workers, table, f"worker {w}'s table after training"):
            t.fail(f"{dense.case.label()}: {problem}" + "; dense_step updates `table` in place" * ("initial" in problem))
    if problem := judging.marks_problem(sparse.task) or judging.marks_problem(dense.task):
        t.fail(problem)
    if problem := judging.pushes_problem(sparse, "the servers' table after training"):
        t.fail(f"{case.label()}: {problem}")
    if problem := judging.exchange_problem(dense, "the table"):
        t.fail(f"{dense.case.label()}: {problem}")
    before, after = judging.held_out_loss(data, initial_table(data)), judging.held_out_loss(data, got)
    t.metric("held_out_loss", [round(before, 4), round(after, 4)])
    losses = judging.batch_losses(sparse)
    t.say("the workers' batch loss, step by step: " + (", ".join(f"{x:.4f}" for x in losses) if losses is not None
                                                        else "not reported") + f"; held-out loss {before:.4f} -> {after:.4f}")
    t.say(f"both tables are single-process SGD's (rtol {cases.RTOL:g}), {float(np.max(np.abs(got - replicas[0]))):.1e} "
          f"apart, with rank {case.late} late ({sparse.task.wall_s():.2f} s of wall time)")


@CHECKS.check("duplicate ids in a batch are summed, not overwritten", points=3)
def duplicates_summed(t: CheckContext, everything: Run) -> None:
    sparse, dense = everything.cases()[1], everything.cases()[4]
    data, ids = sparse.case.data, cases.batch_ids(sparse.case.data, 0, 0)
    t.say(f"one step; worker 0's batch holds {ids.size} ids, {np.unique(ids).size} distinct; its most popular row "
          f"occurs {np.bincount(ids.ravel()).max()} times")
    (table, problem), (replicas, other) = judging.table_of(sparse), judging.dense_tables(dense)
    if problem or other:
        t.fail(problem or other)
    tables = [(sparse.case, "the parameter server", table)]
    tables += [(dense.case, f"the allreduce (worker {w})", replica) for w, replica in enumerate(replicas)]
    for case, path, table in tables:
        if problem := judging.duplicates_problem(data, case.workers, table, f"{path}'s table after one step"):
            t.fail(f"{case.label()}: {problem}")
    if problem := judging.marks_problem(sparse.task) or judging.marks_problem(dense.task):
        t.fail(problem)
    if problem := judging.pushes_problem(sparse, "the parameter server's table after one step"):
        t.fail(f"{sparse.case.label()}: {problem}")
    if problem := judging.exchange_problem(dense, "the allreduce's table after one step"):
        t.fail(f"{dense.case.label()}: {problem}")
    t.say("every row's update is the sum of its occurrences' gradients, on both paths")


@CHECKS.check("a worker's bytes follow the rows its batch touches, not the table", points=3)
def bytes_follow_touched_rows(t: CheckContext, everything: Run) -> None:
    main, _, million = everything.cases()[:3]
    if problem := judging.marks_problem(main.task):
        t.fail(problem)
    t.say("each worker, each step: at least its distinct rows each way with the server that holds each one, "
          "at most touched x (16 + 8 x dim) bytes")
    per_row: dict[str, list[float]] = {}
    for run in (main, million):
        for w in range(run.case.workers):
            for step in range(run.case.data.steps):
                moved, problem = judging.bytes_problem(run, w, step)
                if problem:
                    t.fail(problem)
                per_row.setdefault(run.case.what, []).append(moved / judging.distinct(run.case.data, w, step))
                small = judging.bytes_problem(main, w, step)[0]
                t.expect(moved <= 1.01 * small + 16, f"the bytes of the same batches on {main.case.data.rows:,} rows ({small:,})",
                         f"{moved:,} for worker rank {run.case.servers + w}, step {step}, of {run.case.label()}: "
                         "its bytes grew with the table")
    t.metric("bytes_per_touched_row", {what: round(float(np.mean(v)), 1) for what, v in per_row.items()})
    t.say("; ".join(f"{what}: {np.mean(v):.1f} bytes per touched row (8 x dim = {8 * main.case.data.dim})"
                    for what, v in per_row.items()))


@CHECKS.check(f"each step within the card's cost: parameter server {SPARSE_SLACK}x, allreduce {DENSE_SLACK}x", points=2)
def steps_cost_what_the_card_says(t: CheckContext, plan: cases.Session, everything: Run) -> None:
    grid, (sparse, dense) = plan.grid, [r.task for r in everything.cases()[5:7]]
    t.say(f"{len(grid.points)} points, {grid.label()}")
    if problem := judging.marks_problem(sparse) or judging.marks_problem(dense):
        t.fail(problem)
    measured, costs = [judging.point_times(task, len(grid.points)) for task in (sparse, dense)], judging.grid_costs(grid)
    for i in range(len(grid.points)):
        if not judging.moved_rows(sparse, grid, i):
            t.fail(f"{grid.where(i)}: the parameter-server step did not move each worker's distinct rows both ways: not timed")
    if problem := judging.declared_problem(sparse, grid):
        t.fail(problem)
    for i in range(len(grid.points)):
        where = grid.where(i)
        for k, (path, task, slack) in enumerate((("parameter-server", sparse, SPARSE_SLACK), ("allreduce", dense, DENSE_SLACK))):
            if measured[k][i] > slack * costs[i][k]:
                t.fail(f"{where}: the {path} step took {fmt(measured[k][i])}, {measured[k][i] / costs[i][k]:.2f}x the "
                       f"card's {fmt(costs[i][k])} (at most {slack}x)" + judging.slow_step(task, grid, i, k == 1))
    t.metric("sparse_over_cost", [round(m / c[0], 4) for m, c in zip(measured[0], costs)])
    t.performance(sum(measured[0]), sum(c[0] for c in costs), sparse)
    t.say(f"every step within its cost; the parameter server's worst is {max(m / c[0] for m, c in zip(measured[0], costs)):.3f}x")


@CHECKS.check(f"the cost model agrees with the measured times on {MODEL_SHARE:.0%} of a hidden grid", points=4)
def cost_model_agrees(t: CheckContext, plan: cases.Session, everything: Run) -> None:
    grid, (sparse, dense, model) = plan.grid, everything.cases()[5:8]
    answers = model.values[0]
    if problem := judging.broken_answer(answers, len(grid.points)):
        t.fail(problem)
    if problem := judging.marks_problem(sparse.task) or judging.marks_problem(dense.task):
        t.fail(f"not graded: {problem}")
    if not all(judging.moved_rows(sparse.task, grid, i) for i in range(len(grid.points))):
        t.fail("not graded: the parameter-server steps of the grid did not move the touched rows (see the byte check)")
    if judging.declared_problem(sparse.task, grid):
        t.fail("not graded: the declared compute differs from the harness's on the parameter-server steps of the grid "
               "(see the previous check)")
    measured = [judging.point_times(run.task, len(grid.points)) for run in (sparse, dense)]
    if problem := judging.unmeasured(grid, measured):
        t.fail(f"not graded: {problem}")
    t.say(grid.label())
    agree, lines = judging.model_lines(grid, answers, measured, MODEL_TOLERANCE)
    for line in lines:
        t.say(line)
    t.metric("agreeing_points", agree)
    if agree < MODEL_SHARE * len(grid.points):
        head = f"{grid.label()}: your step_times agrees within {MODEL_TOLERANCE:.0%} at {agree} of {len(grid.points)} points"
        off_cost = any(m > slack * c[k] for k, slack in ((0, SPARSE_SLACK), (1, DENSE_SLACK))
                       for m, c in zip(measured[k], judging.grid_costs(grid)))
        t.fail(head + " (the steps themselves cost more than the card's formulas: see the previous check)" if off_cost
               else judging.model_problem(grid, answers, measured, head))
    if wrong := judging.wrong_choices(grid, answers, measured, MODEL_TOLERANCE):
        t.fail(f"choose picked the slower path where the two differ by more than {MODEL_TOLERANCE:.0%}: {wrong[0]}")
    t.say(judging.card_crossovers(t.platform))
