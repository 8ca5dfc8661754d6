"""Max-min fair rates of flows that share links (progressive filling), as the replay uses them."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

L = TypeVar("L", bound=Hashable)


def max_min_rates(
    routes: Sequence[Sequence[L]],
    caps: Sequence[float],
    weights: Sequence[int],
    capacity: Callable[[L], float],
) -> list[float]:
    """Max-min fair per-flow rates by progressive filling.

    Class c holds ``weights[c]`` identical flows over the links ``routes[c]``, each flow capped
    at ``caps[c]`` (math.inf for no cap). All unfrozen flows rise together; when a link fills
    (its remaining capacity over its unfrozen flows is the lowest such share) or a class reaches
    its cap, those flows freeze at that level. Returns each class's per-flow rate.
    """
    slot: dict[L, int] = {}  # link -> index, in order of first appearance
    remaining: list[float] = []
    members: list[list[int]] = []
    uses: list[list[int]] = []
    for c, links in enumerate(routes):
        mine: list[int] = []
        for link in links:
            j = slot.get(link)
            if j is None:
                j = slot[link] = len(remaining)
                remaining.append(float(capacity(link)))
                members.append([])
            if j not in mine:
                mine.append(j)
                members[j].append(c)
        uses.append(mine)
    return progressive_fill(uses, members, remaining, caps, weights)


def progressive_fill(
    uses: Sequence[Sequence[int]],
    members: Sequence[Sequence[int]],
    remaining: list[float],
    caps: Sequence[float],
    weights: Sequence[int],
) -> list[float]:
    """max_min_rates on numbered links: ``uses[c]`` are class c's links (each once),
    ``members[j]`` the classes on link j, ``remaining[j]`` its capacity (consumed in place).

    Links wait in a heap keyed by their current share, so a call costs
    O(sum of route lengths * log links), not a pass over every class at every level.
    """
    n = len(uses)
    unfrozen_on = [sum(weights[c] for c in on) for on in members]  # flows not yet frozen
    share = [r / k if k > 0 else math.inf for r, k in zip(remaining, unfrozen_on)]
    heap = [(s, j) for j, s in enumerate(share) if s < math.inf]
    heapq.heapify(heap)
    by_cap = sorted(range(n), key=lambda c: caps[c])  # stable: ties keep class order
    rates = [-1.0] * n  # -1: not frozen yet
    left, next_cap, level = n, 0, 0.0
    while left:
        # Drop heap entries made stale by later updates of their link.
        while heap and (unfrozen_on[heap[0][1]] == 0 or heap[0][0] != share[heap[0][1]]):
            heapq.heappop(heap)
        while next_cap < n and rates[by_cap[next_cap]] >= 0:
            next_cap += 1
        link_level = heap[0][0] if heap else math.inf
        cap_level = caps[by_cap[next_cap]] if next_cap < n else math.inf
        # Rounding may put a share a hair under the last level; levels never go down, which
        # also keeps every rate positive.
        if cap_level <= link_level:
            level = max(level, cap_level)
            freezing = [by_cap[next_cap]]
        else:
            j = heapq.heappop(heap)[1]
            level = max(level, link_level)
            freezing = [c for c in members[j] if rates[c] < 0]
        changed: dict[int, None] = {}  # links whose share moved; each re-enters the heap once
        for c in freezing:
            rates[c] = level
            left -= 1
            w = weights[c]
            for k in uses[c]:
                unfrozen_on[k] -= w
                remaining[k] -= w * level
                changed[k] = None
        for k in changed:
            if unfrozen_on[k] > 0:
                share[k] = remaining[k] / unfrozen_on[k]
                heapq.heappush(heap, (share[k], k))
    return rates
