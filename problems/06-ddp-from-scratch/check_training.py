"""Problem 06's training: the model, its data, and the two training loops the checks compare.

The records that come back from the ranks (Case, StepCount, RankResult); a small MLP whose layers
declare their forward and backward work on the virtual clock (so the replay shows whether the
gradient allreduces run while backward computes); the synthetic regression batches, sharded by
rank; plain SGD. Then the two loops: ``train``, the program that runs on every rank around the
learner's DataParallel and counts each step's communication, and ``single_process``, rank 0's
model trained by one process on the global batch, which the supervisor takes as the expected
weights. Both live here so that they read side by side and share every helper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

PER_RANK_BATCH = 8


@dataclass(frozen=True)
class Case:
    label: str
    p: int
    widths: tuple[int, ...]  # input, hidden..., output
    seed: int
    cap_bytes: int
    steps: int
    lr: float
    forward_s_per_param: float  # declared forward seconds per parameter; backward is twice that
    side_after: int | None = None  # a side head hangs after this layer (None: no side head)
    side_used: tuple[bool, ...] = ()  # per step: does the loss use the side head

    def uses_side(self, step: int) -> bool:
        return self.side_after is not None and self.side_used[step]


@dataclass(frozen=True)
class StepCount:
    collectives: int  # calls of built-in collectives (Allreduce, Iallreduce, Bcast, ...)
    calls: dict[str, int]
    allreduce_bytes: int


@dataclass
class RankResult:
    start: np.ndarray  # flat weights right after DataParallel(...) returned
    final: np.ndarray  # flat weights after the last step
    steps: list[StepCount] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


# -- the model: each layer declares its work on the virtual clock --------------------------------


class _BackwardWork(torch.autograd.Function):
    """Identity; its backward declares the layer's backward work. It sits on the layer's output,
    so autograd runs it just before the layer's own backward, whose gradients come right after."""

    @staticmethod
    def forward(ctx, x, comm, seconds):  # type: ignore[override]
        ctx.comm, ctx.seconds = comm, seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        ctx.comm.compute(seconds=ctx.seconds, label="backward")
        return grad, None, None


class Net(torch.nn.Module):
    """Linear layers with ReLU between; optionally a one-output side head after one layer,
    registered right after it (so its parameters sit in the middle of the parameter order)."""

    def __init__(self, widths: tuple[int, ...], side_after: int | None = None) -> None:
        super().__init__()
        self.depth = len(widths) - 1
        self.side_after = side_after
        for i in range(self.depth):
            setattr(self, f"fc{i}", torch.nn.Linear(widths[i], widths[i + 1]))
            if i == side_after:
                self.side = torch.nn.Linear(widths[i + 1], 1)
        self.comm = None  # set on the ranks: layers then declare their work
        self.forward_s_per_param = 0.0

    def _timed(self, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        y = layer(x)
        if self.comm is not None:
            seconds = self.forward_s_per_param * sum(p.numel() for p in layer.parameters())
            self.comm.compute(seconds=seconds, label="forward")
            y = _BackwardWork.apply(y, self.comm, 2 * seconds)
        return y

    def forward(self, x: torch.Tensor, use_side: bool = False):  # type: ignore[override]
        side_out = None
        for i in range(self.depth):
            x = self._timed(getattr(self, f"fc{i}"), x)
            if i < self.depth - 1:
                x = torch.relu(x)
            if i == self.side_after and use_side:
                side_out = self._timed(self.side, x)
        return x, side_out


def build_model(case: Case, rank: int) -> Net:
    """Every rank starts from its own random weights; rank 0's are the single-process model's."""
    torch.manual_seed(case.seed + 7919 * rank)
    return Net(case.widths, case.side_after)


def global_batch(case: Case, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s batch over all ranks: rows [r*b, (r+1)*b) are rank r's shard."""
    d_in, d_out = case.widths[0], case.widths[-1]
    teacher = np.random.default_rng([case.seed, 5]).standard_normal((d_in, d_out)) / math.sqrt(d_in)
    rng = np.random.default_rng([case.seed, 17, step])
    x = rng.standard_normal((case.p * PER_RANK_BATCH, d_in))
    y = np.tanh(x @ teacher) + 0.1 * rng.standard_normal((x.shape[0], d_out))
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32))


def loss_of(out: torch.Tensor, side_out: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    loss = torch.nn.functional.mse_loss(out, y)
    if side_out is not None:
        loss = loss + 0.5 * torch.nn.functional.mse_loss(side_out, y[:, :1])
    return loss


def zero_grad(model: torch.nn.Module) -> None:
    """optimizer.zero_grad(set_to_none=True): a parameter left out of a step has no gradient."""
    for p in model.parameters():
        p.grad = None


def sgd_step(model: torch.nn.Module, lr: float) -> None:
    """Plain SGD, as torch.optim.SGD without momentum (whose first use costs seconds of imports):
    a parameter without a gradient stays put."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)


def flat_weights(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def layout(case: Case) -> list[tuple[str, int, int]]:
    """(name, number of elements, bytes) of every parameter, in parameter order."""
    return [(name, p.numel(), p.numel() * p.element_size())
            for name, p in Net(case.widths, case.side_after).named_parameters()]


# -- what runs on every rank ----------------------------------------------------------------------


def train(comm, solution, case):
    """Wraps a fresh model in the learner's DataParallel and trains it for case.steps steps."""
    torch.set_num_threads(1)
    rank = comm.Get_rank()
    model = build_model(case, rank)
    model.comm, model.forward_s_per_param = comm, case.forward_s_per_param
    ddp = solution.DataParallel(comm, model, bucket_cap_bytes=case.cap_bytes)
    result = RankResult(flat_weights(model), np.empty(0))
    for step in range(case.steps):
        x, y = global_batch(case, step)
        shard = slice(rank * PER_RANK_BATCH, (rank + 1) * PER_RANK_BATCH)
        comm.mark("step")
        zero_grad(model)
        out, side_out = model(x[shard], use_side=case.uses_side(step))
        loss = loss_of(out, side_out, y[shard])
        before = comm.stats.snapshot()
        comm.mark("backward")
        loss.backward()
        ddp.finish_gradient_sync()
        comm.mark("synced")
        delta = comm.stats.since(before)
        used = delta.collectives_used()
        result.steps.append(StepCount(sum(delta.calls[op] for op in used), dict(delta.calls),
                                      int(delta.op_bytes.get("Allreduce", 0))))
        result.losses.append(float(loss.detach()))
        sgd_step(model, case.lr)
    result.final = flat_weights(model)
    return result


# -- what the ranks' weights must equal: one process on the global batch --------------------------


def single_process(case: Case, lr_scale: float = 1.0) -> np.ndarray:
    """Rank 0's model trained by one process on every step's global batch, with plain SGD."""
    torch.set_num_threads(1)
    model = build_model(case, 0)
    for step in range(case.steps):
        x, y = global_batch(case, step)
        zero_grad(model)
        out, side_out = model(x, use_side=case.uses_side(step))
        loss_of(out, side_out, y).backward()
        sgd_step(model, case.lr * lr_scale)
    return flat_weights(model)
