"""Problem 16, reference solution: float16 gradients with dynamic loss scaling, over sharded weights.

Each rank keeps the model's float32 master weights; rank r owns shard r (PARAMS / p weights) and
is the only one to update it. One step:

1. Scale, then cast. Multiply the float32 gradient by the loss scale S and only then cast it to
   float16: a gradient of 1e-7 is below float16's smallest normal number (6.1e-5) and loses
   most of its bits, or all of them, if cast first; times S = 2^12 it is 4e-4, which float16 holds
   to 3 digits.
2. Reduce-scatter the float16 buffer: rank r receives the sum of shard r over the ranks, half the
   bytes of float32.
3. Decide the overflow for everyone. A fault in one rank's gradient (inf or nan) lands in one
   shard only, so only its owner sees it. Each rank flags its own shard (np.isfinite is False for
   inf, -inf and nan alike), and an Allreduce with MAX makes the flag global: every rank skips
   the same steps, and every rank's scale stays the same.
4. Step, or skip. On a clean step, unscale in float32 (divide by S and by p for the mean) and
   update the shard; on an overflow, leave it. Either way every rank joins the Allgather that
   hands the shards round, so every rank makes the same calls in the same order.
5. Update the scale: on an overflow multiply it by backoff_factor and restart the count of clean
   steps; after growth_interval clean steps in a row multiply it by growth_factor.
"""

import numpy as np

from distlab import MAX, SUM


class LossScaler:
    """The dynamic loss scale: lower it on an overflow, raise it after a run of clean steps."""

    def __init__(self, init_scale, growth_factor, backoff_factor, growth_interval):
        self.scale = float(init_scale)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.clean_steps = 0  # clean steps since the last overflow or the last growth

    def update(self, overflow):
        if overflow:
            self.scale *= self.backoff_factor
            self.clean_steps = 0  # the run of clean steps starts again
            return
        self.clean_steps += 1
        if self.clean_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.clean_steps = 0


def train_step(comm, model, scaler, lr):
    """One SGD step of the mean of the ranks' gradients; returns True if applied, False if skipped."""
    p, rank = comm.Get_size(), comm.Get_rank()
    size = model.weights.size // p
    mine = slice(rank * size, (rank + 1) * size)

    # Scale in float32 first, then cast: the scale lifts small gradients out of float16's underflow.
    scaled = (model.gradients() * np.float32(scaler.scale)).astype(np.float16)
    summed = np.empty(size, dtype=np.float16)
    comm.Reduce_scatter_block(scaled, summed, op=SUM)

    # Only this rank sees its shard: make the decision global, or the ranks part ways.
    overflow = np.array([0 if np.isfinite(summed).all() else 1], dtype=np.int32)
    comm.Allreduce(overflow.copy(), overflow, op=MAX)
    skipped = bool(overflow[0])

    shard = model.weights[mine].copy()
    if not skipped:
        # Unscale in float32: float16 holds the sum, never the update.
        shard -= np.float32(lr) * (summed.astype(np.float32) / np.float32(scaler.scale * p))
    comm.Allgather(shard, model.weights)  # every rank, every step: the same calls on all ranks
    scaler.update(skipped)
    return not skipped
