"""What problem 02's answers should be, computed in the supervisor: the textbook costs.

The four Allreduce formulas in the alpha-beta model, which algorithm is fastest for a (p, n, alpha,
beta), where the crossover from latency- to bandwidth-optimal lies, and what the replay charges a
ring on the hidden cluster's links; then how seconds, bytes and betas are written in messages. All
of it is pure (unit-tested on its own), and none of it runs next to learner code.
"""

from __future__ import annotations

import math

ALGORITHMS = ("ring", "recursive_doubling", "binomial_tree", "rabenseifner")
LATENCY_OPTIMAL = ("recursive_doubling", "binomial_tree")
FORMULA_RTOL = 1e-9


# -- the textbook costs (the expectations; pure, unit-tested) -----------------------------------


def lg(p: int) -> int:
    """ceil(log2 p): the rounds of a binomial tree; log2 p exactly when p is a power of two."""
    return (p - 1).bit_length() if p > 1 else 0


def is_power_of_two(p: int) -> bool:
    return p >= 1 and p & (p - 1) == 0


def formula(algorithm: str, p: int, n: float, alpha: float, beta: float) -> float:
    """Allreduce of n bytes over p ranks, every link alpha + n beta (the catalog's formulas)."""
    if algorithm == "ring":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta
    if algorithm == "recursive_doubling":
        return lg(p) * (alpha + n * beta)
    if algorithm == "binomial_tree":  # a reduce to the root, then a broadcast from it
        return 2 * lg(p) * (alpha + n * beta)
    if algorithm == "rabenseifner":  # recursive-halving reduce-scatter + recursive-doubling allgather
        return 2 * lg(p) * alpha + 2 * (p - 1) / p * n * beta
    raise ValueError(f"no formula for {algorithm!r}")


def candidates(p: int) -> tuple[str, ...]:
    """Recursive doubling and Rabenseifner, as modelled, need p to be a power of two."""
    return ALGORITHMS if is_power_of_two(p) else ("ring", "binomial_tree")


def fastest(p: int, n: float, alpha: float, beta: float) -> set[str]:
    """Every candidate whose time ties with the minimum (relative 1e-9)."""
    times = {a: formula(a, p, n, alpha, beta) for a in candidates(p)}
    best = min(times.values())
    return {a for a, t in times.items() if t <= best * (1 + FORMULA_RTOL) + 1e-300}


def crossover(p: int, alpha: float, beta: float) -> float | None:
    """The message size (bytes) where the fastest algorithm turns from latency- to
    bandwidth-optimal, or None if one algorithm wins at every size.

    Powers of two: recursive doubling lg p (a + n b) against Rabenseifner 2 lg p a + 2(p-1)/p n b.
    Otherwise: the binomial tree 2 L (a + n b) against the ring 2(p-1) a + 2(p-1)/p n b."""
    if p < 3:
        return None
    if is_power_of_two(p):
        extra_beta = lg(p) - 2 * (p - 1) / p  # per n beta, what recursive doubling pays more
        saved_alpha = lg(p)  # per alpha, what it pays less
    else:
        extra_beta = 2 * lg(p) - 2 * (p - 1) / p
        saved_alpha = 2 * (p - 1) - 2 * lg(p)
    if extra_beta <= 0 or saved_alpha <= 0:
        return None
    return saved_alpha * alpha / (extra_beta * beta)


def ring_replay_time(links: list[tuple[float, float]], p: int, nbytes: int) -> float:
    """What the replay charges a ring Allreduce of nbytes (divisible by p) on these ring links:
    2(p-1) steps, each as long as the slowest link's alpha + n/p beta (the others wait for it)."""
    chunk = nbytes / p
    return 2 * (p - 1) * max(alpha + chunk * beta for alpha, beta in links)


# -- formatting ---------------------------------------------------------------------------------


def fmt_s(seconds: float) -> str:
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return repr(seconds)
    if abs(seconds) < 1e-3:
        return f"{seconds * 1e6:.3g} us"
    if abs(seconds) < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:g} B"


def fmt_beta(beta: float) -> str:
    if not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta <= 0:
        return f"{beta!r} s/B"
    return f"{beta:.3g} s/B ({1 / beta / 1e9:.3g} GB/s)"

