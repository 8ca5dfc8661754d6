"""Checks for problem 02, measuring the network with the alpha-beta model.

The story: a new cluster arrives, hidden and drawn from the seed: p devices (3 to 8), each on its own
cable to one switch, so every link has its own alpha and beta. The learner's `measure` ping-pongs with
the right neighbour on every rank, on the virtual clock, and its fits are compared with the hidden
links (and with a second run, which the exact virtual clock must repeat); then with the cluster shared, where every
link is slower by a hidden amount and a few messages hit a latency spike (point-to-point messages: the
samples must travel so, the card's ping-pong). `predict` is
compared with the textbook formulas on random cases, and `choose` with the fastest formula on a grid
of (p, n) that brackets every crossover. Last, the built-in (ring) Allreduce runs on the cluster,
latency-bound and bandwidth-bound: the ring predicted from the learner's slowest measured link must
land within 10% of the replay's time.
"""

import math

import numpy as np

from distlab.grading import CheckContext, Checklist, Run, Task, faults

from . import cases, judging, programs
from .cases import Allreduce, Choice, Cluster, Measure, fmt_beta, fmt_bytes, fmt_s
from .judging import close, fit_error, judge_choices, judge_link, judge_prediction

CHECKS = Checklist()


@CHECKS.run
def cluster(t: CheckContext) -> Cluster:
    return cases.hidden_cluster(t.seed)


@CHECKS.run
def on_cluster(t: CheckContext, cluster: Cluster) -> Run:
    """One launch on the hidden cluster: measure (quiet, then again: the virtual clock repeats itself
    exactly), measure (shared: slower links, a task's own platform, and spikes), two built-in rings."""
    p, queue = cluster.p, "other jobs share the switch: now and then a message waits in a queue"
    spike = faults.spike(latency_s=cluster.spike_s, probability=cases.SPIKE_PROBABILITY, note=queue)
    spikes = faults.plan(spike, seed=cluster.spike_seed, where=f"02 shared-cluster measurement (seed {t.seed})")
    # The shared cluster's links are the quiet ones slowed by hidden factors: only the agents' clock holds
    # them (the task's platform), so a fit kept from the quiet run cannot pass for one measured there.
    tasks = [Task(ranks=p, case=Measure(cluster.sizes), label=f"measure on the quiet cluster (p = {p})"),
             Task(ranks=p, case=Measure(cluster.sizes), label=f"measure again on the quiet cluster (p = {p})"),
             Task(ranks=p, case=Measure(cluster.sizes), faults=spikes, platform=cluster.platform(shared=True),
                  label=f"measure on the shared cluster with latency spikes (p = {p})")]
    tasks += [Task(ranks=p, case=Allreduce(n), label=f"the built-in Allreduce of {fmt_bytes(n)}")
              for n in cluster.ring]
    return t.launch(programs.on_cluster, tasks, online_clock=True, platform=cluster.platform())


@CHECKS.check("fitted alpha and beta within 5% of every hidden link", points=4)
def fits_match_links(t: CheckContext, cluster: Cluster, on_cluster: Run) -> None:
    p, links = cluster.p, cluster.links
    alphas, bandwidths = [a for a, _ in links], [1 / b for _, b in links]
    t.say(f"a new cluster of p = {p}: alpha {fmt_s(min(alphas))} to {fmt_s(max(alphas))} per link, bandwidth "
          f"{min(bandwidths) / 1e9:.3g} to {max(bandwidths) / 1e9:.3g} GB/s; "
          f"sizes {', '.join(fmt_bytes(s) for s in cluster.sizes)}")
    quiet, again = on_cluster.cases(Measure)[:2]
    fits = quiet.values
    verdicts = [judge_link(r, p, fit, links, judging.exchange(quiet, r, p), again.values[r])
                for r, fit in enumerate(fits)]
    if verdict := next((v for v in verdicts if v), None):
        if not t.learner_faults:
            t.fail(verdict)
        # Your plan's delays are in every message measured: the links are no longer the hidden ones.
        t.say(f"{verdict}; with your fault plan in force: reported, not graded")
    worst = max(fit_error(fit, link) for fit, link in zip(fits, links))
    t.metric("p", p)
    t.metric("worst_fit_error", round(worst, 6))
    if not verdict:
        t.say(f"every one of the {p} links fitted within {worst:.2%} of its hidden alpha and beta")


@CHECKS.check("the fit holds on a shared cluster with latency spikes", points=2)
def fits_survive_spikes(t: CheckContext, cluster: Cluster, on_cluster: Run) -> None:
    p, links, share = cluster.p, cluster.shared_links, f"{cases.SPIKE_PROBABILITY:.0%}"
    t.say(f"the same cluster, shared: every link slower by a hidden amount, and {share} of messages wait "
          f"an extra {fmt_s(cluster.spike_s)}")
    first, again, spiked = on_cluster.cases(Measure)
    quiet, spiky = first.values, spiked.values
    for r, fit in enumerate(spiky):
        # A quiet measurement that did not repeat itself is not on the virtual clock: nor is this one.
        other = None if judging.repeats(quiet[r], again.values[r]) else again.values[r]
        verdict = judge_link(r, p, fit, links, judging.exchange(spiked, r, p), other)
        if verdict and (kept := judging.judge_kept(r, p, fit, cluster.links[r], links[r])):
            t.fail(f"with spikes on {share} of messages, {kept}")
        if verdict and judge_link(r, p, quiet[r], cluster.links, judging.exchange(first, r, p)) is None \
                and not fit.problem:
            t.fail(f"with spikes on {share} of messages, {verdict}. Without spikes this link fitted well, "
                   "so the spikes leaked into the fit: a spike only ever adds time, so repeat each size (10 "
                   "or more round trips) and keep the fastest, not the mean (a median works too, over 20 "
                   "or more)")
        if verdict:
            t.fail(f"with spikes on {share} of messages, {verdict}")
    # Each fit is right: but a fit is graded here for what the spikes did to it, and they delay
    # point-to-point messages, the ping-pong's; a sample timed on a collective never met one.
    for r in range(p):
        if moved := judging.collective_bytes(spiked, r):
            t.fail(f"with spikes on {share} of messages, rank {r}'s measure moved "
                   f"{', '.join(f'{n} bytes through {op}' for op, n in moved.items())}: {judging.NOT_PING_PONG}")
        if called := judging.pair_collectives(spiked, r, p):  # a 0-byte Barrier moved nothing, yet timed
            t.fail(f"with spikes on {share} of messages, rank {r}'s measure called "
                   f"{', '.join(f'{op} {n} times' for op, n in called.items())} on a sub-communicator: "
                   f"{judging.NOT_PING_PONG}")
    worst = max(fit_error(fit, link) for fit, link in zip(spiky, links))
    t.metric("spike_s", cluster.spike_s)
    t.metric("worst_fit_error", round(worst, 6))
    t.say(f"every link still fitted within {worst:.2%}")


@CHECKS.run
def formulas(t: CheckContext) -> Run:
    """Every predict case, then every choose case, on one rank."""
    rng = np.random.default_rng([t.seed, 3])
    every_case = cases.draw_predict_cases(rng) + cases.draw_choose_cases(rng, judging.crossover)
    task = Task(ranks=1, cases=every_case, label="predict and choose on every case")
    return t.launch(programs.on_formulas, [task])


@CHECKS.check("predict equals the standard cost formulas", points=3)
def predictions_match(t: CheckContext, formulas: Run) -> None:
    predicted = [result for result in formulas.cases() if not isinstance(result.case, Choice)]
    t.say(f"{len(predicted)} hidden cases: {', '.join(cases.ALGORITHMS)}; p from 1 to 1024, "
          "latency-bound and bandwidth-bound sizes")
    wrong = []  # (how far off, verdict): the worst case shows the mistake most clearly
    for case, got in [(result.case, result.values[0]) for result in predicted]:
        verdict = judge_prediction(case, got)
        if verdict:
            want = judging.formula(case.algorithm, case.p, case.n, case.alpha, case.beta)
            wrong.append((math.inf if isinstance(got, programs.Raised) or want == 0 or not judging.is_number(got) else abs(got / want - 1),
                          verdict))
    if wrong:
        off, verdict = max(wrong, key=lambda w: w[0])
        worst = "; this one is the farthest off" if math.isfinite(off) else ""
        t.fail(verdict if len(wrong) == 1 else f"{verdict} ({len(wrong)} of {len(predicted)} cases wrong{worst})")
    t.metric("cases", len(predicted))
    t.say("every prediction equals its formula")


@CHECKS.check("choose finds the crossover: latency-optimal when small, bandwidth-optimal when large",
              points=3)
def choices_match(t: CheckContext, formulas: Run) -> None:
    choices = [result.case for result in formulas.cases(Choice)]
    t.say(f"{len(choices)} hidden cases: {len({c.p for c in choices})} rank counts, "
          "n from 1 B to 1 GiB and just either side of each crossover")
    verdict = judge_choices(choices, [result.values[0] for result in formulas.cases(Choice)])
    if verdict:
        t.fail(verdict)
    # A case "just below the crossover" is only drawn where there is one: show the first two.
    for case in [c for c in choices if c.note == "just below the crossover"][:2]:
        small, large = ("recursive_doubling", "rabenseifner") if cases.is_power_of_two(case.p) \
            else ("binomial_tree", "ring")
        t.say(f"p = {case.p} (alpha {fmt_s(case.alpha)}, {1 / case.beta / 1e9:.3g} GB/s): "
              f"{small} up to {fmt_bytes(judging.crossover(case.p, case.alpha, case.beta))}, {large} above")
    t.metric("cases", len(choices))


def slowest_fit(cluster: Cluster, on_cluster: Run) -> tuple[float, float] | None:
    """The largest alpha and the largest beta over every rank's quiet fit, read here from what each
    rank returned (None when some rank's value is unusable): the link a ring moves at."""
    fits = on_cluster.cases(Measure)[0].values
    if len(fits) != cluster.p or any(not isinstance(f, programs.Fitted) or f.problem for f in fits):
        return None
    return max(f.alpha for f in fits), max(f.beta for f in fits)


@CHECKS.run
def ring_predictions(t: CheckContext, cluster: Cluster, on_cluster: Run) -> Run | None:
    """predict('ring', ...) at the built-in Allreduce's sizes, from the slowest fit: a launch of its own,
    after the cluster's, so the learner process never holds those sizes while it can time the cluster."""
    worst = slowest_fit(cluster, on_cluster)
    if worst is None:  # the check says why: some rank's measure returned nothing usable
        return None
    alpha, beta = worst
    task = Task(ranks=1, cases=[cases.RingPrediction("ring", cluster.p, n, alpha, beta) for n in cluster.ring],
                label="predict the built-in ring from your slowest link")
    return t.launch(programs.on_formulas, [task])


@CHECKS.check("predicted ring time within 10% of the built-in Allreduce's virtual time", points=2)
def ring_prediction_holds(t: CheckContext, cluster: Cluster, on_cluster: Run,
                          ring_predictions: Run | None) -> None:
    p, links = cluster.p, cluster.links
    first, again = on_cluster.cases(Measure)[:2]
    worst = slowest_fit(cluster, on_cluster)
    if worst is None or ring_predictions is None:
        bad = [r for r, fit in enumerate(first.values) if not isinstance(fit, programs.Fitted) or fit.problem]
        t.fail(f"measure returned no usable (alpha, beta) on rank {bad[0] if bad else '?'} "
               "(see the first check), so there is no ring to predict")
    (alpha, beta), (true_alpha, true_beta) = worst, cluster.slowest
    t.say(f"your slowest link: alpha {fmt_s(alpha)}, beta {fmt_beta(beta)} "
          f"(hidden: {fmt_s(true_alpha)}, {fmt_beta(true_beta)})")
    rings = on_cluster.cases(Allreduce)
    for ring in rings:  # the replay of the built-in Allreduce itself, as the agents recorded it
        nbytes = ring.case.nbytes
        for r in range(p):
            counts = ring.task.counts(r)
            if counts.calls.get("Allreduce", 0) != 1 or counts.op_bytes.get("Allreduce", 0) != nbytes \
                    or sum(counts.sent_msgs.values()):
                t.fail(f"the built-in Allreduce of {fmt_bytes(nbytes)} did not run as the harness calls it "
                       f"on rank {r} (one Allreduce of {nbytes} bytes, no other messages)")
        if not ring.task.timeline().makespan > 0:
            t.fail(f"the built-in Allreduce of {fmt_bytes(nbytes)} took no virtual time")
    predicted = ring_predictions.cases()
    for k, (ring, result) in enumerate(zip(rings, predicted)):
        # The hidden cluster exists only on the virtual clock, so its replay grades the
        # prediction even under --clock wall (this machine's wall time says nothing about it).
        measured, nbytes, got = ring.task.timeline().makespan, ring.case.nbytes, result.values[0]
        head = f"Allreduce of {fmt_bytes(nbytes)} ({'latency' if k == 0 else 'bandwidth'}-bound) on p = {p}"
        if isinstance(got, programs.Raised):
            t.fail(f"{head}: {got.text}")
        if not judging.is_number(got):
            t.fail(f"{head}: predict returned a {type(got).__name__}, expected a finite number of seconds")
        t.say(f"{head}: predicted {fmt_s(got)}, virtual {fmt_s(measured)} ({got / measured:.3f}x)")
        if k == 1 and t.clock == "virtual":
            t.performance(measured, judging.ring_replay_time(cluster.links, p, nbytes), ring.task)
        if abs(got - measured) <= judging.RING_TOLERANCE * measured:
            continue
        if t.learner_faults:  # the fits carry your plan's delays, the built-in ring does not
            t.say("with your fault plan in force the measured links are not the hidden ones: reported, not graded")
            continue
        base = (f"{head}: expected a prediction within 10% of the replay's {fmt_s(measured)}; predict('ring', "
                f"{p}, {nbytes}, {alpha:.4g}, {beta:.4g}) returned {fmt_s(got)} ({got / measured:.2f}x)")
        want = judging.formula("ring", p, nbytes, alpha, beta)
        if not close(got, want, 1e-6):
            t.fail(f"{base}; the ring formula gives {fmt_s(want)} from those values (see the predict check)")
        tolerance = judging.FIT_TOLERANCE
        if not (close(alpha, true_alpha, tolerance) and close(beta, true_beta, tolerance)):
            t.fail(f"{base}: the slowest link you measured is off (hidden: alpha {fmt_s(true_alpha)}, "
                   f"beta {fmt_beta(true_beta)}); see the first check")
        t.fail(base)
    if not t.learner_faults:
        # Within 10%, but the ring is predicted from the links measured: a prediction from links that
        # are not the cluster's (a fit of some other timing, such as the built-in ring's) is not one.
        for r, fit in enumerate(first.values):
            if judge_link(r, p, fit, links, judging.exchange(first, r, p), again.values[r]):
                t.fail(f"the ring is predicted from your slowest measured link, and {judging.link_name(r, p)} "
                       "did not fit its hidden values (see the first check)")
    t.metric("ring_bytes", list(cluster.ring))
