"""How problem 03 judges a result and names what went wrong, and the ring's time bound."""

from __future__ import annotations

import numpy as np

from distlab.grading import CheckContext, agreement, first_mismatch

from .cases import Case
from .programs import CaseResult


def tolerance(case: Case) -> dict[str, float]:
    """Exact for ints; floats allow for the ring's other order of additions."""
    rtol = 0.0 if case.dtype == "int64" else 1e-4 if case.dtype == "float32" else 1e-9
    return {"rtol": rtol, "atol": rtol * case.p}


def wrong_result(case: Case, rank: int, result: CaseResult, want: np.ndarray) -> str | None:
    """None when ``rank`` holds the reduction, else the symptom named the way a reviewer would."""
    want = want[case.kept(rank)]
    got, indices = result.sample, case.kept(rank)
    mismatch = first_mismatch(got, want, **tolerance(case))
    if mismatch is None:
        return None
    head = f"{case.label()}: rank {rank}"
    if mismatch.index < 0:
        return f"{head} {mismatch.describe()}"
    if np.array_equal(got, case.input(rank)[indices]) and case.p > 1:
        if result.returned != "NoneType":
            return (f"{head} left buf unchanged and returned an {result.returned}: allreduce must "
                    "write the result into buf in place")
        return f"{head} still holds its own input: no reduction reached this rank"
    ok = agreement(got, want, **tolerance(case))
    wrong, right = indices[~ok], int(ok.sum())
    tail = case.n - case.n % case.p
    if case.n % case.p and wrong.size and (wrong >= tail).all():
        return (f"{head}: only the last n % p = {case.n % case.p} elements are wrong, so they "
                "were never reduced: give the first n % p chunks one element more")
    if 0 < right < ok.size and case.p > 1 and right / ok.size <= 1 / case.p + 0.01:
        return (f"{head} holds the right values in only {right} of {ok.size} elements (one chunk): "
                "the reduce-scatter ran but the allgather phase is missing or wrong")
    return f"{head}, {mismatch.describe(at=int(indices[mismatch.index]))}"


def spread_missing(case: Case, results: list[CaseResult], want: np.ndarray) -> bool:
    """Every element is right on some rank but not on all: the reduction ran, the spreading did not."""
    if case.p == 1 or case.n == 0:
        return False
    indices = case.sampled()
    right_on = np.zeros(indices.size, dtype=int)
    for rank, result in enumerate(results):
        got = result.sample[indices] if rank == case.full_rank else result.sample
        if got.shape != indices.shape:
            return False
        right_on += agreement(got, want[indices], **tolerance(case))
    return bool((right_on >= 1).all() and (right_on < case.p).any())


def ring_bound(t: CheckContext, p: int, nbytes: int) -> float:
    """2(p-1) alpha + 2(p-1)/p n beta, with the slowest ring link of the platform. On another
    platform than the card's, ring neighbours may share links (PCIe switches, sockets), which the
    formula ignores: there the bound is the built-in ring replayed on it, if that is slower."""
    routes = [t.platform.route(r, (r + 1) % p) for r in range(p)]
    alpha = max(r.alpha_s for r in routes)
    beta = max(r.beta_s_per_byte for r in routes)
    formula = 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta
    if t.on_card_setting:
        return formula
    return max(formula, t.collective_time("Allreduce", p, nbytes))
