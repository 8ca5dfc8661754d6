"""The rank programs of ``distlab calibrate``: each is ``program(comm, solution, *args)``.

They run under distlab's own launcher, through the same ``comm`` proxy as learner code, so that
what they measure is what a learner's program sees: the transport plus the proxy's bookkeeping
(counting, the rank's state slot, the trace). Every time is taken with ``time.perf_counter``
inside the ranks; the supervisor only collects the figures.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from ..runtime.comm.proxy import Comm

PING_TAG = 11
PONG_TAG = 12
BEGIN_MARK = "calibrate-begin"
END_MARK = "calibrate-end"


def ping_pong(
    comm: Comm, solution: Any, sizes: list[int], reps: int, warmup: int
) -> list[float] | None:
    """Rank 0 sends ``n`` bytes to rank 1 and waits for them back, for every n in ``sizes``.

    Returns, on rank 0, the median one-way time (half a round trip) per size; None elsewhere.
    Each round trip is timed on its own and the median taken, because on a shared machine a
    single descheduled rank inflates one sample by milliseconds and a mean would keep that."""
    rank = comm.Get_rank()
    medians: list[float] = []
    for n in sizes:
        buf = np.zeros(n, dtype=np.uint8)
        # Both ranks enter each size together, so the warmup absorbs any first-touch cost
        # (page faults of the new buffer, a transport switching protocol) on both sides.
        comm.Barrier()
        samples: list[float] = []
        for i in range(warmup + reps):
            if rank == 0:
                start = time.perf_counter()
                comm.Send(buf, dest=1, tag=PING_TAG)
                comm.Recv(buf, source=1, tag=PONG_TAG)
                if i >= warmup:
                    samples.append((time.perf_counter() - start) / 2)
            elif rank == 1:
                comm.Recv(buf, source=0, tag=PING_TAG)
                comm.Send(buf, dest=0, tag=PONG_TAG)
        if rank == 0:
            medians.append(statistics.median(samples))
    return medians if rank == 0 else None


def ring_allreduce(comm: Comm, solution: Any, n: int, reps: int, warmup: int) -> list[float]:
    """Runs ``solution.allreduce`` (problem 03's reference) on ``n`` float64 elements ``reps``
    times after ``warmup`` untimed calls; returns this rank's wall time of each timed call.

    Each timed call sits between two marks, so the supervisor can read the same call's virtual
    time off the replay of this rank's trace."""
    buf = np.empty(n, dtype=np.float64)
    times: list[float] = []
    for i in range(warmup + reps):
        buf.fill(1.0)  # fresh input each time: repeated sums would otherwise grow without bound
        # Every rank starts a call together, so a rank's wall time is the call's, not the time
        # it spent waiting for a peer still finishing the previous one.
        comm.Barrier()
        timed = i >= warmup
        if timed:
            comm.mark(BEGIN_MARK)
        start = time.perf_counter()
        solution.allreduce(comm, buf)
        elapsed = time.perf_counter() - start
        if timed:
            comm.mark(END_MARK)
            times.append(elapsed)
    return times
