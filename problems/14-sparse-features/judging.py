"""How problem 14 reads a run: single-process SGD (the table every case must end with, computed
here from every worker's data, which no rank holds), the table the servers hold and the mistake
behind a wrong one, the pushes that must have carried it, a worker's bytes per step, each grid
point's time and declared compute on the replay, what the cost model gets wrong, and the card's
cost formulas (the reference's step_times, computed here, never in a rank).

Whatever the ranks returned is checked for its shape before it is read: a learner's process can
return anything, and what is malformed fails the check that reads it, named."""

from dataclasses import replace
from typing import Any

import numpy as np

from distlab.grading import COLLECTIVES, CaseRun, Counts, TaskRun, first_mismatch

from . import cases
from .cases import (
    FIELDS,
    ID_BYTES,
    VALUE_BYTES,
    Data,
    Grid,
    Run,
    batch_ids,
    clicks,
    fm_gradients,
    fm_logits,
    initial_table,
)

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


# -- single-process SGD: every worker's data, the checker's alone ----------------------------------


def train(data: Data, workers: int, keep_last: bool = False) -> np.ndarray:
    """The table after data.steps steps of SGD on every worker's batch, in float64; ``keep_last``: a
    worker keeps the gradient of a repeated id's last occurrence only (summed[where] += grads)."""
    table, scale = initial_table(data).astype(np.float64), 1.0 / (workers * data.batch)
    for step in range(data.steps):
        total = np.zeros_like(table)
        for w in range(workers):
            ids = batch_ids(data, w, step).ravel()
            grads = fm_gradients(table[ids.reshape(-1, FIELDS)], clicks(data, ids.reshape(-1, FIELDS), w, step),
                                 scale)[0].reshape(-1, data.dim)
            if keep_last:
                last = ids.size - 1 - np.unique(ids[::-1], return_index=True)[1]
                total[ids[last]] += grads[last]
            else:
                np.add.at(total, ids, grads)
        table -= data.lr * total
    return table


def held_out_loss(data: Data, table: np.ndarray) -> float:
    ids = batch_ids(replace(data, batch=2000), 99, 0)
    logits = fm_logits(np.asarray(table, dtype=np.float64)[ids])[0]
    return float(np.mean(np.logaddexp(0.0, logits) - clicks(data, ids, 99, 0) * logits))


# -- the trained table -----------------------------------------------------------------------------


def close(got: np.ndarray, want: np.ndarray) -> bool:
    return first_mismatch(got, want, rtol=cases.RTOL, atol=cases.ATOL) is None


def as_table(value: Any, shape: tuple[int, int], head: str) -> tuple[np.ndarray | None, str | None]:
    """``value`` as a float32 array of ``shape``, or None and what is wrong with it."""
    try:
        array = np.asarray(value, dtype=np.float32)
    except Exception as exc:  # noqa: BLE001 - whatever a learner returned: a failed check, named
        return None, f"{head} is not an array of numbers ({type(value).__name__}: {type(exc).__name__})"
    if array.shape != shape:
        return None, f"{head} has shape {array.shape}, expected {shape} (rows x dim)"
    return array, None


def table_of(run: CaseRun) -> tuple[np.ndarray | None, str | None]:
    """The table the servers hold at the end (row r is server r % S's row r // S), or what is wrong
    with the rows a server returned."""
    case = run.case
    table = np.empty((case.data.rows, case.data.dim), dtype=np.float32)
    for s in range(case.servers):
        rows = len(range(s, case.data.rows, case.servers))
        table[s :: case.servers], problem = as_table(run.values[s] if s < len(run.values) else None,
                                                     (rows, case.data.dim), f"server {s}'s rows after training")
        if problem:
            return None, f"{case.label()}: {problem}"
    return table, None


def dense_tables(run: CaseRun) -> tuple[list[np.ndarray], str | None]:
    """Every allreduce worker's table, or what is wrong with what a worker returned."""
    tables, shape = [], (run.case.data.rows, run.case.data.dim)
    for w, value in enumerate(run.values):
        ok = isinstance(value, (tuple, list)) and len(value) == 2
        table, problem = as_table(value[0] if ok else value, shape, f"worker {w}'s table after training")
        if problem:
            return [], f"{run.case.label()}: {problem}"
        tables.append(table)
    return tables, None


def batch_losses(run: CaseRun) -> np.ndarray | None:
    """The parameter-server workers' batch loss per step (mean over the workers), if well formed."""
    try:
        losses = np.asarray(run.values[run.case.servers:], dtype=np.float64)
    except Exception:  # noqa: BLE001 - only said, never graded
        return None
    return losses.mean(0) if losses.ndim == 2 and losses.shape[0] == run.case.workers else None


# -- the pushes the table was made of --------------------------------------------------------------


def phase_of(task: TaskRun, rank: int, what: str, nth: int = 0) -> Counts:
    """The rank's counts in its ``nth`` phase ``what``; none (zeros) where it set no such mark."""
    found = task.phases(rank, what)
    return found[nth] if nth < len(found) else Counts()


def short_pair(task: TaskRun, case: Run, worker: int, step: int) -> tuple[int, int, int, int] | None:
    """(server, bytes sent, bytes received, rows) of the first server the worker, in its ``step``-th
    phase, sent fewer bytes than the gradients of the rows its batch touched there (4 x dim a row),
    or was sent fewer than those rows by; None if it moved at least its rows both ways with each."""
    rank, ids, row = case.servers + worker, np.unique(batch_ids(case.data, worker, step)), VALUE_BYTES * case.data.dim
    mine = phase_of(task, rank, case.what, step)
    for s in range(case.servers):
        rows = int(np.count_nonzero(ids % case.servers == s))
        sent, got = mine.sent_bytes.get(s, 0), phase_of(task, s, case.what, step).sent_bytes.get(rank, 0)
        if min(sent, got) < rows * row:
            return s, sent, got, rows
    return None


def pushes_problem(run: CaseRun, head: str) -> str | None:
    """None if, in every step, each worker sent each server at least the gradients of the rows its
    batch touched there (4 x dim bytes a row) and was sent those rows: the traffic a right table
    must have come through. Else the first pair short of it (a table that no push carried)."""
    case, row = run.case, VALUE_BYTES * run.case.data.dim
    for step in range(case.data.steps):
        for w in range(case.workers):
            if short := short_pair(run.task, case, w, step):
                s, sent, got, rows = short
                return (f"{head} is single-process SGD's, but in step {step} worker rank {case.servers + w} sent "
                        f"server {s} {sent:,} bytes and was sent {got:,}, fewer than the {rows} rows its batch "
                        f"touched there need each way ({rows * row:,} bytes): the gradients that reached the server "
                        "cannot have made that table")
    return None


def exchange_problem(run: CaseRun, head: str) -> str | None:
    """None if every allreduce worker exchanged something with the others in every step (its table
    needs their gradients), else the first worker and step that did not."""
    for w in range(run.case.workers):
        for step in range(run.case.data.steps):
            counts = phase_of(run.task, w, run.case.what, step)
            if not (counts.bytes_sent + counts.bytes_received
                    + sum(n for op, n in counts.op_bytes.items() if op in COLLECTIVES)):
                return (f"{head} is single-process SGD's, but worker {w} exchanged no bytes with the others in step "
                        f"{step}: the other workers' gradients cannot have reached it")
    return None


def table_problem(data: Data, workers: int, got: np.ndarray, head: str) -> str | None:
    """None if ``got`` is single-process SGD's table, else what is wrong (named where a mistake fits exactly)."""
    want = train(data, workers)
    if close(got, want):
        return None
    if close(got, initial_table(data)):
        return f"{head} is still the initial table: no update was applied"
    if close(got, train(data, workers, keep_last=True)):
        return (f"{head} equals training where a repeated id keeps the gradient of its last occurrence only: "
                f"the gradients of repeated ids were overwritten, not summed; {SUMMED}")
    bad = first_mismatch(got, want, rtol=cases.RTOL, atol=cases.ATOL)
    return (f"{head} differs from single-process SGD in {bad.wrong} of {bad.total} values; row {bad.index // data.dim}: "
            f"expected {bad.expected:.7g}, saw {bad.seen:.7g}")


def duplicates_problem(data: Data, workers: int, got: np.ndarray, head: str) -> str | None:
    """One step: each row's update, read apart where a batch repeats the row's id and where it does not."""
    # The cause is named only when the whole table is that of a worker keeping one occurrence.
    start = initial_table(data).astype(np.float64)
    update, want = got - start, train(data, workers) - start
    repeats = np.max([np.bincount(batch_ids(data, w, 0).ravel(), minlength=data.rows) for w in range(workers)], 0)
    wrong = ~np.isclose(update, want, rtol=cases.RTOL, atol=cases.ATOL).all(axis=1)
    if not wrong.any() or not (repeats[wrong] > 1).all():  # right, or wrong where ids occur once too
        return None if not wrong.any() else table_problem(data, workers, got, head)
    row = int(np.flatnonzero(wrong)[np.argmax(repeats[wrong])])
    kept = close(got, train(data, workers, keep_last=True))
    return (f"{head}: every row whose id occurs once in a batch is right, but {int(wrong.sum())} row(s) repeated "
            f"in a batch are wrong; row {row} occurs {repeats[row]} times in one batch and moved by "
            f"{np.abs(update[row]).sum():.4g} (sum of |update|), expected {np.abs(want[row]).sum():.4g}"
            + (f"; the table matches keeping only the last occurrence of each repeated id: {SUMMED}" if kept else ""))


# -- bytes -----------------------------------------------------------------------------------------


def distinct(data: Data, worker: int, step: int) -> int:
    return int(np.unique(batch_ids(data, worker, step)).size)


def worker_bytes(task: TaskRun, case: Run, worker: int, what: str, nth: int = 0) -> tuple[int, int]:
    """(bytes the worker sent, bytes the servers sent it) in its ``nth`` step of phase ``what``."""
    rank = case.servers + worker
    received = sum(phase_of(task, s, what, nth).sent_bytes.get(rank, 0) for s in range(case.servers))
    return phase_of(task, rank, what, nth).bytes_sent, received


def bytes_limit(case: Run, touched: int) -> int:
    return touched * (2 * ID_BYTES + 2 * VALUE_BYTES * case.data.dim) + 4 * SLACK * case.servers


def bytes_problem(run: CaseRun, worker: int, step: int) -> tuple[int, str | None]:
    """A worker's bytes in one step, and what is wrong when they pass the card's limit or fall short
    of its touched rows, each pulled from and pushed to the server that holds it."""
    case, data, row = run.case, run.case.data, VALUE_BYTES * run.case.data.dim
    sent, received = worker_bytes(run.task, case, worker, case.what, step)
    moved, limit = sent + received, bytes_limit(case, distinct(data, worker, step))
    head = (f"{case.label()}: worker rank {case.servers + worker}, step {step}: {moved:,} bytes for "
            f"{distinct(data, worker, step)} distinct rows; expected at most {limit:,} (touched x (16 + 8 x dim) "
            f"+ {SLACK} per message)")
    if moved == 0:
        return moved, f"{head}: it neither pulled nor pushed"
    if moved <= limit:
        # Few bytes follow the rows only if they carried them: a token per step is not a row.
        if short := short_pair(run.task, case, worker, step):
            s, to, back, rows = short
            return moved, (f"{case.label()}: worker rank {case.servers + worker}, step {step}: it sent server {s} "
                           f"{to:,} bytes and was sent {back:,}, fewer than the {rows} distinct rows its batch "
                           f"touched there ({rows * row:,} bytes, 4 x dim each way): too few bytes to have carried "
                           "its rows and their gradients")
        return moved, None
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


# -- the harness's marks ---------------------------------------------------------------------------


def program_marks(case: Any) -> list[str]:
    """The marks programs.run_case sets on every rank, in order, for ``case`` (a list of cases, a
    grid or one case): "between" before each case, its phase at every step, "done" after it."""
    if isinstance(case, list):
        return [name for one in case for name in ["between", *program_marks(one)]]
    if isinstance(case, Grid):
        if case.mode == "model":
            return []
        return [name for i, (data, _) in enumerate(case.points)
                for name in ["between", *[f"point {i}"] * data.steps, "done"]] + ["between"]
    return [case.what] * case.data.steps + ["done"]


def task_marks(case: Any) -> tuple[str, ...]:
    """The names of the marks the program sets for ``case``, for Task(marks=...): the phases and
    the spans on the replay begin and end at those alone, not at the learner's own marks."""
    return tuple(sorted(set(program_marks(case))))


def harness_marks(task: Any, rank: int) -> list[tuple[str, float]]:
    """The rank's marks on the replay of the names the program sets (all where the task names none)."""
    names = getattr(getattr(task, "spec", None), "marks", ())
    return [(name, at) for name, at in task.timeline().marks(rank) if not names or name in names]


def marks_problem(task: TaskRun) -> str | None:
    """None if every rank set exactly the program's marks, in its order; else the first rank that
    set one more, one fewer or another in its place (the learner's code calling comm.mark with a
    name the program uses: it would cut a phase, or a grid point's time, short)."""
    spec = task.spec
    if head := task.marks_differ(program_marks(list(spec.cases) if spec.cases is not None else spec.case)):
        return (f"{head}: the harness marks every step itself, and its phases and times run from one of its "
                "marks to the next (your own marks may have other names)")
    return None


def point_times(task: TaskRun, count: int) -> list[float]:
    """Each grid point's span on the replay: from the first rank's "point i" mark to the last
    rank's next mark of the harness's (every rank starts a point as it leaves the barrier before
    it); infinite for a point no rank marked. Marks of other names, the learner's own, cut nothing."""
    timeline, spans = task.timeline(), [[float("inf"), 0.0] for _ in range(count)]
    for rank in timeline.ranks:
        marks = harness_marks(task, rank)
        for (name, at), (_, until) in zip(marks, marks[1:]):
            if (i := point_index(name, count)) is not None:
                span = spans[i]
                span[0], span[1] = min(span[0], at), max(span[1], until)
    return [end - begin if end >= begin else float("inf") for begin, end in spans]


def point_index(name: str, count: int) -> int | None:
    """The grid point a mark "point i" begins, None for any other mark."""
    head, _, number = name.partition(" ")
    return int(number) if head == "point" and number.isdigit() and int(number) < count else None


def declared_problem(task: TaskRun, g: Grid) -> str | None:
    """None if every server declared, at every grid point, at least the hash table's work the harness's
    shard declares for the rows it served: row_cost x the distinct rows the workers asked it for, for
    "lookup" and again for "add". Declared compute comes from the learner's process (a patched shard
    can skip it), and the step's time and the cost model's agreement are read off it."""
    timeline, count = task.timeline(), len(g.points)
    names = getattr(getattr(task, "spec", None), "marks", ())
    for s in range(g.servers):
        declared: dict[tuple[int, str], float] = {}
        at: int | None = None
        for span in timeline.events(s):
            if span.kind == "mark" and (not names or span.name in names):  # the learner's own: nothing
                at = point_index(span.name, count)
            elif span.kind == "compute" and at is not None:
                declared[at, span.name] = declared.get((at, span.name), 0.0) + span.seconds
        for i, (data, _) in enumerate(g.points):
            asked = np.unique(np.concatenate([np.unique(batch_ids(data, w, 0)) for w in range(g.workers)]))
            rows = int(np.count_nonzero(asked % g.servers == s))
            for call in ("lookup", "add"):
                if declared.get((i, call), 0.0) < g.row_cost * rows * (1 - 1e-6):
                    return (f"{g.where(i)}: the declared compute differs from the harness's: server {s} declared "
                            f"{fmt(declared.get((i, call), 0.0))} of {call!r}, while its shard declares row_cost x "
                            f"rows = {fmt(g.row_cost * rows)} at least for the {rows} distinct rows the workers "
                            f"asked it for: the hash table's work must go through shard.lookup and shard.add")
    return None


def moved_rows(task: TaskRun, g: Grid, i: int) -> bool:
    """Whether every worker of a parameter-server grid point pushed, and was sent, its distinct rows."""
    data = g.points[i][0]
    case = Run(g.servers, g.workers, data, f"point {i}")
    return all(min(worker_bytes(task, case, w, case.what)) >= distinct(data, w, 0) * VALUE_BYTES * data.dim
               for w in range(g.workers))


def slow_step(task: TaskRun, g: Grid, i: int, dense: bool) -> str:
    """What the counters of a slow step show, where they show something."""
    data, case = g.points[i][0], Run(g.servers, g.workers, g.points[i][0], f"point {i}")
    if dense and (sent := phase_of(task, 0, case.what).op_bytes.get("Allreduce", 0)) >= 8 * data.rows * data.dim:
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


def broken_answer(answers: Any, count: int) -> str | None:
    if not isinstance(answers, list) or len(answers) != count:
        return f"the cost model's answers came back as {type(answers).__name__}, not one per grid point ({count})"
    for a in answers:
        if isinstance(a, str):
            return a
        if not (isinstance(a, tuple) and len(a) == 3 and all(isinstance(x, float) for x in a[:2])):
            seconds = a[:-1] if isinstance(a, tuple) else a
            return (f"step_times returned {shown(seconds)}; expected two positive seconds: (parameter server, "
                    "allreduce)")
        if not all(np.isfinite(a[:2])) or min(a[:2]) <= 0:
            return f"step_times returned {a[:2]!r}; expected two positive seconds: (parameter server, allreduce)"
        if not isinstance(a[2], str) or a[2] not in ("parameter server", "allreduce"):
            return f"choose returned {shown(a[2])}; expected \"parameter server\" or \"allreduce\""
    return None


def shown(value: Any) -> str:
    """A learner's value in a message, whatever it is."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr that raises
        text = f"a {type(value).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


def unmeasured(g: Grid, measured: list[list[float]]) -> str | None:
    """The first grid point whose step has no positive, finite time on the replay, named."""
    for k, path in enumerate(("parameter-server", "allreduce")):
        for i, m in enumerate(measured[k]):
            if not (np.isfinite(m) and m > 0):
                return (f"{g.where(i)}: the {path} step took {fmt(m) if np.isfinite(m) else 'no marked time'} on the "
                        "replay: no step to model (its ranks mark each point as they start it)")
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
