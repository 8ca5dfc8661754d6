"""Small rank programs for launcher tests: each is ``program(comm, solution, *args)``."""

from __future__ import annotations

import os
import time

import numpy as np


def ring_sum(comm, solution, n):
    """Passes a buffer once around the ring with Sendrecv and returns what arrived."""
    rank, size = comm.Get_rank(), comm.Get_size()
    out = np.full(n, float(rank))
    got = np.empty(n)
    comm.Sendrecv(out, dest=(rank + 1) % size, recvbuf=got, source=(rank - 1) % size)
    return got


def call_solution(comm, solution, name, *args):
    """Calls solution.<name>(comm, *args) and returns its result."""
    return getattr(solution, name)(comm, *args)


def send_send_deadlock(comm, solution, n):
    """Every rank sends to its right neighbour first: deadlocks once n is past the eager limit."""
    rank, size = comm.Get_rank(), comm.Get_size()
    buf = np.zeros(n)
    comm.Send(buf, dest=(rank + 1) % size)
    comm.Recv(buf, source=(rank - 1) % size)
    return buf.sum()


def recv_from_finished(comm, solution):
    """Rank 0 waits for a message that rank 1 never sends; rank 1 just returns."""
    if comm.Get_rank() == 0:
        comm.Recv(np.zeros(1), source=1)
    return comm.Get_rank()


def spin(comm, solution, rank_that_spins):
    if comm.Get_rank() == rank_that_spins:
        while True:
            pass
    comm.Barrier()


def os_abort(comm, solution):
    if comm.Get_rank() == 1:
        os.abort()
    comm.Barrier()


def sleep_then_return(comm, solution, seconds):
    time.sleep(seconds)
    return comm.Get_rank()


def allocate(comm, solution, megabytes):
    block = np.ones(megabytes * 1024 * 1024 // 8)
    return float(block.sum())


def burn_cpu(comm, solution):
    x = 0
    while True:
        x += 1


def write_file(comm, solution, path, megabytes):
    with open(f"{path}.{comm.Get_rank()}", "wb") as f:
        for _ in range(megabytes):
            f.write(b"x" * 1024 * 1024)
    return megabytes


def slow_big_allreduce(comm, solution, n):
    """All ranks sit in one big collective: slow but not stuck."""
    buf = np.ones(n)
    out = np.empty_like(buf)
    comm.Allreduce(buf, out)
    return float(out[0])
