"""Problem 02's model and cases: the hidden cluster and the formula cases, drawn from the seed (the
order of the draws is part of what a seed means). The rank program imports this file, so the learner
process can read it: the textbook costs (the expected answers) live in judging.py, which it cannot."""

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from distlab.grading import Platform, Widener, cost, parse_platform

ALGORITHMS = ("ring", "recursive_doubling", "binomial_tree", "rabenseifner")
LATENCY_OPTIMAL = ("recursive_doubling", "binomial_tree")
FORMULA_RTOL = 1e-9
WORLD_SIZES = (3, 4, 5, 6, 8)
SPIKE_PROBABILITY = 0.05  # of each message, on the shared cluster
SHARED_SLOWDOWN = (1.2, 1.6)  # each cable's latency and time per byte on the shared cluster, times the quiet's
CHOOSE_GRID = 2 ** (1 / 3)  # the choose cases' sizes: a geometric grid, 26% apart

Link = tuple[float, float]  # (alpha in seconds, beta in seconds per byte)


# -- helpers ---------------------------------------------------------------------------------------


lg = cost.rounds  # ceil(log2 p): the rounds of a binomial tree; log2 p exactly when p is a power of two


def is_power_of_two(p: int) -> bool:
    return p >= 1 and p & (p - 1) == 0


def fmt_s(seconds: float) -> str:
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return repr(seconds)
    scale, unit = (1e6, "us") if abs(seconds) < 1e-3 else (1e3, "ms") if abs(seconds) < 1 else (1, "s")
    return f"{seconds * scale:.3g} {unit}"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:g} B"


def fmt_beta(beta: float) -> str:
    if not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta <= 0:
        return f"{beta!r} s/B"
    return f"{beta:.3g} s/B ({1 / beta / 1e9:.3g} GB/s)"


# -- the hidden cluster ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    """p devices, each on its own cable to one switch with its own latency and bandwidth; the sizes
    measure is given there, and the spikes and the slower cables of the cluster when it is shared."""

    latency_us: tuple[float, ...]
    bandwidth_gbps: tuple[float, ...]
    sizes: tuple[int, ...]  # six message sizes from a few bytes to about half a MiB, none round
    spike_s: float
    spike_seed: int
    # Shared with other jobs, every cable is slower by its own hidden factor (1.2 to 1.6): its latency
    # times the first, its time per byte times the second. Only a measurement made then can fit it.
    shared_latency: tuple[float, ...]
    shared_beta: tuple[float, ...]

    @property
    def p(self) -> int:
        return len(self.latency_us)

    def platform(self, shared: bool = False) -> Platform:
        """dev i in host i, and a cable from dev i to the switch; ``shared``: every cable slower by its
        hidden factors (the cluster that the spiked measurement runs on, a task's own platform)."""
        latency, bandwidth = self.latency_us, self.bandwidth_gbps
        if shared:
            latency = tuple(us * f for us, f in zip(latency, self.shared_latency))
            bandwidth = tuple(gbps / f for gbps, f in zip(bandwidth, self.shared_beta))
        hosts = [f'  {{ name = "host{i}", kind = "host", in = "switch" }}, '
                 f'{{ name = "dev{i}", kind = "device", in = "host{i}", profile = "gpu" }},'
                 for i in range(self.p)]
        cables = [f'  {{ a = "dev{i}", b = "switch", latency_us = {us!r}, bandwidth_gbps = {gbps!r} }},'
                  for i, (us, gbps) in enumerate(zip(latency, bandwidth))]
        devices = ", ".join(f'"dev{i}"' for i in range(self.p))
        name, what, where = ("shared-cluster", "the same cluster, shared with other jobs", "shared cluster") \
            if shared else ("new-cluster", "the cluster that just arrived", "cluster")
        return parse_platform("\n".join([
            "format_version = 1", f'name = "{name}"',
            f'description = "{what}: {self.p} devices, one cable each to a switch"',
            f"ranks = [{devices}]", "node = [", '  { name = "switch", kind = "switch" },', *hosts, "]",
            "link = [", *cables, "]", "[profile.gpu]", "flops = 19.5e12", "memory_gib = 40",
        ]) + "\n", where=f"problem 02's hidden {where}")

    @staticmethod
    def ring_links(platform: Platform, p: int) -> list[Link]:
        return [(route.alpha_s, route.beta_s_per_byte)
                for route in (platform.route(r, (r + 1) % p) for r in range(p))]

    @cached_property
    def links(self) -> list[Link]:
        """(alpha, beta) of every link r -> r + 1 of the ring, as the virtual clock charges them."""
        return self.ring_links(self.platform(), self.p)

    @cached_property
    def shared_links(self) -> list[Link]:
        """The same links on the shared cluster: each 1.2 to 1.6 times slower, by hidden amounts."""
        return self.ring_links(self.platform(shared=True), self.p)

    @property
    def slowest(self) -> Link:
        """The largest alpha and the largest beta of any link: the pace a ring moves at."""
        return max(a for a, _ in self.links), max(b for _, b in self.links)

    @cached_property
    def ring(self) -> tuple[int, int]:
        """Two Allreduce sizes (float64, divisible by p): one element per rank, and one where every alpha
        is under a sixth of a chunk's wire time on the slowest link, so predicting from it is within 10%."""
        worst_alpha, worst_beta = self.slowest
        return 8 * self.p, 8 * math.ceil(6 * worst_alpha / worst_beta / 8) * self.p


def hidden_cluster(seed: int) -> Cluster:
    """A cluster class (base latency and bandwidth), every cable varied around it; then the sizes, the
    spikes, and last (so that the quiet cluster of a seed stays what it was) how much slower each cable
    is when the cluster is shared."""
    rng, widen = np.random.default_rng([seed, 2]), Widener(seed, 2)
    p = int(rng.choice(WORLD_SIZES))
    base_us = float(np.exp(rng.uniform(np.log(0.5), np.log(5.0))))
    base_gbps = float(np.exp(rng.uniform(np.log(10.0), np.log(100.0))))
    latency = tuple(round(base_us * float(rng.uniform(0.7, 1.3)), 3) for _ in range(p))
    bandwidth = tuple(round(base_gbps * float(rng.uniform(0.6, 1.2)), 2) for _ in range(p))
    sizes = tuple(sorted({int(np.exp2(rng.uniform(lo, lo + 1.5))) for lo in (3, 7, 10.5, 13.5, 16, 18)}))
    spike_s, spike_seed = round(float(rng.uniform(50e-6, 150e-6)), 7), widen(int(rng.integers(1 << 31)))
    shared_latency = tuple(round(float(rng.uniform(*SHARED_SLOWDOWN)), 3) for _ in range(p))
    shared_beta = tuple(round(float(rng.uniform(*SHARED_SLOWDOWN)), 3) for _ in range(p))
    return Cluster(latency, bandwidth, sizes, spike_s, spike_seed, shared_latency, shared_beta)


@dataclass(frozen=True)
class Measure:
    """The learner's measure on every rank: the sizes to time, and nothing of the ring sizes the check
    predicts later (those follow from the slowest link, and reach the learner only after measuring,
    in the check's own launch: see RingPrediction)."""

    sizes: tuple[int, ...]


@dataclass(frozen=True)
class Allreduce:
    """The built-in Allreduce of nbytes (float64), whose replay the ring prediction must match."""

    nbytes: int


# -- the formula cases ----------------------------------------------------------------------------


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

    def for_rank(self, rank: int) -> "Case":
        """What the rank program is handed: the arguments of the call, not the checker's note (such as
        "just below the crossover", which would tell choose its answer)."""
        return replace(self, note="")


class Choice(Case):
    """A case of choose (the other cases are of predict)."""


class RingPrediction(Case):
    """predict('ring', ...) at one of the built-in Allreduce's sizes, from the slowest link as the
    checker reads it off every rank's fit (never a value the learner process hands over)."""


def draw_predict_cases(rng: np.random.Generator) -> list[Case]:
    """Per algorithm: p = 1, p = 2, two latency- and two bandwidth-bound cases at powers of two, an empty
    message, and (ring and binomial tree) three p that are not powers of two."""

    def draw(algorithm: str, p: int, note: str = "", bound: str = "", n: int | None = None) -> Case:
        alpha = float(np.exp(rng.uniform(np.log(1e-7), np.log(1e-3))))
        beta = float(np.exp(rng.uniform(np.log(1e-11), np.log(1e-8))))
        if n is None:
            # n beta against alpha: far below it (latency-bound), far above (bandwidth-bound)
            lo, hi = {"latency": (-3, -1), "bandwidth": (1, 3)}.get(bound, (-3, 3))
            n = int(min(max(10 ** rng.uniform(lo, hi) * alpha / beta, 1), 1 << 40))
        return Case(algorithm, p, n, alpha, beta, note or (f"{bound}-bound" if bound else ""))

    powers, others = [4, 8, 16, 32, 64, 128, 256, 1024], [3, 5, 6, 7, 12, 24, 100, 1000]
    bounds = ("latency", "latency", "bandwidth", "bandwidth")
    cases = []
    for algorithm in ALGORITHMS:
        cases += [draw(algorithm, 1, "one rank: nothing to do"), draw(algorithm, 2)]
        drawn = rng.choice(powers, size=4, replace=False)
        cases += [draw(algorithm, int(p), bound=bound) for p, bound in zip(drawn, bounds)]
        cases.append(draw(algorithm, int(rng.choice(powers)), "empty message", n=0))
        if algorithm in ("ring", "binomial_tree"):
            drawn = rng.choice(others, size=3, replace=False)
            cases += [draw(algorithm, int(p), "not a power of two") for p in drawn]
    return [cases[i] for i in rng.permutation(len(cases))]


def draw_choose_cases(rng: np.random.Generator, crossover: Callable[[int, float, float], float | None]
                      ) -> list[Choice]:
    """Nine p, each with its alpha and beta, and for each the sizes of a geometric grid from 1 B to 1 GiB,
    CHOOSE_GRID apart from a random offset: every crossover has a size just below and one just above it
    (``crossover``: judging.crossover, which the checker passes in; the note, which says so, stays out of
    the ranks). No size stands out, so the list the rank holds does not give the crossover away: two sizes
    drawn at it, after six others, did to a choose that read the harness's list."""
    ps = [int(p) for p in rng.choice([2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], size=5, replace=False)]
    ps += [int(p) for p in rng.choice([3, 5, 6, 7, 9, 12, 24, 48, 100, 1000], size=4, replace=False)]
    cases = []
    for p in ps:
        alpha = float(np.exp(rng.uniform(np.log(5e-7), np.log(5e-5))))
        beta = 8 / (float(np.exp(rng.uniform(np.log(1.0), np.log(400.0)))) * 1e9)
        steps = np.arange(rng.uniform(0, 1), math.log(1 << 30, CHOOSE_GRID))
        sizes = sorted({max(1, int(CHOOSE_GRID ** k)) for k in steps})
        cross = crossover(p, alpha, beta)
        below = max((n for n in sizes if cross is not None and n < cross), default=None)
        above = min((n for n in sizes if cross is not None and n > cross), default=None)
        notes = {below: "just below the crossover", above: "just above the crossover"} \
            if below is not None and above is not None else {}
        cases += [Choice("", p, n, alpha, beta, notes.get(n, "")) for n in sizes]
    return cases
