"""How problem 02 judges a fitted link, a prediction and a list of choices: None when all is well,
else the message the learner reads, naming the symptom where it can be recognised.
The textbook costs (formula, fastest, crossover) are here too: the expected answers, which the
sandbox hides from the learner process (cases.py, which the rank program imports, is readable)."""

import math
import numbers
from typing import Any

from . import cases
from .cases import ALGORITHMS, LATENCY_OPTIMAL, Case, Link, fmt_beta, fmt_s
from .programs import Fitted, Raised

FIT_TOLERANCE = 0.05  # fitted alpha and beta, relative to the hidden link
RING_TOLERANCE = 0.10  # predicted ring time, relative to the replay


# -- the textbook costs: the expected answers (here, out of the learner process's reach) ----------


def formula(algorithm: str, p: int, n: float, alpha: float, beta: float) -> float:
    """Allreduce of n bytes over p ranks, every link alpha + n beta (the catalog's formulas)."""
    if algorithm == "ring":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta
    if algorithm == "recursive_doubling":
        return cases.lg(p) * (alpha + n * beta)
    if algorithm == "binomial_tree":  # a reduce to the root, then a broadcast from it
        return 2 * cases.lg(p) * (alpha + n * beta)
    if algorithm == "rabenseifner":  # recursive-halving reduce-scatter + recursive-doubling allgather
        return 2 * cases.lg(p) * alpha + 2 * (p - 1) / p * n * beta
    raise ValueError(f"no formula for {algorithm!r}")


def candidates(p: int) -> tuple[str, ...]:
    """Recursive doubling and Rabenseifner, as modelled, need p to be a power of two."""
    return ALGORITHMS if cases.is_power_of_two(p) else ("ring", "binomial_tree")


def fastest(p: int, n: float, alpha: float, beta: float) -> set[str]:
    """Every candidate whose time ties with the minimum (relative 1e-9)."""
    times = {a: formula(a, p, n, alpha, beta) for a in candidates(p)}
    best = min(times.values())
    return {a for a, t in times.items() if t <= best * (1 + cases.FORMULA_RTOL) + 1e-300}


def crossover(p: int, alpha: float, beta: float) -> float | None:
    """The size (bytes) where the fastest algorithm turns from latency- to bandwidth-optimal, or None
    (for p = 1, 2 and 3, one algorithm is fastest at every size)."""
    # per n beta, what the latency-optimal one pays more; per alpha, what it pays less
    if cases.is_power_of_two(p):
        extra_beta, saved_alpha = cases.lg(p) - 2 * (p - 1) / p, cases.lg(p)
    else:
        extra_beta, saved_alpha = 2 * cases.lg(p) - 2 * (p - 1) / p, 2 * (p - 1) - 2 * cases.lg(p)
    if extra_beta <= 0 or saved_alpha <= 0:
        return None
    return saved_alpha * alpha / (extra_beta * beta)


def ring_replay_time(links: list[Link], p: int, nbytes: int) -> float:
    """The replay's ring Allreduce: 2(p-1) steps, each as long as the slowest link's alpha + n/p beta."""
    return 2 * (p - 1) * max(alpha + nbytes / p * beta for alpha, beta in links)


# -- the verdicts ---------------------------------------------------------------------------------


def close(got: float, want: float, rtol: float) -> bool:
    return is_number(got) and abs(got - want) <= rtol * abs(want)


def link_name(r: int, p: int) -> str:
    return f"link {r} -> {(r + 1) % p}"


def is_number(x: Any) -> bool:
    """A finite real number, as the program's values should be: they come from the solution's
    process, where strings in their place once crashed two checks."""
    try:
        return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)
    except OverflowError:  # an int past a float's range
        return False


def usable(fit: Any) -> Fitted:
    """``fit`` as the program makes it, or a Fitted whose problem says what came back instead."""
    if type(fit) is not Fitted:
        return Fitted(0.0, 0.0, f"came back as a {type(fit).__name__}")
    if not isinstance(fit.problem, str) or not (fit.problem or (is_number(fit.alpha) and is_number(fit.beta))):
        return Fitted(0.0, 0.0, "came back with an alpha and a beta that are not two finite numbers")
    return fit


def fit_error(fit: Fitted, link: Link) -> float:
    """How far off the worse of alpha and beta is, relative to the hidden link."""
    fit = usable(fit)
    if fit.problem:
        return float("inf")
    return max(abs(fit.alpha / link[0] - 1), abs(fit.beta / link[1] - 1))


def exchange(measured: Any, r: int, p: int) -> tuple[int, int]:
    """(messages rank r sent to its right neighbour, messages it got back from it) in a measure
    task, from the proxy's counters (ranks of a task are world ranks 0..p-1)."""
    counts, right = measured.task.counts(r), (r + 1) % p
    return counts.sent_msgs.get(right, 0), counts.recv_msgs.get(right, 0)


HARNESS_AGREE_BYTES = 24  # programs.on_cluster's Allreduce after measure: three float64
NOT_PING_PONG = ("the shared cluster's spikes delay point-to-point messages, so a sample timed on a collective "
                 "never meets one and says nothing of how your fit copes with them. Time every sample on a "
                 "ping-pong (Send, then Recv the echo), as the card asks, and keep the fastest of the repeats")


def collective_bytes(measured: Any, r: int) -> dict[str, int]:
    """The bytes rank r moved through each collective in a measure task, beyond the harness's own
    Allreduce after measure, from the proxy's counters: a sample timed on a collective (a Bcast on a
    pair's sub-communicator) has met none of the spikes, which the fault plan puts on point-to-point
    messages, so it says nothing of how a fit copes with them."""
    counts = measured.task.counts(r)
    moved = {op: counts.op_bytes.get(op, 0) for op in counts.collectives_used()}
    moved["Allreduce"] = moved.get("Allreduce", 0) - HARNESS_AGREE_BYTES
    return {op: n for op, n in sorted(moved.items()) if n > 0}


def pair_collectives(measured: Any, r: int, p: int) -> dict[str, int]:
    """Rank r's collective calls on a communicator smaller than the task's, from its agent's trace,
    by name: 0 bytes or not (a Barrier on the pair {r, r+1} times the pair's latency), such a call
    is a sample that no spike can reach, where a Barrier of every rank only lines up the turns."""
    called: dict[str, int] = {}
    for event in measured.task.traces.get(r, []):
        if event[0] in ("coll", "icoll"):
            op, group = (event[1], event[2]) if event[0] == "coll" else (event[2], event[3])
            if group is not None and len(set(group)) < p:
                called[str(op)] = called.get(str(op), 0) + 1
    return dict(sorted(called.items()))


def repeats(fit: Fitted, again: Fitted) -> bool:
    """Whether two fits of one link agree as two runs on the exact virtual clock do."""
    fit, again = usable(fit), usable(again)
    if fit.problem or again.problem:
        return False
    return close(again.alpha, fit.alpha, 1e-9) and close(again.beta, fit.beta, 1e-9)


def judge_link(r: int, p: int, fit: Fitted, links: list[Link], exchange: tuple[int, int] | None = None,
               again: Fitted | None = None) -> str | None:
    """None when rank r's fit is within 5% of its link r -> r+1; else what is wrong, by symptom.
    ``exchange``: the messages rank r sent its right neighbour and got back from it while measuring;
    ``again``: its fit of the same link in a second run on the same quiet cluster."""
    alpha, beta = links[r]
    head = f"rank {r}, {link_name(r, p)}"
    fit, again = usable(fit), (usable(again) if again is not None else None)
    if fit.problem:
        return f"{head}: measure {fit.problem}"
    base = (f"{head}: expected alpha = {fmt_s(alpha)} and beta = {fmt_beta(beta)} (within 5%); "
            f"saw alpha = {fmt_s(fit.alpha)}, beta = {fmt_beta(fit.beta)}")
    sent, echoed = exchange or (0, 0)
    if sent and not echoed:  # the counters: nothing came back, so no round trip was timed
        # Before the values: past the eager limit a blocking Send waits for its bytes (a rendezvous),
        # so lone Sends of large messages alone would still fit the link; the counters tell.
        return (f"{base}: rank {r} sent {sent} messages to rank {(r + 1) % p} and got none back, so it "
                "timed a lone Send with no echo. A Send below the eager limit returns once MPI has copied "
                "the message out, long before it arrives, so its time says nothing of the link: time a "
                "ping-pong (Send, then Recv the echo) and halve the round trip")
    if close(fit.alpha, alpha, FIT_TOLERANCE) and close(fit.beta, beta, FIT_TOLERANCE):
        return None
    ra, rb = fit.alpha / alpha, fit.beta / beta
    if fit.alpha == 0 and fit.beta == 0:
        return f"{base}: nothing was measured yet"
    if again is not None and not again.problem and not repeats(fit, again):
        # The virtual clock is exact: the same measurement on the same quiet cluster gives the same times.
        return (f"{base}; a second run on the same quiet cluster gave alpha = {fmt_s(again.alpha)}, "
                f"beta = {fmt_beta(again.beta)}. The virtual clock repeats itself exactly, so these times "
                "came from another clock, such as this machine's wall clock: read the virtual clock with "
                "comm.now()")
    if abs(fit.alpha) < 0.05 * alpha and rb >= 1:  # a line through the origin: alpha lands in beta
        return (f"{base}: the fit has no intercept, so latency was ignored (t = n * beta charges every "
                "message's alpha to its bytes); fit t = alpha + n * beta by least squares, with a column of ones")
    if 1.9 <= ra <= 2.1 and 1.9 <= rb <= 2.1:
        return (f"{base}: both are twice the hidden values, so the round trip was reported as "
                "the one-way time; a ping-pong crosses the link twice, so halve it")
    for j, (a_j, b_j) in enumerate(links):
        if j != r and close(fit.alpha, a_j, FIT_TOLERANCE) and close(fit.beta, b_j, FIT_TOLERANCE):
            return (f"{base}, which are the values of {link_name(j, p)}: rank r should return "
                    "the link to its right neighbour (r + 1) % p")
    return f"{base} ({ra:.3g}x and {rb:.3g}x the hidden values)"


def judge_kept(r: int, p: int, fit: Fitted, quiet: Link, shared: Link) -> str | None:
    """A fit of rank r's link on the shared cluster (whose links are the quiet ones, slower by hidden
    factors of 1.2 to 1.6) that is the quiet link within 5%: not measured there, but kept from the quiet
    run (a cache across calls); None otherwise."""
    if fit.problem or not (close(fit.alpha, quiet[0], FIT_TOLERANCE) and close(fit.beta, quiet[1], FIT_TOLERANCE)):
        return None
    return (f"rank {r}, {link_name(r, p)}: expected alpha = {fmt_s(shared[0])} and beta = {fmt_beta(shared[1])} "
            f"(within 5%); saw alpha = {fmt_s(fit.alpha)}, beta = {fmt_beta(fit.beta)}, which are this link's "
            "values on the quiet cluster. Shared with other jobs, every link is slower by a hidden amount, so "
            "this fit was not measured here: measure the link afresh in every call, under the spikes "
            "(nothing kept from an earlier call)")


def judge_prediction(case: Case, got: Any) -> str | None:
    """None when predict returned the formula's value; else the symptom."""
    want = formula(case.algorithm, case.p, case.n, case.alpha, case.beta)
    head = f"predict for {case.label()}"
    if isinstance(got, Raised):
        return f"{head}: {got.text}"
    if not is_number(got):
        return f"{head}: returned a {type(got).__name__}, expected a finite number of seconds"
    if close(got, want, cases.FORMULA_RTOL) or (want == 0 and abs(got) < 1e-300):
        return None
    shown_want, shown_got = fmt_s(want), fmt_s(got)
    if shown_want == shown_got:  # close but not equal: show the digits that differ
        shown_want, shown_got = f"{want:.9g} s", f"{got:.9g} s"
    base = f"{head}: expected {shown_want}; saw {shown_got}"
    p, L, a, nb = case.p, cases.lg(case.p), case.alpha, case.n * case.beta
    if case.algorithm == "rabenseifner" and L > 1 and (
            close(got, 2 * (p - 1) * L * a + 2 * (p - 1) / p * nb, 1e-6)
            or close(got, 2 * L * a + 2 * (p - 1) * L / p * nb, 1e-6)
            or close(got, 2 * L * a + 2 * (p - 1) * L * nb, 1e-6)):
        return (f"{base}: a (p-1) lg p term. Rabenseifner takes lg p steps each way (2 lg p alpha), "
                "and recursive halving sends n/2 + n/4 + ... = (p-1)/p n in all, not per step: "
                "2 lg p alpha + 2(p-1)/p n beta")
    if case.algorithm == "ring" and p > 2 and nb > 0 and close(got, 2 * (p - 1) * (a + nb), 1e-6):
        return (f"{base}: each of the ring's 2(p-1) steps moves one chunk of n/p bytes, not the whole "
                "vector: 2(p-1) alpha + 2(p-1)/p n beta")
    if case.algorithm == "binomial_tree" and close(got, L * (a + nb), 1e-6):
        return (f"{base}: that is one tree; an allreduce by trees is a reduce to the root and then "
                "a broadcast from it, 2 lg p (alpha + n beta)")
    if not cases.is_power_of_two(p) and close(got, want * math.log2(p) / L, 1e-6):
        return (f"{base}: p = {p} is not a power of two, and a binomial tree needs ceil(lg p) = "
                f"{L} rounds, not log2 p = {math.log2(p):.3g}")
    if p == 1:
        return f"{base}: with one rank there is nothing to send"
    return base


def judge_choices(choices: list[Case], chosen: list[Any]) -> str | None:
    """None when every choice is a fastest algorithm; else the first wrong one, by symptom."""
    answers = [c for c in chosen if isinstance(c, str)]
    for case, got in zip(choices, chosen):
        best = fastest(case.p, case.n, case.alpha, case.beta)
        if isinstance(got, str) and got in best:
            continue
        head = f"choose for {case.label()}"
        times = {a: formula(a, case.p, case.n, case.alpha, case.beta) for a in ALGORITHMS}
        want = " or ".join(f"'{a}' ({fmt_s(times[a])})" for a in sorted(best))
        if isinstance(got, Raised):
            return f"{head}: expected {want}; {got.text}"
        if got not in ALGORITHMS:
            return f"{head}: expected {want}; saw {got!r}, which is none of {', '.join(ALGORITHMS)}"
        base = f"{head}: expected {want}; saw '{got}' ({fmt_s(times[got])})"
        if len(answers) == len(chosen) and len(set(answers)) == 1:
            return (f"{base}. choose answered '{got}' for all {len(choices)} cases, but no algorithm "
                    "is fastest everywhere: small messages are latency-bound (recursive doubling "
                    "pays lg p alpha, the ring 2(p-1) alpha), large ones bandwidth-bound")
        if got not in candidates(case.p):
            return (f"{base}: p = {case.p} is not a power of two, and recursive doubling and "
                    "Rabenseifner as modelled here need one: choose between ring and binomial_tree")
        if best & set(LATENCY_OPTIMAL) and got not in LATENCY_OPTIMAL:
            return f"{base}: this message is small enough to be latency-bound"
        if got in LATENCY_OPTIMAL and not best & set(LATENCY_OPTIMAL):
            return f"{base}: this message is large enough to be bandwidth-bound"
        return base
    return None
