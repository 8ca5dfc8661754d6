"""How problem 06 judges: the expected weights and the symptom that explains a difference; the
collective counts; how much of one step's communication hid behind backward on the virtual clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from distlab.grading import first_mismatch

from .cases import Case, build_model, layout
from .programs import RankResult, StepCount, flat_weights, single_process

RTOL, ATOL = 2e-4, 2e-5  # float32 SGD: summation order differs between p ranks and one process
HIDDEN_TARGET = 0.5  # the catalog's "at least half of the communication hidden"


def start_weights(case: Case) -> np.ndarray:
    return flat_weights(build_model(case, 0))


def close(got: np.ndarray, want: np.ndarray, rtol: float = RTOL, atol: float = ATOL) -> bool:
    return first_mismatch(got, want, rtol=rtol, atol=atol) is None


def worst_parameter(case: Case, got: np.ndarray, want: np.ndarray) -> str:
    """Names the parameter with the largest difference."""
    offset, worst, name_of = 0, -1.0, ""
    for name, n, _ in layout(case):
        diff = float(np.max(np.abs(got[offset:offset + n] - want[offset:offset + n]))) if n else 0.0
        if diff > worst:
            worst, name_of = diff, name
        offset += n
    return f"largest difference {worst:.3g} in {name_of}"


def diagnose_weights(case: Case, results: list[RankResult]) -> str | None:
    """None if every rank's final weights are single-process SGD's (computed here, never on the
    ranks that run the learner's code); else the known mistake that explains the difference."""
    want = single_process(case)
    bad = [r for r, res in enumerate(results) if not close(res.final, want)]
    if not bad:
        return None
    rank = bad[0]
    head = f"{case.label}, after {case.steps} steps of SGD (lr {case.lr}): rank {rank}'s weights"
    if all(s.collectives == 0 for res in results for s in res.steps):
        return (f"{head} are not those of one process training on the global batch: no collective "
                "ran in any step, so each rank followed its own shard's gradients only")
    start = start_weights(case)
    diverged = [r for r, res in enumerate(results) if not np.array_equal(res.start, start)]
    if diverged:
        return (f"{head} are wrong: rank {diverged[0]} still held its own initial weights when "
                "DataParallel(...) returned; broadcast rank 0's weights to every rank first")
    got, total = results[rank].final, sum(case.backward_sizes())
    for step, count in enumerate(results[rank].steps):
        if count.allreduce_bytes > total:
            return (f"{head} are wrong: its allreduces carried {count.allreduce_bytes} bytes in "
                    f"step {step}, more than the {total} bytes of gradients; a bucket reduced "
                    "twice comes out summed over the ranks twice")
    if case.p > 1 and close(got, single_process(case, lr_scale=case.p)):
        return (f"{head} moved {case.p} times too far each step: the gradients were summed over "
                f"the ranks, not averaged (divide by the world size, p = {case.p})")
    return f"{head} differ from single-process SGD on the global batch ({worst_parameter(case, got, want)})"


def miscounted(where: str, buckets: int, total: int, rank: int, step: int,
               count: StepCount) -> str | None:
    """None if ``rank`` made one allreduce per bucket in ``step``, carrying every gradient once."""
    if count.collectives == buckets and count.allreduce_bytes == total:
        return None
    calls = ', '.join(f'{op} x{n}' for op, n in sorted(count.calls.items())) or 'none'
    seen = (f"{where}, so {buckets} allreduce(s) per step; rank {rank} made {count.collectives} "
            f"collective call(s) in step {step} ({calls}), carrying {count.allreduce_bytes} bytes")
    if count.allreduce_bytes > total:
        return f"{seen}: more than the gradients hold, so a bucket was launched twice"
    if count.allreduce_bytes < total:
        return f"{seen}: fewer bytes than the gradients hold, so some gradients were never reduced"
    return (f"{seen}: the gradients are cut into buckets differently; walk the parameters in "
            "reverse order and start a new bucket only when the next gradient would take the "
            "current one past the cap")


# -- the overlap accounting, read from a rank's replayed events -----------------------------------


@dataclass
class Window:
    """One rank's backward + gradient sync of one step, on the virtual clock."""

    begin: float  # mark "backward"
    compute_end: float  # when the last backward work ended
    end: float = math.nan  # mark "synced"
    compute_s: float = 0.0  # declared backward work inside
    launches: tuple[float, ...] = ()  # when each allreduce was called
    waits: list[tuple[float, float]] = field(default_factory=list)  # blocked: waits, Allreduce

    @property
    def blocked_in_backward(self) -> float:
        return sum(max(0.0, min(b, self.compute_end) - a) for a, b in self.waits)


def windows(events: list[tuple], spans: tuple[tuple[float, float], ...]) -> list[Window]:
    """Per step, the window from mark "backward" to mark "synced" of one rank's replayed events."""
    found, cur = [], None
    for e, (t0, t1) in zip(events, spans):
        kind = e[0]
        if kind == "mark" and e[1] == "backward":
            cur = Window(t0, t0)
        elif cur is None:
            continue
        elif kind == "mark" and e[1] == "synced":
            cur.end = t0
            found.append(cur)
            cur = None
        elif kind == "compute":
            cur.compute_s += t1 - t0
            cur.compute_end = t1
        elif (kind == "coll" and e[1] == "Allreduce") or (kind == "icoll" and e[2] == "Allreduce"):
            cur.launches += (t0,)
            if kind == "coll":
                cur.waits.append((t0, t1))
        elif kind == "wait":
            cur.waits.append((t0, t1))
    return found


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals."""
    total, end = 0.0, -math.inf
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def hidden_fraction(exposed_s: float, comm_s: float) -> float:
    """Share of the communication time that did not add to the step."""
    if comm_s <= 0:
        return 0.0
    return min(max(1.0 - exposed_s / comm_s, 0.0), 1.0)


def too_little_hidden(head: str, rank0: Window, exposed: float, comm_s: float,
                      hidden: float) -> str:
    """Why a step hid less than HIDDEN_TARGET of its communication, as rank 0's window shows it."""
    seen = (f"expected at least {HIDDEN_TARGET:.0%} hidden; saw {head}; the ranks sat "
            f"{exposed * 1e6:.1f} us in communication after or besides it, so only {hidden:.0%} "
            "of it was hidden")
    if not any(x < rank0.compute_end - 1e-12 for x in rank0.launches):
        return (f"{seen}: every allreduce started only after backward had ended. Backward produces "
                "the gradients of the last layer first: put them in the first bucket (reverse "
                "parameter order) and start each bucket as soon as it is full")
    if rank0.blocked_in_backward > 0.5 * comm_s:
        return (f"{seen}: the allreduces start during backward, but rank 0 waited "
                f"{rank0.blocked_in_backward * 1e6:.1f} us for them before backward ended (a "
                "blocking Allreduce, or a Wait right after each launch), so backward stood still. "
                "Start each bucket with comm.Iallreduce and wait for them all once, at the end of "
                "backward (finish_gradient_sync)")
    return seen
