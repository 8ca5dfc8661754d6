"""Problem 05, reference solution: choose the layout, then build the tensor-parallel MLP.

plan(model, devices, batch) walks the layouts (dp, tp, pp) with dp * tp * pp = devices from the
least model parallelism (tp * pp) to the most, and for each amount tries the widest TP first:
model parallelism puts communication on the critical path of every layer, so use as little of
it as memory allows, and TP inside a node (fast links) before PP (bubbles).

The tensor-parallel MLP is Megatron-LM's: the first linear layer is split by output features
(column-parallel: each rank computes a slice of the hidden activation, GELU works slice-wise), the
second by input features (row-parallel: each rank produces a partial sum of the output). Two
conjugate operators make the autograd right with one allreduce each way:

    f: identity forward, allreduce backward    (in front of the column-parallel layer)
    g: allreduce forward, identity backward    (after the row-parallel layer)
"""

import torch
import torch.nn.functional as F
from torch import nn

from distlab import IN_PLACE, SUM

BYTES_PER_PARAM = 16  # fp16 weights 2 + fp16 grads 2 + fp32 master weights 4 + Adam m 4 + v 4


# -- part 1: the plan -----------------------------------------------------------------------------


def memory_per_device(model, batch, dp, tp, pp):
    """Bytes one device needs for layout (dp, tp, pp), by the card's memory model."""
    # Model state: every parameter lives on one TP x PP cell, and DP replicates it (no ZeRO).
    state = BYTES_PER_PARAM * model["params"] / (tp * pp)
    # Activations, GPipe style: a stage keeps its layers' activations for its whole share of the
    # batch. Per token and layer 34 * hidden bytes, of which TP splits 24 and replicates 10.
    samples = batch / dp
    per_token_layer = model["hidden"] * (10 + 24 / tp)
    activations = samples * model["seq_len"] * (model["layers"] / pp) * per_token_layer
    return state + activations


def plan(model, devices, batch):
    """The layout to train ``model`` on ``devices`` with ``batch``: {"dp", "tp", "pp"} or None."""
    n, per_node, memory = devices["count"], devices["per_node"], devices["memory_bytes"]
    for mp in range(1, n + 1):  # least model parallelism first
        if n % mp:
            continue
        dp = n // mp
        for tp in range(mp, 0, -1):  # the widest TP first
            if mp % tp:
                continue
            pp = mp // tp
            if per_node % tp or model["layers"] % pp or batch % dp:
                continue  # TP must stay in a node, stages need whole layers, replicas whole samples
            if memory_per_device(model, batch, dp, tp, pp) <= memory:
                return {"dp": dp, "tp": tp, "pp": pp}
    return None


# -- part 2: the tensor-parallel MLP --------------------------------------------------------------


def shard_range(n, comm):
    """The rows [start, stop) of n that this rank keeps (n is a multiple of the rank count)."""
    size = n // comm.Get_size()
    start = comm.Get_rank() * size
    return start, start + size


def allreduce(tensor, comm):
    """The sum of ``tensor`` over all ranks, as a new tensor (autograd may still need the input)."""
    out = tensor.detach().contiguous().clone()
    comm.Allreduce(IN_PLACE, out, op=SUM)
    return out


class CopyToTensorParallel(torch.autograd.Function):
    """f: the input is already the same on every rank, so forward passes it through. Each rank's
    column shard sends back only its part of dL/dx, so backward sums the parts."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return allreduce(grad, ctx.comm), None


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: forward sums the row-parallel partial outputs. Every rank then holds the same output,
    so the gradient arriving at g is already the full one on every rank: backward passes it."""

    @staticmethod
    def forward(ctx, partial, comm):
        return allreduce(partial, comm)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ColumnParallelLinear(nn.Module):
    """y_r = x W_r^T + b_r with W_r, b_r this rank's rows (output features) of W [out, in], b [out]."""

    def __init__(self, comm, weight, bias):
        super().__init__()
        self.comm = comm
        start, stop = shard_range(weight.shape[0], comm)
        # clone(): the shard owns its memory, so the full matrix can be freed.
        self.weight = nn.Parameter(weight[start:stop].clone())
        self.bias = nn.Parameter(bias[start:stop].clone())

    def forward(self, x):
        x = CopyToTensorParallel.apply(x, self.comm)
        return F.linear(x, self.weight, self.bias)  # [..., out / p]: no communication


class RowParallelLinear(nn.Module):
    """y = sum_r x_r W_r^T + b with W_r this rank's columns (input features) of W [out, in]."""

    def __init__(self, comm, weight, bias):
        super().__init__()
        self.comm = comm
        start, stop = shard_range(weight.shape[1], comm)
        self.weight = nn.Parameter(weight[:, start:stop].contiguous().clone())
        self.bias = nn.Parameter(bias.clone())  # whole, on every rank

    def forward(self, x_shard):
        partial = F.linear(x_shard, self.weight)  # [..., out], one rank's share of the sum
        # The bias goes in once, after the sum; added before it, it would count p times.
        return ReduceFromTensorParallel.apply(partial, self.comm) + self.bias


class ParallelMLP(nn.Module):
    """The transformer MLP, fc2(gelu(fc1(x))), split over the ranks of ``comm``."""

    def __init__(self, comm, w1, b1, w2, b2):
        super().__init__()
        self.fc1 = ColumnParallelLinear(comm, w1, b1)  # w1 [ffn, hidden]
        self.fc2 = RowParallelLinear(comm, w2, b2)  # w2 [hidden, ffn]

    def forward(self, x):
        # x [..., hidden], the same on every rank -> [..., ffn / p] -> [..., hidden] on every rank
        return self.fc2(F.gelu(self.fc1(x)))
