"""What a launch costs with ranks forked from the zygote (runtime/zygote/) against ranks started
afresh: the wall time of one 8-rank launch of a program that only does a Barrier, on each engine,
the median of a few launches each, both in the same run. Started afresh, a gloo rank imports
torch and an MPI rank numpy and the worker; forked, each finds them imported (target: the forked
launch at most half the fresh one's time on gloo, where the import is torch's; MPI's is reported).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import HarnessError
from ..runtime.jobspec import Task
from ..runtime.zygote.client import OFF_ENV

RANKS = 8
FORKED_GLOO_LIMIT_X = 0.5  # forked / fresh, gloo


def launch_s(backend: str, forked: bool, ranks: int = RANKS) -> float:
    """Wall seconds of one launch of ``ranks`` ranks that meet at a Barrier."""
    from ..runs import Program, run, run_options  # the front door for runs, as every job starts

    before = os.environ.get(OFF_ENV)
    os.environ[OFF_ENV] = "0" if forked else "1"  # read by the supervisor at each launch
    try:
        program = Program(Path(__file__).with_name("seal_ranks.py"), "barrier")
        start = time.perf_counter()
        done = run(program, [Task(ranks=ranks)], run_options(backend=backend), deadline_s=120)
        elapsed = time.perf_counter() - start
    finally:
        if before is None:
            os.environ.pop(OFF_ENV, None)
        else:
            os.environ[OFF_ENV] = before
    if not done.ok:
        raise HarnessError(f"the {backend} launch benchmark failed: {done.result.message}")
    return elapsed


@dataclass(frozen=True)
class StartTimings:
    """Seconds per launch, per engine: (forked, fresh)."""

    mpi: tuple[float, float]
    gloo: tuple[float, float]


def measure(quick: bool) -> StartTimings:
    rounds = 2 if quick else 4
    launch_s("gloo", forked=True)  # the zygote's own start (torch's import) is not a launch's

    def median(backend: str, forked: bool) -> float:
        return statistics.median(launch_s(backend, forked) for _ in range(rounds))

    return StartTimings(
        mpi=(median("mpi", True), median("mpi", False)),
        gloo=(median("gloo", True), median("gloo", False)),
    )
