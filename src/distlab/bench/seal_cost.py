"""What the seal costs (runtime/seal/): a message sealed against unsealed, and check 03's wall time.

The per-message figures come from two launches of the same 2-rank ping-pong
(``seal_ranks.pingpong``) through distlab's launcher, one with learner processes and one without,
timed where the calls are made; a message of 8 bytes shows the crossing's fixed cost (target: at
most 30 us added), one of 1 MiB the copies in and out of the arena. Check 03's wall time is
``distlab check 03 --solution reference`` with ``--seal on`` and with ``--seal off`` (target: at
most 1.5x).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import HarnessError
from ..runtime.jobspec import Task

SMALL_BYTES, LARGE_BYTES = 8, 1 << 20
SEALED_SMALL_LIMIT_US = 30.0  # added per 8-byte message
SEALED_CHECK_LIMIT_X = 1.5  # check 03 sealed / unsealed


def per_message_s(nbytes: int, rounds: int, seal: bool) -> float:
    """Seconds per message of the ping-pong, the slower rank's median."""
    from ..runs import (  # the front door for runs, as every job starts
        Program,
        run,
        run_options,
    )

    program = Program(Path(__file__).with_name("seal_ranks.py"), "pingpong")
    done = run(program, [Task(ranks=2, args=(nbytes, rounds))], run_options(seal=seal), deadline_s=120)
    if not done.ok:
        raise HarnessError(f"the seal's ping-pong failed ({'sealed' if seal else 'unsealed'}): "
                           f"{done.result.message}")
    return float(max(done.tasks[0].values))


@dataclass(frozen=True)
class SealTimings:
    """Seconds per message (small, large) and check 03's wall time, each sealed and not."""

    small_sealed_s: float
    small_plain_s: float
    large_sealed_s: float
    large_plain_s: float
    check_sealed_s: float
    check_plain_s: float


def measure(quick: bool, time_check: Callable[[tuple[str, ...]], float]) -> SealTimings:
    """Every figure side by side, unsealed first (the baseline of the same run)."""
    small_rounds, large_rounds = (300, 20) if quick else (2000, 100)
    small = [per_message_s(SMALL_BYTES, small_rounds, seal) for seal in (True, False)]
    large = [per_message_s(LARGE_BYTES, large_rounds, seal) for seal in (True, False)]
    sealed_s, plain_s = measure_check(1 if quick else 3, time_check)
    return SealTimings(small[0], small[1], large[0], large[1], sealed_s, plain_s)


def measure_check(runs: int, time_check: Callable[[tuple[str, ...]], float]) -> tuple[float, float]:
    """Check 03's wall time sealed and unsealed, the median of ``runs`` each. Both said
    explicitly: check grades sealed unless told otherwise."""
    sealed_s, plain_s = (statistics.median(time_check(extra) for _ in range(runs))
                         for extra in (("--seal", "on"), ("--seal", "off")))
    return sealed_s, plain_s
