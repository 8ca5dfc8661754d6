"""The measurement plan and the least-squares fit of one-way time = alpha + n * beta, made robust
to sizes a busy machine spoiled. Pure functions, tested without processes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

RING_PROBLEM = "03"
# Sizes the ping-pong may spoil on a busy machine: a size whose median is more than this factor
# above the fitted line is set aside and the line fitted again (scheduling only ever adds time).
OUTLIER_FACTOR = 2.0
MIN_FIT_POINTS = 4
ROUTE_TOLERANCE = 1e-9  # relative: the file's route must give back the fitted alpha and beta


@dataclass(frozen=True)
class Plan:
    """How much to measure. ``quick`` trades precision for a run of a few seconds (tests)."""

    ping_sizes: tuple[int, ...]
    ping_reps: int
    ping_warmup: int
    ring_elements: tuple[int, ...]  # float64 elements per allreduce
    ring_reps: int
    ring_warmup: int
    matmul_n: int


def powers(first: int, last: int, factor: int) -> tuple[int, ...]:
    """first, first*factor, ... below last, then last itself: the range always ends at ``last``
    (powers of 4 from 8 B step over 4 MiB)."""
    out = []
    size = first
    while size < last:
        out.append(size)
        size *= factor
    return (*out, last)


KIB, MIB = 1024, 1024 * 1024
FULL_PLAN = Plan(
    ping_sizes=powers(8, 4 * MIB, 2), ping_reps=50, ping_warmup=5,
    ring_elements=(64 * KIB // 8, MIB // 8, 8 * MIB // 8), ring_reps=20, ring_warmup=2,
    matmul_n=512,
)
QUICK_PLAN = Plan(
    ping_sizes=powers(8, 4 * MIB, 4), ping_reps=10, ping_warmup=3,
    ring_elements=(64 * KIB // 8, MIB // 8), ring_reps=3, ring_warmup=1,
    matmul_n=256,
)


# -- the fit ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    alpha_s: float  # one-way latency
    beta_s_per_byte: float
    r2: float  # coefficient of determination on the raw times

    def predict(self, nbytes: float) -> float:
        return self.alpha_s + nbytes * self.beta_s_per_byte


def r_squared(x: np.ndarray, y: np.ndarray, alpha: float, beta: float) -> float:
    ss_res = float(np.sum((y - (alpha + beta * x)) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


def fit_alpha_beta(sizes: Sequence[float], times: Sequence[float]) -> Fit:
    """Least-squares line time = alpha + n * beta through (size, one-way time) points.

    Weighted by 1/time, i.e. least squares on *relative* errors: unweighted, the megabyte sizes
    (a thousand times the latency) decide the whole line, and the intercept alpha comes out as
    their noise, far from the small-message latency and sometimes negative."""
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(times, dtype=float)
    if x.shape != y.shape or len(np.unique(x)) < 2:
        raise ValueError("a line needs points at two different sizes at least")
    if not np.all(y > 0):
        raise ValueError("times must be positive")
    beta, alpha = np.polyfit(x, y, 1, w=1.0 / y)
    return Fit(float(alpha), float(beta), r_squared(x, y, float(alpha), float(beta)))


def robust_fit(sizes: Sequence[int], times: Sequence[float]) -> tuple[Fit, list[int]]:
    """The fit, after setting aside, one at a time and worst first, sizes whose median sits more
    than OUTLIER_FACTOR above the line. Returns the fit and the sizes set aside."""
    kept = list(zip(sizes, times))
    dropped: list[int] = []
    while True:
        fit = fit_alpha_beta([s for s, _ in kept], [t for _, t in kept])
        ratios = [_excess(fit, size, t) for size, t in kept]
        worst = int(np.argmax(ratios))
        if ratios[worst] <= OUTLIER_FACTOR or len(kept) <= MIN_FIT_POINTS:
            return fit, sorted(dropped)
        dropped.append(kept.pop(worst)[0])


def _excess(fit: Fit, size: int, measured: float) -> float:
    """How many times the line's prediction ``measured`` is (inf where the line is not positive)."""
    predicted = fit.predict(size)
    return measured / predicted if predicted > 0 else math.inf
