"""The handshake: a Unix stream socketpair that carries one byte per request and per reply.

The request and the reply themselves lie in the arena's blocks; the byte only wakes the other
end, which then looks at the block's call id. Why this one (scripts/seal_handshake.py measures
them all; figures below): of the transports that block without burning a core it had the best
median here, and it is the one that fails safe:

* each end is its own open file, so the learner can neither read the agent's bytes nor change the
  agent's descriptor flags (an eventfd pair is one shared file: a learner could clear its
  O_NONBLOCK, or fill its counter, and hang the agent in a write);
* when the learner process dies or closes its end, the agent reads EOF; it also looks at a pidfd
  of the learner every WATCH_S, which tells even if a grandchild still holds the socket open;
* its timeouts are the kernel's (SO_RCVTIMEO) on a plain blocking recv: an eventfd or a pipe
  needs poll() for a timeout, and poll() then read costs three times a blocking read here;
* the agent sends without blocking (``MSG_DONTWAIT``): a learner that never reads its replies
  fills its buffer and is named (``LearnerFlooding``) instead of hanging its agent.

Measured with scripts/seal_handshake.py on this 2-core VM, under /tmp/distlab-heavy.lock (load
0.8-2.7 from other work); medians in microseconds. The candidates, an empty round trip between a
parent and a forked child, 2000 calls, 5 runs (median of the runs; the fastest and slowest run)::

    pipe pair          82   (7-92)        SOCK_SEQPACKET    104   (15-111)
    eventfd pair       73   (7-86)        futex (ctypes)     87   (17-122)
    Unix socketpair    61   (17-74)       futex, 30 us spin   3.2 (burns a core while it waits)

(A run where both processes share one CPU gets the 7-17 us figures; most runs do not.) The channel
as built (AgentEnd and LearnerEnd, spawned child, 3000 calls, two runs)::

                          empty call   1 MiB in + out   CPU per empty call (both ends,
                                                        the child's start included)
    blocking (spin_s=0)   180-212      469-560          316-343
    spin_s = 30 us        120-187      435-500          242-359
    spin_s = 300 us        22-54       280-338          148-243   (neither end sleeps)

So the Python of both ends costs 22-54 us per call, and the copies about 250 us per MiB in and
out (four copies); the rest is waking a sleeping CPU, which here costs more the longer the other
end ran before (the bare socketpair with 0, 10 and 25 us of work on each side: 57, 85 and 161 us).

A waiter may spin on the block's call id for a few microseconds before it blocks (``spin_s``):
that saves both wake-ups when the other end answers at once, at the price of that much CPU per
wait, which ranks sharing two cores cannot spare; 0 (the default) blocks at once. A 30 us spin is
shorter than the other end's Python and saves little; 300 us saves the wake-ups and costs a core
per waiting rank. The wiring step may turn it on where cores outnumber processes. Tried on a whole
check (check 03's reference, sealed, six runs paired against a blocking channel): a 100 us spin
that yields the CPU on each turn changed its wall time by 0.998x, so it stays off. A wait that
finds its block ready without having read the ring reads it without blocking, or, if the ring is
still on its way, the next wait reads it and looks at the call id again: rings never pile up.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from enum import Enum
from typing import Callable


class Woke(Enum):
    READY = "ready"  # the block the waiter waits for is there
    TIMEOUT = "timeout"
    CLOSED = "closed"  # EOF: the other end closed (or its process died)
    DIED = "died"  # the watched process ended (agent side)


WATCH_S = 0.05  # how often a waiting agent looks at the learner's pidfd
_DRAIN = 4096  # bytes read at once: any number of rings counts as one look at the block
# As plain ints: or-ing the enum members costs microseconds per call.
_SEND_FLAGS = int(socket.MSG_DONTWAIT) | int(socket.MSG_NOSIGNAL)
_RECV_FLAGS = int(socket.MSG_DONTWAIT)


class Doorbell:
    """One end of the handshake. ``ring`` wakes the other end; ``wait`` returns when ``ready()``
    (a look at the arena) turns true, the timeout passes, the socket closes or ``pidfd`` fires."""

    def __init__(self, sock: socket.socket, pidfd: int | None = None, spin_s: float = 0.0) -> None:
        self.sock = sock
        self.spin_s = spin_s
        self.pidfd = pidfd
        self._recv_timeout: float | None = None  # what SO_RCVTIMEO is set to; None: forever
        sock.settimeout(None)  # Python's own timeouts poll(): the kernel's, below, do not

    @staticmethod
    def pair() -> tuple[socket.socket, socket.socket]:
        """(this end, the child's end). Python makes both close-on-exec; the child's end is
        passed on with ``pass_fds``."""
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def watch(self, pidfd: int) -> None:
        """Also wake (within ``WATCH_S``) when the process behind ``pidfd`` ends."""
        self.pidfd = pidfd

    def ring(self) -> bool:
        """Wakes the other end; False when its buffer is full (it is not reading)."""
        try:
            self.sock.send(b"!", _SEND_FLAGS)
        except BlockingIOError:
            return False
        return True

    def wait(self, ready: Callable[[], bool], timeout: float | None) -> Woke:
        if ready() or (self.spin_s and self._spin(ready)):
            # Seen without reading the ring: read it (or the one still on its way, next time),
            # so that rings never pile up in the socket.
            self._drain_now()
            return Woke.READY
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            # A blocking recv, its timeout in the kernel (SO_RCVTIMEO): measured three times
            # faster per wake-up here than poll() and a recv (the reader is woken "sync", on the
            # waker's CPU). The pidfd is looked at between slices of WATCH_S; a death closes
            # the socket at once anyway, unless a process the learner started still holds it.
            slice_s = WATCH_S if self.pidfd is not None else None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return Woke.TIMEOUT
                slice_s = left if slice_s is None else min(slice_s, left)
            self._set_recv_timeout(slice_s)
            try:
                got = self.sock.recv(_DRAIN)
            except BlockingIOError:  # the slice passed
                if self.pidfd is not None and _readable(self.pidfd):
                    return Woke.DIED
                continue
            except ConnectionError:
                return Woke.CLOSED
            if not got:
                return Woke.CLOSED
            if ready():
                return Woke.READY

    def _set_recv_timeout(self, seconds: float | None) -> None:
        if seconds == self._recv_timeout:
            return
        micros = 0 if seconds is None else max(1, round(seconds * 1e6))  # 0 means forever
        value = struct.pack("ll", micros // 1_000_000, micros % 1_000_000)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        self._recv_timeout = seconds

    def _spin(self, ready: Callable[[], bool]) -> bool:
        end = time.perf_counter() + self.spin_s
        while time.perf_counter() < end:
            if ready():
                return True
        return False

    def _drain_now(self) -> None:
        # Bytes of earlier rings that a spin made unnecessary: read them so they cannot pile up.
        try:
            self.sock.recv(_DRAIN, _RECV_FLAGS)
        except (BlockingIOError, ConnectionError):
            pass

    def shut(self) -> None:
        """Shuts the socket both ways, which wakes a thread blocked in ``wait`` on it (closing
        it would not); the descriptor stays open until ``close``."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the other end already gone

    def close(self) -> None:
        self.sock.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
