"""What the seal costs (runtime/seal/): a call and a message sealed against unsealed, and check 03's
wall time.

Each figure comes from two launches of the same rank program (``seal_ranks.py``) through
distlab's launcher, one with learner processes and one without, timed where the calls are made:

* per call: one rank's Sendrecv to itself (``seal_ranks.selfcall``), of 8 bytes (the crossing's
  fixed cost; target: at most 30 us added) and of 1 MiB (the copies in and out of the arena).
  One rank is two processes sealed: where the machine has a CPU for each, the two ends spin before
  they sleep (runtime/seal/doorbell.py), as they do for any job whose processes fit its CPUs;
* per message: a ping-pong between two ranks (``seal_ranks.pingpong``), 8 bytes and 1 MiB,
  report-only. On a machine with fewer CPUs than the four processes, the ends sleep at once and
  each message wakes the ends of both ranks.

Both on the wall clock (``--clock wall``): MPI's waits then poll. On the virtual clock, an idle
rank sleeps a millisecond between polls (supervisor/start.py), which makes a ping-pong's message
take half a millisecond sealed or not, and the difference of two such figures mostly noise (runs
of the same build differed by 40 us).

Check 03's wall time is ``distlab check 03 --solution reference`` with ``--seal on`` and with
``--seal off`` (target: at most 1.5x).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import HarnessError
from ..runtime.jobspec import Task

SMALL_BYTES, LARGE_BYTES = 8, 1 << 20
SEALED_CALL_LIMIT_US = 30.0  # added per 8-byte call
SEALED_CHECK_LIMIT_X = 1.5  # check 03 sealed / unsealed


def _timed(program_name: str, ranks: int, nbytes: int, rounds: int, seal: bool) -> float:
    """The slower rank's figure of ``seal_ranks.<program_name>``, on the wall clock."""
    from ..runs import (  # the front door for runs, as every job starts
        Program,
        run,
        run_options,
    )

    program = Program(Path(__file__).with_name("seal_ranks.py"), program_name)
    done = run(program, [Task(ranks=ranks, args=(nbytes, rounds))],
               run_options(seal=seal, clock="wall"), deadline_s=120)
    if not done.ok:
        raise HarnessError(f"the seal's {program_name} failed ({'sealed' if seal else 'unsealed'}): "
                           f"{done.result.message}")
    return float(max(done.tasks[0].values))


def per_call_s(nbytes: int, rounds: int, seal: bool) -> float:
    """Seconds per Sendrecv of one rank to itself, the median."""
    return _timed("selfcall", 1, nbytes, rounds, seal)


def per_message_s(nbytes: int, rounds: int, seal: bool) -> float:
    """Seconds per message (half a round trip) of the two-rank ping-pong, the slower rank's median."""
    return _timed("pingpong", 2, nbytes, rounds, seal)


@dataclass(frozen=True)
class Pair:
    """One figure sealed and unsealed, in seconds."""

    sealed_s: float
    plain_s: float


@dataclass(frozen=True)
class SealTimings:
    """Per call and per message (small, large), and check 03's wall time, each sealed and not."""

    call_small: Pair
    call_large: Pair
    message_small: Pair
    message_large: Pair
    check: Pair


def measure(quick: bool, time_check: Callable[[tuple[str, ...]], float]) -> SealTimings:
    """Every figure side by side, sealed and unsealed in turn (the baseline of the same run)."""
    small_rounds, large_rounds = (300, 20) if quick else (2000, 100)
    # A small call takes some 30 us: 2000 of them fall within the job's first 60 ms, while the
    # launch's other processes still run (medians of 2000 ranged 30-50 us, of 20000 30-32).
    call_rounds = 10 * small_rounds

    def pair(timed: Callable[[int, int, bool], float], nbytes: int, rounds: int) -> Pair:
        return Pair(timed(nbytes, rounds, True), timed(nbytes, rounds, False))

    return SealTimings(
        call_small=pair(per_call_s, SMALL_BYTES, call_rounds),
        call_large=pair(per_call_s, LARGE_BYTES, large_rounds),
        message_small=pair(per_message_s, SMALL_BYTES, small_rounds),
        message_large=pair(per_message_s, LARGE_BYTES, large_rounds),
        check=Pair(*measure_check(1 if quick else 3, time_check)),
    )


def measure_check(runs: int, time_check: Callable[[tuple[str, ...]], float]) -> tuple[float, float]:
    """Check 03's wall time sealed and unsealed, the median of ``runs`` each. Both said
    explicitly: check grades sealed unless told otherwise."""
    sealed_s, plain_s = (statistics.median(time_check(extra) for _ in range(runs))
                         for extra in (("--seal", "on"), ("--seal", "off")))
    return sealed_s, plain_s
