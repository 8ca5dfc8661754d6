"""How problem 02's checks judge what came back: tolerances, verdicts and symptoms.

A fitted link, a prediction and a list of choices are each compared with what the supervisor
computed, and a wrong one is named by its symptom where it can be recognised (latency ignored,
the round trip reported as one way, the neighbour's link, the wall clock; a (p-1) lg p term, one
tree instead of two; a message on the wrong side of the crossover). Every function is pure and
returns None when all is well, else the message the learner reads.
"""

from __future__ import annotations

import math
from typing import Any

from distlab.grading import check_part

models = check_part(__file__, "models")  # the textbook formulas, and how figures are written
programs = check_part(__file__, "programs")  # Fitted and Raised: what the ranks returned
scenario = check_part(__file__, "scenario")  # Case: one call of predict or choose
fmt_s, fmt_beta = models.fmt_s, models.fmt_beta

FIT_TOLERANCE = 0.05  # fitted alpha and beta, relative to the hidden link
RING_TOLERANCE = 0.10  # predicted ring time, relative to the replay


# -- a fitted link ------------------------------------------------------------------------------


def close(got: float, want: float, rtol: float) -> bool:
    return abs(got - want) <= rtol * abs(want)


def link_name(r: int, p: int) -> str:
    return f"link {r} -> {(r + 1) % p}"


def judge_link(r: int, p: int, fit: programs.Fitted,
               links: list[tuple[float, float]]) -> str | None:
    """None when rank r's fit is within 5% of its link r -> r+1; else what is wrong, by symptom."""
    alpha, beta = links[r]
    head = f"rank {r}, {link_name(r, p)}"
    if fit.problem:
        return f"{head}: measure {fit.problem}"
    ok_a, ok_b = close(fit.alpha, alpha, FIT_TOLERANCE), close(fit.beta, beta, FIT_TOLERANCE)
    if ok_a and ok_b:
        return None
    want = (f"alpha = {fmt_s(alpha)} and beta = {fmt_beta(beta)} (within 5%)")
    seen = f"alpha = {fmt_s(fit.alpha)}, beta = {fmt_beta(fit.beta)}"
    base = f"{head}: expected {want}; saw {seen}"
    ra, rb = fit.alpha / alpha, fit.beta / beta
    if fit.alpha == 0 and fit.beta == 0:
        return f"{base}: nothing was measured yet"
    if abs(fit.alpha) < 0.05 * alpha and rb > 1 + FIT_TOLERANCE:
        return (f"{base}: the fit has no intercept, so latency was ignored (beta = t / n charges "
                "every message's alpha to its bytes); fit t = alpha + n * beta by least squares")
    if 1.9 <= ra <= 2.1 and 1.9 <= rb <= 2.1:
        return (f"{base}: both are twice the hidden values, so the round trip was reported as "
                "the one-way time; a ping-pong crosses the link twice, so halve it")
    for j, (a_j, b_j) in enumerate(links):
        if j != r and close(fit.alpha, a_j, FIT_TOLERANCE) and close(fit.beta, b_j, FIT_TOLERANCE):
            return (f"{base}, which are the values of {link_name(j, p)}: rank r should return "
                    "the link to its right neighbour (r + 1) % p")
    if ra > 20 or rb > 20:
        return (f"{base} ({ra:.3g}x and {rb:.3g}x): times this large look like the wall clock; "
                "read the virtual clock with comm.now()")
    return f"{base} ({ra:.3g}x and {rb:.3g}x the hidden values)"


def fits_of(task_run: Any) -> list[programs.Fitted]:
    return [value.fitted for value in task_run.values]


# -- predict and choose -------------------------------------------------------------------------


def judge_prediction(case: scenario.Case, got: Any) -> str | None:
    """None when predict returned the formula's value; else the symptom."""
    want = models.formula(case.algorithm, case.p, case.n, case.alpha, case.beta)
    head = f"predict for {case.label()}"
    if isinstance(got, programs.Raised):
        return f"{head}: {got.text}"
    if close(got, want, models.FORMULA_RTOL) or (want == 0 and abs(got) < 1e-300):
        return None
    shown_want, shown_got = fmt_s(want), fmt_s(got)
    if shown_want == shown_got:  # close but not equal: show the digits that differ
        shown_want, shown_got = f"{want:.9g} s", f"{got:.9g} s"
    base = f"{head}: expected {shown_want}; saw {shown_got}"
    p, L, a, nb = case.p, models.lg(case.p), case.alpha, case.n * case.beta
    if case.algorithm == "rabenseifner" and L > 1 and (
            close(got, 2 * (p - 1) * L * a + 2 * (p - 1) / p * nb, 1e-6)
            or close(got, 2 * L * a + 2 * (p - 1) * L / p * nb, 1e-6)
            or close(got, 2 * L * a + 2 * (p - 1) * L * nb, 1e-6)):
        return (f"{base}: a (p-1) lg p term. Rabenseifner takes lg p steps each way (2 lg p alpha), "
                "and recursive halving sends n/2 + n/4 + ... = (p-1)/p n in all, not per step: "
                "2 lg p alpha + 2(p-1)/p n beta")
    if case.algorithm == "binomial_tree" and close(got, L * (a + nb), 1e-6):
        return (f"{base}: that is one tree; an allreduce by trees is a reduce to the root and then "
                "a broadcast from it, 2 lg p (alpha + n beta)")
    if not models.is_power_of_two(p) and close(got, want * math.log2(p) / L, 1e-6):
        return (f"{base}: p = {p} is not a power of two, and a binomial tree needs ceil(lg p) = "
                f"{L} rounds, not log2 p = {math.log2(p):.3g}")
    if p == 1:
        return f"{base}: with one rank there is nothing to send"
    return base


def judge_choices(cases: list[scenario.Case], chosen: list[Any]) -> str | None:
    """None when every choice is a fastest algorithm; else the first wrong one, by symptom."""
    answers = [c for c in chosen if isinstance(c, str)]
    for case, got in zip(cases, chosen):
        best = models.fastest(case.p, case.n, case.alpha, case.beta)
        if isinstance(got, str) and got in best:
            continue
        head = f"choose for {case.label()}"
        times = {a: models.formula(a, case.p, case.n, case.alpha, case.beta)
                 for a in models.ALGORITHMS}
        want = " or ".join(f"'{a}' ({fmt_s(times[a])})" for a in sorted(best))
        if isinstance(got, programs.Raised):
            return f"{head}: expected {want}; {got.text}"
        if got not in models.ALGORITHMS:
            return (f"{head}: expected {want}; saw {got!r}, which is none of "
                    f"{', '.join(models.ALGORITHMS)}")
        base = f"{head}: expected {want}; saw '{got}' ({fmt_s(times[got])})"
        if len(answers) == len(chosen) and len(set(answers)) == 1:
            return (f"{base}. choose answered '{got}' for all {len(cases)} cases, but no algorithm "
                    "is fastest everywhere: small messages are latency-bound (recursive doubling "
                    "pays lg p alpha, the ring 2(p-1) alpha), large ones bandwidth-bound")
        if got not in models.candidates(case.p):
            return (f"{base}: p = {case.p} is not a power of two, and recursive doubling and "
                    "Rabenseifner as modelled here need one: choose between ring and binomial_tree")
        if best & set(models.LATENCY_OPTIMAL) and got not in models.LATENCY_OPTIMAL:
            return f"{base}: this message is small enough to be latency-bound"
        if got in models.LATENCY_OPTIMAL and not best & set(models.LATENCY_OPTIMAL):
            return f"{base}: this message is large enough to be bandwidth-bound"
        return base
    return None
