"""What runs on every rank of problem 03: the learner's allreduce on each case."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from distlab import MAX, SUM
from distlab.grading import CommStats

from .cases import Case

OPS = {"SUM": SUM, "MAX": MAX}


@dataclass
class CaseResult:
    sample: np.ndarray  # the result at the case's kept indices
    returned: str  # type name of what allreduce returned ("NoneType" when it followed the rules)
    stats: CommStats  # this case's calls and bytes


def run_cases(comm, solution, cases: list[Case]) -> list[CaseResult]:
    """Runs the learner's allreduce on each case; returns what each left in its buffer."""
    results = []
    rank = comm.Get_rank()
    for case in cases:
        buf = case.input(rank)
        before = comm.stats.snapshot()
        returned = solution.allreduce(comm, buf, OPS[case.op])
        results.append(CaseResult(buf[case.kept(rank)].copy(), type(returned).__name__,
                                  comm.stats.since(before)))
    return results


def main(comm, solution, n="1048576"):
    """A free run (distlab run, mpirun, torchrun): one float64 allreduce of n elements.

    Rank 0 checks the result by regenerating every rank's input itself, so the run holds nothing
    but the learner's allreduce (its virtual time is the allreduce's)."""
    n, rank, p = int(n), comm.Get_rank(), comm.Get_size()
    buf = np.random.default_rng(rank).standard_normal(n)
    start = time.perf_counter()
    solution.allreduce(comm, buf, SUM)
    elapsed = time.perf_counter() - start
    if rank != 0:
        return None
    want = sum(np.random.default_rng(r).standard_normal(n) for r in range(p))
    verdict = "matches" if np.allclose(buf, want) else "DIFFERS FROM"
    return f"n={n} float64: {verdict} the sum of all inputs; {elapsed * 1e3:.2f} ms wall on rank 0"
