"""Receives whose timeout passed on the gloo engine, and who takes what they bring.

MPI withdraws a receive that timed out (MPI_Cancel), and the message, when it comes, goes to the
next receive that matches it. Gloo cannot withdraw a posted receive: it stays in the pair's
queue and takes the next message from its source with its tag, whoever asks for it later. So a
receive with a timeout lands in a scratch buffer of its own (gloo_parts.py's ``_Request`` with
``into``), and when its timeout passes it becomes an orphan here, under its (source, tag). The
next receive from that source with that tag adopts the oldest orphan instead of posting one of
its own: gloo gives the orphan the very message MPI would have given that receive, so both
engines deliver the same messages to the same receives. What is left in a process's orphans when
it ends was never sent.

Not covered: an orphan from any source (``ANY_SOURCE``) takes the next message from any rank
with its tag, so a later receive naming a source may see that message go to the orphan first;
the wildcard receive that comes next adopts it.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .gloo_parts import _Request


class Orphans:
    """The orphaned receives of one process group, oldest first per (source, tag)."""

    def __init__(self) -> None:
        self._by_channel: dict[tuple[int, int], deque[_Request]] = {}

    def add(self, source: int, tag: int, request: _Request) -> None:
        waiting = self._by_channel.setdefault((source, tag), deque())
        # One adopted before, orphaned again, was the channel's oldest: it stays first.
        (waiting.appendleft if request.adopted else waiting.append)(request)

    def adopt(self, source: int, tag: int, into: np.ndarray) -> _Request | None:
        """The oldest orphan of (source, tag), now receiving into ``into``; None if none."""
        waiting = self._by_channel.get((source, tag))
        if not waiting:
            return None
        request = waiting.popleft()
        if not waiting:
            del self._by_channel[(source, tag)]
        return request.adopt(into)

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_channel.values())
