"""Problem 03 on the ranks: the cases (every length that trips people up, each rank's input, the
expected result) and the learner's allreduce run on them. Hidden variants, from the seed: the input
values, the lengths past p, the large length."""

import itertools
import time
from dataclasses import dataclass, field, replace
from functools import reduce
from typing import NamedTuple

import numpy as np

from distlab import MAX, SUM
from distlab.grading import Widener

OPS = {"SUM": SUM, "MAX": MAX}


@dataclass(frozen=True)
class Case:
    p: int
    n: int
    dtype: str
    op: str
    seed: int
    shape: str  # which edge this length probes
    own: tuple[int, np.ndarray] | None = field(default=None, compare=False)  # a rank's view: (its rank, its input)

    def label(self) -> str:
        return f"p = {self.p}, n = {self.n} ({self.shape}), {self.dtype}, {self.op}"

    def for_rank(self, rank: int) -> "Case":
        """What rank ``rank``'s program is handed: its own input, made by its agent, and nothing it
        was made from. With the seed, one process could compute every rank's input and the sum;
        with a short key, a rank could smuggle it to the others inside a few bytes of a message."""
        return replace(self, seed=-1, own=(rank, self.input(rank)))

    def input(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s input: the same array in the rank and in the checker."""
        if self.own is not None:
            if rank != self.own[0]:
                raise ValueError(f"rank {self.own[0]}'s view of the case holds no input of rank {rank}: "
                                 "the other ranks' inputs reach it in messages only")
            return self.own[1].copy()
        rng = np.random.default_rng([self.seed, rank])
        values = rng.integers(-1000, 1000, size=self.n) if self.dtype == "int64" else rng.standard_normal(self.n)
        return values.astype(self.dtype)

    def expected(self) -> np.ndarray:
        """The reduction of every rank's input, computed here, outside the ranks."""
        return reduce(np.add if self.op == "SUM" else np.maximum, map(self.input, range(self.p)))


class Timed(Case):
    """A case whose virtual time is graded (float64 SUM, about 2 MiB: bandwidth-bound)."""


def cases_for(p: int, rng: np.random.Generator, widen: Widener) -> list[Case]:
    large = (1 << 17) + int(rng.integers(1, 4096))  # about 1 MiB of float64: past the eager limit
    lengths = [(0, "empty"), (1, "one element"), (max(p - 1, 1), "fewer than p" if p > 1 else "one element"),
               (p * int(rng.integers(3, 9)) + int(rng.integers(1, p)) if p > 1 else 7, "not divisible by p"),
               (large, "large")]
    cases = []
    for (n, shape), dtype, op in itertools.product(lengths, ("float32", "float64", "int64"), OPS):
        # Each case's seed 63 bits wide: from 31, a rank found it from its own input, and so every
        # rank's input (distlab.grading.seeds).
        cases.append(Case(p, n, dtype, op, widen(int(rng.integers(1 << 31))), shape))
        rng.integers(p)  # once the rank that sent back all its result: drawn still, so each seed keeps its variants
    return cases


def draw(seed: int) -> tuple[list[list[Case]], list[Timed]]:
    """The variant of ``seed``: the cases of each rank count (the card's and a hidden one), and
    one timed case for each of three rank counts."""
    rng, widen = np.random.default_rng([seed, 3]), Widener(seed, 3)
    groups = [cases_for(p, rng, widen) for p in [1, 2, 3, 4, 5, 8, int(rng.choice([6, 7]))]]
    timed = [Timed(p, 2**18 + int(rng.integers(1, 4096)), "float64", "SUM", widen(int(rng.integers(1 << 31))),
                   "large")
             for p in (4, 8, int(rng.choice([3, 5, 6, 7])))]
    return groups, timed


# One case on one rank: the whole result, and what allreduce returned: "buf" (buf itself or a view
# of it), else its type's name ("NoneType" when it returned nothing). All of it: with a sample of
# about 4096 elements, one rank reduced and the others were sent only the elements read back.
CaseResult = NamedTuple("CaseResult", [("buf", np.ndarray), ("returned", str)])


def run_cases(comm, solution, cases: list[Case]) -> list[CaseResult]:
    """The learner's allreduce on each case, a phase of its own (mark "case"); what each left in buf."""
    results, rank = [], comm.Get_rank()
    for case in cases:
        buf = case.input(rank)
        comm.mark("case")
        returned = solution.allreduce(comm, buf, OPS[case.op])
        view = isinstance(returned, np.ndarray) and np.may_share_memory(returned, buf)
        results.append(CaseResult(buf.copy(), "buf" if view else type(returned).__name__))
    return results


def main(comm, solution, n="1048576"):
    """A free run (distlab run, mpirun, torchrun): one float64 allreduce of n elements. Rank 0
    checks it against every rank's input regenerated there, so the run holds only the allreduce."""
    case = Case(comm.Get_size(), int(n), "float64", "SUM", 0, "free run")
    buf, start = case.input(comm.Get_rank()), time.perf_counter()
    solution.allreduce(comm, buf, SUM)
    elapsed = time.perf_counter() - start
    if comm.Get_rank() == 0:  # the other ranks return None
        verdict = "matches" if np.allclose(buf, case.expected()) else "DIFFERS FROM"
        return f"n={case.n} float64: {verdict} the sum of all inputs; {elapsed * 1e3:.2f} ms wall on rank 0"
