"""What runs on problem 02's ranks. What the learner returns is made plain data here, in the rank (a
Fitted, a number, a name, or a Raised saying what went wrong and on which line), so that a bad value
is a verdict for the supervisor rather than a crash of the run."""

import math
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distlab import MAX, SUM

from .cases import Allreduce, Case, Choice, Measure, fmt_bytes, fmt_s


@dataclass
class Fitted:
    """What one rank's measure returned, made plain: alpha and beta, or what was wrong with it."""

    alpha: float
    beta: float
    problem: str = ""  # why the value is unusable ("" when it is a pair of finite numbers)


@dataclass
class Raised:
    """A learner function raised, or returned the wrong kind of value: what, and where."""

    text: str


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


def answer(solution: Any, name: str, *args: Any) -> Any:
    """solution.name(*args): a number from predict, a name from choose, else a Raised naming the
    exception and the learner's line, or what came back instead."""
    try:
        value = getattr(solution, name)(*args)
    except Exception as exc:  # noqa: BLE001 (the learner's bug: reported per case, the run goes on)
        mine = getattr(solution, "__file__", None)
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == mine]
        where = f" ({Path(frames[-1].filename).name}, line {frames[-1].lineno})" if frames else ""
        return Raised(f"{name} raised {type(exc).__name__}: {exc}{where}")
    if name == "choose":
        return value if isinstance(value, str) else Raised(f"returned {describe(value)}, not an algorithm name")
    try:
        return float(value)
    except (TypeError, ValueError):
        return Raised(f"returned {describe(value)}, not a number")


def on_cluster(comm, solution, case: Measure | Allreduce) -> Fitted | None:
    """On the hidden cluster: the built-in Allreduce, or the learner's measure. (The ring is predicted
    later, in a launch of its own, from the slowest link the checker reads off every rank's fit.)"""
    if isinstance(case, Allreduce):
        data = np.ones(case.nbytes // 8)
        comm.Allreduce(data, np.empty_like(data), SUM)
        return None
    fitted = as_fitted(solution.measure(comm, list(case.sizes)))
    # Every rank leaves together (the third entry flags a rank whose value was unusable).
    mine = np.array([0.0, 0.0, 1.0]) if fitted.problem else np.array([fitted.alpha, fitted.beta, 0.0])
    comm.Allreduce(mine, np.empty(3), MAX)
    return fitted


def on_formulas(comm, solution, cases: list[Case]) -> list[Any]:
    """One rank: every predict case (a number), then every choose case (a name); or the ring's
    predictions (RingPrediction cases, predict cases too)."""
    return [answer(solution, "choose", c.p, c.n, c.alpha, c.beta) if isinstance(c, Choice)
            else answer(solution, "predict", c.algorithm, c.p, c.n, c.alpha, c.beta) for c in cases]


def main(comm, solution, sizes="8,1024,16384,131072,1048576", n="1048576"):
    """A free run (distlab run, mpirun): measure every ring link, then model an allreduce of n
    bytes on the slowest one. Rank 0 returns one line."""
    p, rank, n = comm.Get_size(), comm.Get_rank(), int(n)
    fitted = as_fitted(solution.measure(comm, [int(s) for s in sizes.split(",")]))
    table = np.empty(2 * p)
    comm.Allgather(np.array([fitted.alpha, fitted.beta]), table)
    if rank != 0:
        return None
    if fitted.problem or not np.all(np.isfinite(table)):
        return f"measure {fitted.problem or 'returned unusable values on some rank'}"
    alphas, betas = table[0::2], table[1::2]
    slow = int(np.argmax(alphas + n / p * betas))
    alpha, beta = float(alphas.max()), float(betas.max())
    best = solution.choose(p, n, alpha, beta)
    ring = fmt_s(float(solution.predict("ring", p, n, alpha, beta)))
    return (f"{p} links: alpha {fmt_s(alphas.min())}..{fmt_s(alphas.max())}, beta {betas.min():.3g}.."
            f"{betas.max():.3g} s/B; slowest for the ring: {slow} -> {(slow + 1) % p}; allreduce of "
            f"{fmt_bytes(n)}: ring {ring}, choose -> {best}")
