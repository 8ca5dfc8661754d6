"""What each rank is doing right now, written by the rank and read by the supervisor.

Each rank owns one small memory-mapped file in the job folder. The comm proxy overwrites it on entry
to and exit from every call (a ``struct.pack_into``, well under a microsecond), so a supervisor that
finds the job stuck can say who waits on whom without asking the stuck processes anything.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

# Layout: state, op, number of peers, task index, call sequence, 4 peers (world ranks), bytes,
# since, training step (counted by problem code's comm.mark("step"); process faults trigger on it).
_FORMAT = "<BBBBI4iqdI"
SIZE = struct.calcsize(_FORMAT)
_STEP_OFFSET = SIZE - 4
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
)
OP_CODE = {name: i for i, name in enumerate(OPS)}

ALL_PEERS = -2  # a collective: waits on every rank of its group


def state_path(job_dir: Path, rank: int) -> Path:
    return job_dir / f"state-{rank}.bin"


class RankSlot:
    """The writer side, used by one rank. Written on every call of the proxy: kept cheap."""

    _record = struct.Struct(_FORMAT)
    # state (byte 0) and seq (bytes 4-7) alone, for the frequent "back to running" write.
    _state_only = struct.Struct("<B")
    _seq_only = struct.Struct("<I")

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._seq = 0
        self.task = 0  # index of the batch task running now
        self.step = 0  # the rank's training step, as marked by problem code
        self.set(RUNNING)

    def set(self, state: int, op: str = "-", peers: tuple[int, ...] = (), nbytes: int = 0) -> None:
        self._seq += 1
        npeers = len(peers)
        if npeers >= MAX_PEERS:
            p0, p1, p2, p3 = peers[:MAX_PEERS]
            npeers = MAX_PEERS
        else:
            p0, p1, p2, p3 = (*peers, 0, 0, 0, 0)[:MAX_PEERS]
        self._record.pack_into(
            self._map, 0, state, OP_CODE[op], npeers, self.task & 0xFF, self._seq & 0xFFFFFFFF,
            p0, p1, p2, p3, nbytes, time.monotonic(), self.step & 0xFFFFFFFF,
        )

    def blocked(self, op: str, peers: tuple[int, ...], nbytes: int = 0) -> None:
        self.set(BLOCKED, op, peers, nbytes)

    def running(self) -> None:
        # The supervisor reads the state and the sequence number; the rest may stay stale.
        self._seq += 1
        self._state_only.pack_into(self._map, 0, RUNNING)
        self._seq_only.pack_into(self._map, 4, self._seq & 0xFFFFFFFF)

    def set_step(self, step: int) -> None:
        self.step = step
        self._seq += 1
        self._seq_only.pack_into(self._map, 4, self._seq & 0xFFFFFFFF)
        self._seq_only.pack_into(self._map, _STEP_OFFSET, step & 0xFFFFFFFF)


class NullSlot:
    """Stands in for RankSlot when no supervisor watches (an external mpirun or torchrun)."""

    task = 0
    step = 0

    def set_step(self, step: int) -> None:
        self.step = step

    def set(self, state: int, op: str = "-", peers: tuple[int, ...] = (), nbytes: int = 0) -> None:
        pass

    def blocked(self, op: str, peers: tuple[int, ...], nbytes: int = 0) -> None:
        pass

    def running(self) -> None:
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

    def describe(self) -> str:
        if self.state != "blocked":
            return f"rank {self.rank} is {self.state}"
        if self.op == "hung":
            return f"rank {self.rank} is hung (a fault plan froze it in a communication call)"
        if self.peers == (ALL_PEERS,):
            return f"rank {self.rank} is blocked in {self.op} (waits for every rank of its group)"
        who = ", ".join(str(p) for p in self.peers) if self.peers else "any rank"
        verb = {
            "Send": "waits to send to",
            "Recv": "waits to receive from",
            "Sendrecv": "waits to exchange with",
            "Wait": "waits on a request with",
            "Waitall": "waits on requests with",
            "Probe": "waits for a message from",
        }.get(self.op, f"is blocked in {self.op} with")
        size = f" ({self.nbytes} bytes)" if self.nbytes else ""
        return f"rank {self.rank} {verb} {who} in {self.op}{size}"


def read_state(job_dir: Path, rank: int) -> RankState | None:
    try:
        data = state_path(job_dir, rank).read_bytes()
    except OSError:
        return None
    if len(data) < SIZE:
        return None
    state, op, npeers, task, seq, p0, p1, p2, p3, nbytes, since, step = struct.unpack_from(
        _FORMAT, data
    )
    peers = (p0, p1, p2, p3)[:npeers]
    name = STATE_NAMES[state] if state < len(STATE_NAMES) else "unknown"
    op_name = OPS[op] if op < len(OPS) else "?"
    return RankState(rank, name, op_name, peers, nbytes, seq, since, task, step)
