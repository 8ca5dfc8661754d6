"""Measures the seal's handshake candidates and the channel itself (runtime/seal/).

    flock /tmp/distlab-heavy.lock .venv/bin/python scripts/seal_handshake.py [--calls 3000]

Part 1, the candidates, each with an empty round trip between a parent ("agent") and a forked
child ("learner") and nothing else: a pipe pair, an eventfd pair, a Unix stream socketpair, a
SOCK_SEQPACKET socketpair, a futex on a shared word (ctypes), and the futex with 30 us of
spinning before it sleeps. Part 2, the channel as built (AgentEnd/LearnerEnd over a spawned child
process): an empty call (``now``), and a 1 MiB float32 Allreduce-shaped call (1 MiB copied in,
copied out of the arena by the agent, 1 MiB written back, copied out by the learner), blocking
and with a 30 us and a 300 us spin (long enough that neither end ever sleeps: what is left is
the Python of both ends). Prints the median and the 10th/90th percentiles of each, in microseconds,
and the CPU both processes used per call.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import resource
import socket
import subprocess
import sys
import time
from typing import Callable

import numpy as np

from distlab.runtime.seal import AgentEnd, Call, LearnerEnd, Request

Pair = tuple[Callable[[], None], Callable[[], None], Callable[[], None], Callable[[], None]]


def _fd_pair(kind: str) -> Pair:
    """(learner ring, learner wait, agent wait, agent ring) over file descriptors."""
    if kind == "pipe":
        a_r, l_w = os.pipe()
        l_r, a_w = os.pipe()
        return (lambda: None if os.write(l_w, b"!") else None, lambda: None if os.read(l_r, 64) else None,
                lambda: None if os.read(a_r, 64) else None, lambda: None if os.write(a_w, b"!") else None)
    if kind == "eventfd":
        e1, e2 = os.eventfd(0), os.eventfd(0)
        return (lambda: os.eventfd_write(e1, 1), lambda: None if os.eventfd_read(e2) else None,
                lambda: None if os.eventfd_read(e1) else None, lambda: os.eventfd_write(e2, 1))
    sock_type = socket.SOCK_STREAM if kind == "socketpair" else socket.SOCK_SEQPACKET
    a, b = socket.socketpair(socket.AF_UNIX, sock_type)
    fa, fb = a.detach(), b.detach()
    return (lambda: None if os.write(fb, b"!") else None, lambda: None if os.read(fb, 64) else None,
            lambda: None if os.read(fa, 64) else None, lambda: None if os.write(fa, b"!") else None)


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


def _futex_pair(spin_ns: int) -> Pair:
    libc = ctypes.CDLL(None, use_errno=True)
    sys_futex, wait_op, wake_op = 202, 0, 1  # x86-64; shared (not PRIVATE): two processes
    area = mmap.mmap(-1, 4096)
    words = [ctypes.c_uint32.from_buffer(area, at) for at in (0, 64)]
    timeout = _Timespec(0, 50_000_000)

    def ends(word: ctypes.c_uint32) -> tuple[Callable[[], None], Callable[[], None]]:
        seen = [0]
        addr = ctypes.c_void_p(ctypes.addressof(word))

        def ring() -> None:
            word.value += 1
            libc.syscall(sys_futex, addr, wake_op, 1, None, None, 0)

        def wait() -> None:
            end = time.perf_counter_ns() + spin_ns
            while word.value == seen[0] and time.perf_counter_ns() < end:
                pass
            while word.value == seen[0]:
                libc.syscall(sys_futex, addr, wait_op, seen[0], ctypes.byref(timeout), None, 0)
            seen[0] = word.value

        return ring, wait

    l_ring, a_wait = ends(words[0])
    a_ring, l_wait = ends(words[1])
    return l_ring, l_wait, a_wait, a_ring


def candidate(kind: str, calls: int) -> tuple[list[int], float]:
    if kind.startswith("futex"):
        l_ring, l_wait, a_wait, a_ring = _futex_pair(30_000 if kind.endswith("spin") else 0)
    else:
        l_ring, l_wait, a_wait, a_ring = _fd_pair(kind)
    before = _cpu()
    pid = os.fork()
    if pid == 0:
        for _ in range(calls + 1):
            a_wait()
            a_ring()
        os._exit(0)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        l_ring()
        l_wait()
        times.append(time.perf_counter_ns() - t0)
    l_ring()
    os.waitpid(pid, 0)
    return times, (_cpu() - before) / calls


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def channel(spin_s: float, calls: int, nbytes: int) -> tuple[list[int], float]:
    agent = AgentEnd.create(4 * nbytes + (1 << 16), spin_s=spin_s)
    before = _cpu()
    child = subprocess.Popen([sys.executable, __file__, "--learner", agent.handle(), str(calls),
                              str(nbytes)], pass_fds=agent.child_fds, stdout=subprocess.PIPE, text=True)
    agent.watch(child.pid)
    for _ in range(calls + 20):
        request = agent.serve(timeout=30)
        assert isinstance(request, Request), request
        if request.inputs:
            agent.reply(request, outputs=[request.inputs[0]])
        else:
            agent.reply(request, floats=[0.0])
    out, _ = child.communicate(timeout=30)
    agent.close()
    return [int(t) for t in out.split()], (_cpu() - before) / (calls + 20)


def learner(handle: str, calls: int, nbytes: int) -> None:
    seal = LearnerEnd.open(handle)
    send = np.ones(nbytes // 4, np.float32)
    recv = np.zeros_like(send)
    times = []
    for i in range(calls + 20):  # the first 20 warm up
        t0 = time.perf_counter_ns()
        if nbytes:
            seal.call(Call.ALLREDUCE, (0,), inputs=(send,), outputs=(recv,))
        else:
            seal.call(Call.NOW)
        if i >= 20:
            times.append(time.perf_counter_ns() - t0)
    print(" ".join(map(str, times)))


def line(name: str, times: list[int], cpu_s: float) -> str:
    ts = sorted(times)
    pick = lambda q: ts[int(q * (len(ts) - 1))] / 1000  # noqa: E731
    return (f"{name:34s} median {pick(0.5):7.1f} us   p10 {pick(0.1):7.1f}   p90 {pick(0.9):7.1f}"
            f"   cpu/call {cpu_s * 1e6:6.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--learner", nargs=3)
    args = parser.parse_args()
    if args.learner:
        learner(args.learner[0], int(args.learner[1]), int(args.learner[2]))
        return
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, {args.calls} calls each")
    for kind in ("pipe", "eventfd", "socketpair", "seqpacket", "futex", "futex+spin"):
        print(line(f"candidate {kind}", *candidate(kind, args.calls)))
    for spin in (0.0, 30e-6, 300e-6):
        tag = "blocking" if not spin else f"spin {spin * 1e6:.0f} us"
        print(line(f"channel empty call ({tag})", *channel(spin, args.calls, 0)))
        print(line(f"channel 1 MiB in+out ({tag})", *channel(spin, args.calls // 4, 1 << 20)))
    print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
