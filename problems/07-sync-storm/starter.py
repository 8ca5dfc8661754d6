"""Problem 07: the gradient sync storm. Write tensor fusion.

A training step hands you a few hundred small gradient tensors (NumPy arrays of float32, float64
and int64). Summing each with its own comm.Allreduce pays the network's latency once per tensor;
pack them into buffers and pay it once per buffer instead:

    fusion = Fusion(comm, threshold_bytes=64 * 1024)
    for grad in grads:
        fusion.add(grad)
    fusion.flush()            # the end of the step: now every grad holds the sum over all ranks

Rules of the game:

* the result is the SUM over the ranks, written into each tensor in place (np.copyto(t, ...));
* one buffer per dtype: never pack float32, float64 and int64 tensors together;
* a buffer is reduced with ONE collective (comm.Allreduce) as soon as it holds threshold_bytes
  or more, so it never holds more than threshold + one tensor; at most
  ceil(step bytes / threshold) + (number of dtypes) collectives per step;
* flush() sends whatever is left and leaves the fusion empty for the next step;
* every rank adds the same tensors in the same order.

Check it with `distlab check 07`; ask for a nudge with `distlab hint 07`.
"""

import numpy as np

from distlab import IN_PLACE, SUM


class Fusion:
    """Sums tensors across all ranks, in place, a bufferful at a time."""

    def __init__(self, comm, threshold_bytes):
        self.comm = comm
        self.threshold_bytes = threshold_bytes
        # TODO: what you keep while tensors wait: per dtype, the tensors and their total bytes.

    def add(self, tensor):
        """Schedules tensor to be summed across the ranks in place.

        TODO: put it with the waiting tensors of its dtype; once those hold threshold_bytes or
        more, pack them into one buffer (np.empty of that dtype, each tensor at its offset),
        reduce it with comm.Allreduce(IN_PLACE, buffer, SUM) and copy each slice back."""

    def flush(self):
        """Ends the step: afterwards every added tensor holds its sum.

        TODO: send every buffer that still has tensors in it, and start the next step empty."""
