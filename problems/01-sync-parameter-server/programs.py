"""What runs on the ranks of problem 01: the learner's server and worker on one case, and the free run."""

from dataclasses import dataclass
from typing import Any

import numpy as np

from distlab.grading import CommStats

from . import cases


class Batch:
    """One worker's share of the global batch: ``X`` (n x keys hashed features), ``y`` (n clicks, 0 or 1)."""

    def __init__(self, X: np.ndarray, y: np.ndarray, comm: Any = None) -> None:
        self.X, self.y, self.size, self._comm = X, y, len(y), comm

    def __iter__(self) -> Any:  # so that ``X, y = batch`` works too
        return iter((self.X, self.y))

    def gradient(self, w: Any) -> np.ndarray:
        """The SUM over the n examples of the log-loss gradient at the full model ``w``; declares its work."""
        w = np.asarray(w, dtype=np.float64)
        if w.shape != (self.X.shape[1],):
            raise ValueError(f"gradient(w): w has shape {w.shape}, expected ({self.X.shape[1]},): "
                             "the whole model, one shard pulled from every server")
        if hasattr(self._comm, "compute"):  # a plain MPI communicator has no virtual clock
            self._comm.compute(flops=4.0 * self.X.size, label="gradient")  # two matrix-vector products
        return self.X.T @ (cases.sigmoid(self.X @ w) - self.y)

    def loss(self, w: Any) -> float:  # the mean log loss of the model w on this batch
        z = self.X @ np.asarray(w, dtype=np.float64)
        return float(np.mean(np.logaddexp(0.0, z) - self.y * z))


@dataclass
class RankResult:
    lo: int | None  # a server's first key (None: a worker, or a return value that broke the contract)
    shard: np.ndarray | None  # a server's final weights of keys lo .. lo + len - 1
    returned: str  # what the server returned, when it broke the contract
    stats: CommStats


def run_ps(comm, solution, case: cases.Case) -> RankResult:
    """Ranks 0 .. S-1 run the learner's server, the others its worker, for one case."""
    rank, servers, workers = comm.Get_rank(), list(range(case.servers)), case.worker_ranks
    before = comm.stats.snapshot()  # making the data sends nothing
    if rank >= case.servers:
        batch = Batch(*cases.worker_data(case, rank - case.servers), comm=comm)
        solution.worker(comm, servers, workers, batch, case.steps)
        return RankResult(None, None, "", comm.stats.since(before))
    out = solution.server(comm, servers, workers, cases.initial_weights(case), case.steps, case.lr)
    stats = comm.stats.since(before)
    try:
        lo, values = out
        return RankResult(int(lo), np.array(values, dtype=np.float64).reshape(-1), "", stats)
    except Exception:  # noqa: BLE001 - any shape of mistake becomes a message
        return RankResult(None, None, f"{type(out).__name__} {repr(out)[:60]}", stats)


def main(comm, solution, servers="auto", keys="4096", batch="512", steps="30", lr="2.0", seed="1"):
    """A free run (distlab run, mpirun): S servers and p - S workers train the CTR model; rank 0
    reports the log loss, the held-out AUC and whether the model is gradient descent's."""
    p, rank = comm.Get_size(), comm.Get_rank()
    S = max(1, p // 2) if servers == "auto" else int(servers)
    if not 1 <= S < p:
        raise ValueError(f"need 1 <= servers < ranks; got servers={S} with {p} ranks")
    W, D, n = p - S, int(keys), int(batch)
    case = cases.Case(S, W, D, (n,) * W, int(steps), float(lr), int(seed), "free run")
    result = run_ps(comm, solution, case)
    comm.mark("gather")  # not the learner's: collect the shards on rank 0 for the report
    if 0 < rank < S:
        values = result.shard if result.shard is not None else np.empty(0)
        comm.Send(np.array([result.lo or 0, len(values)], dtype=np.float64), dest=0, tag=90)
        comm.Send(values, dest=0, tag=91)
    if rank != 0:
        return None
    shards = [(result.lo, result.shard)]
    for s in range(1, S):
        head = np.empty(2)
        comm.Recv(head, source=s, tag=90)
        shards.append((int(head[0]), np.empty(int(head[1]))))
        comm.Recv(shards[-1][1], source=s, tag=91)
    model = np.full(D, np.nan)
    for lo, values in shards:
        if lo is not None:
            model[lo:lo + len(values)] = values
    train = Batch(*cases.global_batch(case))
    held_out = Batch(*cases.impressions(case.seed, 1, 4 * n, D))
    right = np.allclose(model, cases.sgd(case), rtol=cases.RTOL, atol=cases.ATOL)
    return (f"S={S} W={W} keys={D} batch={W}x{n} steps={case.steps}: train log loss "
            f"{train.loss(cases.initial_weights(case)):.4f} -> {train.loss(np.nan_to_num(model)):.4f}, "
            f"held-out AUC {auc(held_out.y, held_out.X @ np.nan_to_num(model)):.3f}; the model "
            f"{'equals' if right else 'DIFFERS FROM'} single-process gradient descent")


def auc(y: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a click outranks a non-click (ties count half)."""
    clicks, others = score[y > 0.5], np.sort(score[y <= 0.5])
    if not clicks.size or not others.size:
        return float("nan")
    below = np.searchsorted(others, clicks, "left") + np.searchsorted(others, clicks, "right")
    return float(below.sum() / 2 / (clicks.size * others.size))
