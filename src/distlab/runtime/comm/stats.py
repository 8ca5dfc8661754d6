"""Message and byte counters kept by the comm proxy, per operation and per peer."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping

POINT_TO_POINT = frozenset({"Send", "Recv", "Isend", "Irecv", "Sendrecv", "Probe", "Iprobe"})
COLLECTIVES = frozenset(
    {"Barrier", "Bcast", "Reduce", "Allreduce", "Reduce_scatter", "Reduce_scatter_block", "Allgather",
     "Gather", "Scatter", "Allgatherv", "Alltoall", "Alltoallv"}
)


COUNTERS = ("calls", "op_bytes", "sent_msgs", "sent_bytes", "recv_msgs", "recv_bytes")


class Readings:
    """The totals read off a rank's counters; shared by ``CommStats`` and grading's ``Counts``."""

    calls: Mapping[str, int]
    sent_msgs: Mapping[int, int]
    sent_bytes: Mapping[int, int]
    recv_bytes: Mapping[int, int]

    @property
    def messages_sent(self) -> int:
        return sum(self.sent_msgs.values())

    @property
    def bytes_sent(self) -> int:
        return sum(self.sent_bytes.values())

    @property
    def bytes_received(self) -> int:
        return sum(self.recv_bytes.values())

    def collectives_used(self) -> list[str]:
        return sorted(op for op, n in self.calls.items() if n and op in COLLECTIVES)


@dataclass
class CommStats(Readings):
    """Counters of one rank. Peers are world ranks; bytes are payload bytes, a receive's those
    that arrived (where the engine says: MPI) rather than its buffer's. A message a rank sends
    itself counts among ``calls`` and ``op_bytes`` only: it never crosses a link."""

    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    op_bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    sent_msgs: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    sent_bytes: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    recv_msgs: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    recv_bytes: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    def count_call(self, op: str, nbytes: int) -> None:
        self.calls[op] += 1
        self.op_bytes[op] += nbytes

    def count_send(self, peer: int, nbytes: int) -> None:
        self.sent_msgs[peer] += 1
        self.sent_bytes[peer] += nbytes

    def count_recv(self, peer: int, nbytes: int) -> None:
        self.recv_msgs[peer] += 1
        self.recv_bytes[peer] += nbytes

    def snapshot(self) -> "CommStats":
        copy = CommStats()
        for name in COUNTERS:
            getattr(copy, name).update(getattr(self, name))
        return copy

    def since(self, earlier: "CommStats") -> "CommStats":
        """The counts added after ``earlier`` was taken."""
        delta = CommStats()
        for name in COUNTERS:
            now, before, out = getattr(self, name), getattr(earlier, name), getattr(delta, name)
            for key, value in now.items():
                if value - before.get(key, 0):
                    out[key] = value - before.get(key, 0)
        return delta

    def merge(self, other: "CommStats") -> None:
        for name in COUNTERS:
            mine = getattr(self, name)
            for key, value in getattr(other, name).items():
                mine[key] += value

    def to_dict(self) -> dict[str, Any]:
        return {
            "calls": dict(self.calls),
            "op_bytes": dict(self.op_bytes),
            "messages_sent": self.messages_sent,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "sent_bytes_by_peer": {str(k): v for k, v in sorted(self.sent_bytes.items())},
        }

    def __getstate__(self) -> dict[str, Any]:
        # defaultdicts holding a lambda do not pickle; plain dicts do.
        return {k: dict(v) for k, v in self.__dict__.items()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, defaultdict(int, value))
