"""Problem 16: float16 gradients with dynamic loss scaling, across ranks.

Every rank keeps float32 master weights of a small model and owns one shard of them (48 weights,
shard r = weights r*48/p to (r+1)*48/p - 1). One step of train_step(comm, model, scaler, lr):

    model.gradients()      this rank's float32 gradient of its batch's mean loss, unscaled; at hidden
                           steps the harness writes inf, -inf or nan into one rank's result
    model.weights          this rank's float32 copy of all the weights: update it in place
    scaler                 your LossScaler, with the policy's parameters of the case

Multiply by the scale, cast to float16, reduce-scatter (SUM) so each rank gets its shard of the
sum, decide whether the step overflowed (inf or nan anywhere, on any rank), then either skip it or
update your shard with the unscaled mean and allgather the shards; and update the scale:
times backoff_factor on an overflow, times growth_factor after growth_interval clean steps in a
row. Return True if the step was applied, False if it was skipped.

Check it with `distlab check 16`; see it with `distlab run 16`; ask for a nudge with `distlab hint 16`.
"""

import numpy as np

from distlab import SUM


class LossScaler:
    """The dynamic loss scale."""

    def __init__(self, init_scale, growth_factor, backoff_factor, growth_interval):
        self.scale = float(init_scale)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval

    def update(self, overflow):
        # TODO: lower the scale on an overflow, raise it after growth_interval clean steps in a row.
        pass


def train_step(comm, model, scaler, lr):
    """One SGD step of the mean of the ranks' gradients; True if applied, False if skipped."""
    p = comm.Get_size()
    # TODO: float16 on the wire, scaled; a reduce-scatter, so each rank sums only its shard.
    total = np.empty_like(model.weights)
    comm.Allreduce(model.gradients(), total, op=SUM)
    # TODO: an overflowed step (inf or nan anywhere) must be skipped by every rank.
    model.weights -= np.float32(lr) * total / np.float32(p)
    scaler.update(False)
    return True
