"""Shortest paths over the platform's link graph: least latency, then fewest hops, then names.

Pure functions over plain data, so the rule is tested on its own and the same answer comes out
on every run: the priority key (latency, hops, node names on the path) is a total order, and it
is compatible with extending paths (two paths with equal latency and hops have equal length, so
appending the same hop keeps their name order), which is what Dijkstra's label setting needs.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Graph:
    """Directed edges with integer costs (picoseconds); ``endpoints`` may start or end a path but
    never sit in its middle (devices do not forward traffic)."""

    edges: dict[tuple[str, str], int]
    endpoints: frozenset[str] = frozenset()
    adjacency: dict[str, list[tuple[str, int]]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        adj: dict[str, list[tuple[str, int]]] = {}
        for (a, b), cost in sorted(self.edges.items()):
            adj.setdefault(a, []).append((b, cost))
        object.__setattr__(self, "adjacency", adj)


def shortest_paths(graph: Graph, src: str) -> dict[str, tuple[str, ...]]:
    """Best path from ``src`` to every node it can reach (``src`` itself maps to ``(src,)``)."""
    best: dict[str, tuple[str, ...]] = {}
    heap: list[tuple[int, int, tuple[str, ...]]] = [(0, 0, (src,))]
    while heap:
        cost, hops, path = heapq.heappop(heap)
        node = path[-1]
        if node in best:
            continue
        best[node] = path
        if node != src and node in graph.endpoints:
            continue  # a path may end at a device but not pass through it
        for nxt, step in graph.adjacency.get(node, ()):
            if nxt not in best:
                heapq.heappush(heap, (cost + step, hops + 1, path + (nxt,)))
    return best
