"""Problem 09 on the ranks: the learner's hierarchical allreduce on each buffer, the training loop
that sums its gradients with it, and the cost questions (on one rank); and the free run, the
learner's allreduce or a flat ring on the card's three data centers, timed on the virtual clock."""

from __future__ import annotations

import numpy as np

from distlab import grading

from .cases import CARD, MODEL_SIZES, Bill, Buffer, Cluster, Training


def run_case(comm, solution, case):
    """The program of every task of the checks: a training run, the cost questions (a list of
    bills) or a list of buffers to sum."""
    if isinstance(case, Training):
        return run_training(comm, solution, case)
    if isinstance(case[0], Bill):
        return run_bills(comm, solution, case)
    return run_buffers(comm, solution, case)


def run_buffers(comm, solution, buffers: list[Buffer]) -> list[np.ndarray]:
    """Each buffer summed in place by the learner's allreduce, a phase of its own (mark "buffer")."""
    rank, found = comm.Get_rank(), []
    for buffer in buffers:
        values = buffer.input(rank)
        comm.mark("buffer")
        solution.hierarchical_allreduce(comm, values, buffer.cluster.datacenter_of())
        # All of it: a sample (every 97th element, once) let a solution sum only the elements read.
        found.append(values.copy())
    return found


def run_training(comm, solution, training: Training) -> tuple[np.ndarray, list[float]]:
    """Full-batch gradient descent: each rank's gradient summed across the data centers by the
    learner's allreduce; the weights at the end and the loss each step (rank 0's view)."""
    rank, w, losses = comm.Get_rank(), np.zeros(training.features), []
    x, y = training.shard(rank)
    for _ in range(training.steps):
        comm.mark("step")
        part = np.array([np.sum((x @ w - y) ** 2) / (training.rows_per_rank * training.cluster.p)])
        grad = training.gradient(w, rank)
        joined = np.concatenate([grad, part])  # one allreduce per step: the gradient and the loss
        solution.hierarchical_allreduce(comm, joined, training.cluster.datacenter_of())
        losses.append(float(joined[-1]))
        w = w - training.lr * joined[:-1]
    return w, losses


def run_bills(comm, solution, bills: list[Bill]) -> list[dict[str, float]]:
    """The learner's cost functions on each bill, for each model size the questions ask about."""
    answers = []
    for bill in bills:
        answer = {"breakeven": float(solution.breakeven_params(bill, 0.4))}
        for params in MODEL_SIZES:
            answer[f"wan_bytes {params:g}"] = float(solution.wan_bytes_per_step(params, bill))
            wan, compute = solution.cost_per_step(params, bill)
            answer[f"step {params:g}"] = (float(wan), float(compute))
            wan, compute = solution.cost_per_epoch(params, bill)
            answer[f"epoch {params:g}"] = (float(wan), float(compute))
        answers.append(answer)
    return answers


def main(comm, solution, mib="1", method="yours"):
    """A free run on the card's cluster (``distlab run 09``, 12 ranks on three-dc; other rank
    counts fill data centers of 4 in order): one float32 allreduce of ``mib`` MiB per rank, the
    learner's (``method=yours``) or the built-in flat ring (``method=flat``). Rank 0 checks the
    sum. ``distlab tune 09 --param mib=... --metric virtual_s`` draws the replay's time (links
    shared) beside ``bounds``; ``online_s`` is the online clock's, which shares no link."""
    p, rank = comm.Get_size(), comm.Get_rank()
    values = np.full(_elements(mib), float(rank + 1), dtype=np.float32)
    start = comm.now()
    if method == "flat":
        comm.Allreduce(values.copy(), values)
    else:
        solution.hierarchical_allreduce(comm, values, [r // CARD.per_dc for r in range(p)])
    online_s = comm.now() - start
    if rank != 0:
        return None
    ok = bool(np.all(values == p * (p + 1) / 2))
    return {"ok": ok, "online_s": online_s, "method": method, "mib": float(mib),
            "summary": f"{method}: {mib} MiB on {p} ranks; the sum "
                       f"{'is right' if ok else 'DIFFERS FROM the sum of all inputs'}"}


def bounds(platform, ranks, mib="1", method="yours"):
    """What the free run can reach on ``platform`` (computed in the checker): the built-in flat
    ring replayed there, or the hierarchy's closed form on data centers of 4."""
    nbytes = 4 * _elements(mib)
    if method == "flat":
        return {"virtual_s": grading.collective_time(platform, "Allreduce", ranks, nbytes)}
    return {"virtual_s": Cluster(max(1, ranks // CARD.per_dc), CARD.per_dc, 0.0).hierarchical_time(nbytes)}


def _elements(mib) -> int:
    return max(1, int(float(mib) * (1 << 20)) // 4)
