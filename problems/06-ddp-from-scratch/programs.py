"""Problem 06's training loop: ``train``, what runs on every rank around the learner's DataParallel (each step's
backward is the phase from mark "backward" to mark "finish", its gradient sync from there to mark "synced"). Its
single-process twin, the supervisor's expected weights, is judging.single_process: the learner's process never holds
it (nor could it run it: a rank is handed only its own view of the case, Case.for_rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from distlab import MAX, SUM

from .cases import Case, build_model, loss_of, run_model, shard


@dataclass
class RankResult:
    start: np.ndarray  # flat weights right after DataParallel(...) returned
    final: np.ndarray  # flat weights after the last step
    losses: list[float]


def sgd_step(model: torch.nn.Module, lr: float) -> None:
    """Plain SGD, as torch.optim.SGD without momentum (whose first use costs seconds of imports):
    a parameter without a gradient stays put."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)


def flat_weights(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def train(comm, solution, case: Case) -> RankResult:
    """Wraps a fresh model in the learner's DataParallel and trains it for case.steps steps."""
    torch.set_num_threads(1)
    # Bound before the learner's constructor is handed comm, and passed to the model's forward, never kept on the
    # model: what the layers declare and when the step's phases begin reach the agent through these alone.
    declare, mark = comm.compute, comm.mark
    rank = comm.Get_rank()
    model = build_model(case, rank)
    model.forward_s_per_param = case.forward_s_per_param
    ddp = solution.DataParallel(comm, model, bucket_cap_bytes=case.cap_bytes)
    start, losses = flat_weights(model), []
    for step in range(case.steps):
        x, y = shard(case, rank, step)  # this rank's samples only: its view holds no other's
        mark("step")
        model.zero_grad(set_to_none=True)  # as the optimizer does: a parameter left out has no grad
        loss = loss_of(*run_model(model, x, use_side=case.uses_side(step), declare=declare), y)
        mark("backward")
        loss.backward()
        mark("finish")  # backward is over: its work was all declared before this mark
        ddp.finish_gradient_sync()
        mark("synced")
        losses.append(float(loss.detach()))
        sgd_step(model, case.lr)
    return RankResult(start, flat_weights(model), losses)


def main(comm, solution, steps="40", cap_kib="64", width="128", lr="0.5"):
    """A free run (distlab run 06 --param cap_kib=16): trains the MLP on every rank; rank 0
    reports the loss over the global batch, the buckets by the card's rule, the collectives per step
    and whether replicas agree.

    Each layer declares 1 ns of forward work per parameter (2 ns backward): change cap_kib and
    watch the step time (P50) in the metrics."""
    p, rank, w = comm.Get_size(), comm.Get_rank(), int(width)
    case = Case("free run", p, (32, w, w, w, 8), 606, int(float(cap_kib) * 1024), int(steps),
                float(lr), 1e-9)
    before = comm.stats.snapshot()  # a free run may read the counters: it grades nothing
    result = train(comm, solution, case)
    trained = comm.stats.since(before)
    per_step = sum(trained.calls[op] for op in trained.collectives_used()) / max(case.steps, 1)
    # The loss over the global batch: the mean of the ranks' shard losses (equal shards).
    losses = np.array(result.losses)
    comm.Allreduce(comm.IN_PLACE, losses, SUM)
    losses /= p
    digest = float(np.abs(result.final).sum())
    spread = np.array([digest, -digest])  # max and -min of the ranks' digests in one call
    comm.Allreduce(comm.IN_PLACE, spread, MAX)
    if rank != 0:
        return None
    same = math.isclose(spread[0], -spread[1], rel_tol=1e-6)
    k = max(1, min(5, case.steps // 4))
    return (f"{case.steps} steps on {p} ranks: global-batch loss {losses[:k].mean():.4f} (first "
            f"{k} steps) -> {losses[-k:].mean():.4f} (last {k}); {len(case.buckets())} bucket(s) "
            f"by the card's rule, {per_step:.1f} collective(s) per step; weights {'agree' if same else 'DIFFER'} across ranks")
