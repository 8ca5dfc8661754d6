"""The summary of a run: what a learner looks at in the Instrument step.

Computed from the replay (virtual time) and the traces (wall time): the sync/compute ratio, the
bytes each rank sent to each peer, the idle fraction, and per-step times with P50/P99 where problem
code marks its steps (``comm.mark("step")``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..trace.events import Event
from .replay import Replay

STEP_MARK = "step"


@dataclass(frozen=True)
class RunMetrics:
    ranks: int
    virtual_s: float  # makespan on the virtual clock
    wall_s: float  # longest rank's wall time from its first to its last event
    compute_s: float  # summed over ranks
    comm_s: float  # summed over ranks: blocked in communication
    sync_compute_ratio: float  # comm_s / compute_s (inf when nothing was computed)
    idle_fraction: float  # idle rank-time over makespan x ranks
    messages: int
    bytes_by_pair: dict[str, int]  # "src->dst" -> bytes (collectives included)
    money: float  # price of the bytes that crossed priced links
    step_times_s: list[float] = field(default_factory=list)
    step_p50_s: float | None = None
    step_p99_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not np.isfinite(self.sync_compute_ratio):
            data["sync_compute_ratio"] = None
        return data

    def lines(self) -> list[str]:
        """The summary as a learner reads it."""
        ratio = "n/a (no declared compute)" if not np.isfinite(self.sync_compute_ratio) else f"{self.sync_compute_ratio:.3f}"
        out = [
            f"virtual time {format_seconds(self.virtual_s)} · wall {format_seconds(self.wall_s)} · ranks {self.ranks}",
            f"sync/compute {ratio} · idle {self.idle_fraction:.1%} · messages {self.messages}",
        ]
        if self.step_times_s:
            out.append(
                f"steps {len(self.step_times_s)} · P50 {format_seconds(self.step_p50_s or 0)} · "
                f"P99 {format_seconds(self.step_p99_s or 0)}"
            )
        if self.money:
            out.append(f"cost of priced traffic {self.money:.4f}")
        return out


def summarize(replay: Replay, traces: dict[int, list[Event]]) -> RunMetrics:
    compute = sum(replay.compute_s.values())
    comm = sum(replay.comm_s.values())
    ranks = len(traces)
    idle = sum(replay.idle_s.values())
    steps = step_times(replay)
    return RunMetrics(
        ranks=ranks,
        virtual_s=replay.makespan,
        wall_s=_wall_span(traces),
        compute_s=compute,
        comm_s=comm,
        sync_compute_ratio=comm / compute if compute > 0 else float("inf"),
        idle_fraction=idle / (replay.makespan * ranks) if replay.makespan > 0 and ranks else 0.0,
        messages=len(replay.flows),
        bytes_by_pair={f"{s}->{d}": n for (s, d), n in sorted(replay.pair_bytes.items())},
        money=replay.money,
        step_times_s=steps,
        step_p50_s=float(np.percentile(steps, 50)) if steps else None,
        step_p99_s=float(np.percentile(steps, 99)) if steps else None,
    )


def step_times(replay: Replay, mark: str = STEP_MARK) -> list[float]:
    """Time of step k = latest rank's (k+1)-th mark minus the earliest rank's k-th mark.

    A step ends for the job when its slowest rank reaches the next step mark; the last step ends at
    the rank's finish. Ranks with different step counts are cut to the common number.
    """
    per_rank = []
    for rank, marks in sorted(replay.marks.items()):
        times = [t for name, t in marks if name == mark]
        if times:
            per_rank.append(times + [replay.finish[rank]])
    if not per_rank:
        return []
    count = min(len(t) for t in per_rank) - 1
    return [
        max(t[k + 1] for t in per_rank) - min(t[k] for t in per_rank) for k in range(count)
    ]


def phase_time(replay: Replay, start: str, end: str) -> float | None:
    """From the earliest ``start`` mark to the latest ``end`` mark; None if either is missing."""
    starts = [t for marks in replay.marks.values() for name, t in marks if name == start]
    ends = [t for marks in replay.marks.values() for name, t in marks if name == end]
    if not starts or not ends:
        return None
    return max(ends) - min(starts)


def _wall_span(traces: dict[int, list[Event]]) -> float:
    spans = [events[-1][-1] - events[0][-2] for events in traces.values() if events]
    return max(spans) if spans else 0.0


def format_seconds(seconds: float) -> str:
    """3.2e-3 -> '3.200 ms': the unit a person would pick."""
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.3f} us"
