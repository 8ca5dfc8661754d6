"""Problem 03, reference solution: ring allreduce from point-to-point calls.

The buffer is cut into p chunks. Reduce-scatter: in p-1 steps each rank passes one chunk to its
right neighbour and folds the chunk arriving from its left one into its own copy; afterwards rank r
owns the fully reduced chunk r+1. Allgather: p-1 more steps pass the finished chunks around.
Every rank sends 2(p-1) chunks of n/p elements: 2(p-1)/p * n in all, the bandwidth optimum.

Each step is one Sendrecv, so no rank ever blocks in a Send while its neighbour does the same.
"""

import numpy as np

from distlab import SUM


def chunk_bounds(n, p):
    """Start of each of p nearly equal chunks of n elements, plus n at the end."""
    base, extra = divmod(n, p)
    bounds = [0]
    for i in range(p):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return bounds


def allreduce(comm, buf, op=SUM):
    """Reduces buf element-wise across all ranks, in place: afterwards every rank holds the result."""
    p, rank = comm.Get_size(), comm.Get_rank()
    if p == 1 or buf.size == 0:
        return
    flat = buf.reshape(-1)  # a view: writes land in buf
    bounds = chunk_bounds(flat.size, p)

    def chunk(i):
        i %= p
        return flat[bounds[i] : bounds[i + 1]]

    right, left = (rank + 1) % p, (rank - 1) % p
    incoming = np.empty(bounds[1] - bounds[0], dtype=flat.dtype)  # chunk 0 is the largest

    # Reduce-scatter: at step s, send chunk (rank - s), fold the arriving chunk (rank - s - 1).
    for step in range(p - 1):
        mine = chunk(rank - step - 1)
        comm.Sendrecv(chunk(rank - step), dest=right, recvbuf=incoming[: mine.size], source=left)
        op.Reduce_local(incoming[: mine.size], mine)

    # Allgather: rank owns chunk (rank + 1); pass finished chunks on, receive into place.
    for step in range(p - 1):
        comm.Sendrecv(chunk(rank + 1 - step), dest=right, recvbuf=chunk(rank - step), source=left)
