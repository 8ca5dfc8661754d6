"""What a check reads of a task besides the values its ranks returned: counters and the timeline.

Both come from the runtime's own records of the task (the proxy's counters, the trace, the replay
on the virtual clock), not from anything the rank program returned, and both are grading's own
types, so a problem never holds a runtime object::

    counts = result.task.counts(rank)                 # the whole task on one rank
    counts = result.task.counts(rank, "backward")     # from comm.mark("backward") to the next mark
    per_step = result.task.phases(rank, "step")       # every phase that starts at a "step" mark
    timeline = result.task.timeline()                 # the replay: spans, messages, totals
    timeline.events(rank), timeline.messages, timeline.makespan, timeline.marks(rank)

A *phase* starts at a ``comm.mark(name)`` and ends at the rank's next mark of any name, or at the
end of the task; what a rank did before its first mark belongs to no named phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from ..runtime.comm.stats import CommStats, Readings
from ..runtime.trace.events import (
    COLL,
    COMPUTE,
    ICOLL,
    MARK,
    RECV,
    SEND,
    STORE,
    TIMEOUT,
    WAIT,
)

if TYPE_CHECKING:
    from ..runs import TaskRun

# A message, named the same way by its sender and its receiver: (communicator, source, destination,
# tag, k) where k counts the messages of that (source, destination, tag) channel in send order.
MessageKey = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class Counts(Readings):
    """One rank's calls and payload bytes over a task or a phase. Peers are world ranks; the
    totals (messages_sent, bytes_sent, bytes_received, collectives_used()) come from Readings."""

    calls: Mapping[str, int] = field(default_factory=dict)  # API calls, by name ("Sendrecv", ...)
    op_bytes: Mapping[str, int] = field(default_factory=dict)  # their buffer bytes, by name
    sent_msgs: Mapping[int, int] = field(default_factory=dict)  # point-to-point, by destination
    sent_bytes: Mapping[int, int] = field(default_factory=dict)
    recv_msgs: Mapping[int, int] = field(default_factory=dict)  # by source
    recv_bytes: Mapping[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, stats: CommStats) -> Counts:
        return cls(dict(stats.calls), dict(stats.op_bytes), dict(stats.sent_msgs),
                   dict(stats.sent_bytes), dict(stats.recv_msgs), dict(stats.recv_bytes))


def phases_of(task_run: TaskRun, rank: int, phase: str) -> list[Counts]:
    """The rank's counts in every phase named ``phase``, in order. Where the task lists the
    program's mark names (grading's ``Task.marks``), marks of other names are passed over."""
    outcome = task_run.outcomes[rank]
    harness = getattr(getattr(task_run, "spec", None), "marks", ())
    marks = [(name, stats) for name, stats in outcome.marks if not harness or name in harness]
    ends = [stats for _, stats in marks[1:]] + [outcome.stats]
    return [Counts.of(end.since(start)) for (name, start), end in zip(marks, ends) if name == phase]


@dataclass(frozen=True)
class Span:
    """One call of one rank on the virtual clock, in the rank's program order.

    ``kind`` is "compute", "send", "recv", "wait", "coll" (a blocking collective), "icoll" (a
    nonblocking one posted), "mark", "store" (a call on the task's store, no time) or "timeout"
    (a call that waited its timeout and gave up); ``name`` is the compute's label, the mark's
    name, the collective's operation ("Allreduce") or the call that timed out; ``peer`` the
    destination of a send, the source of a receive or the rank a timed-out call waited on (-1:
    any); ``message`` names a send's message, ``received`` the messages a wait's
    receives matched."""

    kind: str
    begin: float
    end: float
    name: str = ""
    peer: int | None = None
    tag: int | None = None
    nbytes: int = 0
    message: MessageKey | None = None
    received: tuple[MessageKey, ...] = ()

    @property
    def seconds(self) -> float:
        return self.end - self.begin


@dataclass(frozen=True)
class Message:
    """One flow on the wire, as the replay moved it: posted by the sender at ``posted``, its first
    byte out at ``start`` (after the route's latency), its last byte in at ``end``."""

    src: int
    dst: int
    nbytes: int
    posted: float
    start: float
    end: float
    op: str  # "send" for point-to-point, else the collective it belongs to ("Allreduce", ...)


def _span(rank: int, event: tuple[Any, ...], begin: float, end: float) -> Span:
    kind = event[0]
    if kind == COMPUTE:
        return Span(kind, begin, end, name=str(event[2]))
    if kind == SEND:
        _, _, ctx, dst, tag, k, nbytes, *_ = event
        return Span(kind, begin, end, peer=dst, tag=tag, nbytes=int(nbytes),
                    message=(ctx, rank, dst, tag, k))
    if kind == RECV:
        return Span(kind, begin, end, peer=event[3], tag=event[4], nbytes=int(event[5]))
    if kind == WAIT:
        received = tuple((ctx, src, rank, tag, k) for ctx, src, tag, k in event[2].values())
        return Span(kind, begin, end, received=received)
    if kind == COLL:  # an Alltoallv's bytes come per destination
        return Span(kind, begin, end, name=str(event[1]), nbytes=_total(event[4]))
    if kind == ICOLL:
        return Span(kind, begin, end, name=str(event[2]), nbytes=_total(event[5]))
    if kind == MARK:
        return Span(kind, begin, end, name=str(event[1]))
    if kind == STORE:  # name: the call ("get"); nbytes: its value's
        return Span(kind, begin, end, name=str(event[1]), nbytes=int(event[3]))
    if kind == TIMEOUT:
        peer = event[2] if isinstance(event[2], int) else None
        return Span(kind, begin, end, name=str(event[1]), peer=peer)
    raise ValueError(f"rank {rank}: an event of unknown kind {kind!r} in the trace")


def _total(nbytes: Any) -> int:
    return sum(nbytes) if isinstance(nbytes, (tuple, list)) else int(nbytes)


class Timeline:
    """A task on the virtual clock of its platform: every rank's calls, the messages, the totals."""

    def __init__(self, task_run: TaskRun) -> None:
        played = task_run.replay()
        self._events = {
            rank: [_span(rank, e, b, f) for e, (b, f) in zip(events, played.spans.get(rank, ()))]
            for rank, events in task_run.traces.items()
        }
        self.makespan: float = played.makespan
        self.finish: dict[int, float] = dict(played.finish)
        self.compute_s: dict[int, float] = dict(played.compute_s)
        self.comm_s: dict[int, float] = dict(played.comm_s)  # blocked in waits and collectives
        self.sync_wait_s: dict[int, float] = dict(played.sync_wait_s)
        self.idle_s: dict[int, float] = dict(played.idle_s)
        self.pair_bytes: dict[tuple[int, int], int] = dict(played.pair_bytes)
        self.link_bytes: dict[str, int] = dict(played.link_bytes)
        self.money: float = played.money
        self.messages: list[Message] = [
            Message(f.src, f.dst, f.nbytes, f.posted, f.start, f.end, f.op) for f in played.flows
        ]
        self._marks = {rank: list(marks) for rank, marks in played.marks.items()}

    @property
    def ranks(self) -> list[int]:
        return sorted(self._events)

    def events(self, rank: int, kind: str | None = None) -> list[Span]:
        """The rank's calls in program order (only those of ``kind`` if given)."""
        return [s for s in self._events.get(rank, []) if kind is None or s.kind == kind]

    def marks(self, rank: int) -> list[tuple[str, float]]:
        """(name, virtual time) of each of the rank's marks."""
        return list(self._marks.get(rank, []))
