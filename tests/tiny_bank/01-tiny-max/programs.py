"""The rank programs of the tiny problem, its free run, and the free run's bound."""

from __future__ import annotations

from distlab.grading import Platform

from .cases import Case


def run_batch(comm, solution, cases: list[Case]) -> list[float]:
    return [solution.largest(comm, case.values[comm.Get_rank()]) for case in cases]


def run_one(comm, solution, case: Case) -> float:
    return solution.largest(comm, case.values[comm.Get_rank()])


def main(comm, solution, repeat="1"):
    case = Case(tuple(float(r) for r in range(comm.Get_size())))
    for _ in range(int(repeat)):
        got = run_one(comm, solution, case)
    return f"rank 0 holds {got}" if comm.Get_rank() == 0 else None


def bounds(platform: Platform, ranks: int, repeat: str = "1") -> dict[str, float]:
    """The free run at best: per repeat, p - 1 rounds of one 8-byte message to every rank at once
    (the reference's exchange), each round as slow as the slowest route."""
    routes = [platform.route(a, b) for a in range(ranks) for b in range(ranks) if a != b]
    round_s = max((r.alpha_s + 8 * r.beta_s_per_byte for r in routes), default=0.0)
    return {"virtual_s": int(repeat) * (ranks - 1) * round_s}
