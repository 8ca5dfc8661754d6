"""The cases of problem 03: every length that trips people up, and the inputs of every rank.

Hidden variants (from the seed): the input values, the lengths past p, the large length, which
rank returns its whole buffer, and one extra rank count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DTYPES = ("float32", "float64", "int64")
OPS = ("SUM", "MAX")
SAMPLE = 4096  # elements kept per rank and case for comparison (the chosen rank keeps all)


@dataclass(frozen=True)
class Case:
    p: int
    n: int
    dtype: str
    op: str
    seed: int
    shape: str  # which edge this length probes
    full_rank: int  # the rank whose whole result comes back (others send a sample)

    def label(self) -> str:
        return f"p = {self.p}, n = {self.n} ({self.shape}), {self.dtype}, {self.op}"

    def input(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s input: the same array in the rank and in the checker."""
        rng = np.random.default_rng([self.seed, rank])
        if self.dtype == "int64":
            return rng.integers(-1000, 1000, size=self.n).astype(np.int64)
        return rng.standard_normal(self.n).astype(self.dtype)

    def sampled(self) -> np.ndarray:
        return np.arange(0, self.n, max(1, self.n // SAMPLE))

    def kept(self, rank: int) -> np.ndarray:
        """The indices of the result that ``rank`` sends back: all, or a sample."""
        return np.arange(self.n) if rank == self.full_rank else self.sampled()

    def expected(self) -> np.ndarray:
        """The reduction of every rank's input, computed here, outside the ranks."""
        ufunc = np.add if self.op == "SUM" else np.maximum
        result = self.input(0)
        for rank in range(1, self.p):
            ufunc(result, self.input(rank), out=result)
        return result


class Timed(Case):
    """A case whose virtual time is graded (float64 SUM, about 2 MiB: bandwidth-bound)."""


def cases_for(p: int, rng: np.random.Generator) -> list[Case]:
    large = (1 << 17) + int(rng.integers(1, 4096))  # about 1 MiB of float64: past the eager limit
    lengths = [
        (0, "empty"),
        (1, "one element"),
        (max(p - 1, 1), "fewer than p" if p > 1 else "one element"),
        (p * int(rng.integers(3, 9)) + int(rng.integers(1, p)) if p > 1 else 7, "not divisible by p"),
        (large, "large"),
    ]
    return [Case(p, n, dtype, op, int(rng.integers(1 << 31)), shape, int(rng.integers(p)))
            for n, shape in lengths for dtype in DTYPES for op in OPS]


def rank_counts(rng: np.random.Generator) -> list[int]:
    """The catalog's rank counts plus one hidden extra."""
    return [1, 2, 3, 4, 5, 8, int(rng.choice([6, 7]))]


def timed_case(p: int, rng: np.random.Generator) -> Timed:
    n = (1 << 18) + int(rng.integers(1, 1 << 12))
    return Timed(p, n, "float64", "SUM", int(rng.integers(1 << 31)), "large", 0)
