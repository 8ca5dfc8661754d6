"""What runs on the ranks of problem 01: the learner's server and worker, one case at a time.

``run_ps`` is the one program the checks launch: ranks 0 .. S-1 call the learner's ``server``,
the others its ``worker`` with a ``Batch`` of their click log. Each rank hands back a
``RankResult`` (a server's shard, and every rank's counters), plain data that the supervisor
reads in check_readings.py. Nothing here computes an expected value: that is done in the
supervisor (check_models.py), never next to learner code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from distlab.grading import CommStats, check_part

cases = check_part(__file__, "cases")


# -- what a worker holds: its share of the global batch -------------------------------------------


class Batch:
    """One worker's share of the global batch: ``X`` (n x keys hashed features) and ``y`` (n
    clicks, 0 or 1). ``gradient(w)`` returns the SUM over the n examples of the log-loss gradient
    at the full model ``w``, and declares its work to the virtual clock."""

    def __init__(self, X: np.ndarray, y: np.ndarray, comm: Any = None) -> None:
        self.X, self.y = X, y
        self._comm = comm

    @property
    def size(self) -> int:
        return len(self.y)

    def __iter__(self) -> Any:  # so that ``X, y = batch`` works too
        return iter((self.X, self.y))

    def gradient(self, w: Any) -> np.ndarray:
        w = np.asarray(w, dtype=np.float64)
        if w.shape != (self.X.shape[1],):
            raise ValueError(f"gradient(w): w has shape {w.shape}, expected ({self.X.shape[1]},): "
                             "the whole model, one shard pulled from every server")
        if self._comm is not None and hasattr(self._comm, "compute"):
            self._comm.compute(flops=4.0 * self.X.size, label="gradient")  # two matrix-vector products
        return self.X.T @ (cases.sigmoid(self.X @ w) - self.y)

    def loss(self, w: Any) -> float:
        """Mean log loss of the model w on this batch."""
        z = self.X @ np.asarray(w, dtype=np.float64)
        return float(np.mean(np.logaddexp(0.0, z) - self.y * z))


# -- what runs on every rank ----------------------------------------------------------------------


@dataclass
class RankResult:
    role: str  # "server" or "worker"
    lo: int | None  # a server's first key (None: the return value broke the contract)
    shard: np.ndarray | None  # a server's final weights of keys lo .. lo + len - 1
    returned: str  # what the server returned, when it broke the contract
    stats: CommStats


def _as_shard(out: Any) -> tuple[int | None, np.ndarray | None, str]:
    try:
        lo, values = out
        return int(lo), np.array(values, dtype=np.float64).reshape(-1), ""
    except Exception:  # noqa: BLE001 - any shape of mistake becomes a message
        return None, None, f"{type(out).__name__} {repr(out)[:60]}"


def run_ps(comm, solution, case: cases.Case) -> RankResult:
    """Ranks 0 .. S-1 run the learner's server, the others its worker, for one case."""
    rank = comm.Get_rank()
    if rank < case.servers:
        weights = cases.initial_weights(case)
        before = comm.stats.snapshot()
        out = solution.server(comm, case.server_ranks, case.worker_ranks, weights, case.steps,
                              case.lr)
        lo, shard, returned = _as_shard(out)
        return RankResult("server", lo, shard, returned, comm.stats.since(before))
    batch = Batch(*cases.worker_data(case, rank - case.servers), comm=comm)
    before = comm.stats.snapshot()
    solution.worker(comm, case.server_ranks, case.worker_ranks, batch, case.steps)
    return RankResult("worker", None, None, "", comm.stats.since(before))
