"""What a rank sent, value for value, for a task that asks (``Task(record_sent=True)``).

The counters say how many bytes left a rank; they cannot say what those bytes were. A check that
must know that the right data travelled (the partial sums a tensor-parallel layer reduces, the
updated shard a ZeRO rank hands its peers, the activations a pipeline stage passes on) reads
this log instead: a copy of every buffer the rank handed the engine to send, made by the proxy
(the rank's agent, sealed) as the call starts, so that nothing the learner's process does later
changes it. Point-to-point sends are logged with their destination; a collective with the
buffer this rank contributes (an allreduce's input, an allgather's block, a root's bcast). Only
what leaves the rank: a send to itself, a collective on a communicator of one rank and the root's
own share of a Gather or a Reduce reach no other rank and are not logged (a rank that "shares" its
result with itself shows nothing), and each entry names the communicator's ranks it went over.

The log is bounded: past ``SENT_LIMIT_BYTES`` a rank's further sends are not copied and the log
says it overflowed, which a check reads as missing evidence, never as a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SENT_LIMIT_BYTES = 64 << 20
COLLECTIVE = -1  # the peer of a collective's contribution: the whole group


@dataclass(frozen=True)
class Sent:
    op: str  # the call: "Send", "Isend", "Sendrecv", "Allreduce", "Allgather", ...
    peer: int  # the destination's world rank; COLLECTIVE for a collective's contribution
    data: np.ndarray  # a flat copy, with the dtype it was sent as
    after_marks: int  # how many comm.mark() calls the rank had made when it sent this
    group: tuple[int, ...] = ()  # the world ranks of the communicator it went over, in its order


@dataclass
class SentLog:
    items: list[Sent] = field(default_factory=list)
    nbytes: int = 0
    overflowed: bool = False

    def add(self, op: str, peer: int, array: np.ndarray, after_marks: int, group: tuple[int, ...] = ()) -> None:
        if self.nbytes + array.nbytes > SENT_LIMIT_BYTES:
            self.overflowed = True
            return
        self.items.append(Sent(op, peer, np.array(array, copy=True).reshape(-1), after_marks, group))
        self.nbytes += array.nbytes
