"""The options of the commands that run a problem (`check`, `run`, `tune`, `report`, `calibrate`):
one function per option, one set of messages, one place to call them from (the commands, and the
front door for runs, distlab/runs.py, which checks a run's options as a whole).

Each function takes the value as the command line parsed it and returns it checked (or None when
the option was not given), or raises UsageError with one sentence that names the option and the
value. They run before anything starts, so a bad value never costs a run: a results file that
cannot be written is refused up front, not after the checks.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from .errors import UsageError
from .runtime.faults.model import MAX_SEED

# A run longer than a day is a mistake, not a deadline; nan and inf would be no deadline at all.
MAX_TIME_LIMIT_S = 86_400.0
BACKENDS = ("mpi", "gloo")
CLOCKS = ("virtual", "wall")


def backend(value: str, allowed: Sequence[str] = BACKENDS, problem: str = "") -> str:
    """--backend: an engine distlab has, and one the problem's card allows."""
    if value not in BACKENDS:
        raise UsageError(f"unknown backend {value!r}: use {' or '.join(BACKENDS)}")
    if value not in allowed:
        raise UsageError(f"problem {problem} runs on {', '.join(allowed)}, not {value}")
    return value


def clock(value: str) -> str:
    """--clock: grade on the virtual clock (the modelled cluster) or on wall time."""
    if value not in CLOCKS:
        raise UsageError(f"unknown clock {value!r}: use {' or '.join(CLOCKS)}")
    return value


SEALS = ("on", "off")


def seal(value: str | None, clock: str = "virtual") -> bool:
    """--seal: run the learner's code in a process of its own per rank (on), or in the rank (off:
    the learner's process then holds the counters the grade reads, which only advise). Unsaid
    (None): on, but for a wall-clock run, where each call's trip through the rank's agent would
    be in the times measured (on a real cluster, under the assessor's own launcher)."""
    if value is None:
        return clock != "wall"
    if value not in SEALS:
        raise UsageError(f"unknown seal {value!r}: use on or off")
    return value == "on"


def seed(value: int | None) -> int | None:
    """--seed: the variants' and the fault plans' seed, 0..2**63-1 (it must fit a signed int64)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise UsageError(f"--seed must be an integer from 0 to 2**63-1; got {value}")
    return value


def time_limit(value: float | None) -> float | None:
    """--time-limit: seconds each run may take; finite, positive and at most a day."""
    if value is None:
        return None
    if not (math.isfinite(value) and 0 < value <= MAX_TIME_LIMIT_S):
        raise UsageError(
            f"--time-limit must be a positive number of seconds, at most {MAX_TIME_LIMIT_S:g} "
            f"(a day); got {value:g}"
        )
    return float(value)


def solution_file(arg: str) -> Path:
    """--solution PATH: an existing file (the names 'reference' and 'starter' are the bank's)."""
    path = Path(arg).expanduser()
    if path.is_dir():
        raise UsageError(f"--solution {arg} is a folder: give the path of your .py file")
    if not path.exists():
        raise UsageError(f"solution file {arg} does not exist")
    if not path.is_file():
        raise UsageError(f"--solution {arg} is not a regular file: give the path of your .py file")
    return path.resolve()


def json_path(value: Path | None, keep: Mapping[str, Path]) -> Path | None:
    """--json PATH: a file that can be written and is none of ``keep`` ({"your progress file":
    path, ...}: files the command must not overwrite). Checked by writing a trial file beside it,
    because permissions say yes to root whatever they are."""
    if value is None:
        return None
    path = value.expanduser().absolute()
    if path.is_dir():
        raise UsageError(f"--json {value} is a folder: give the path of a file to write the results to")
    for what, other in keep.items():
        if _same_file(path, other):
            raise UsageError(f"--json {value} is {what}, which the results would overwrite: "
                             "give another file")
    existing = next(p for p in path.parents if p.exists())
    if not existing.is_dir():
        raise UsageError(f"--json {value} cannot be written: {existing} is a file, not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=f".{path.name}."):
            pass
    except OSError as exc:
        raise UsageError(f"--json {value} cannot be written: {exc.strerror or exc}") from None
    return path


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:  # a loop of links: not the same as a file we keep
        return False
