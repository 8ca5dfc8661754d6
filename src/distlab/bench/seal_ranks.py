"""The rank programs of the benchmarks: the seal's call of a rank to itself and ping-pong between
ranks 0 and 1, timed in the process that makes the calls (the learner process when sealed, the
rank when not), and the launch benchmark's barrier."""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def pingpong(comm: Any, solution: Any, nbytes: int, rounds: int) -> float:
    """Seconds per message (half a round trip), the median of ``rounds`` round trips."""
    buf = np.zeros(max(nbytes, 1), dtype=np.uint8)
    rank, peer = comm.Get_rank(), 1 - comm.Get_rank()
    times = []
    for _ in range(rounds + 5):  # five to warm up
        start = time.perf_counter()
        if rank == 0:
            comm.Send(buf, dest=peer)
            comm.Recv(buf, source=peer)
        else:
            comm.Recv(buf, source=peer)
            comm.Send(buf, dest=peer)
        times.append(time.perf_counter() - start)
    return float(np.median(times[5:])) / 2


def selfcall(comm: Any, solution: Any, nbytes: int, rounds: int) -> float:
    """Seconds per Sendrecv of ``nbytes`` from a rank to itself, the median of ``rounds``: one
    call's crossing, with no peer to wait for."""
    send = np.zeros(max(nbytes, 1), dtype=np.uint8)
    recv = np.empty_like(send)
    rank = comm.Get_rank()
    times = []
    for _ in range(rounds + 5):  # five to warm up
        start = time.perf_counter()
        comm.Sendrecv(send, rank, 0, recv, rank, 0)
        times.append(time.perf_counter() - start)
    return float(np.median(times[5:]))


def barrier(comm: Any, solution: Any) -> None:
    """Nothing but meeting the others: what a launch costs beyond the program (start_cost.py)."""
    comm.Barrier()
