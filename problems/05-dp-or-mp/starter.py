"""Problem 05: data parallel or model parallel?

Part 1. plan(model, devices, batch) says how to lay a model out on a cluster:
{"dp": d, "tp": t, "pp": p} with d * t * p = devices["count"], or None when nothing fits.

    model   = {"name": "GPT 6.7B", "params": 6_650_200_064, "layers": 32, "hidden": 4096, "seq_len": 2048}
    devices = {"count": 8, "per_node": 8, "memory_bytes": 80 * 2**30}
    batch   = 8   # sequences per step
    plan(model, devices, batch)  ->  {"dp": 4, "tp": 2, "pp": 1}

The card gives the memory model (16 bytes per parameter for mixed-precision Adam, plus the
activations) and the rule (least model parallelism first, TP before PP).

Part 2. A tensor-parallel transformer MLP, y = fc2(gelu(fc1(x))), in torch with autograd:
fc1 split by output features (column-parallel), fc2 by input features (row-parallel), and two
autograd operators that carry the communication:

    f (CopyToTensorParallel):    identity in forward, allreduce in backward
    g (ReduceFromTensorParallel): allreduce in forward, identity in backward

comm.Allreduce accepts CPU torch tensors: comm.Allreduce(IN_PLACE, t) sums t over the ranks.

Check it with `distlab check 05`; ask for a nudge with `distlab hint 05`.
"""

import torch
import torch.nn.functional as F
from torch import nn

from distlab import IN_PLACE, SUM  # noqa: F401 (you will need them)

BYTES_PER_PARAM = 16  # fp16 weights 2 + fp16 grads 2 + fp32 master weights 4 + Adam m 4 + v 4


# -- part 1: the plan -----------------------------------------------------------------------------


def memory_per_device(model, batch, dp, tp, pp):
    """Bytes one device needs for layout (dp, tp, pp): model state plus activations (see the card)."""
    # TODO: 16 bytes per parameter, split over tp * pp; activations of batch / dp sequences, of
    # layers / pp layers, 10 + 24 / tp bytes per token per hidden unit and layer.
    return 0


def plan(model, devices, batch):
    """The layout to train ``model`` on ``devices`` with ``batch``: {"dp", "tp", "pp"} or None."""
    # TODO: try tp * pp = 1, 2, ... (divisors of devices["count"]) and, for each, the widest tp
    # first; skip illegal layouts (tp must divide per_node, pp the layers, dp the batch) and
    # return the first one that fits in devices["memory_bytes"]. None if none fits.
    # For now: pure data parallelism, whatever the model.
    return {"dp": devices["count"], "tp": 1, "pp": 1}


# -- part 2: the tensor-parallel MLP --------------------------------------------------------------


def shard_range(n, comm):
    """The rows [start, stop) of n that this rank keeps (n is a multiple of the rank count)."""
    size = n // comm.Get_size()
    start = comm.Get_rank() * size
    return start, start + size


class CopyToTensorParallel(torch.autograd.Function):
    """f: identity in forward, allreduce in backward."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # TODO: each rank's shard contributes only its part of dL/dx: sum the parts.
        return grad, None  # one gradient per forward argument: None for comm


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: allreduce in forward, identity in backward."""

    @staticmethod
    def forward(ctx, partial, comm):
        # TODO: sum the partial outputs of the ranks (into a new tensor).
        return partial.view_as(partial)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ColumnParallelLinear(nn.Module):
    """fc1: this rank keeps rows (output features) start..stop of weight [out, in] and of bias."""

    def __init__(self, comm, weight, bias):
        super().__init__()
        self.comm = comm
        # TODO: keep only this rank's rows (shard_range); for now every rank keeps everything.
        self.weight = nn.Parameter(weight.clone())
        self.bias = nn.Parameter(bias.clone())

    def forward(self, x):
        # TODO: where does f go?
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """fc2: this rank keeps columns (input features) start..stop of weight [out, in]; the whole bias."""

    def __init__(self, comm, weight, bias):
        super().__init__()
        self.comm = comm
        # TODO: keep only this rank's columns; the bias stays whole.
        self.weight = nn.Parameter(weight.clone())
        self.bias = nn.Parameter(bias.clone())

    def forward(self, x_shard):
        # TODO: x_shard W_r^T is this rank's partial sum of the output: where does g go, and
        # where the bias?
        return F.linear(x_shard, self.weight, self.bias)


class ParallelMLP(nn.Module):
    """The transformer MLP, fc2(gelu(fc1(x))), split over the ranks of ``comm``."""

    def __init__(self, comm, w1, b1, w2, b2):
        super().__init__()
        self.fc1 = ColumnParallelLinear(comm, w1, b1)  # w1 [ffn, hidden]
        self.fc2 = RowParallelLinear(comm, w2, b2)  # w2 [hidden, ffn]

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))
