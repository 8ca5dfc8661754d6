"""The handshake: two pipes, one each way, that carry one byte per request and per reply.

The request and the reply themselves lie in the arena's blocks; the byte only wakes the other
end, which then looks at the block's call id. Why pipes, and why two:

* each end of a pipe is its own open file, so the learner can neither read the agent's bytes nor
  change the agent's descriptor flags (an eventfd pair is one shared file: a learner could clear
  its O_NONBLOCK, or fill its counter, and hang the agent in a write). Where it could open
  another read end of the pipe it rings on (/proc/self/fd/N: refused to nobody, the pipes being
  root's), bytes taken from under the agent only send it back to polling: its reads are
  O_NONBLOCK. What the ends do share is the pipe: its size (a learner may grow it) and its lock,
  which every read and write takes, uninterruptibly. A call that waits while holding it (splice
  from an idle socket: an outside tester's attack, which left the agent asleep in its read until
  the job's deadline) is refused by the learner's seccomp filter, with tee, vmsplice, sendfile,
  io_uring and userfaultfd (syscalls.py);
* when the learner process dies or closes its end, the agent reads EOF; it also polls a pidfd of
  the learner, which tells even if a grandchild still holds the pipe open;
* the agent writes without blocking: a learner that never reads its replies fills its pipe (one
  page) and is named (``LearnerFlooding``) instead of hanging its agent;
* a ring is a write of one byte: 0.4 us here, against 2.7 us for a send on a Unix socket; and a
  reader is woken by writes only. Until 2026-12 the handshake was one Unix socketpair, whose
  reader was also woken each time the other end read (the kernel wakes a socket's waiters when
  its sent bytes are consumed: ``unix_write_space``), an IPI to a halted vCPU per call for
  nothing (perf on a sealed rank: 12.6% of the agent's CPU).

The learner's wait is one blocking read; the agent's polls its pipe, the learner's pidfd and an
eventfd of its own (``shut``, which wakes a line's thread when the learner is done with it).
The socketpair's timeouts were the kernel's (SO_RCVTIMEO), found three times cheaper per wake-up
than poll() and a read; measured again with the rest of the call (below), the pipes were faster.

The first measurements (scripts/seal_handshake.py, this 2-core VM, under
/tmp/distlab-heavy.lock, load 0.8-2.7 from other work; medians in microseconds). The candidates, an empty round trip between a
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

So the Python of both ends cost 22-54 us per call then (trimmed since: below), and the copies
about 250 us per MiB in and out (four copies); the rest is waking a sleeping CPU, which here costs
more the longer the other end ran before (the bare socketpair with 0, 10 and 25 us of work on each side: 57, 85 and 161 us).

Where the time goes (2026-12, this 2-core firecracker VM, perf and py-spy on a sealed rank making
the same call in a loop): mostly in waking the other end's CPU. The VM halts an idle vCPU at once
(its guest_halt_poll_ns is 0), so a wake-up across CPUs is an IPI to a halted vCPU, tens of
microseconds; two per call. Both processes pinned to one CPU, an empty call took 31 us instead of
63 (pinning is not done: problem 11 grades the affinity a learner sets itself, and a pinned rank
could not be moved off a busy CPU). What stays is the Python of both ends (a Sendrecv's, both
in one process, no kernel: 25 us) and four system calls.

So a waiter spins before it sleeps (``spin_s``), looking at the block's call id and yielding the
CPU on each turn, where every process of the job has a CPU of its own (``spin_for``): a call
answered within the spin wakes nobody. Elsewhere (more processes than CPUs) a spinner would take
the CPU that the end it waits for needs, and it blocks at once. Measured through the launcher on
one rank (2 processes, 2 CPUs, so spinning 50 us), added to the unsealed call, medians of 2000::

                          comm.now()   Sendrecv of 8 bytes
    blocking at once      +63-66       +130-144
    spin 50 us            +15.5        +27.5

That with the socketpair; the pipes took comm.now() to +12.4, the Sendrecv to +27.0, and a
two-rank ping-pong (4 processes on 2 CPUs: no spin) from +44.6 to +39.7 us per message.

A wait that sees its block ready without sleeping leaves the ring's byte in the pipe; one read
takes them all every DRAIN_EVERY such waits, or the next wait that sleeps reads them, looks at the
block, and sleeps again if it is not ready: rings never pile up to fill the pipe.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import select
import time
from enum import Enum
from typing import Callable


class Woke(Enum):
    READY = "ready"  # the block the waiter waits for is there
    TIMEOUT = "timeout"
    CLOSED = "closed"  # EOF: the other end closed (or its process died)
    DIED = "died"  # the watched process ended (agent side)


SPIN_S = 50e-6  # how long a waiter spins before it sleeps, where spin_for allows it
_DRAIN = 4096  # bytes read at once: any number of rings counts as one look at the block
# Rings left unread at most: one read then takes them all.
DRAIN_EVERY = 32
# Each pipe holds one page: 4096 rings unread (a few hundred more than DRAIN_EVERY can leave)
# before a ring fails and the ringer names the other end (the agent: LearnerFlooding).
PIPE_BYTES = 4096


class Doorbell:
    """One end of the handshake: the pipe it reads the other end's rings from, and the pipe it
    rings on. ``ring`` wakes the other end; ``wait`` returns when ``ready()`` (a look at the
    arena) turns true, the timeout passes, the other end closes its pipe, ``pidfd`` fires or
    ``shut`` is called."""

    def __init__(self, read_fd: int, write_fd: int, pidfd: int | None = None,
                 spin_s: float = 0.0, plain_reads: bool = False) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.spin_s = spin_s
        self.pidfd = pidfd
        # The learner's end: a wait without a timeout is one blocking read, which only a ring
        # or the agent's end closing ends. The agent's always polls, also for its learner's
        # pidfd and for ``shut``.
        self.plain_reads = plain_reads
        self._unread = 0  # rings of blocks seen without reading them (wait)
        # A ring never blocks: a full pipe means the other end does not read (ring() False).
        os.set_blocking(write_fd, False)
        # The agent's reads are O_NONBLOCK too: a learner that could open another read end of
        # the same pipe (/proc/self/fd/N of its write end, where the pipe is its own user's)
        # could take the bytes between the agent's poll and its read; the agent then polls
        # again, still watching the learner's pidfd. Each end's flags are its own: the learner
        # cannot change these (the pipe's lock it could hold: syscalls.py refuses the calls).
        os.set_blocking(read_fd, plain_reads)
        self._shut = None if plain_reads else os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._poller: select.poll | None = None  # made at the first wait that polls

    @staticmethod
    def pair() -> tuple[tuple[int, int], tuple[int, int]]:
        """Two pipes, as (read, write) descriptors for this end and for the child's: this end
        reads what the child writes, and the other way round. All close-on-exec, each one page;
        the child's are passed on with ``pass_fds``."""
        mine_read, theirs_write = os.pipe2(os.O_CLOEXEC)
        theirs_read, mine_write = os.pipe2(os.O_CLOEXEC)
        for fd in (mine_read, theirs_read):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        return (mine_read, mine_write), (theirs_read, theirs_write)

    def watch(self, pidfd: int) -> None:
        """Also wake when the process behind ``pidfd`` ends (before the first wait)."""
        self.pidfd = pidfd
        if self._poller is not None:
            self._poller.register(pidfd, select.POLLIN)

    def ring(self) -> bool:
        """Wakes the other end; False when its pipe is full (it is not reading). Raises
        BrokenPipeError (a ConnectionError) when the other end closed it."""
        try:
            os.write(self.write_fd, b"!")
        except BlockingIOError:
            return False
        return True

    def wait(self, ready: Callable[[], bool], timeout: float | None) -> Woke:
        if ready() or (self.spin_s and self._spin(ready)):
            # Seen without reading the ring. Its byte is left in the pipe, to be read with
            # others at once: every DRAIN_EVERY such waits, or by the next wait that sleeps
            # (which reads them all, looks at the block, and sleeps again if it was not ready),
            # so that rings never pile up to fill the pipe.
            self._unread += 1
            if self._unread >= DRAIN_EVERY:
                self._drain_now()
            return Woke.READY
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if deadline is None and self.plain_reads:
                got = os.read(self.read_fd, _DRAIN)  # the learner's usual wait: one system call
            else:
                woke = self._poll(deadline)
                if woke is not None:
                    return woke
                try:
                    got = os.read(self.read_fd, _DRAIN)
                except BlockingIOError:
                    continue  # someone else read the bytes (see __init__)
            if not got:
                return Woke.CLOSED  # EOF: every copy of the other end's pipe is closed
            self._unread = 0
            if ready():
                return Woke.READY

    def _poll(self, deadline: float | None) -> Woke | None:
        """Waits until the pipe has bytes or has lost its writers (None: read it now), or the
        deadline passes, the pidfd fires or ``shut`` is called. Bytes come first: a request sent
        just before its learner died is still served, as it would have been a moment earlier."""
        if self._poller is None:
            self._poller = select.poll()
            watched = [self.read_fd, self._shut, self.pidfd]
            for fd in watched:
                if fd is not None:
                    self._poller.register(fd, select.POLLIN)
        while True:
            wait_ms = -1
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return Woke.TIMEOUT
                wait_ms = max(1, math.ceil(left * 1000))
            events = dict(self._poller.poll(wait_ms))
            if self._shut is not None and self._shut in events:
                return Woke.CLOSED
            if self.read_fd in events:
                return None
            if self.pidfd is not None and self.pidfd in events:
                return Woke.DIED
            # Nothing: the deadline's last fraction of a millisecond. Look again.

    def _spin(self, ready: Callable[[], bool]) -> bool:
        # Each turn gives the CPU to whatever else is runnable on it (sched_yield returns at
        # once when nothing is): a spinner never holds up the process it waits for.
        end = time.perf_counter() + self.spin_s
        while True:
            if ready():
                return True
            if time.perf_counter() >= end:
                return False
            os.sched_yield()

    def _drain_now(self) -> None:
        # Bytes of earlier rings that a spin made unnecessary: read them so they cannot pile up.
        self._unread = 0
        if self.plain_reads and not _readable(self.read_fd):
            return  # a blocking read would wait for the next ring
        with contextlib.suppress(BlockingIOError):
            os.read(self.read_fd, _DRAIN)

    def shut(self) -> None:
        """Wakes a thread blocked in ``wait`` here for good (it returns CLOSED); the descriptors
        stay open until ``close``. The agent's end only: the learner's reads without polling."""
        if self._shut is None:
            raise ValueError("shut() on an end made with plain_reads")
        os.eventfd_write(self._shut, 1)

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd, self._shut):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def spin_for(processes: int) -> float:
    """The spin of a job whose seal has ``processes`` agents and learners: SPIN_S where each
    has a CPU of its own among those this process may use, else 0. A spinner then takes a CPU
    nobody else wants; on fewer CPUs it would take one from the process it waits for."""
    return SPIN_S if processes <= len(os.sched_getaffinity(0)) else 0.0


def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
