"""Problem 13, reference solution: Adam with sharded moments (ZeRO stages 1 and 2), and the ZeRO
paper's memory calculator.

Plain data-parallel Adam keeps, on every rank, the momentum m and the variance v of EVERY
parameter: two more copies of the model, the same on all p ranks. But each rank only needs the
moments of the parameters it updates, so split the flat parameter vector into p contiguous shards
and give each rank one. One step, on every rank:

  reduce-scatter  the ranks' gradients, summed, land shard by shard: rank r receives only the sum
                  of shard r (the vector is padded with zeros to p equal blocks first); divide by p
                  for the mean gradient of the global batch;
  update          Adam on shard r alone: its slice of m and v, bias-corrected with the step count t
                  (1 at the first step), and its slice of the weights;
  allgather       every rank's updated shard to every rank, so all hold the same full weights for
                  the next forward pass.

A reduce-scatter and an allgather move what a ring allreduce moves (an allreduce IS the two), so
sharding costs no extra bytes; it saves (p - 1) / p of the optimizer state on each rank.
"""

import numpy as np

from distlab import SUM


class ShardedAdam:
    """Adam over a flat float32 parameter vector of ``size`` elements, its moments sharded over the ranks."""

    def __init__(self, comm, size, lr, betas, eps):
        self.comm, self.size, self.lr, (self.beta1, self.beta2), self.eps = comm, size, lr, betas, eps
        p, rank = comm.Get_size(), comm.Get_rank()
        self.per = -(-size // p)  # ceil: the last shard is padded, never dropped
        self.start, self.stop = min(rank * self.per, size), min((rank + 1) * self.per, size)
        self.m = np.zeros(self.per, dtype=np.float32)  # this rank's shard of the moments only
        self.v = np.zeros(self.per, dtype=np.float32)
        self.t = 0

    def step(self, weights, grad):
        """One Adam step: ``grad`` is this rank's gradient (of its own batch's mean loss);
        ``weights`` (float32, every rank the same) is updated in place to the same values everywhere."""
        p, per = self.comm.Get_size(), self.per
        padded = np.zeros(p * per, dtype=np.float32)
        padded[: self.size] = grad
        shard_grad = np.empty(per, dtype=np.float32)
        self.comm.Reduce_scatter_block(padded, shard_grad, op=SUM)
        shard_grad /= p  # a sum of p batch means: the global batch's mean is its p-th

        self.t += 1  # the bias correction counts steps from 1
        self.m = self.beta1 * self.m + (1 - self.beta1) * shard_grad
        self.v = self.beta2 * self.v + (1 - self.beta2) * shard_grad**2
        m_hat = self.m / (1 - self.beta1**self.t)
        v_hat = self.v / (1 - self.beta2**self.t)

        full = np.zeros(p * per, dtype=np.float32)
        full[: self.size] = weights
        mine = full[self.start : self.start + per]
        mine -= (self.lr * m_hat / (np.sqrt(v_hat) + self.eps)).astype(np.float32)
        self.comm.Allgather(mine.copy(), full)  # each rank's updated shard, to every rank
        weights[:] = full[: self.size]

    def state(self):
        """This rank's optimizer state: where its shard starts, and its moments (the padded tail is zeros)."""
        return {"start": self.start, "m": self.m, "v": self.v}


def memory_per_rank_gb(params, ranks, stage):
    """GB (1e9 bytes) per rank of mixed-precision Adam's model states, at ZeRO ``stage`` (0: plain
    data parallel). Per parameter: 2 bytes of fp16 weights, 2 of fp16 gradients, and K = 12 of
    optimizer states (fp32 master weights, momentum, variance). Stage 1 shards the 12, stage 2 the
    gradients too, stage 3 the weights too: whatever is sharded costs 1 / ranks of itself."""
    weights, grads, states = 2 * params, 2 * params, 12 * params
    sharded = {0: 0, 1: states, 2: states + grads, 3: states + grads + weights}[stage]
    whole = weights + grads + states
    return ((whole - sharded) + sharded / ranks) / 1e9
