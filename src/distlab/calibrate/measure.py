"""The measurements on real ranks, through the front door (distlab/runs.py): the ping-pong, the
matmul FLOP/s, and problem 03's reference ring against its analytic cost and its replay.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..bank import Bank
from ..errors import HarnessError
from ..platforms import Platform
from ..runs import Program, Run, TaskRun, run, run_options
from ..runtime.clock.collectives_cost import ring_allreduce_time
from ..runtime.jobspec import Task
from . import ranks as calibration_ranks
from .fit import RING_PROBLEM, Plan

# -- measurements on real ranks ---------------------------------------------------------------


def _run(program: str, tasks: Sequence[Task], backend: str, what: str, deadline_s: float,
         solution: Path | None = None, platform: Platform | None = None) -> Run:
    """A program of calibration_ranks.py on real ranks, through the front door; ended badly, it
    is the harness's error (the measurement cannot go on)."""
    done = run(
        Program(Path(calibration_ranks.__file__), program, solution, module=calibration_ranks.__name__),
        tasks, run_options(backend, platform, deadline_s=deadline_s),
    )
    if not done.ok:
        result = done.result
        detail = f"\n{result.details}" if result.details else ""
        raise HarnessError(f"the {what} on {backend} ended badly: {result.message}{detail}")
    return done


def measure_ping_pong(backend: str, plan: Plan) -> list[float]:
    """Median one-way time per size of ``plan.ping_sizes``, measured inside rank 0."""
    args = (list(plan.ping_sizes), plan.ping_reps, plan.ping_warmup)
    task = Task(ranks=2, args=args, label="ping-pong")
    medians = _run("ping_pong", [task], backend, "ping-pong", deadline_s=180).tasks[0].values[0]
    return [float(t) for t in medians]


def measure_flops(n: int, reps: int = 3) -> float:
    """FLOP/s of an n x n float64 matmul, best of ``reps``: a rough figure (numpy's BLAS may use
    every core, and other load on the machine lowers it), but this machine's, not a guess."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    best = math.inf
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best


@dataclass(frozen=True)
class RingRow:
    nbytes: int
    analytic_s: float  # 2(p-1)alpha + 2(p-1)/p n beta
    replayed_s: float  # the run's own trace on the calibrated platform
    measured_s: float  # wall: median over repetitions of the slowest rank

    @property
    def ratio_analytic(self) -> float:
        return self.measured_s / self.analytic_s

    @property
    def ratio_replayed(self) -> float:
        return self.measured_s / self.replayed_s


def ring_reference() -> Path:
    return Bank.default().ready_problem(RING_PROBLEM).path / "reference.py"


def measure_ring(backend: str, ranks: int, plan: Plan, platform: Platform) -> list[RingRow]:
    """Problem 03's reference on ``ranks`` real ranks, every size in one launch (one task each)."""
    tasks = [
        Task(ranks, args=(n, plan.ring_reps, plan.ring_warmup), label=f"allreduce of {n * 8} B")
        for n in plan.ring_elements
    ]
    done = _run("ring_allreduce", tasks, backend, "ring allreduce", deadline_s=300,
                solution=ring_reference(), platform=platform)
    route = platform.route(0, 1)  # every route of the star is the same
    rows = []
    for n, task_run in zip(plan.ring_elements, done.tasks):
        rows.append(RingRow(
            nbytes=n * 8,
            analytic_s=ring_allreduce_time(ranks, n * 8, route.alpha_s, route.beta_s_per_byte),
            replayed_s=replayed_time(task_run),
            measured_s=measured_time(task_run),
        ))
    return rows


def measured_time(task_run: TaskRun) -> float:
    """Median over repetitions of the slowest rank's wall time (a call ends with its last rank)."""
    per_rank: list[list[float]] = task_run.values
    slowest = [max(times) for times in zip(*per_rank)]
    return statistics.median(slowest)


def replayed_time(task_run: TaskRun) -> float:
    """The same calls on the virtual clock: the replay's time between each rank's begin and end
    marks, the slowest rank per call, the median over calls (the same statistic as the wall)."""
    played = task_run.replay()
    per_rank = []
    for rank in sorted(played.marks):
        marks = played.marks[rank]
        begins = [t for name, t in marks if name == calibration_ranks.BEGIN_MARK]
        ends = [t for name, t in marks if name == calibration_ranks.END_MARK]
        per_rank.append([end - begin for begin, end in zip(begins, ends)])
    slowest = [max(spans) for spans in zip(*per_rank)]
    return statistics.median(slowest)
