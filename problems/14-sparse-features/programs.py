"""What runs on the ranks of problem 14: the learner's parameter server, allreduce baseline and cost
model on the checks' cases, and the free run (main, bounds). Every step is a phase marked with its
case, whose counters the checks read; the ranks return plain data and judge nothing. A rank is
handed its view of each case (cases.Run.for_rank, Grid.for_rank): a server its shard's initial rows,
a worker its own batches (ids and clicks), never another's, and no key of them, read through the
same accessors as the checker's whole case (cases.batch_ids, clicks, initial_table); single-process
SGD is judging.py's."""

from dataclasses import replace
from typing import Any

import numpy as np

from distlab import IN_PLACE, MAX, UNDEFINED

from . import cases
from .cases import Data, Grid, Run


class Batch:
    """One worker's impressions for one step: ``ids`` (B x FIELDS), ``dim``, ``table_rows``, ``gradients``."""

    def __init__(self, data: Data, worker: int, step: int, workers: int, comm: Any, declare: bool) -> None:
        self._ids = cases.batch_ids(data, worker, step)
        self.ids, self.dim, self.table_rows = self._ids.copy(), data.dim, data.rows
        self._labels, self._scale = cases.clicks(data, self._ids, worker, step), 1.0 / (workers * data.batch)
        self._comm, self._declare, self.losses = comm, declare, []

    def gradients(self, emb: Any) -> np.ndarray:
        """The gradient of the global batch's mean log loss for every id occurrence (B x FIELDS x dim)."""
        emb = np.asarray(emb, dtype=np.float32)
        if emb.shape != self._ids.shape + (self.dim,):
            raise ValueError(f"batch.gradients(emb): emb has shape {emb.shape}, expected "
                             f"{self._ids.shape + (self.dim,)}: one row per id occurrence, laid out as batch.ids")
        if self._declare:
            self._comm.compute(flops=8.0 * emb.size, label="forward+backward")
        grads, loss = cases.fm_gradients(emb, self._labels, self._scale)
        self.losses.append(loss)
        return grads.astype(np.float32)


class Shard:
    """Server ``index``'s rows: row r when r % servers == index, kept at r // servers."""

    def __init__(self, comm: Any, data: Data, index: int, servers: int, row_cost: float) -> None:
        self.index, self.servers, self.dim, self.table_rows = index, servers, data.dim, data.rows
        self.rows = cases.initial_table(data, index, servers)
        self._comm, self._row_cost = comm, row_cost

    def _local(self, ids: Any, call: str) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if (stray := ids[ids % self.servers != self.index]).size:  # a routing mistake, named where it happens
            raise ValueError(f"shard.{call}(ids) on server {self.index}: row {stray[0]} lives on server "
                             f"{stray[0] % self.servers} (row r lives on server r % S): route each id to server id % S")
        self._comm.compute(seconds=self._row_cost * ids.size, label=call)  # the hash table's work, per row
        return ids // self.servers

    def lookup(self, ids: Any) -> np.ndarray:
        """The rows of ``ids`` (len(ids) x dim float32, a copy); costs row_cost per id."""
        return self.rows[self._local(ids, "lookup")]

    def add(self, ids: Any, deltas: Any) -> None:
        """rows[ids] += deltas, a repeated id getting every delta; costs row_cost per id."""
        local = self._local(ids, "add")
        np.add.at(self.rows, local, np.asarray(deltas, dtype=np.float32).reshape(local.size, self.dim))


def run_path(comm: Any, solution: Any, case: Run, declare: bool = True, row_cost: float = cases.ROW_COST_S) -> Any:
    # A server returns its rows; a worker of the parameter server its batch losses; a worker of the
    # allreduce (its table, its batch losses).
    rank, data = comm.Get_rank(), case.data
    if rank < case.servers:
        shard = Shard(comm, data, rank, case.servers, row_cost)
        for _ in range(data.steps):
            comm.mark(case.what)
            solution.server_step(comm, list(range(case.servers, case.servers + case.workers)), shard, data.lr)
        comm.mark("done")
        return shard.rows
    table, losses = cases.initial_table(data) if not case.servers else None, []
    for step in range(data.steps):
        batch = Batch(data, rank - case.servers, step, case.workers, comm, declare)
        comm.mark(case.what)
        if case.servers:
            solution.worker_step(comm, list(range(case.servers)), batch)
        else:
            solution.dense_step(comm, table, batch, data.lr)
        losses += batch.losses[:1]
    comm.mark("done")
    return losses if case.servers else (np.array(table, dtype=np.float32), losses)


def run_grid(comm: Any, solution: Any, grid: Grid) -> Any:
    # One step of a path per grid point, each a phase "point i" begun as the ranks leave a barrier,
    # whose span on the replay is the point's measured time; or (mode "model") the learner's
    # step_times and choose at every point: (seconds, seconds, choice), or what went wrong.
    if grid.mode == "model":
        answers = []
        for data, touched in grid.points:
            question = (data.rows, data.dim, touched, grid.workers, grid.servers, grid.alpha, grid.beta, grid.row_cost)
            try:
                answers.append((*map(float, solution.step_times(*question)), solution.choose(*question)))
            except Exception as exc:  # noqa: BLE001 - any mistake becomes a message
                answers.append(f"step_times or choose raised {type(exc).__name__}: {exc}")
        return answers
    for i, (data, _) in enumerate(grid.points):
        comm.mark("between")
        comm.Barrier()
        run_path(comm, solution, Run(grid.servers if grid.mode == "sparse" else 0, grid.workers, data, f"point {i}"),
                 declare=False, row_cost=grid.row_cost)
    comm.mark("between")
    return None


def run_case(comm: Any, solution: Any, case: Any) -> Any:
    if isinstance(case, list):  # several cases on the same ranks, a barrier apart
        done = []
        for one in case:
            comm.mark("between")
            comm.Barrier()
            done.append(run_case(comm, solution, one))
        return done
    return (run_grid if isinstance(case, Grid) else run_path)(comm, solution, case)


# -- the free run: distlab run 14, distlab tune 14 -------------------------------------------------
FREE_CELLS = 2**22  # rows x dim, and batch ids x dim, within 16 MiB per rank


def free_case(ranks: int, dim: str, touched: str, rows: str, steps: str, servers: str) -> Run:
    S, d, n = ranks // 2 if servers == "auto" else int(servers), int(dim), min(int(rows), FREE_CELLS // int(dim))
    if not 1 <= S < ranks:
        raise ValueError(f"need 1 <= servers < ranks; got servers={S} with {ranks} ranks")
    batch = cases.batch_for(n, 1.05, float(touched) / 100, FREE_CELLS // d)  # rows cut to keep rows x dim
    return Run(S, ranks - S, Data(n, d, batch, int(steps), 0.6, 1.05, 1), "step")


def main(comm, solution, dim="64", touched="5", rows="16384", steps="4", servers="auto"):
    """A free run: ``steps`` steps of each path on a table of ``rows`` x ``dim`` whose batches touch
    about ``touched`` percent of the rows, ``servers`` ranks (half by default) serving the rest.
    Rank 0 returns both paths' time per step on the online clock (the slowest rank's) and their
    ratio, below 1 where the parameter server wins, which the Tune step sweeps:

        distlab tune 14 --param dim=8,32,128,512,2048 --fixed touched=2 --metric ps_over_allreduce"""
    rank = comm.Get_rank()
    case = free_case(comm.Get_size(), dim, touched, rows, steps, servers)
    workers, took = comm.Split(0 if rank >= case.servers else UNDEFINED), np.zeros(2)  # the baseline's ranks
    for k, (path, on) in enumerate(((case, comm), (replace(case, servers=0, what="dense step"), workers))):
        comm.Barrier()
        start = comm.now()
        if on is not None:
            run_path(on, solution, path, declare=False)
        took[k] = (comm.now() - start) / case.data.steps
    comm.Allreduce(IN_PLACE, took, MAX)  # a step ends when its slowest rank is done
    if rank != 0:
        return None
    ratio = took[0] / took[1] if took[1] > 0 else float("inf")
    return {"table": f"{case.data.rows} x {case.data.dim}, S = {case.servers}, W = {case.workers}",
            "touched_fraction": round(cases.touched(case.data, case.workers) / case.data.rows, 4),
            "sparse_s": float(f"{took[0]:.6g}"), "dense_s": float(f"{took[1]:.6g}"),
            "ps_over_allreduce": float(f"{ratio:.6g}"), "faster": "parameter server" if ratio < 1 else "allreduce"}


def bounds(platform, ranks, dim="64", touched="5", rows="16384", steps="4", servers="auto"):
    """The card's cost formulas for this free run, computed in the supervisor."""
    from .judging import step_costs

    case = free_case(ranks, dim, touched, rows, steps, servers)
    route = platform.route(0, case.servers)
    sparse, dense = step_costs(case.data.rows, case.data.dim, cases.touched(case.data, case.workers), case.workers,
                               case.servers, route.alpha_s, route.beta_s_per_byte, cases.ROW_COST_S)
    return {"sparse_s": sparse, "dense_s": dense, "ps_over_allreduce": sparse / dense if dense else float("inf")}
