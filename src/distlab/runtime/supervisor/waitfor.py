"""The wait-for graph: from each blocked rank to the ranks it waits on, and the cycle if any.

Pure functions over RankState records, so they are tested without processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..comm.rankstate import ALL_PEERS, Communicator, RankState


@dataclass(frozen=True)
class WaitForGraph:
    states: dict[int, RankState]
    edges: dict[int, tuple[int, ...]]
    cycle: tuple[int, ...] | None
    communicators: Mapping[int, Communicator] = field(default_factory=dict)

    def describe(self, instead: dict[int, str] | None = None) -> str:
        """One line per rank (``instead`` replaces a rank's line: a rank the fault plan froze
        keeps the slot of the call it was stopped in), then the cycle if there is one."""
        instead = instead or {}
        lines = [instead.get(s.rank) or s.describe(self.communicators.get(s.comm))
                 for s in sorted(self.states.values(), key=lambda s: s.rank)]
        if self.cycle:
            lines.append(cycle_sentence(self.cycle) + ": a cycle, so none of them can go on")
        return "\n".join(lines)


def build(states: list[RankState], world_size: int,
          communicators: Mapping[int, Communicator] | None = None) -> WaitForGraph:
    """``communicators``: the sub-communicators the ranks made (``read_communicators``), whose
    collectives wait on their members only."""
    communicators = communicators or {}
    by_rank = {s.rank: s for s in states}
    edges: dict[int, tuple[int, ...]] = {}
    for s in states:
        if s.state != "blocked":
            continue
        if s.peers == (ALL_PEERS,):
            # A collective waits on every rank of its communicator that has not entered it.
            registered = communicators.get(s.comm)
            members = registered.members if registered is not None else range(world_size)
            edges[s.rank] = tuple(
                r for r in members
                if r != s.rank and not (r in by_rank and by_rank[r].op == s.op
                                        and by_rank[r].state == "blocked" and by_rank[r].comm == s.comm)
            )
        elif s.op == "Sendrecv":
            # Its send can always complete once the destination posts a receive; what holds a
            # Sendrecv is its source not sending. Counting the destination too would see a cycle
            # in every ring that is merely in the middle of an exchange.
            edges[s.rank] = tuple(p for p in s.peers[:1] if p >= 0) if len(s.peers) > 1 else ()
        else:
            edges[s.rank] = tuple(p for p in s.peers if p >= 0)
    return WaitForGraph(by_rank, edges, find_cycle(edges), communicators)


def find_cycle(edges: dict[int, tuple[int, ...]]) -> tuple[int, ...] | None:
    """The first cycle found by depth-first search, as ranks in waiting order, or None."""
    done: set[int] = set()
    for start in sorted(edges):
        path: list[int] = []
        on_path: dict[int, int] = {}
        node: int | None = start
        # Follow the first unexplored edge; a rank waiting on one peer is the common case.
        stack = [(start, iter(edges.get(start, ())))]
        on_path[start] = 0
        path.append(start)
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                on_path.pop(node, None)
                done.add(node)
                continue
            if nxt in on_path:
                return tuple(path[on_path[nxt]:])
            if nxt in done or nxt not in edges:
                continue
            on_path[nxt] = len(path)
            path.append(nxt)
            stack.append((nxt, iter(edges.get(nxt, ()))))
    return None


def cycle_sentence(cycle: tuple[int, ...]) -> str:
    """(0, 3, 2) -> 'rank 0 waits on 3, 3 on 2, 2 on 0'."""
    first = f"rank {cycle[0]} waits on {cycle[1 % len(cycle)]}"
    rest = [f"{cycle[i]} on {cycle[(i + 1) % len(cycle)]}" for i in range(1, len(cycle))]
    return ", ".join([first, *rest])
