"""How problem 06 judges: the expected weights and the symptom that explains a difference; the collective counts of
each step's phase (mark "backward" to mark "synced"); how much of one step's communication hid behind backward on the
virtual clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from distlab.grading import CaseRun, Counts, Span, first_mismatch

from .cases import Case, build_model, layout
from .programs import flat_weights, single_process

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


def collectives(step: Counts) -> int:
    """Calls of built-in collectives (Allreduce, Iallreduce, Bcast, ...) in one step's phase."""
    return sum(step.calls[op] for op in step.collectives_used())


def diagnose_weights(result: CaseRun[Case]) -> str | None:
    """None if every rank's final weights are single-process SGD's (computed here, never on the
    ranks that run the learner's code); else the known mistake that explains the difference."""
    case, results, want = result.case, result.values, single_process(result.case)
    bad = [r for r, res in enumerate(results) if not close(res.final, want)]
    if not bad:
        return None
    rank = bad[0]
    head = f"{case.label}, after {case.steps} steps of SGD (lr {case.lr}): rank {rank}'s weights"
    if all(collectives(s) == 0 for r in range(len(results)) for s in result.task.phases(r, "backward")):
        return (f"{head} are not those of one process training on the global batch: no collective "
                "ran in any step, so each rank followed its own shard's gradients only")
    start = start_weights(case)
    diverged = [r for r, res in enumerate(results) if not np.array_equal(res.start, start)]
    if diverged:
        return (f"{head} are wrong: rank {diverged[0]} still held its own initial weights when "
                "DataParallel(...) returned; broadcast rank 0's weights to every rank first")
    got, total = results[rank].final, sum(case.backward_sizes())
    for step, carried in enumerate(c.op_bytes.get("Allreduce", 0) for c in result.task.phases(rank, "backward")):
        if carried > total:
            return (f"{head} are wrong: its allreduces carried {carried} bytes in step {step}, more than the "
                    f"{total} bytes of gradients; a bucket reduced twice comes out summed over the ranks twice")
    if case.p > 1 and close(got, single_process(case, lr_scale=case.p)):
        return (f"{head} moved {case.p} times too far each step: the gradients were summed over "
                f"the ranks, not averaged (divide by the world size, p = {case.p})")
    seen = f"{head} differ from single-process SGD on the global batch ({worst_parameter(case, got, want)})"
    carried_over = launched_early(result, rank)
    return f"{seen}: {carried_over}" if carried_over else seen


def launched_early(result: CaseRun[Case], rank: int) -> str | None:
    """Per-step state carried over, in words: from a step on, every bucket of ``rank`` (all the bytes)
    was launched before backward reached the first layer, whose gradients the last bucket holds,
    though in step 0 the rank waited for them."""
    case, total = result.case, sum(result.case.backward_sizes())
    steps = zip(windows(result.task.timeline().events(rank)), result.task.phases(rank, "backward"))

    def early(w: Window) -> bool:
        return bool(w.launches) and max(w.launches) < w.compute_end - 1e-12

    for step, (w, count) in enumerate(steps):
        if step == 0 and early(w):
            return None  # not carried over from an earlier step: some other launch rule
        if early(w) and len(w.launches) == len(case.buckets()) and count.op_bytes.get("Allreduce", 0) == total:
            return (f"in step {step} rank {rank} launched every bucket ({len(w.launches)}), the last "
                    f"{(w.compute_end - max(w.launches)) * 1e6:.1f} us before its backward ended, so before the first "
                    "layer's gradients it holds existed, where in step 0 it waited for them: per-step state (each "
                    "bucket's set of arrived gradients, a launch counter) was never reset and carried over from the "
                    "step before; reset it at the end of finish_gradient_sync")
    return None


def miscounted(where: str, buckets: int, total: int, rank: int, step: int, count: Counts) -> str | None:
    """None if ``rank`` made one allreduce per bucket in ``step``, carrying every gradient once."""
    made, carried = collectives(count), count.op_bytes.get("Allreduce", 0)
    if made == buckets and carried == total:
        return None
    calls = ', '.join(f'{op} x{n}' for op, n in sorted(count.calls.items())) or 'none'
    seen = (f"{where}, so {buckets} allreduce(s) per step; rank {rank} made {made} "
            f"collective call(s) in step {step} ({calls}), carrying {carried} bytes")
    if carried > total:
        return f"{seen}: more than the gradients hold, so a bucket was launched twice"
    if carried < total:
        return f"{seen}: fewer bytes than the gradients hold, so some gradients were never reduced"
    return (f"{seen}: the gradients are cut into buckets differently; walk the parameters in reverse order "
            "and start a new bucket only when the next gradient would take the current one past the cap")


# -- the overlap accounting, read from a rank's replayed events -----------------------------------


@dataclass(frozen=True)
class Window:
    """One rank's backward + gradient sync of one step, on the virtual clock."""

    begin: float  # mark "backward"
    end: float  # mark "synced"
    compute_s: float  # declared backward work inside
    compute_end: float  # when the last backward work ended
    launches: tuple[float, ...]  # when each allreduce was called
    blocked_in_backward: float  # in waits and blocking Allreduces, before compute_end


def window(begin: float, end: float, inside: list[Span]) -> Window:
    """The window of the spans between a rank's marks "backward" (at ``begin``) and "synced"."""
    compute = [s for s in inside if s.kind == "compute"]
    compute_end = compute[-1].end if compute else begin
    allreduces = [s for s in inside if s.kind in ("coll", "icoll") and s.name == "Allreduce"]
    blocked = [s for s in inside if s.kind == "wait" or (s.kind == "coll" and s.name == "Allreduce")]
    return Window(begin, end, sum(s.seconds for s in compute), compute_end, tuple(s.begin for s in allreduces),
                  sum(max(0.0, min(s.end, compute_end) - s.begin) for s in blocked))


def windows(events: list[Span]) -> list[Window]:
    """Per step, the window from mark "backward" to mark "synced" of one rank's replayed events."""
    found, opened = [], None
    for i, s in enumerate(events):
        if s.kind == "mark" and s.name == "backward":
            opened = i
        elif opened is not None and s.kind == "mark" and s.name == "synced":
            found.append(window(events[opened].begin, s.begin, events[opened + 1:i]))
            opened = None
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
    return min(max(1.0 - exposed_s / comm_s, 0.0), 1.0) if comm_s > 0 else 0.0


def too_little_hidden(head: str, rank0: Window, exposed: float, comm_s: float, hidden: float) -> str:
    """Why a step hid less than HIDDEN_TARGET of its communication, as rank 0's window shows it."""
    seen = (f"expected at least {HIDDEN_TARGET:.0%} hidden; saw {head}; the ranks sat {exposed * 1e6:.1f} us "
            f"in communication after or besides it, so only {hidden:.0%} of it was hidden")
    if not any(x < rank0.compute_end - 1e-12 for x in rank0.launches):
        return (f"{seen}: every allreduce started only after backward had ended. Backward produces "
                "the gradients of the last layer first: put them in the first bucket (reverse "
                "parameter order) and start each bucket as soon as it is full")
    if rank0.blocked_in_backward > 0.5 * comm_s:
        return (f"{seen}: the allreduces start during backward, but rank 0 waited "
                f"{rank0.blocked_in_backward * 1e6:.1f} us for them before backward ended (a blocking Allreduce, "
                "or a Wait right after each launch), so backward stood still. Start each bucket with "
                "comm.Iallreduce and wait for them all once, at the end of backward (finish_gradient_sync)")
    return seen
