"""How problem 14 reads a run: the table the servers hold and the mistake behind a wrong one, a
worker's bytes per step, each grid point's time on the replay, what the cost model gets wrong, and
the card's cost formulas (the reference's step_times, computed here, never in a rank)."""

from typing import Any

import numpy as np

from distlab.grading import CaseRun, TaskRun, first_mismatch

from . import cases
from .cases import FIELDS, ID_BYTES, VALUE_BYTES, Data, Grid, Run

SLACK = 64  # bytes allowed per message besides ids, rows and gradients (counts, headers)
SUMMED = ("sum the gradients of a repeated id over its occurrences: np.add.at(summed, where, grads); "
          "summed[where] += grads writes each repeated index once")


def step_costs(rows, dim, touched, workers, servers, alpha, beta, row_cost):
    """(parameter-server seconds, allreduce seconds) of one step, as the card writes them."""
    row_bytes = VALUE_BYTES * dim
    served = touched * workers / servers  # rows one server looks up, sends, receives and updates
    busiest = max(served, touched)  # the busiest port: a server's, or a worker's when S > W
    sparse = 3 * alpha + 2 * row_cost * served + (ID_BYTES * served + 2 * row_bytes * busiest) * beta
    dense = 2 * (workers - 1) * alpha + 2 * (workers - 1) / workers * rows * row_bytes * beta
    return sparse, dense


def grid_costs(g: Grid) -> list[tuple[float, float]]:
    return [step_costs(d.rows, d.dim, u, g.workers, g.servers, g.alpha, g.beta, g.row_cost) for d, u in g.points]


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


# -- the trained table -----------------------------------------------------------------------------


def close(got: np.ndarray, want: np.ndarray) -> bool:
    return first_mismatch(got, want, rtol=cases.RTOL, atol=cases.ATOL) is None


def table_of(run: CaseRun) -> np.ndarray:
    """The table the servers hold at the end (row r is server r % S's row r // S)."""
    case = run.case
    table = np.empty((case.data.rows, case.data.dim), dtype=np.float32)
    for s in range(case.servers):
        table[s :: case.servers] = run.values[s]
    return table


def table_problem(data: Data, workers: int, got: np.ndarray, head: str) -> str | None:
    """None if ``got`` is single-process SGD's table, else what is wrong (named where a mistake fits exactly)."""
    want = cases.train(data, workers)
    if close(got, want):
        return None
    if close(got, cases.initial_table(data)):
        return f"{head} is still the initial table: no update was applied"
    if close(got, cases.train(data, workers, keep_last=True)):
        return (f"{head} equals training where a repeated id keeps the gradient of its last occurrence only: "
                f"the gradients of repeated ids were overwritten, not summed; {SUMMED}")
    bad = first_mismatch(got, want, rtol=cases.RTOL, atol=cases.ATOL)
    return (f"{head} differs from single-process SGD in {bad.wrong} of {bad.total} values; row {bad.index // data.dim}: "
            f"expected {bad.expected:.7g}, saw {bad.seen:.7g}")


def duplicates_problem(data: Data, workers: int, got: np.ndarray, head: str) -> str | None:
    """One step: each row's update, read apart where a batch repeats the row's id and where it does not."""
    # The cause is named only when the whole table is that of a worker keeping one occurrence.
    start = cases.initial_table(data).astype(np.float64)
    update, want = got - start, cases.train(data, workers) - start
    repeats = np.max([np.bincount(cases.batch_ids(data, w, 0).ravel(), minlength=data.rows) for w in range(workers)], 0)
    wrong = ~np.isclose(update, want, rtol=cases.RTOL, atol=cases.ATOL).all(axis=1)
    if not wrong.any() or not (repeats[wrong] > 1).all():  # right, or wrong where ids occur once too
        return None if not wrong.any() else table_problem(data, workers, got, head)
    row = int(np.flatnonzero(wrong)[np.argmax(repeats[wrong])])
    kept = close(got, cases.train(data, workers, keep_last=True))
    return (f"{head}: every row whose id occurs once in a batch is right, but {int(wrong.sum())} row(s) repeated "
            f"in a batch are wrong; row {row} occurs {repeats[row]} times in one batch and moved by "
            f"{np.abs(update[row]).sum():.4g} (sum of |update|), expected {np.abs(want[row]).sum():.4g}"
            + (f"; the table matches keeping only the last occurrence of each repeated id: {SUMMED}" if kept else ""))


# -- bytes -----------------------------------------------------------------------------------------


def distinct(data: Data, worker: int, step: int) -> int:
    return int(np.unique(cases.batch_ids(data, worker, step)).size)


def worker_bytes(task: TaskRun, case: Run, worker: int, phase: str, nth: int = 0) -> tuple[int, int]:
    """(bytes the worker sent, bytes the servers sent it) in its ``nth`` step of ``phase``."""
    rank = case.servers + worker
    received = sum(task.phases(s, phase)[nth].sent_bytes.get(rank, 0) for s in range(case.servers))
    return task.phases(rank, phase)[nth].bytes_sent, received


def bytes_limit(case: Run, touched: int) -> int:
    return touched * (2 * ID_BYTES + 2 * VALUE_BYTES * case.data.dim) + 4 * SLACK * case.servers


def bytes_problem(run: CaseRun, worker: int, step: int) -> tuple[int, str | None]:
    """A worker's bytes in one step, and what is wrong when they pass the card's limit."""
    case, data, row = run.case, run.case.data, VALUE_BYTES * run.case.data.dim
    sent, received = worker_bytes(run.task, case, worker, case.what, step)
    moved, limit = sent + received, bytes_limit(case, distinct(data, worker, step))
    head = (f"{case.label()}: worker rank {case.servers + worker}, step {step}: {moved:,} bytes for "
            f"{distinct(data, worker, step)} distinct rows; expected at most {limit:,} (touched x (16 + 8 x dim) "
            f"+ {SLACK} per message)")
    if moved == 0 or moved <= limit:
        return moved, None if moved else f"{head}: it neither pulled nor pushed"
    shard = -(-data.rows // case.servers) * row
    if received >= 0.9 * shard:
        return moved, f"{head}: the servers sent it {received:,} bytes, whole shards: send only the rows asked for"
    if sent >= 0.9 * shard:
        return moved, (f"{head}: it pushed {sent:,} bytes, a gradient for every row of a shard: push only the rows "
                       "the batch touched")
    if received >= 0.9 * data.batch * FIELDS * row:
        return moved, (f"{head}: it pulled about one row per id occurrence ({data.batch * FIELDS} occurrences): "
                       "de-duplicate the ids (np.unique) and pull each distinct row once")
    return moved, f"{head}: {sent:,} bytes sent and {received:,} received"


# -- time on the grid ------------------------------------------------------------------------------


def point_times(task: TaskRun, count: int) -> list[float]:
    """Each grid point's span on the replay: from the first rank's "point i" mark to the last
    rank's next mark (every rank starts a point as it leaves the barrier before it)."""
    timeline, spans = task.timeline(), [[float("inf"), 0.0] for _ in range(count)]
    for rank in timeline.ranks:
        marks = timeline.marks(rank)
        for (name, at), (_, until) in zip(marks, marks[1:]):
            if name.startswith("point "):
                span = spans[int(name.split()[1])]
                span[0], span[1] = min(span[0], at), max(span[1], until)
    return [end - begin for begin, end in spans]


def moved_rows(task: TaskRun, g: Grid, i: int) -> bool:
    """Whether every worker of a parameter-server grid point pushed, and was sent, its distinct rows."""
    data = g.points[i][0]
    case = Run(g.servers, g.workers, data, f"point {i}")
    return all(min(worker_bytes(task, case, w, case.what)) >= distinct(data, w, 0) * VALUE_BYTES * data.dim
               for w in range(g.workers))


def slow_step(task: TaskRun, g: Grid, i: int, dense: bool) -> str:
    """What the counters of a slow step show, where they show something."""
    data, case = g.points[i][0], Run(g.servers, g.workers, g.points[i][0], f"point {i}")
    if dense and (sent := task.phases(0, case.what)[0].op_bytes.get("Allreduce", 0)) >= 8 * data.rows * data.dim:
        return f": its Allreduce carried {sent:,} bytes, 8 per value: the gradient is float64 (np.zeros defaults to it)"
    for w in range(0 if dense else g.workers):
        if (moved := sum(worker_bytes(task, case, w, case.what))) > bytes_limit(case, distinct(data, w, 0)):
            return f": worker rank {g.servers + w} moved {moved:,} bytes, more than its touched rows need (see the byte check)"
    return "" if dense else ": open its timeline (distlab run 14 --trace t.json) to see who waits for whom"


# -- the cost model --------------------------------------------------------------------------------


def model_lines(g: Grid, answers: list[Any], measured: list[list[float]], tolerance: float) -> tuple[int, list[str]]:
    """How many points the model gets within ``tolerance`` on both paths, and a line per point."""
    good = [all(abs(a[k] / measured[k][i] - 1) <= tolerance for k in (0, 1)) for i, a in enumerate(answers)]
    return sum(good), [f"{g.where(i)}: parameter server {fmt(measured[0][i])}, allreduce {fmt(measured[1][i])}; "
                       f"your model {'agrees' if ok else 'is off'}" for i, ok in enumerate(good)]


def broken_answer(answers: list[Any]) -> str | None:
    for a in answers:
        if isinstance(a, str):
            return a
        if not all(np.isfinite(a[:2])) or min(a[:2]) <= 0:
            return f"step_times returned {a[:2]!r}; expected two positive seconds: (parameter server, allreduce)"
        if a[2] not in ("parameter server", "allreduce"):
            return f"choose returned {a[2]!r}; expected \"parameter server\" or \"allreduce\""
    return None


def model_problem(g: Grid, answers: list[Any], measured: list[list[float]], head: str) -> str:
    """The pattern of the model's errors, named where it points at one cause."""
    ratio = np.array([[a[k] / m for a, m in zip(answers, measured[k])] for k in (0, 1)])
    worst = int(np.argmax(np.abs(np.log(ratio)).max(axis=0)))
    head += (f"; worst at {g.where(worst)}: it predicts {fmt(answers[worst][0])} and {fmt(answers[worst][1])}, "
             f"measured {fmt(measured[0][worst])} and {fmt(measured[1][worst])}")
    spreads = [ratio[0][[i for i, (d, _) in enumerate(g.points) if d.dim == dim]] for dim in {d.dim for d, _ in g.points}]
    if all(s.max() > 2 * s.min() for s in spreads):  # at one dimension, wrong by factors that differ 2x and more
        return (f"{head}. At every dimension your parameter-server time is off by factors that differ 2x or more from "
                "one touched fraction to the next: it does not follow the rows a batch touches as the step does")
    return head


def wrong_choices(g: Grid, answers: list[Any], measured: list[list[float]], tolerance: float) -> list[str]:
    """Points where choose picked the slower path while the two differ by more than ``tolerance``."""
    return [f"{g.where(i)}: it chose {a[2]}, measured {fmt(ps)} against {fmt(ar)}"
            for i, (a, ps, ar) in enumerate(zip(answers, *measured))
            if abs(ps / ar - 1) > tolerance and a[2] != ("parameter server" if ps < ar else "allreduce")]


def card_crossovers(platform: Any, hosts: int = 8, rows: int = 10**6) -> str:
    """Where the parameter server starts to win on the card's cluster, and how far the 1024 rule holds."""
    route = platform.route(0, 1)

    def wins(dim: int, density: float) -> bool:
        sparse, dense = step_costs(rows, dim, density * rows, hosts, hosts, route.alpha_s, route.beta_s_per_byte,
                                   cases.ROW_COST_S)
        return sparse < dense

    found = ", ".join(f"from d = {next((2**k for k in range(15) if wins(2**k, f)), 'never')} at {f:.1%}"
                      for f in (0.001, 0.01, 0.1, 0.3, 0.5))
    limit = max((f / 1000 for f in range(1, 1000) if wins(1024, f / 1000)), default=0.0)
    return (f"on the card's cluster ({hosts} workers, {hosts} servers, {rows:,} rows) the parameter server wins {found} "
            f"touched: 'past dimension 1024 the parameter server wins' holds while batches touch less than {limit:.1%}")
