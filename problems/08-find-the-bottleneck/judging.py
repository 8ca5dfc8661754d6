"""How problem 08 judges a hidden run: its truth from the replay's marks, never what the ranks say;
readers of rank 0's answer that fail the check, naming the variant, on a missing or malformed entry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from distlab.grading import CaseRun, CheckContext, TaskRun

from .cases import Variant, look_alikes
from .programs import RankResult


@dataclass
class Truth:
    compute: np.ndarray  # (p, steps) seconds, from the replay
    sync: np.ndarray  # (p, steps)
    trained_s: float  # training makespan: the last rank's "trained" mark

    @property
    def ratio(self) -> float:
        return float(self.sync.sum() / self.compute.sum())

    def look_alike(self, got: float) -> tuple[str, float] | None:
        """The common wrong answer that got is (within 0.5%; the nearest), if any: (what, its value)."""
        near = [(abs(got - value), name, value) for name, value in look_alikes(self.compute, self.sync).items()
                if abs(got - value) <= 0.005 * abs(value)]
        return min(near)[1:] if near else None

    def compute_over_median(self) -> np.ndarray:
        per_rank = self.compute.mean(axis=1)
        return per_rank / float(np.median(per_rank))


def phase_times(marks: list[tuple[str, float]], steps: int) -> tuple[list[float], list[float], float]:
    """(compute per step, sync per step, end of training) of one rank, from its marks."""
    starts = [t for name, t in marks if name == "step"]
    syncs = [t for name, t in marks if name == "sync"]
    trained = next(t for name, t in marks if name == "trained")
    ends = starts[1:steps] + [trained]
    return [syncs[k] - starts[k] for k in range(steps)], [ends[k] - syncs[k] for k in range(steps)], trained


def truth_of(task_run: TaskRun, v: Variant) -> Truth:
    timeline = task_run.timeline()
    compute, sync, trained = zip(*(phase_times(timeline.marks(rank), v.steps) for rank in range(v.p)))
    return Truth(np.array(compute), np.array(sync), max(trained))


def training_calls(task_run: TaskRun) -> int:
    """Communication calls of every rank before its "trained" mark: the task's, less diagnose()'s."""
    return sum(sum(task_run.counts(r).calls.values()) - sum(task_run.counts(r, "trained").calls.values())
               for r in range(task_run.spec.ranks))


@dataclass
class HiddenRun:
    """One probed variant as the checks judge it: its truth and what came back from rank 0."""

    variant: Variant
    task_run: TaskRun
    truth: Truth
    rank0: RankResult


def hidden_run(result: CaseRun[Variant]) -> HiddenRun:
    return HiddenRun(result.case, result.task, truth_of(result.task, result.case), result.values[0])


def report_of(t: CheckContext, case: HiddenRun) -> dict[str, Any]:
    """What diagnose() returned on rank 0; the check fails unless it is a dict."""
    report = case.rank0.report
    if not isinstance(report, dict):
        t.fail(f"{case.variant.label()}: diagnose() returned {type(report).__name__} on rank 0, not a dict")
    return report


def answer(t: CheckContext, case: HiddenRun, key: str) -> Any:
    report = report_of(t, case)
    if key not in report:
        t.fail(f"{case.variant.label()}: diagnose() returned no {key!r} "
               f"(its keys: {', '.join(map(str, report)) or 'none'})")
    return report[key]


def listed(t: CheckContext, case: HiddenRun, key: str, what: str, read: Callable[[Any], list[Any]]) -> list[Any]:
    """The answer under key through read (to a sorted list); the check fails where read cannot."""
    value = answer(t, case, key)
    try:
        return read(value)
    except (TypeError, ValueError):
        t.fail(f"{case.variant.label()}: {key!r} must be a list of {what}; saw {value!r}")


def spans_of(t: CheckContext, case: HiddenRun) -> np.ndarray:
    v = case.variant
    raw = answer(t, case, "spans")
    try:
        spans = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError):
        t.fail(f"{v.label()}: 'spans' is not an array of numbers; saw {type(raw).__name__}")
    want = (v.p, v.steps, 4)
    if spans.shape != want:
        why = []
        if spans.ndim == 3 and spans.shape[1] == 0:
            why.append("the probes recorded no step")
        elif spans.ndim == 3 and spans.shape[1] != v.steps:
            why.append(f"{spans.shape[1]} steps recorded, the job ran {v.steps}")
        if spans.ndim == 3 and spans.shape[0] == 1 and v.p > 1:
            why.append("only rank 0's own spans reached rank 0: the aggregation is missing")
        t.fail(f"{v.label()}: expected rank 0 to hold spans of shape {want} (ranks, steps, "
               f"[compute start, compute end, sync start, sync end]); saw {spans.shape}"
               + "".join(f"; {w}" for w in why))
    return spans


def trace_tracks(events: list[Any]) -> dict[tuple[Any, Any], list[dict[str, Any]]]:
    """Complete events ("X") by (pid, tid): the tracks a viewer draws."""
    tracks: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for event in events:
        if isinstance(event, dict) and event.get("ph") == "X":
            tracks.setdefault((event.get("pid"), event.get("tid")), []).append(event)
    return tracks

