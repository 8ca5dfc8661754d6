"""Problem 13: sharded optimizer states (ZeRO stages 1 and 2).

Data-parallel Adam keeps the momentum m and the variance v of every parameter on every rank: two
more copies of the model, identical on all p ranks. Shard them: rank r keeps the moments of one
contiguous shard of the flat parameter vector, and only updates that shard.

ShardedAdam(comm, size, lr, betas, eps)
    Adam over a flat float32 parameter vector of `size` elements; betas = (beta1, beta2).

opt.step(weights, grad)
    Called once per step on every rank. `grad` (float32, `size`) is the gradient of THIS rank's
    batch's mean loss; the global batch's gradient is the mean over the ranks. Update `weights`
    (float32, `size`, the same on every rank) in place, so that afterwards every rank holds the
    same weights as plain Adam would on the global batch:

        m = beta1 m + (1 - beta1) g        v = beta2 v + (1 - beta2) g^2        (t = 1, 2, ...)
        w -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)

    Keep only your shard of m and v. comm.Reduce_scatter_block(sendbuf, recvbuf, op=SUM) and
    comm.Allgather(sendbuf, recvbuf) work on NumPy arrays, mpi4py style; `size` need not divide by p.

opt.state()
    -> {"start": the index of your shard's first parameter, "m": your m, "v": your v}
    (a padded tail beyond `size` may be zeros). The checker compares the values with plain Adam's.

memory_per_rank_gb(params, ranks, stage)
    GB (1e9 bytes) per rank of mixed-precision Adam's model states for `params` parameters on
    `ranks` data-parallel ranks at ZeRO stage 0 (plain data parallel), 1, 2 or 3: 2 bytes per
    parameter of fp16 weights, 2 of fp16 gradients, 12 of optimizer states.

Check it with `distlab check 13`; see it with `distlab run 13`; ask for a nudge with `distlab hint 13`.
"""

import numpy as np

from distlab import SUM  # noqa: F401 (you will need it)


class ShardedAdam:
    def __init__(self, comm, size, lr, betas, eps):
        self.comm, self.size, self.lr, (self.beta1, self.beta2), self.eps = comm, size, lr, betas, eps
        # TODO: which parameters are this rank's shard (size may not divide by p), and the moments
        # of that shard only.
        self.start = 0
        self.m = np.zeros(0, dtype=np.float32)
        self.v = np.zeros(0, dtype=np.float32)

    def step(self, weights, grad):
        # TODO: reduce-scatter the gradients (padded to p equal blocks), average them, update your
        # shard with Adam, allgather the shards into `weights`.
        pass

    def state(self):
        return {"start": self.start, "m": self.m, "v": self.v}


def memory_per_rank_gb(params, ranks, stage):
    # TODO: the ZeRO paper's model-state memory per rank, in GB.
    return 0.0
