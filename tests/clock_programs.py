"""Rank programs for the virtual-clock and message-fault tests: ``program(comm, solution, *args)``."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np

from distlab import Request

REFERENCE_03 = Path(__file__).resolve().parents[1] / "problems/03-ring-allreduce/reference.py"


def _reference():
    spec = importlib.util.spec_from_file_location("reference_03", REFERENCE_03)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ring_allreduce(comm, solution, n):
    """Problem 03's reference on n float64; returns the rank's online virtual time at the end."""
    buf = np.full(n, float(comm.Get_rank()))
    _reference().allreduce(comm, buf, __import__("distlab").SUM)
    assert buf[0] == sum(range(comm.Get_size()))
    return comm.now()


def fan_in(comm, solution, senders, nbytes):
    """Ranks 0..senders-1 each send nbytes to the last rank at once."""
    last = comm.Get_size() - 1
    buf = np.zeros(nbytes, dtype=np.uint8)
    if comm.Get_rank() < senders:
        comm.Send(buf, dest=last)
    elif comm.Get_rank() == last:
        for source in range(senders):
            comm.Recv(buf, source=source)
    return comm.now()


def compute_then_barrier(comm, solution, flops):
    comm.mark("step")
    comm.compute(flops=flops)
    comm.Barrier()
    return comm.now()


def one_message(comm, solution, nbytes):
    """Rank 0 sends one message to rank 1; rank 1 returns when it arrived (virtual time)."""
    buf = np.zeros(nbytes, dtype=np.uint8)
    if comm.Get_rank() == 0:
        comm.Send(buf, dest=1)
    elif comm.Get_rank() == 1:
        comm.Recv(buf, source=0)
    return comm.now()


def steps_with_timeout(comm, solution, steps, timeout_s):
    """Each step rank 0 sends a token to rank 1, which waits at most timeout_s (wall) for it.

    Returns, on rank 1, the steps whose token arrived; lost tokens must not hang the program."""
    token = np.zeros(1)
    arrived = []
    for step in range(steps):
        comm.mark("step")
        if comm.Get_rank() == 0:
            comm.Send(np.array([float(step)]), dest=1, tag=step)
        else:
            request = comm.Irecv(token, source=0, tag=step)
            deadline = time.monotonic() + timeout_s
            while not request.Test():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)
            else:
                arrived.append(step)
    return arrived


def exchange_forever(comm, solution):
    """A ring exchange per step, forever (stopped by a hung fault and the supervisor)."""
    buf = np.zeros(1)
    step = 0
    while True:
        comm.mark("step")
        comm.Sendrecv(buf, dest=(comm.Get_rank() + 1) % comm.Get_size(), recvbuf=np.zeros(1),
                      source=(comm.Get_rank() - 1) % comm.Get_size())
        step += 1
        time.sleep(0.01)


def lone_send_then_ping_pong(comm, solution, nbytes, late_s):
    """Rank 0 times a lone Send to rank 1, which posts its Recv late_s late; after a Barrier,
    rank 0 times one ping-pong. Returns (lone Send, ping-pong) on rank 0, rank 1's arrival time."""
    buf = np.zeros(nbytes, dtype=np.uint8)
    if comm.Get_rank() == 0:
        start = comm.now()
        comm.Send(buf, dest=1)
        lone = comm.now() - start
    else:
        comm.compute(seconds=late_s)
        comm.Recv(buf, source=0)
        arrived = comm.now()
    comm.Barrier()
    if comm.Get_rank() == 0:
        start = comm.now()
        comm.Send(buf, dest=1)
        comm.Recv(buf, source=1)
        return lone, comm.now() - start
    comm.Recv(buf, source=0)
    comm.Send(buf, dest=0)
    return arrived


def burst_to_one_peer(comm, solution, sizes):
    """Rank 0 posts one Isend per size to rank 1 at once; rank 1 waits for each in turn and
    returns when each arrived on its clock."""
    bufs = [np.zeros(n, dtype=np.uint8) for n in sizes]
    if comm.Get_rank() == 0:
        Request.Waitall([comm.Isend(b, dest=1, tag=7) for b in bufs])
        return None
    requests = [comm.Irecv(b, source=0, tag=7) for b in bufs]
    arrivals = []
    for request in requests:
        request.Wait()
        arrivals.append(comm.now())
    return arrivals
