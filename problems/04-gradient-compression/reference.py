"""Problem 04, reference solution: gradient compression, from FP16 to 1-bit Adam.

Ways to average a gradient over p ranks with fewer bytes on the wire, gentlest first:

* FP16: cast to float16, allreduce, cast back. Half the bytes of float32. Dividing by p *before*
  the cast keeps the float16 sum below its largest value (65504).
* 1-bit compression: send the sign of each element, packed 8 per byte, and one float32 scale
  (the mean |x|) per chunk; the receiver rebuilds scale * sign. The part that was lost, x minus
  what was sent, is kept as an *error* and added to the next vector: error feedback. Nothing is
  lost for good, only delayed.
* 1-bit allreduce (DeepSpeed): rank j serves chunk j. Every worker compresses its whole vector
  (with its worker error), sends chunk j to rank j; the server averages the p chunks it received,
  compresses the average again (with its server error) and sends it to every rank. Each rank sends
  2(p-1)/p * n/8 bytes plus the scales: 1/32 of a float32 ring allreduce.
* 1-bit Adam: plain Adam for a warmup, while the variance settles; then the variance is frozen
  and only the momentum travels, through the 1-bit allreduce. Over the whole run the volume is
  w + (1-w)/32 of float32 for a warmup fraction w.
* Top-k: send only the k largest |x| as (index, value) pairs; error feedback keeps the rest.

    distlab check 04 --solution reference
    distlab run 04 --solution reference                      # AUC, bytes, virtual times
    distlab run 04 --solution reference --param sweep=1      # AUC against top-k compression
"""

import numpy as np


def chunk_bounds(n, p):
    """Start of each of p nearly equal chunks of n elements, plus n at the end."""
    base, extra = divmod(n, p)
    bounds = [0]
    for i in range(p):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return bounds


def topk_count(n, keep_fraction):
    """How many elements top-k keeps: keep_fraction of n, at least one (none of nothing)."""
    return min(n, max(1, int(round(keep_fraction * n)))) if n else 0


def fp32_allreduce(comm, grad):
    """Given: the full-precision baseline. grad (float32) becomes the mean over all ranks."""
    total = np.empty_like(grad)
    comm.Allreduce(grad, total)  # SUM, the default, on distlab's comm and on mpi4py's
    np.divide(total, comm.Get_size(), out=grad)


# -- FP16 ----------------------------------------------------------------------------------------


def fp16_allreduce(comm, grad):
    """grad (float32) becomes the mean over all ranks, with float16 on the wire."""
    # Divide first: p float16 values of up to 65504 each may sum past float16's largest value.
    half = (grad / comm.Get_size()).astype(np.float16)
    total = np.empty_like(half)
    comm.Allreduce(half, total)  # a float16 SUM: it works on MPI and gloo alike
    grad[:] = total


# -- 1-bit compression ---------------------------------------------------------------------------


def packed_size(length):
    """Bytes of `length` sign bits packed 8 per byte."""
    return (length + 7) // 8


def compress(x, chunks):
    """1 bit per element plus one scale per chunk.

    Returns (signs, scales): signs is uint8, each chunk's bits (1 for x >= 0) packed 8 per byte
    on its own, chunk after chunk; scales is float32, the mean |x| of each chunk: the one number
    that makes scale * sign(x) closest to x in squared error."""
    bounds = chunk_bounds(x.size, chunks)
    signs, scales = [], np.zeros(chunks, dtype=np.float32)
    for c in range(chunks):
        part = x[bounds[c] : bounds[c + 1]]
        signs.append(np.packbits(part >= 0))
        if part.size:
            scales[c] = np.abs(part).mean()
    return np.concatenate(signs) if signs else np.zeros(0, np.uint8), scales


def decompress(signs, scales, n):
    """The float32 vector of n elements that compress() describes: +scale or -scale each."""
    bounds = chunk_bounds(n, scales.size)
    out = np.empty(n, dtype=np.float32)
    offset = 0
    for c in range(scales.size):
        length = bounds[c + 1] - bounds[c]
        bits = np.unpackbits(signs[offset : offset + packed_size(length)], count=length)
        out[bounds[c] : bounds[c + 1]] = np.where(bits == 1, scales[c], -scales[c])
        offset += packed_size(length)
    return out


def compress_with_feedback(x, error, chunks):
    """Compresses x + error; error (float32, in place) becomes what this compression lost."""
    corrected = x + error
    signs, scales = compress(corrected, chunks)
    error[:] = corrected - decompress(signs, scales, x.size)
    return signs, scales


def to_bytes(signs, scale):
    """One message: the packed signs, then the float32 scale as 4 bytes."""
    return np.concatenate([signs, np.asarray([scale], dtype=np.float32).view(np.uint8)])


def from_bytes(message):
    """The inverse of to_bytes: (signs, scales) with one scale."""
    return message[:-4], message[-4:].copy().view(np.float32)


def onebit_allreduce(comm, x, worker_error, server_error):
    """x (float32, n elements) becomes the compressed mean over all ranks, in place.

    worker_error: this rank's residual, n elements. server_error: the residual of the chunk this
    rank serves, chunk `rank` of chunk_bounds(n, p). Both are updated in place."""
    p, rank, n = comm.Get_size(), comm.Get_rank(), x.size
    bounds = chunk_bounds(n, p)
    lengths = [bounds[j + 1] - bounds[j] for j in range(p)]

    # Worker side: compress the whole vector, one scale per server chunk.
    signs, scales = compress_with_feedback(x, worker_error, p)
    starts = np.cumsum([0] + [packed_size(length) for length in lengths])
    outgoing = [to_bytes(signs[starts[j] : starts[j + 1]], scales[j]) for j in range(p)]

    # Scatter: at step s, send chunk rank+s to its server and receive our chunk from rank-s.
    # A shift pattern with Sendrecv: every rank sends and receives once per step, no deadlock.
    mine = lengths[rank]
    received = [outgoing[rank]]
    for s in range(1, p):
        dest, source = (rank + s) % p, (rank - s) % p
        incoming = np.empty(packed_size(mine) + 4, dtype=np.uint8)
        comm.Sendrecv(outgoing[dest], dest=dest, recvbuf=incoming, source=source)
        received.append(incoming)

    # Server side: average the p workers' versions of our chunk, compress again with feedback.
    average = sum(decompress(*from_bytes(m), mine) for m in received) / p
    served_signs, served_scale = compress_with_feedback(average.astype(np.float32), server_error, 1)
    served = to_bytes(served_signs, served_scale[0])

    # Allgather: every server's compressed chunk goes to every rank.
    x[bounds[rank] : bounds[rank + 1]] = decompress(served_signs, served_scale, mine)
    for s in range(1, p):
        dest, source = (rank + s) % p, (rank - s) % p
        incoming = np.empty(packed_size(lengths[source]) + 4, dtype=np.uint8)
        comm.Sendrecv(served, dest=dest, recvbuf=incoming, source=source)
        x[bounds[source] : bounds[source + 1]] = decompress(*from_bytes(incoming), lengths[source])


# -- 1-bit Adam ----------------------------------------------------------------------------------


class OneBitAdam:
    """Adam whose second half talks in 1-bit momenta (DeepSpeed's 1-bit Adam).

    Steps 1..warmup_steps: plain Adam on the full-precision mean gradient. Afterwards the variance
    is frozen (it barely moves once warm, and it is what makes Adam adaptive), each rank updates
    its momentum with its own gradient, and the momenta are averaged by onebit_allreduce. Every
    rank then applies the same update, so the parameters stay identical on all ranks."""

    def __init__(self, params, lr, warmup_steps, betas=(0.9, 0.999), eps=1e-8):
        self.params = params  # float32, updated in place
        self.lr, self.warmup_steps, self.eps = lr, warmup_steps, eps
        self.beta1, self.beta2 = betas
        self.m = np.zeros_like(params)
        self.v = np.zeros_like(params)
        self.v_hat = np.zeros_like(params)  # bias-corrected variance; frozen after the warmup
        self.t = 0
        self.worker_error = np.zeros_like(params)
        self.server_error = None  # sized on the first compressed step, when p and rank are known

    def step(self, comm, grad):
        """One optimizer step with this rank's gradient (float32, may be overwritten)."""
        self.t += 1
        b1, b2 = self.beta1, self.beta2
        if self.t <= self.warmup_steps:
            fp32_allreduce(comm, grad)
            self.m = b1 * self.m + (1 - b1) * grad
            self.v = b2 * self.v + (1 - b2) * grad * grad
            self.v_hat = self.v / (1 - b2**self.t)
        else:
            if self.server_error is None:
                bounds = chunk_bounds(self.params.size, comm.Get_size())
                rank = comm.Get_rank()
                self.server_error = np.zeros(bounds[rank + 1] - bounds[rank], dtype=np.float32)
            # The local momentum travels, not the gradient: averaging momenta is what Adam's
            # update needs, and momentum changes slowly, so its compression error stays small.
            self.m = (b1 * self.m + (1 - b1) * grad).astype(np.float32)
            onebit_allreduce(comm, self.m, self.worker_error, self.server_error)
        m_hat = self.m / (1 - b1**self.t)
        self.params -= (self.lr * m_hat / (np.sqrt(self.v_hat) + self.eps)).astype(np.float32)


# -- top-k sparsification ------------------------------------------------------------------------


def topk_allreduce(comm, grad, keep_fraction, error=None):
    """grad (float32) becomes the mean over all ranks of each rank's k largest |values|.

    error: None (no error feedback), or this rank's residual (float32, in place): what was not
    sent this time is added to the next gradient."""
    p, rank, n = comm.Get_size(), comm.Get_rank(), grad.size
    k = topk_count(n, keep_fraction)
    corrected = grad + error if error is not None else grad.copy()
    index = np.argpartition(np.abs(corrected), n - k)[n - k :].astype(np.int32)
    values = corrected[index].astype(np.float32)
    if error is not None:
        error[:] = corrected
        error[index] = 0

    # Allgather of the (index, value) pairs: k int32 then k float32 in one message per peer.
    message = np.concatenate([index.view(np.uint8), values.view(np.uint8)])
    total = np.zeros(n, dtype=np.float32)
    np.add.at(total, index, values)
    incoming = np.empty_like(message)
    for s in range(1, p):
        comm.Sendrecv(message, dest=(rank + s) % p, recvbuf=incoming, source=(rank - s) % p)
        np.add.at(total, incoming[: 4 * k].view(np.int32), incoming[4 * k :].view(np.float32))
    grad[:] = total / p
