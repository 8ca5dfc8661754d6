"""Problem 04: gradient compression, from FP16 to 1-bit Adam.

Four workers train a click-through-rate model over a slow link, and the gradient sync costs more
than the compute. Write four ways to average a gradient with fewer bytes, and an optimizer:

* fp16_allreduce: float16 on the wire, half the bytes;
* compress / decompress / compress_with_feedback: 1 bit per element, packed 8 per byte, plus one
  float32 scale per chunk, and error feedback that keeps what the compression lost;
* onebit_allreduce: DeepSpeed's compressed allreduce, where rank j serves chunk j;
* OneBitAdam: plain Adam during a warmup, then frozen variance and 1-bit momentum;
* topk_allreduce: only the k largest values travel, as (index, value) pairs.

Every reducer leaves the *mean* over the ranks in the buffer it is given, in place. The built-in
collectives are allowed where they make sense (comm.Allreduce sums float16 on MPI and gloo alike);
point-to-point calls (Sendrecv, Isend/Irecv) are needed where the data is compressed.

Check it with `distlab check 04`; ask for a nudge with `distlab hint 04`.
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


def packed_size(length):
    """Bytes of `length` sign bits packed 8 per byte."""
    return (length + 7) // 8


def fp32_allreduce(comm, grad):
    """Given: the full-precision baseline. grad (float32) becomes the mean over all ranks."""
    total = np.empty_like(grad)
    comm.Allreduce(grad, total)  # SUM, the default, on distlab's comm and on mpi4py's
    np.divide(total, comm.Get_size(), out=grad)


def fp16_allreduce(comm, grad):
    """grad (float32) becomes the mean over all ranks, with float16 on the wire.

    Values may be large: p float16 values near 30000 sum past 65504, float16's largest."""
    # TODO: cast to float16, allreduce the float16 buffer, write the mean back into grad.


def compress(x, chunks):
    """1 bit per element plus one scale per chunk.

    x is a float32 vector; cut it into `chunks` chunks with chunk_bounds(x.size, chunks).
    Returns (signs, scales):
      signs:  uint8; each chunk's bits (1 where x >= 0) packed 8 per byte with np.packbits, chunk
              after chunk, each chunk starting on a new byte (packed_size(len) bytes per chunk);
      scales: float32, one per chunk: the mean |x| of the chunk (0 for an empty chunk).
    """
    # TODO
    return np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.float32)


def decompress(signs, scales, n):
    """The float32 vector of n elements that (signs, scales) describe: +scale where the bit is 1,
    -scale where it is 0, chunk by chunk (chunk_bounds(n, scales.size))."""
    # TODO: np.unpackbits(..., count=length) undoes np.packbits.
    return np.zeros(n, dtype=np.float32)


def compress_with_feedback(x, error, chunks):
    """Compresses x + error and returns (signs, scales); error (float32) becomes, in place, what
    this compression lost: (x + error) - decompress(signs, scales, n)."""
    # TODO: error feedback.
    return compress(x, chunks)


def onebit_allreduce(comm, x, worker_error, server_error):
    """x (float32, n elements) becomes the compressed mean over all ranks, in place.

    worker_error: this rank's residual, n elements.
    server_error: the residual of the chunk this rank serves, chunk `rank` of chunk_bounds(n, p).
    Both are updated in place.

    1. worker: compress x with feedback (worker_error), one scale per chunk of chunk_bounds(n, p);
    2. send chunk j (its signs and its scale) to rank j; receive your chunk from every rank;
    3. server: average the p decompressed versions of your chunk, compress the average with
       feedback (server_error) and one scale;
    4. send it to every rank; x becomes the concatenation of the p servers' decompressed chunks.
    """
    p, rank = comm.Get_size(), comm.Get_rank()
    # TODO


class OneBitAdam:
    """DeepSpeed's 1-bit Adam on a flat float32 parameter vector, updated in place.

    Steps 1..warmup_steps (t counts from 1): plain Adam on the mean gradient (fp32_allreduce):
        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  v_hat = v / (1 - b2^t)
    Later steps: v_hat stays frozen; m = b1 m + (1 - b1) g with this rank's own g, then
        onebit_allreduce(comm, m, worker_error, server_error).
    Every step: params -= lr * (m / (1 - b1^t)) / (sqrt(v_hat) + eps).
    """

    def __init__(self, params, lr, warmup_steps, betas=(0.9, 0.999), eps=1e-8):
        self.params = params  # float32, updated in place
        self.lr, self.warmup_steps, self.eps = lr, warmup_steps, eps
        self.beta1, self.beta2 = betas
        self.m = np.zeros_like(params)
        self.v = np.zeros_like(params)
        self.v_hat = np.zeros_like(params)
        self.t = 0
        self.worker_error = np.zeros_like(params)
        self.server_error = None  # the chunk this rank serves: size it once p and rank are known

    def step(self, comm, grad):
        """One optimizer step with this rank's gradient (float32, may be overwritten)."""
        self.t += 1
        # TODO: the warmup stage, the compressed stage, the update.


def topk_allreduce(comm, grad, keep_fraction, error=None):
    """grad (float32) becomes the mean over all ranks of each rank's k largest |values|, where
    k = topk_count(n, keep_fraction).

    error: None (no error feedback), or this rank's residual (float32, in place): select the top
    k of grad + error, and keep the rest in error for next time. Send each peer k int32 indices
    and k float32 values (8k bytes)."""
    p, rank = comm.Get_size(), comm.Get_rank()
    # TODO
