"""What runs on problem 02's ranks, next to the learner's code, and what comes back from them.

Two programs: on the hidden cluster, the learner's measure (then, on rank 0, its ring prediction
from the slowest link any rank measured) or the built-in Allreduce; on one rank, every predict and
choose case. What the learner returns is made plain data here, in the rank (a Fitted, a number, a
name, or a Raised saying what went wrong and on which line), so that a bad value is a verdict for
the supervisor rather than a crash of the run.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distlab import MAX, SUM


@dataclass
class Fitted:
    """What one rank's measure returned, made plain: alpha and beta, or what was wrong with it."""

    alpha: float
    beta: float
    problem: str = ""  # why the value is unusable ("" when it is a pair of finite numbers)


@dataclass
class Raised:
    """A learner function raised: the exception and where."""

    text: str


@dataclass
class MeasureResult:
    fitted: Fitted
    ring: list[Any] | None  # rank 0: predict("ring", ...) for each ring size, or a Raised
    worst: tuple[float, float] | None  # rank 0: the slowest link's alpha and beta over all ranks


def describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def as_fitted(value: Any) -> Fitted:
    try:
        alpha, beta = value
        alpha, beta = float(alpha), float(beta)
    except (TypeError, ValueError):
        return Fitted(math.nan, math.nan, f"returned {describe(value)}, not a pair (alpha, beta)")
    if not (math.isfinite(alpha) and math.isfinite(beta)):
        return Fitted(alpha, beta, f"returned ({alpha!r}, {beta!r}), which are not finite numbers")
    return Fitted(alpha, beta)


def call(solution: Any, name: str, *args: Any) -> Any:
    """solution.name(*args), or a Raised naming the exception and the learner's line."""
    try:
        return getattr(solution, name)(*args)
    except Exception as exc:  # noqa: BLE001 (the learner's bug: reported per case, the run goes on)
        mine = getattr(solution, "__file__", None)
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == mine]
        where = f" ({Path(frames[-1].filename).name}, line {frames[-1].lineno})" if frames else ""
        return Raised(f"{name} raised {type(exc).__name__}: {exc}{where}")


def as_number(value: Any) -> Any:
    if isinstance(value, Raised):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return Raised(f"returned {describe(value)}, not a number")


def on_cluster(comm, solution, job, *args):
    """The program of the measurement launch: job "measure" or "allreduce"."""
    if job == "allreduce":
        (nbytes,) = args
        data = np.ones(nbytes // 8)
        comm.Allreduce(data, np.empty_like(data), SUM)
        return None
    sizes, ring_nbytes = args
    fitted = as_fitted(solution.measure(comm, list(sizes)))
    # A ring moves at the pace of its slowest link: take the largest alpha and the largest beta
    # that any rank measured (the third entry flags a rank whose value was unusable).
    mine = np.array([0.0, 0.0, 1.0]) if fitted.problem else np.array([fitted.alpha, fitted.beta, 0.0])
    worst = np.empty(3)
    comm.Allreduce(mine, worst, MAX)
    if comm.Get_rank() != 0:
        return MeasureResult(fitted, None, None)
    if worst[2]:
        return MeasureResult(fitted, None, None)
    p = comm.Get_size()
    ring = [as_number(call(solution, "predict", "ring", p, n, float(worst[0]), float(worst[1])))
            for n in ring_nbytes]
    return MeasureResult(fitted, ring, (float(worst[0]), float(worst[1])))


def on_formulas(comm, solution, predict_cases, choose_cases):
    """The program of the formula launch (one rank): every predict and choose case."""
    predicted = [as_number(call(solution, "predict", c.algorithm, c.p, c.n, c.alpha, c.beta))
                 for c in predict_cases]
    chosen = [call(solution, "choose", c.p, c.n, c.alpha, c.beta) for c in choose_cases]
    return predicted, [c if isinstance(c, (str, Raised))
                       else Raised(f"returned {describe(c)}, not an algorithm name") for c in chosen]
