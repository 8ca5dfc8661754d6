"""What runs on the ranks of problem 01: the learner's server and worker on one case, and the free run."""

from typing import Any

import numpy as np

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


def run_ps(comm, solution, case: cases.Case) -> tuple[int, np.ndarray] | str | None:
    """Ranks 0 .. S-1 run the learner's server, the others its worker, for one case. A server hands back
    (lo, its final weights), or in words what it returned when that broke the contract; a worker None.
    ``case`` is this rank's view (Case.for_rank): a server's holds the initial weights, a worker's its
    own examples, none the seed: the gradients reach the servers in the workers' pushes only."""
    rank, servers, workers = comm.Get_rank(), list(range(case.servers)), case.worker_ranks
    if rank >= case.servers:
        batch = Batch(*cases.worker_data(case, rank - case.servers), comm=comm)
        solution.worker(comm, servers, workers, batch, case.steps)
        return None
    out = solution.server(comm, servers, workers, cases.initial_weights(case), case.steps, case.lr)
    try:
        lo, values = out
        return int(lo), np.array(values, dtype=np.float64).reshape(-1)
    except Exception:  # noqa: BLE001 - any shape of mistake becomes a message
        return f"{type(out).__name__} {repr(out)[:60]}"


def main(comm, solution, servers="auto", keys="4096", batch="512", steps="30", lr="2.0", seed="1"):
    """A free run (distlab run, mpirun): S servers and p - S workers train the CTR model; rank 0
    reports the log loss, the held-out AUC and whether the model is gradient descent's."""
    p, rank = comm.Get_size(), comm.Get_rank()
    S = max(1, p // 2) if servers == "auto" else int(servers)
    if not 1 <= S < p:
        raise ValueError(f"need 1 <= servers < ranks; got servers={S} with {p} ranks")
    W, D, n = p - S, int(keys), int(batch)
    case = cases.Case(S, W, D, (n,) * W, int(steps), float(lr), int(seed), "free run")
    result = run_ps(comm, solution, case.for_rank(rank))  # what a rank is handed in the check too
    comm.mark("gather")  # not the learner's: collect the shards on rank 0 for the report
    lo, values = result if isinstance(result, tuple) else (0, np.empty(0))  # a worker, or a broken return
    if 0 < rank < S:
        comm.Send(np.array([lo, len(values)], dtype=np.float64), dest=0, tag=90)
        comm.Send(values, dest=0, tag=91)
    if rank != 0:
        return None
    model = np.full(D, np.nan)
    model[lo:lo + len(values)] = values
    for s in range(1, S):
        head = np.empty(2)
        comm.Recv(head, source=s, tag=90)
        lo, values = int(head[0]), np.empty(int(head[1]))
        comm.Recv(values, source=s, tag=91)
        model[lo:lo + len(values)] = values
    train, held_out = Batch(*cases.global_batch(case)), Batch(*cases.impressions(case.seed, 1, 4 * n, D))
    fitted, right = np.nan_to_num(model), np.allclose(model, cases.sgd(case), rtol=cases.RTOL, atol=cases.ATOL)
    return (f"S={S} W={W} keys={D} batch={W}x{n} steps={case.steps}: train log loss "
            f"{train.loss(cases.initial_weights(case)):.4f} -> {train.loss(fitted):.4f}, "
            f"held-out AUC {auc(held_out.y, held_out.X @ fitted):.3f}; the model "
            f"{'equals' if right else 'DIFFERS FROM'} single-process gradient descent")


def auc(y: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a click outranks a non-click (ties count half)."""
    clicks, others = score[y > 0.5], np.sort(score[y <= 0.5])
    if not clicks.size or not others.size:
        return float("nan")
    below = np.searchsorted(others, clicks, "left") + np.searchsorted(others, clicks, "right")
    return float(below.sum() / 2 / (clicks.size * others.size))
