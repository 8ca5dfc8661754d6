"""Problem 07, reference solution: tensor fusion.

One Allreduce per gradient tensor pays the ring's latency, 2(p-1) alpha, once per tensor: with
300 tensors and alpha = 50 us that is 90 ms on 4 ranks before a single byte has moved. Fusion
pays it once per *buffer*: tensors wait in a buffer until it holds threshold_bytes, then the
whole buffer is reduced with one Allreduce and the sums are copied back into the tensors.

* One buffer per dtype. An Allreduce reduces one datatype; packing a float64 into a float32
  buffer throws away half its mantissa, and an int64 in any float buffer loses its low bits.
* A buffer is sent as soon as it holds threshold_bytes or more (the tensor that crossed the line
  is included). So it never holds more than threshold + one tensor, and every buffer but the last
  of its dtype carries at least threshold bytes: a step of B bytes in D dtypes needs at most
  ceil(B / threshold) + D collectives.
* flush() ends the cycle (here: the training step): whatever sits in a partial buffer is sent.

The pending tensors are kept as references and packed only when their buffer is due, so the only
memory the fusion allocates is the buffer being reduced.
"""

import numpy as np

from distlab import IN_PLACE, SUM


class Fusion:
    """Sums tensors across all ranks, in place, a bufferful at a time.

        fusion = Fusion(comm, threshold_bytes=64 * 1024)
        for grad in grads:
            fusion.add(grad)      # may reduce a full buffer right away
        fusion.flush()            # now every grad holds the sum over the ranks

    Every rank must add the same tensors (same shapes and dtypes) in the same order.
    """

    def __init__(self, comm, threshold_bytes):
        self.comm = comm
        self.threshold_bytes = threshold_bytes
        self.pending = {}  # dtype -> tensors waiting for their buffer, in add order
        self.pending_bytes = {}  # dtype -> their total size in bytes
        self.peak_buffer_bytes = 0  # the largest buffer reduced so far (for the curious)

    def add(self, tensor):
        """Schedules tensor (a contiguous NumPy array) to be summed across the ranks in place."""
        dtype = tensor.dtype
        self.pending.setdefault(dtype, []).append(tensor)
        self.pending_bytes[dtype] = self.pending_bytes.get(dtype, 0) + tensor.nbytes
        if self.pending_bytes[dtype] >= self.threshold_bytes:
            self._reduce(dtype)

    def flush(self):
        """Sends every partial buffer; afterwards every added tensor holds its sum."""
        for dtype in list(self.pending):  # the same order on every rank: first added first
            self._reduce(dtype)

    def _reduce(self, dtype):
        tensors = self.pending.pop(dtype)
        del self.pending_bytes[dtype]
        sizes = [t.size for t in tensors]
        offsets = np.cumsum([0] + sizes)

        # Pack: one contiguous buffer of this dtype, each tensor at its offset.
        buffer = np.empty(offsets[-1], dtype=dtype)
        for t, start, stop in zip(tensors, offsets[:-1], offsets[1:]):
            buffer[start:stop] = t.reshape(-1)
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, buffer.nbytes)

        # One collective for the whole buffer, in place: no second copy of it.
        self.comm.Allreduce(IN_PLACE, buffer, SUM)

        # Unpack: copyto writes into the tensor itself, whatever its shape.
        for t, start, stop in zip(tensors, offsets[:-1], offsets[1:]):
            np.copyto(t, buffer[start:stop].reshape(t.shape))
