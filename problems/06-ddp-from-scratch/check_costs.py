"""Problem 06's arithmetic: the card's bucket rule, the ring's cost, and the overlap accounting.

Pure functions, computed in the supervisor and unit-tested without a process: how the card cuts
gradients into buckets (plan_buckets), which caps give a wanted number of buckets (for the hidden
variants), what a ring allreduce costs on the platform, and how much of the communication of one
step hid behind backward compute, read from a rank's replayed events (windows, hidden_fraction).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np


def plan_buckets(nbytes: list[int], cap_bytes: int) -> list[list[int]]:
    """The bucket rule of the card: consecutive tensors (``nbytes`` in reverse parameter order),
    a new bucket when the next one would pass the cap; a tensor over the cap gets its own."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i, n in enumerate(nbytes):
        if current and filled + n > cap_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(i)
        filled += n
    if current:
        buckets.append(current)
    return buckets


def caps_giving(nbytes: list[int], count: int) -> list[tuple[int, int]]:
    """Ranges [lo, hi) of caps for which ``plan_buckets`` makes exactly ``count`` buckets.

    The count only changes where the cap crosses the size of a run of consecutive tensors."""
    sums = sorted({sum(nbytes[i:j]) for i in range(len(nbytes)) for j in range(i + 1, len(nbytes) + 1)})
    edges = sums + [2 * sums[-1] + 1]
    return [(lo, hi) for lo, hi in itertools.pairwise(edges)
            if len(plan_buckets(nbytes, lo)) == count]


def pick_cap(nbytes: list[int], count: int, rng: np.random.Generator) -> int:
    """A cap strictly inside a range giving ``count`` buckets (never equal to a bucket's size)."""
    ranges = [(lo, hi) for lo, hi in caps_giving(nbytes, count) if hi - lo > 2]
    if not ranges:
        raise ValueError(f"no cap gives {count} buckets for sizes {nbytes}")
    lo, hi = ranges[int(rng.integers(len(ranges)))]
    return int(rng.integers(lo + 1, hi))


def ring_time(p: int, nbytes: int, alpha: float, beta: float) -> float:
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta if p > 1 else 0.0


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals."""
    total, end = 0.0, -math.inf
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


@dataclass(frozen=True)
class Window:
    """One rank's backward + gradient sync of one step, on the virtual clock."""

    begin: float  # mark "backward"
    end: float  # mark "synced"
    compute_s: float  # declared backward work inside
    compute_end: float  # when the last backward work ended
    launches: tuple[float, ...]  # when each allreduce was called
    blocked_in_backward: float  # time blocked in waits before compute_end


def windows(events: list[tuple], spans: tuple[tuple[float, float], ...]) -> list[Window]:
    """Per step, the window from mark "backward" to mark "synced" of one rank's replayed events."""
    found, cur = [], None
    for e, (t0, t1) in zip(events, spans):
        kind = e[0]
        if kind == "mark" and e[1] == "backward":
            cur = {"begin": t0, "compute": 0.0, "compute_end": t0, "launches": [], "waits": []}
        elif cur is None:
            continue
        elif kind == "mark" and e[1] == "synced":
            blocked = sum(max(0.0, min(b, cur["compute_end"]) - a) for a, b in cur["waits"])
            found.append(Window(cur["begin"], t0, cur["compute"], cur["compute_end"],
                                tuple(cur["launches"]), blocked))
            cur = None
        elif kind == "compute":
            cur["compute"] += t1 - t0
            cur["compute_end"] = t1
        elif (kind == "coll" and e[1] == "Allreduce") or (kind == "icoll" and e[2] == "Allreduce"):
            cur["launches"].append(t0)
            if kind == "coll":
                cur["waits"].append((t0, t1))
        elif kind == "wait":
            cur["waits"].append((t0, t1))
    return found


def hidden_fraction(exposed_s: float, comm_s: float) -> float:
    """Share of the communication time that did not add to the step."""
    if comm_s <= 0:
        return 0.0
    return min(max(1.0 - exposed_s / comm_s, 0.0), 1.0)
