"""What each rank is doing right now, written by the rank and read by the supervisor.

Each rank owns one small memory-mapped file in the job folder. The comm proxy overwrites it on entry
to and exit from every call (a few stores into a ctypes view of the mapping, a fraction of a
microsecond), so a supervisor that finds the job stuck can say who waits on whom without asking the
stuck processes anything.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Layout: state, op, number of peers, task index, call sequence, 4 peers (world ranks), bytes,
# since, training step (counted by problem code's comm.mark("step"); process faults trigger on it),
# the context of the communicator the call is on (0: the task's; others: see ``register``), and
# when a call with a timeout gives up (time.monotonic(); 0: it has none), the rank's trigger marks
# it reached (process faults at_mark, as bits), and two counts of the pauses it made for the
# supervisor to act at a trigger step or mark (``pause``): asked, and done (the one field the
# supervisor writes: ``acknowledge``).
_FORMAT = "<BBBBI4iqdIqdIII"
SIZE = struct.calcsize(_FORMAT)
MAX_PEERS = 4

STARTING, RUNNING, BLOCKED, IDLE, FINISHED, FAILED = range(6)
STATE_NAMES = ("starting", "running", "blocked", "idle", "finished", "failed")

# Operation codes; the index is what is stored.
OPS = (
    "-",
    "Send",
    "Recv",
    "Sendrecv",
    "Wait",
    "Waitall",
    "Barrier",
    "Bcast",
    "Reduce",
    "Allreduce",
    "Reduce_scatter",
    "Allgather",
    "Probe",
    "delay",
    "hung",
    "Gather",
    "Scatter",
    "Allgatherv",
    "Alltoall",
    "Waitany",
    "Alltoallv",
    "store.get",
    "store.wait",
    "Admit",  # a newcomer in the lobby, or a member in comm.Admit() (engines/admission.py)
)
OP_CODE = {name: i for i, name in enumerate(OPS)}

ALL_PEERS = -2  # a collective: waits on every rank of its group


def state_path(job_dir: Path, rank: int) -> Path:
    return job_dir / f"state-{rank}.bin"


def communicators_path(job_dir: Path, rank: int) -> Path:
    return job_dir / f"communicators-{rank}.txt"


@dataclass(frozen=True)
class Communicator:
    """A sub-communicator as its ranks registered it: its group's path and its world ranks."""

    path: str
    members: tuple[int, ...]


def read_communicators(job_dir: Path, world_size: int) -> dict[int, Communicator]:
    """Every sub-communicator any rank made, by context (runtime/comm/groups.py)."""
    found: dict[int, Communicator] = {}
    for rank in range(world_size):
        try:
            lines = communicators_path(job_dir, rank).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            ctx, path, members = line.split(" ")
            found[int(ctx)] = Communicator(path, tuple(int(m) for m in members.split(",")))
    return found


class _Record(ctypes.LittleEndianStructure):
    """The slot's bytes as fields (the same layout as ``_FORMAT``), mapped onto the file: setting
    a field is one store, several times cheaper than packing the whole record again."""

    _pack_ = 1
    _fields_ = [
        ("state", ctypes.c_uint8),
        ("op", ctypes.c_uint8),
        ("npeers", ctypes.c_uint8),
        ("task", ctypes.c_uint8),
        ("seq", ctypes.c_uint32),
        ("peers", ctypes.c_int32 * MAX_PEERS),
        ("nbytes", ctypes.c_int64),
        ("since", ctypes.c_double),
        ("step", ctypes.c_uint32),
        ("comm", ctypes.c_int64),
        ("until", ctypes.c_double),
        ("marks", ctypes.c_uint32),
        ("pauses", ctypes.c_uint32),
        ("acked", ctypes.c_uint32),
    ]


assert ctypes.sizeof(_Record) == SIZE
_ACKED_AT = _Record.acked.offset

# How long a rank at a trigger step or mark waits for the supervisor to act (it polls every
# 50 ms): past this the supervisor is gone or wedged, and the rank goes on rather than hang.
PAUSE_S = 10.0


class RankSlot:
    """The writer side, used by one rank. Written on every call of the proxy: kept cheap."""

    def __init__(self, path: Path, registry: Path | None = None) -> None:
        self._registry = registry  # where ``register`` notes sub-communicators (None: nowhere)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._record = _Record.from_buffer(self._map)
        self._peers = self._record.peers
        self._seq = 0
        self.task = 0  # index of the batch task running now
        # The running task's marks (its proxy's, shared): the outcome of a rank whose task failed
        # says how far it had come (RankOutcome.marks_at_error).
        self.marked: list[tuple[str, Any]] = []
        self.step = 0  # the rank's training step, as marked by problem code
        self.set(RUNNING)

    def close(self) -> None:
        """Lets go of the mapping (the record's view must go first)."""
        del self._record, self._peers
        self._map.close()

    def register(self, ctx: int, path: str, members: list[int]) -> None:
        """Notes a sub-communicator this rank is in, for the wait-for graph (once, when made)."""
        if self._registry is None:
            return
        with open(self._registry, "a") as registry:
            registry.write(f"{ctx} {path} {','.join(map(str, members))}\n")

    def set(self, state: int, op: str = "-", peers: tuple[int, ...] = (), nbytes: int = 0,
            comm: int = 0) -> None:
        record = self._record
        npeers = min(len(peers), MAX_PEERS)
        for i in range(npeers):
            self._peers[i] = peers[i]
        record.op = OP_CODE[op]
        record.npeers = npeers
        record.task = self.task & 0xFF
        record.nbytes = nbytes
        record.since = time.monotonic()
        record.step = self.step & 0xFFFFFFFF
        record.comm = comm
        record.until = 0.0
        self._publish(state)

    def _publish(self, state: int) -> None:
        # The state and the sequence number last: a reader that sees them new sees the rest new.
        self._seq += 1
        self._record.state = state
        self._record.seq = self._seq & 0xFFFFFFFF

    def blocked(self, op: str, peers: tuple[int, ...], nbytes: int = 0, comm: int = 0) -> None:
        self.set(BLOCKED, op, peers, nbytes, comm)

    def blocked_on(self, op: str, first: int, second: int, nbytes: int, comm: int = 0) -> None:
        """``blocked`` for at most two peers, -1 standing for none: what the proxy's point-to-
        point calls need, without building a tuple of peers on every call. (The task, the step and
        the time since stay as the last ``set`` wrote them: the supervisor reads the state, the
        operation, the peers and the sequence number.)"""
        if first == -1:
            first, second = second, -1
        record, peers = self._record, self._peers
        peers[0] = first
        peers[1] = second
        record.npeers = 0 if first == -1 else 1 if second == -1 else 2
        record.op = OP_CODE[op]
        record.nbytes = nbytes
        record.comm = comm
        record.until = 0.0
        self._seq += 1
        record.state = BLOCKED
        record.seq = self._seq & 0xFFFFFFFF

    def gives_up_at(self, until: float) -> None:
        """The call just marked blocked has a timeout: it returns by ``until`` (time.monotonic()),
        so the supervisor must not take its wait for a deadlock."""
        self._record.until = until
        self._seq += 1
        self._record.seq = self._seq & 0xFFFFFFFF

    def running(self) -> None:
        # The supervisor reads the state and the sequence number; the rest may stay stale.
        self._seq += 1
        self._record.state = RUNNING
        self._record.seq = self._seq & 0xFFFFFFFF

    def set_step(self, step: int) -> None:
        self.step = step
        self._record.step = step & 0xFFFFFFFF
        self._seq += 1
        self._record.seq = self._seq & 0xFFFFFFFF

    def pause(self, mark_bit: int = 0) -> None:
        """The rank is at a step or mark that a process fault triggers on (``mark_bit``: the
        mark's place among the rank's trigger marks, 0 for a step, already published by
        ``set_step``): shows it, and waits until the supervisor has acted on what it saw, so that
        a kill or stop "at step 30" or "at the mark" lands exactly there, never a few calls later
        on a busy machine."""
        record = self._record
        record.marks |= mark_bit
        record.pauses = asked = (record.pauses + 1) & 0xFFFFFFFF
        self._seq += 1
        record.seq = self._seq & 0xFFFFFFFF
        give_up = time.monotonic() + PAUSE_S
        while record.acked != asked and time.monotonic() < give_up:
            time.sleep(0.001)


def acknowledge(job_dir: Path, rank: int, pauses: int) -> None:
    """The supervisor's: it has acted on the rank's pauses up to ``pauses`` (see ``pause``)."""
    try:
        fd = os.open(state_path(job_dir, rank), os.O_WRONLY)
    except OSError:
        return  # the rank is gone with its job folder's file: nothing waits
    try:
        os.pwrite(fd, struct.pack("<I", pauses), _ACKED_AT)
    finally:
        os.close(fd)


class NullSlot:
    """Stands in for RankSlot when no supervisor watches (an external mpirun or torchrun)."""

    task = 0
    step = 0

    def __init__(self) -> None:
        self.marked: list[tuple[str, Any]] = []

    def set_step(self, step: int) -> None:
        self.step = step

    def register(self, ctx: int, path: str, members: list[int]) -> None:
        pass

    def set(self, state: int, op: str = "-", peers: tuple[int, ...] = (), nbytes: int = 0,
            comm: int = 0) -> None:
        pass

    def blocked(self, op: str, peers: tuple[int, ...], nbytes: int = 0, comm: int = 0) -> None:
        pass

    def blocked_on(self, op: str, first: int, second: int, nbytes: int, comm: int = 0) -> None:
        pass

    def running(self) -> None:
        pass

    def gives_up_at(self, until: float) -> None:
        pass

    def pause(self, mark_bit: int = 0) -> None:
        pass


@dataclass(frozen=True)
class RankState:
    rank: int
    state: str
    op: str
    peers: tuple[int, ...]
    nbytes: int
    seq: int
    since: float
    task: int = 0
    step: int = 0
    comm: int = 0  # the context of the communicator it waits in (0: the task's)
    until: float = 0.0  # when its call gives up (time.monotonic()), 0 for a call without timeout
    marks: int = 0  # the trigger marks it reached, as bits (RankSlot.pause)
    pauses: int = 0  # the pauses it made for the supervisor to act
    acked: int = 0  # those the supervisor acted on

    @property
    def timed(self) -> bool:
        """Blocked in a call that returns by itself at its timeout."""
        return self.state == "blocked" and self.until > 0

    def describe(self, communicator: Communicator | None = None) -> str:
        """What the rank does, in a line; ``communicator``: the one it waits in, if not the
        task's (from ``read_communicators``)."""
        if self.state != "blocked":
            return f"rank {self.rank} is {self.state}"
        if self.op == "hung":
            return f"rank {self.rank} is hung (a fault plan froze it in a communication call)"
        if self.op == "Admit" and self.peers != (ALL_PEERS,):
            return (f"rank {self.rank} joined the running job and waits to be admitted (the "
                    "others' comm.Admit())")
        if self.op.startswith("store."):
            return f"rank {self.rank} waits on the task's store ({self.op}) for a key no rank has set"
        on = (f" on communicator {communicator.path} (world ranks "
              f"{', '.join(map(str, communicator.members))})") if communicator is not None else ""
        if self.peers == (ALL_PEERS,):
            group = "its communicator" if communicator is not None else "its group"
            return f"rank {self.rank} is blocked in {self.op}{on} (waits for every rank of {group})"
        who = ", ".join(str(p) for p in self.peers) if self.peers else "any rank"
        verb = {
            "Send": "waits to send to",
            "Recv": "waits to receive from",
            "Sendrecv": "waits to exchange with",
            "Wait": "waits on a request with",
            "Waitall": "waits on requests with",
            "Waitany": "waits on any request with",
            "Probe": "waits for a message from",
        }.get(self.op, f"is blocked in {self.op} with")
        size = f" ({self.nbytes} bytes)" if self.nbytes else ""
        return f"rank {self.rank} {verb} {who} in {self.op}{size}{on}{self._giving_up()}"

    def _giving_up(self) -> str:
        if not self.timed:
            return ""
        return f", and gives up in {max(self.until - time.monotonic(), 0.0):.1f} s"


def read_state(job_dir: Path, rank: int) -> RankState | None:
    try:
        data = state_path(job_dir, rank).read_bytes()
    except OSError:
        return None
    if len(data) < SIZE:
        return None
    (state, op, npeers, task, seq, p0, p1, p2, p3, nbytes, since, step, comm, until, marks,
     pauses, acked) = struct.unpack_from(_FORMAT, data)
    peers = (p0, p1, p2, p3)[:npeers]
    name = STATE_NAMES[state] if state < len(STATE_NAMES) else "unknown"
    op_name = OPS[op] if op < len(OPS) else "?"
    return RankState(rank, name, op_name, peers, nbytes, seq, since, task, step, comm, until,
                     marks, pauses, acked)
