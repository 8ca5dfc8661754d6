"""Checks for problem 02, measuring the network with the alpha-beta model.

The story: a new cluster arrives, built here from the seed. It has p devices (3 to 8), each on its
own cable to one switch, and every cable has its own latency and bandwidth. So every link i -> j
has its own alpha (the latencies of both cables added up) and its own beta (the slower cable's
seconds per byte), and the learner does not know them. The learner's `measure` runs on this
cluster on the virtual clock: each rank ping-pongs with its right neighbour and fits alpha and
beta. Its fits are compared with the hidden links. Then the same again on a shared cluster, where
a few messages hit a latency spike.
The learner's `predict` is compared with the textbook formulas on a table of random cases, and its
`choose` with the fastest formula on a grid of (p, n) that brackets every crossover. Last, the
built-in (ring) Allreduce runs on the hidden cluster twice: once latency-bound and once
bandwidth-bound. The learner's ring prediction, made from its own slowest measured link, must land
within 10% of the replay's time.

Hidden variants: the cluster (p, every cable's latency and bandwidth), the message sizes that
measure is given, the spikes (size, and which messages they hit), the ring sizes, every case of the
formula table and of the choose grid (p, n, alpha, beta).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from distlab.grading import CheckContext, Checklist, Platform, Task, check_part

models = check_part(__file__, "models")  # the textbook costs, and how figures are written
scenario = check_part(__file__, "scenario")  # the hidden cluster and the formula cases, from the seed
programs = check_part(__file__, "programs")  # what runs on the ranks: measure, predict, choose
judging = check_part(__file__, "judging")  # tolerances, verdicts and symptoms
fmt_s, fmt_bytes, fmt_beta = models.fmt_s, models.fmt_bytes, models.fmt_beta  # 12.3 us, 4.56 MiB


# -- building the launches ----------------------------------------------------------------------


def measure_run(t: CheckContext) -> tuple[scenario.Setup, Platform, Any]:
    """One launch on the hidden cluster: measure (quiet), measure (spikes), two built-in rings."""
    setup = scenario.cluster_setup(t.seed)
    platform = setup.cluster.platform()
    p = setup.p
    tasks = [
        Task(ranks=p, args=("measure", setup.sizes, setup.ring),
             label=f"measure on the quiet cluster (p = {p})"),
        Task(ranks=p, args=("measure", setup.sizes, ()), faults=scenario.spike_plan(setup, t.seed),
             label=f"measure on the shared cluster with latency spikes (p = {p})"),
        Task(ranks=p, args=("allreduce", setup.ring[0]),
             label=f"the built-in Allreduce of {fmt_bytes(setup.ring[0])}"),
        Task(ranks=p, args=("allreduce", setup.ring[1]),
             label=f"the built-in Allreduce of {fmt_bytes(setup.ring[1])}"),
    ]
    run = t.launch(programs.on_cluster, tasks, online_clock=True, platform=platform)
    return setup, platform, run


def formula_run(t: CheckContext) -> tuple[list[scenario.Case], list[scenario.Case], Any]:
    rng = np.random.default_rng([t.seed, 3])
    predict_cases = scenario.draw_predict_cases(rng)
    choose_cases = scenario.draw_choose_cases(rng)
    run = t.launch(programs.on_formulas, [Task(ranks=1, args=(predict_cases, choose_cases),
                                               label="predict and choose on every case")])
    return predict_cases, choose_cases, run


# -- the checks ---------------------------------------------------------------------------------

CHECKS = Checklist()


@CHECKS.check("fitted alpha and beta within 5% of every hidden link", points=4)
def fits_match_links(t: CheckContext) -> None:
    setup, platform, run = measure_run(t)
    p = setup.p
    links = scenario.ring_links(platform, p)
    t.say(f"a new cluster of p = {p}: alpha {fmt_s(min(a for a, _ in links))} to "
          f"{fmt_s(max(a for a, _ in links))} per link, bandwidth "
          f"{min(1 / b for _, b in links) / 1e9:.3g} to {max(1 / b for _, b in links) / 1e9:.3g} GB/s; "
          f"sizes {', '.join(fmt_bytes(s) for s in setup.sizes)}")
    worst = 0.0
    for r, fit in enumerate(judging.fits_of(run.tasks[0])):
        verdict = judging.judge_link(r, p, fit, links)
        if verdict:
            t.fail(verdict)
        worst = max(worst, abs(fit.alpha / links[r][0] - 1), abs(fit.beta / links[r][1] - 1))
    t.metric("p", p)
    t.metric("worst_fit_error", round(worst, 6))
    t.say(f"every one of the {p} links fitted within {worst:.2%} of its hidden alpha and beta")


@CHECKS.check("the fit holds on a shared cluster with latency spikes", points=2)
def fits_survive_spikes(t: CheckContext) -> None:
    setup, platform, run = measure_run(t)
    p = setup.p
    links = scenario.ring_links(platform, p)
    t.say(f"the same cluster, shared: {scenario.SPIKE_PROBABILITY:.0%} of messages wait an extra "
          f"{fmt_s(setup.spike_s)}")
    quiet = judging.fits_of(run.tasks[0])
    worst = 0.0
    for r, fit in enumerate(judging.fits_of(run.tasks[1])):
        verdict = judging.judge_link(r, p, fit, links)
        if verdict is None:
            worst = max(worst, abs(fit.alpha / links[r][0] - 1), abs(fit.beta / links[r][1] - 1))
            continue
        if judging.judge_link(r, p, quiet[r], links) is None and not fit.problem:
            t.fail(f"with spikes on {scenario.SPIKE_PROBABILITY:.0%} of messages, {verdict}. Without "
                   "spikes this link fitted well, so the spikes leaked into the fit: a spike "
                   "only ever adds time, so repeat each size (10 or more round trips) and keep "
                   "the fastest, not the mean (a median works too, over 20 or more)")
        t.fail(f"with spikes on {scenario.SPIKE_PROBABILITY:.0%} of messages, {verdict}")
    t.metric("spike_s", setup.spike_s)
    t.metric("worst_fit_error", round(worst, 6))
    t.say(f"every link still fitted within {worst:.2%}")


@CHECKS.check("predict equals the standard cost formulas", points=3)
def predictions_match(t: CheckContext) -> None:
    predict_cases, _, run = formula_run(t)
    predicted, _ = run.tasks[0].values[0]
    t.say(f"{len(predict_cases)} hidden cases: {', '.join(models.ALGORITHMS)}; p from 1 to 1024, "
          "latency-bound and bandwidth-bound sizes")
    wrong = []  # (how far off, verdict): the worst case shows the mistake most clearly
    for case, got in zip(predict_cases, predicted):
        verdict = judging.judge_prediction(case, got)
        if verdict:
            want = models.formula(case.algorithm, case.p, case.n, case.alpha, case.beta)
            off = math.inf if isinstance(got, programs.Raised) or want == 0 else abs(got / want - 1)
            wrong.append((off, verdict))
    if wrong:
        off, verdict = max(wrong, key=lambda w: w[0])
        if len(wrong) > 1:
            worst = "; this one is the farthest off" if math.isfinite(off) else ""
            verdict = f"{verdict} ({len(wrong)} of {len(predict_cases)} cases wrong{worst})"
        t.fail(verdict)
    t.metric("cases", len(predict_cases))
    t.say("every prediction equals its formula")


@CHECKS.check("choose finds the crossover: latency-optimal when small, bandwidth-optimal when large",
              points=3)
def choices_match(t: CheckContext) -> None:
    _, choose_cases, run = formula_run(t)
    _, chosen = run.tasks[0].values[0]
    t.say(f"{len(choose_cases)} hidden cases: {len({c.p for c in choose_cases})} rank counts, "
          "n from 1 B to 1 GiB and just either side of each crossover")
    verdict = judging.judge_choices(choose_cases, chosen)
    if verdict:
        t.fail(verdict)
    shown = 0
    for case in choose_cases:
        cross = models.crossover(case.p, case.alpha, case.beta)
        if case.note == "just below the crossover" and cross is not None and shown < 2:
            small, large = ("recursive_doubling", "rabenseifner") if models.is_power_of_two(case.p) \
                else ("binomial_tree", "ring")
            t.say(f"p = {case.p} (alpha {fmt_s(case.alpha)}, {1 / case.beta / 1e9:.3g} GB/s): "
                  f"{small} up to {fmt_bytes(cross)}, {large} above")
            shown += 1
    t.metric("cases", len(choose_cases))


@CHECKS.check("predicted ring time within 10% of the built-in Allreduce's virtual time", points=2)
def ring_prediction_holds(t: CheckContext) -> None:
    setup, platform, run = measure_run(t)
    p = setup.p
    links = scenario.ring_links(platform, p)
    result: programs.MeasureResult = run.tasks[0].values[0]
    fits = judging.fits_of(run.tasks[0])
    bad = [r for r, fit in enumerate(fits) if fit.problem]
    if bad or result.worst is None or result.ring is None:
        t.fail(f"measure returned no usable (alpha, beta) on rank {bad[0] if bad else '?'} "
               "(see the first check), so there is no ring to predict")
        return
    alpha, beta = result.worst
    true_alpha, true_beta = max(a for a, _ in links), max(b for _, b in links)
    t.say(f"your slowest link: alpha {fmt_s(alpha)}, beta {fmt_beta(beta)} "
          f"(hidden: {fmt_s(true_alpha)}, {fmt_beta(true_beta)})")
    for k, (nbytes, got, task_run) in enumerate(zip(setup.ring, result.ring, run.tasks[2:4])):
        kind = "latency-bound" if k == 0 else "bandwidth-bound"
        # The hidden cluster exists only on the virtual clock, so its replay grades the
        # prediction even under --clock wall (this machine's wall time says nothing about it).
        measured = task_run.replay().makespan
        bound = models.ring_replay_time(links, p, nbytes)
        head = f"Allreduce of {fmt_bytes(nbytes)} ({kind}) on p = {p}"
        if isinstance(got, programs.Raised):
            t.fail(f"{head}: {got.text}")
        t.say(f"{head}: predicted {fmt_s(got)}, virtual {fmt_s(measured)} ({got / measured:.3f}x)")
        if k == 1 and t.clock == "virtual":
            t.performance(measured, bound, task_run)
        if abs(got - measured) <= judging.RING_TOLERANCE * measured:
            continue
        base = (f"{head}: expected a prediction within 10% of the replay's {fmt_s(measured)}; "
                f"predict('ring', {p}, {nbytes}, {alpha:.4g}, {beta:.4g}) returned {fmt_s(got)} "
                f"({got / measured:.2f}x)")
        want = models.formula("ring", p, nbytes, alpha, beta)
        if not judging.close(got, want, 1e-6):
            t.fail(f"{base}; the ring formula gives {fmt_s(want)} from those values (see the "
                   "predict check)")
        if not (judging.close(alpha, true_alpha, judging.FIT_TOLERANCE)
                and judging.close(beta, true_beta, judging.FIT_TOLERANCE)):
            t.fail(f"{base}: the slowest link you measured is off (hidden: alpha "
                   f"{fmt_s(true_alpha)}, beta {fmt_beta(true_beta)}); see the first check")
        t.fail(base)
    t.metric("ring_bytes", list(setup.ring))


# -- the free run -------------------------------------------------------------------------------


def main(comm, solution, sizes="8,1024,16384,131072,1048576", n="1048576"):
    """A free run (distlab run, mpirun): measure every ring link, then model an allreduce of n
    bytes on the slowest one. Rank 0 returns one line."""
    p, rank = comm.Get_size(), comm.Get_rank()
    size_list = [int(s) for s in sizes.split(",")]
    fitted = programs.as_fitted(solution.measure(comm, size_list))
    table = np.empty(2 * p)
    comm.Allgather(np.array([fitted.alpha, fitted.beta]), table)
    if rank != 0:
        return None
    if fitted.problem or not np.all(np.isfinite(table)):
        return f"measure {fitted.problem or 'returned unusable values on some rank'}"
    alphas, betas = table[0::2], table[1::2]
    slow = int(np.argmax(alphas + int(n) / p * betas))
    alpha, beta = float(alphas.max()), float(betas.max())
    best = solution.choose(p, int(n), alpha, beta)
    return (f"{p} links: alpha {fmt_s(alphas.min())}..{fmt_s(alphas.max())}, beta "
            f"{betas.min():.3g}..{betas.max():.3g} s/B; slowest for the ring: {slow} -> "
            f"{(slow + 1) % p}; allreduce of {fmt_bytes(int(n))}: ring "
            f"{fmt_s(float(solution.predict('ring', p, int(n), alpha, beta)))}, "
            f"choose -> {best}")
