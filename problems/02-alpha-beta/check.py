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
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distlab import MAX, SUM
from distlab.grading import CheckContext, Checklist, Task, parse_fault_plan
from distlab.platforms import Platform, parse_platform

ALGORITHMS = ("ring", "recursive_doubling", "binomial_tree", "rabenseifner")
LATENCY_OPTIMAL = ("recursive_doubling", "binomial_tree")
FIT_TOLERANCE = 0.05  # fitted alpha and beta, relative to the hidden link
RING_TOLERANCE = 0.10  # predicted ring time, relative to the replay
FORMULA_RTOL = 1e-9
WORLD_SIZES = (3, 4, 5, 6, 8)
SPIKE_PROBABILITY = 0.05  # of each message, on the shared cluster


# -- the textbook costs (the expectations; pure, unit-tested) -----------------------------------


def lg(p: int) -> int:
    """ceil(log2 p): the rounds of a binomial tree; log2 p exactly when p is a power of two."""
    return (p - 1).bit_length() if p > 1 else 0


def is_power_of_two(p: int) -> bool:
    return p >= 1 and p & (p - 1) == 0


def formula(algorithm: str, p: int, n: float, alpha: float, beta: float) -> float:
    """Allreduce of n bytes over p ranks, every link alpha + n beta (the catalog's formulas)."""
    if algorithm == "ring":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta
    if algorithm == "recursive_doubling":
        return lg(p) * (alpha + n * beta)
    if algorithm == "binomial_tree":  # a reduce to the root, then a broadcast from it
        return 2 * lg(p) * (alpha + n * beta)
    if algorithm == "rabenseifner":  # recursive-halving reduce-scatter + recursive-doubling allgather
        return 2 * lg(p) * alpha + 2 * (p - 1) / p * n * beta
    raise ValueError(f"no formula for {algorithm!r}")


def candidates(p: int) -> tuple[str, ...]:
    """Recursive doubling and Rabenseifner, as modelled, need p to be a power of two."""
    return ALGORITHMS if is_power_of_two(p) else ("ring", "binomial_tree")


def fastest(p: int, n: float, alpha: float, beta: float) -> set[str]:
    """Every candidate whose time ties with the minimum (relative 1e-9)."""
    times = {a: formula(a, p, n, alpha, beta) for a in candidates(p)}
    best = min(times.values())
    return {a for a, t in times.items() if t <= best * (1 + FORMULA_RTOL) + 1e-300}


def crossover(p: int, alpha: float, beta: float) -> float | None:
    """The message size (bytes) where the fastest algorithm turns from latency- to
    bandwidth-optimal, or None if one algorithm wins at every size.

    Powers of two: recursive doubling lg p (a + n b) against Rabenseifner 2 lg p a + 2(p-1)/p n b.
    Otherwise: the binomial tree 2 L (a + n b) against the ring 2(p-1) a + 2(p-1)/p n b."""
    if p < 3:
        return None
    if is_power_of_two(p):
        extra_beta = lg(p) - 2 * (p - 1) / p  # per n beta, what recursive doubling pays more
        saved_alpha = lg(p)  # per alpha, what it pays less
    else:
        extra_beta = 2 * lg(p) - 2 * (p - 1) / p
        saved_alpha = 2 * (p - 1) - 2 * lg(p)
    if extra_beta <= 0 or saved_alpha <= 0:
        return None
    return saved_alpha * alpha / (extra_beta * beta)


def ring_replay_time(links: list[tuple[float, float]], p: int, nbytes: int) -> float:
    """What the replay charges a ring Allreduce of nbytes (divisible by p) on these ring links:
    2(p-1) steps, each as long as the slowest link's alpha + n/p beta (the others wait for it)."""
    chunk = nbytes / p
    return 2 * (p - 1) * max(alpha + chunk * beta for alpha, beta in links)


# -- formatting ---------------------------------------------------------------------------------


def fmt_s(seconds: float) -> str:
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return repr(seconds)
    if abs(seconds) < 1e-3:
        return f"{seconds * 1e6:.3g} us"
    if abs(seconds) < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:g} B"


def fmt_beta(beta: float) -> str:
    if not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta <= 0:
        return f"{beta!r} s/B"
    return f"{beta:.3g} s/B ({1 / beta / 1e9:.3g} GB/s)"


# -- the hidden cluster -------------------------------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    """p devices, each on its own cable to one switch; cable i has its own latency and bandwidth."""

    latency_us: tuple[float, ...]
    bandwidth_gbps: tuple[float, ...]

    @property
    def p(self) -> int:
        return len(self.latency_us)

    def toml(self) -> str:
        devices = ", ".join(f'"dev{i}"' for i in range(self.p))
        nodes = ['  { name = "switch", kind = "switch" },']
        links = []
        for i in range(self.p):
            nodes.append(f'  {{ name = "host{i}", kind = "host", in = "switch" }},')
            nodes.append(f'  {{ name = "dev{i}", kind = "device", in = "host{i}", profile = "gpu" }},')
            links.append(f'  {{ a = "dev{i}", b = "switch", latency_us = {self.latency_us[i]!r}, '
                         f'bandwidth_gbps = {self.bandwidth_gbps[i]!r} }},')
        return "\n".join([
            "format_version = 1",
            'name = "new-cluster"',
            f'description = "the cluster that just arrived: {self.p} devices, one cable each to a switch"',
            f"ranks = [{devices}]",
            "node = [", *nodes, "]",
            "link = [", *links, "]",
            "[profile.gpu]",
            "flops = 19.5e12",
            "memory_gib = 40",
        ]) + "\n"

    def platform(self) -> Platform:
        return parse_platform(self.toml(), where="problem 02's hidden cluster")


def draw_cluster(rng: np.random.Generator) -> Cluster:
    """A cluster class (base latency and bandwidth), then every cable varied around it."""
    p = int(rng.choice(WORLD_SIZES))
    base_us = float(np.exp(rng.uniform(np.log(0.5), np.log(5.0))))
    base_gbps = float(np.exp(rng.uniform(np.log(10.0), np.log(100.0))))
    latency = tuple(round(base_us * float(rng.uniform(0.7, 1.3)), 3) for _ in range(p))
    bandwidth = tuple(round(base_gbps * float(rng.uniform(0.6, 1.2)), 2) for _ in range(p))
    return Cluster(latency, bandwidth)


def ring_links(platform: Platform, p: int) -> list[tuple[float, float]]:
    """(alpha, beta) of every link r -> r + 1 of the ring, as the virtual clock charges them."""
    routes = [platform.route(r, (r + 1) % p) for r in range(p)]
    return [(r.alpha_s, r.beta_s_per_byte) for r in routes]


def draw_sizes(rng: np.random.Generator) -> list[int]:
    """Six message sizes from a few bytes to about half a mebibyte, none of them round."""
    sizes = {int(np.exp2(rng.uniform(lo, lo + 1.5))) for lo in (3, 7, 10.5, 13.5, 16, 18)}
    return sorted(sizes)


def ring_sizes(links: list[tuple[float, float]], p: int) -> tuple[int, int]:
    """Two Allreduce sizes in bytes (float64, divisible by p): one latency-bound (one element
    per rank) and one bandwidth-bound, where every alpha is under a sixth of a chunk's wire time
    on the slowest link, so predicting with the worst alpha and worst beta is within 10%."""
    worst_alpha = max(a for a, _ in links)
    worst_beta = max(b for _, b in links)
    chunk = 8 * math.ceil(6 * worst_alpha / worst_beta / 8)
    return 8 * p, chunk * p


@dataclass(frozen=True)
class Setup:
    cluster: Cluster
    sizes: tuple[int, ...]
    ring: tuple[int, int]
    spike_s: float
    spike_seed: int

    @property
    def p(self) -> int:
        return self.cluster.p


def cluster_setup(seed: int) -> Setup:
    """Everything the measurement launch needs; the same for every check that reads it."""
    rng = np.random.default_rng([seed, 2])
    cluster = draw_cluster(rng)
    sizes = tuple(draw_sizes(rng))
    spike_s = round(float(rng.uniform(50e-6, 150e-6)), 7)
    spike_seed = int(rng.integers(1 << 31))
    links = ring_links(cluster.platform(), cluster.p)
    return Setup(cluster, sizes, ring_sizes(links, cluster.p), spike_s, spike_seed)


# -- what runs on the ranks ---------------------------------------------------------------------


@dataclass
class Fitted:
    """What one rank's measure returned, made plain: alpha and beta, or what was wrong with it."""

    alpha: float
    beta: float
    problem: str = ""  # why the value is unusable ("" when it is a pair of finite numbers)


@dataclass
class Raised:
    """A learner function raised: the exception and where."""

    text: str


@dataclass
class MeasureResult:
    fitted: Fitted
    ring: list[Any] | None  # rank 0: predict("ring", ...) for each ring size, or a Raised
    worst: tuple[float, float] | None  # rank 0: the slowest link's alpha and beta over all ranks


def describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def as_fitted(value: Any) -> Fitted:
    try:
        alpha, beta = value
        alpha, beta = float(alpha), float(beta)
    except (TypeError, ValueError):
        return Fitted(math.nan, math.nan, f"returned {describe(value)}, not a pair (alpha, beta)")
    if not (math.isfinite(alpha) and math.isfinite(beta)):
        return Fitted(alpha, beta, f"returned ({alpha!r}, {beta!r}), which are not finite numbers")
    return Fitted(alpha, beta)


def call(solution: Any, name: str, *args: Any) -> Any:
    """solution.name(*args), or a Raised naming the exception and the learner's line."""
    try:
        return getattr(solution, name)(*args)
    except Exception as exc:  # noqa: BLE001 (the learner's bug: reported per case, the run goes on)
        mine = getattr(solution, "__file__", None)
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == mine]
        where = f" ({Path(frames[-1].filename).name}, line {frames[-1].lineno})" if frames else ""
        return Raised(f"{name} raised {type(exc).__name__}: {exc}{where}")


def as_number(value: Any) -> Any:
    if isinstance(value, Raised):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return Raised(f"returned {describe(value)}, not a number")


def on_cluster(comm, solution, job, *args):
    """The program of the measurement launch: job "measure" or "allreduce"."""
    if job == "allreduce":
        (nbytes,) = args
        data = np.ones(nbytes // 8)
        comm.Allreduce(data, np.empty_like(data), SUM)
        return None
    sizes, ring_nbytes = args
    fitted = as_fitted(solution.measure(comm, list(sizes)))
    # A ring moves at the pace of its slowest link: take the largest alpha and the largest beta
    # that any rank measured (the third entry flags a rank whose value was unusable).
    mine = np.array([0.0, 0.0, 1.0]) if fitted.problem else np.array([fitted.alpha, fitted.beta, 0.0])
    worst = np.empty(3)
    comm.Allreduce(mine, worst, MAX)
    if comm.Get_rank() != 0:
        return MeasureResult(fitted, None, None)
    if worst[2]:
        return MeasureResult(fitted, None, None)
    p = comm.Get_size()
    ring = [as_number(call(solution, "predict", "ring", p, n, float(worst[0]), float(worst[1])))
            for n in ring_nbytes]
    return MeasureResult(fitted, ring, (float(worst[0]), float(worst[1])))


@dataclass(frozen=True)
class Case:
    """One call of predict or choose; n in bytes, alpha in seconds, beta in seconds per byte."""

    algorithm: str  # "" for a choose case
    p: int
    n: int
    alpha: float
    beta: float
    note: str = ""

    def label(self) -> str:
        head = f"{self.algorithm}, " if self.algorithm else ""
        note = f" ({self.note})" if self.note else ""
        return (f"{head}p = {self.p}, n = {fmt_bytes(self.n)}{note}, alpha = {fmt_s(self.alpha)}, "
                f"beta = {self.beta:.3g} s/B")


def on_formulas(comm, solution, predict_cases, choose_cases):
    """The program of the formula launch (one rank): every predict and choose case."""
    predicted = [as_number(call(solution, "predict", c.algorithm, c.p, c.n, c.alpha, c.beta))
                 for c in predict_cases]
    chosen = [call(solution, "choose", c.p, c.n, c.alpha, c.beta) for c in choose_cases]
    return predicted, [c if isinstance(c, (str, Raised))
                       else Raised(f"returned {describe(c)}, not an algorithm name") for c in chosen]


def main(comm, solution, sizes="8,1024,16384,131072,1048576", n="1048576"):
    """A free run (distlab run, mpirun): measure every ring link, then model an allreduce of n
    bytes on the slowest one. Rank 0 returns one line."""
    p, rank = comm.Get_size(), comm.Get_rank()
    size_list = [int(s) for s in sizes.split(",")]
    fitted = as_fitted(solution.measure(comm, size_list))
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


# -- building the launches ----------------------------------------------------------------------


def spike_plan(setup: Setup, seed: int) -> Any:
    return parse_fault_plan({"format_version": 1, "seed": setup.spike_seed, "fault": [
        {"kind": "spike", "latency_s": setup.spike_s, "probability": SPIKE_PROBABILITY,
         "note": "other jobs share the switch: now and then a message waits in a queue"},
    ]}, where=f"02 shared-cluster measurement (seed {seed})")


def measure_run(t: CheckContext) -> tuple[Setup, Platform, Any]:
    """One launch on the hidden cluster: measure (quiet), measure (spikes), two built-in rings."""
    setup = cluster_setup(t.seed)
    platform = setup.cluster.platform()
    p = setup.p
    tasks = [
        Task(ranks=p, args=("measure", setup.sizes, setup.ring),
             label=f"measure on the quiet cluster (p = {p})"),
        Task(ranks=p, args=("measure", setup.sizes, ()), faults=spike_plan(setup, t.seed),
             label=f"measure on the shared cluster with latency spikes (p = {p})"),
        Task(ranks=p, args=("allreduce", setup.ring[0]),
             label=f"the built-in Allreduce of {fmt_bytes(setup.ring[0])}"),
        Task(ranks=p, args=("allreduce", setup.ring[1]),
             label=f"the built-in Allreduce of {fmt_bytes(setup.ring[1])}"),
    ]
    run = t.launch(on_cluster, tasks, online_clock=True, platform=platform)
    return setup, platform, run


def draw_predict_cases(rng: np.random.Generator) -> list[Case]:
    """Per algorithm: p = 1, p = 2, two latency-bound and two bandwidth-bound cases at powers of
    two, an empty message, and (ring and binomial tree) three p that are not powers of two."""

    def draw(algorithm: str, p: int, note: str = "", bound: str = "", n: int | None = None) -> Case:
        alpha = float(np.exp(rng.uniform(np.log(1e-7), np.log(1e-3))))
        beta = float(np.exp(rng.uniform(np.log(1e-11), np.log(1e-8))))
        if n is None:
            # n beta against alpha: far below it (latency-bound), far above (bandwidth-bound)
            lo, hi = {"latency": (-3, -1), "bandwidth": (1, 3)}.get(bound, (-3, 3))
            n = int(min(max(10 ** rng.uniform(lo, hi) * alpha / beta, 1), 1 << 40))
        return Case(algorithm, p, n, alpha, beta, note or (f"{bound}-bound" if bound else ""))

    powers = [4, 8, 16, 32, 64, 128, 256, 1024]
    others = [3, 5, 6, 7, 12, 24, 100, 1000]
    cases = []
    for algorithm in ALGORITHMS:
        cases.append(draw(algorithm, 1, "one rank: nothing to do"))
        cases.append(draw(algorithm, 2))
        for p, bound in zip(rng.choice(powers, size=4, replace=False),
                            ("latency", "latency", "bandwidth", "bandwidth")):
            cases.append(draw(algorithm, int(p), bound=bound))
        cases.append(draw(algorithm, int(rng.choice(powers)), "empty message", n=0))
        if algorithm in ("ring", "binomial_tree"):
            for p in rng.choice(others, size=3, replace=False):
                cases.append(draw(algorithm, int(p), "not a power of two"))
    order = rng.permutation(len(cases))
    return [cases[i] for i in order]


def draw_choose_cases(rng: np.random.Generator) -> list[Case]:
    powers = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    others = [3, 5, 6, 7, 9, 12, 24, 48, 100, 1000]
    ps = [int(p) for p in rng.choice(powers, size=5, replace=False)]
    ps += [int(p) for p in rng.choice(others, size=4, replace=False)]
    cases = []
    for p in ps:
        alpha = float(np.exp(rng.uniform(np.log(5e-7), np.log(5e-5))))
        beta = 8 / (float(np.exp(rng.uniform(np.log(1.0), np.log(400.0)))) * 1e9)
        ns = [int(np.exp2(rng.uniform(lo, lo + 5))) for lo in (0, 5, 10, 15, 20, 25)]
        for n in ns:
            cases.append(Case("", p, n, alpha, beta))
        cross = crossover(p, alpha, beta)
        if cross is not None and 4 <= cross <= 1 << 34:
            cases.append(Case("", p, max(1, int(cross / 1.25)), alpha, beta, "just below the crossover"))
            cases.append(Case("", p, int(cross * 1.25) + 1, alpha, beta, "just above the crossover"))
    return cases


def formula_run(t: CheckContext) -> tuple[list[Case], list[Case], Any]:
    rng = np.random.default_rng([t.seed, 3])
    predict_cases = draw_predict_cases(rng)
    choose_cases = draw_choose_cases(rng)
    run = t.launch(on_formulas, [Task(ranks=1, args=(predict_cases, choose_cases),
                                      label="predict and choose on every case")])
    return predict_cases, choose_cases, run


# -- judging ------------------------------------------------------------------------------------


def close(got: float, want: float, rtol: float) -> bool:
    return abs(got - want) <= rtol * abs(want)


def link_name(r: int, p: int) -> str:
    return f"link {r} -> {(r + 1) % p}"


def judge_link(r: int, p: int, fit: Fitted, links: list[tuple[float, float]]) -> str | None:
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


def fits_of(task_run: Any) -> list[Fitted]:
    return [value.fitted for value in task_run.values]


CHECKS = Checklist()


@CHECKS.check("fitted alpha and beta within 5% of every hidden link", points=4)
def fits_match_links(t: CheckContext) -> None:
    setup, platform, run = measure_run(t)
    p = setup.p
    links = ring_links(platform, p)
    t.say(f"a new cluster of p = {p}: alpha {fmt_s(min(a for a, _ in links))} to "
          f"{fmt_s(max(a for a, _ in links))} per link, bandwidth "
          f"{min(1 / b for _, b in links) / 1e9:.3g} to {max(1 / b for _, b in links) / 1e9:.3g} GB/s; "
          f"sizes {', '.join(fmt_bytes(s) for s in setup.sizes)}")
    worst = 0.0
    for r, fit in enumerate(fits_of(run.tasks[0])):
        verdict = judge_link(r, p, fit, links)
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
    links = ring_links(platform, p)
    t.say(f"the same cluster, shared: {SPIKE_PROBABILITY:.0%} of messages wait an extra "
          f"{fmt_s(setup.spike_s)}")
    quiet = fits_of(run.tasks[0])
    worst = 0.0
    for r, fit in enumerate(fits_of(run.tasks[1])):
        verdict = judge_link(r, p, fit, links)
        if verdict is None:
            worst = max(worst, abs(fit.alpha / links[r][0] - 1), abs(fit.beta / links[r][1] - 1))
            continue
        if judge_link(r, p, quiet[r], links) is None and not fit.problem:
            t.fail(f"with spikes on {SPIKE_PROBABILITY:.0%} of messages, {verdict}. Without "
                   "spikes this link fitted well, so the spikes leaked into the fit: a spike "
                   "only ever adds time, so repeat each size (10 or more round trips) and keep "
                   "the fastest, not the mean (a median works too, over 20 or more)")
        t.fail(f"with spikes on {SPIKE_PROBABILITY:.0%} of messages, {verdict}")
    t.metric("spike_s", setup.spike_s)
    t.metric("worst_fit_error", round(worst, 6))
    t.say(f"every link still fitted within {worst:.2%}")


def judge_prediction(case: Case, got: Any) -> str | None:
    """None when predict returned the formula's value; else the symptom."""
    want = formula(case.algorithm, case.p, case.n, case.alpha, case.beta)
    head = f"predict for {case.label()}"
    if isinstance(got, Raised):
        return f"{head}: {got.text}"
    if close(got, want, FORMULA_RTOL) or (want == 0 and abs(got) < 1e-300):
        return None
    shown_want, shown_got = fmt_s(want), fmt_s(got)
    if shown_want == shown_got:  # close but not equal: show the digits that differ
        shown_want, shown_got = f"{want:.9g} s", f"{got:.9g} s"
    base = f"{head}: expected {shown_want}; saw {shown_got}"
    p, L, a, nb = case.p, lg(case.p), case.alpha, case.n * case.beta
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
    if not is_power_of_two(p) and close(got, want * math.log2(p) / L, 1e-6):
        return (f"{base}: p = {p} is not a power of two, and a binomial tree needs ceil(lg p) = "
                f"{L} rounds, not log2 p = {math.log2(p):.3g}")
    if p == 1:
        return f"{base}: with one rank there is nothing to send"
    return base


@CHECKS.check("predict equals the standard cost formulas", points=3)
def predictions_match(t: CheckContext) -> None:
    predict_cases, _, run = formula_run(t)
    predicted, _ = run.tasks[0].values[0]
    t.say(f"{len(predict_cases)} hidden cases: {', '.join(ALGORITHMS)}; p from 1 to 1024, "
          "latency-bound and bandwidth-bound sizes")
    wrong = []  # (how far off, verdict): the worst case shows the mistake most clearly
    for case, got in zip(predict_cases, predicted):
        verdict = judge_prediction(case, got)
        if verdict:
            want = formula(case.algorithm, case.p, case.n, case.alpha, case.beta)
            off = math.inf if isinstance(got, Raised) or want == 0 else abs(got / want - 1)
            wrong.append((off, verdict))
    if wrong:
        off, verdict = max(wrong, key=lambda w: w[0])
        if len(wrong) > 1:
            worst = "; this one is the farthest off" if math.isfinite(off) else ""
            verdict = f"{verdict} ({len(wrong)} of {len(predict_cases)} cases wrong{worst})"
        t.fail(verdict)
    t.metric("cases", len(predict_cases))
    t.say("every prediction equals its formula")


def judge_choices(cases: list[Case], chosen: list[Any]) -> str | None:
    """None when every choice is a fastest algorithm; else the first wrong one, by symptom."""
    answers = [c for c in chosen if isinstance(c, str)]
    for case, got in zip(cases, chosen):
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
            return (f"{base}. choose answered '{got}' for all {len(cases)} cases, but no algorithm "
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


@CHECKS.check("choose finds the crossover: latency-optimal when small, bandwidth-optimal when large",
              points=3)
def choices_match(t: CheckContext) -> None:
    _, choose_cases, run = formula_run(t)
    _, chosen = run.tasks[0].values[0]
    t.say(f"{len(choose_cases)} hidden cases: {len({c.p for c in choose_cases})} rank counts, "
          "n from 1 B to 1 GiB and just either side of each crossover")
    verdict = judge_choices(choose_cases, chosen)
    if verdict:
        t.fail(verdict)
    shown = 0
    for case in choose_cases:
        cross = crossover(case.p, case.alpha, case.beta)
        if case.note == "just below the crossover" and cross is not None and shown < 2:
            small, large = ("recursive_doubling", "rabenseifner") if is_power_of_two(case.p) \
                else ("binomial_tree", "ring")
            t.say(f"p = {case.p} (alpha {fmt_s(case.alpha)}, {1 / case.beta / 1e9:.3g} GB/s): "
                  f"{small} up to {fmt_bytes(cross)}, {large} above")
            shown += 1
    t.metric("cases", len(choose_cases))


@CHECKS.check("predicted ring time within 10% of the built-in Allreduce's virtual time", points=2)
def ring_prediction_holds(t: CheckContext) -> None:
    setup, platform, run = measure_run(t)
    p = setup.p
    links = ring_links(platform, p)
    result: MeasureResult = run.tasks[0].values[0]
    fits = fits_of(run.tasks[0])
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
        bound = ring_replay_time(links, p, nbytes)
        head = f"Allreduce of {fmt_bytes(nbytes)} ({kind}) on p = {p}"
        if isinstance(got, Raised):
            t.fail(f"{head}: {got.text}")
        t.say(f"{head}: predicted {fmt_s(got)}, virtual {fmt_s(measured)} ({got / measured:.3f}x)")
        if k == 1 and t.clock == "virtual":
            t.performance(measured, bound, task_run)
        if abs(got - measured) <= RING_TOLERANCE * measured:
            continue
        base = (f"{head}: expected a prediction within 10% of the replay's {fmt_s(measured)}; "
                f"predict('ring', {p}, {nbytes}, {alpha:.4g}, {beta:.4g}) returned {fmt_s(got)} "
                f"({got / measured:.2f}x)")
        want = formula("ring", p, nbytes, alpha, beta)
        if not close(got, want, 1e-6):
            t.fail(f"{base}; the ring formula gives {fmt_s(want)} from those values (see the "
                   "predict check)")
        if not (close(alpha, true_alpha, FIT_TOLERANCE) and close(beta, true_beta, FIT_TOLERANCE)):
            t.fail(f"{base}: the slowest link you measured is off (hidden: alpha "
                   f"{fmt_s(true_alpha)}, beta {fmt_beta(true_beta)}); see the first check")
        t.fail(base)
    t.metric("ring_bytes", list(setup.ring))
