"""What a rank held at its marks: its agent's readings of the learner's processes, and the bytes it
had sent that its peers had not received yet.

A message on its way sits in an agent (its sender's, or its receiver's engine), out of reach of a
reading of the learner's processes: an outside tester kept 18 MiB of Adam's moments in Isends to a
neighbour between two steps, received at the next one, and read as its shard alone. The counters
say where every byte went: what rank r had sent peer q by its k-th mark named m, against what q had
received from r by its own k-th mark m (both at the same point of the program), is what was under
way at that point, and counts as r's. (A message to itself waits in its own agent: the reading
counts those, runtime/rank/memory.py.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HeldMemory:
    """A rank's memory readings (``TaskRun.memory``): bytes held before the learner's file was
    imported (-1: never read), and at each mark, in order, with the most held since the reading
    before (its agent samples the learner every few milliseconds while the task runs)."""

    before_solution: int
    marks: tuple[tuple[str, int, int], ...]

    def at(self, mark: str, nth: int = 0) -> int:
        """Bytes held at the ``nth`` mark named ``mark``."""
        return self._reading(mark, nth)[1]

    def peak_to(self, mark: str, nth: int = 0) -> int:
        """The most bytes held from the reading before the ``nth`` mark named ``mark`` up to it."""
        return self._reading(mark, nth)[2]

    def _reading(self, mark: str, nth: int) -> tuple[str, int, int]:
        found = [reading for reading in self.marks if reading[0] == mark]
        if nth >= len(found):
            raise KeyError(f"{len(found)} mark(s) {mark!r}; no reading #{nth}")
        return found[nth]


def held_with_in_flight(outcomes: Sequence[Any], rank: int) -> HeldMemory:
    """Rank ``rank``'s readings (``TaskOutcome.memory``), each at a mark with the bytes it had sent
    by then that were not received by the same mark of their receiver (``under_way``)."""
    readings = outcomes[rank].memory
    marks = outcomes[rank].marks
    held = []
    for k, (name, at, peak) in enumerate(readings[1:]):
        away = under_way(outcomes, rank, k) if k < len(marks) and marks[k][0] == name else 0
        held.append((name, at + away, max(peak, at + away)))
    return HeldMemory(readings[0][1], tuple(held))


def under_way(outcomes: Sequence[Any], rank: int, k: int) -> int:
    """What rank ``rank`` had sent each peer by its ``k``-th mark that the peer had not received by
    its own mark of that name and number (by the task's end where it never set one)."""
    marks = outcomes[rank].marks
    name, sent = marks[k]
    nth = sum(1 for other, _ in marks[:k] if other == name)
    total = 0
    for peer, outcome in enumerate(outcomes):
        if peer == rank or not sent.sent_bytes.get(peer):
            continue
        theirs = [stats for other, stats in outcome.marks if other == name]
        received = (theirs[nth] if nth < len(theirs) else outcome.stats).recv_bytes.get(rank, 0)
        total += max(0, sent.sent_bytes[peer] - received)
    return total

