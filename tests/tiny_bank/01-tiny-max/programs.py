"""The rank programs of the tiny problem."""

from __future__ import annotations

from .cases import Case


def run_batch(comm, solution, cases: list[Case]) -> list[float]:
    return [solution.largest(comm, case.values[comm.Get_rank()]) for case in cases]


def run_one(comm, solution, case: Case) -> float:
    return solution.largest(comm, case.values[comm.Get_rank()])


def main(comm, solution):
    got = run_one(comm, solution, Case(tuple(float(r) for r in range(comm.Get_size()))))
    return f"rank 0 holds {got}" if comm.Get_rank() == 0 else None
