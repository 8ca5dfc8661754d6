"""Problem 02's scenario: the hidden cluster and the formula cases, drawn from the session seed.

The cluster (p, every cable's latency and bandwidth), the message sizes that measure is given, the
ring sizes, the latency spikes of the shared cluster, and every case of the predict table and of
the choose grid. They live apart from the checks so that each draw can be read, and replayed, in
one place: the order of the draws is part of what a seed means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from distlab.grading import Platform, check_part, parse_fault_plan, parse_platform

models = check_part(__file__, "models")  # the textbook formulas, and how figures are written
fmt_s, fmt_bytes = models.fmt_s, models.fmt_bytes

WORLD_SIZES = (3, 4, 5, 6, 8)
SPIKE_PROBABILITY = 0.05  # of each message, on the shared cluster


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


def spike_plan(setup: Setup, seed: int) -> Any:
    return parse_fault_plan({"format_version": 1, "seed": setup.spike_seed, "fault": [
        {"kind": "spike", "latency_s": setup.spike_s, "probability": SPIKE_PROBABILITY,
         "note": "other jobs share the switch: now and then a message waits in a queue"},
    ]}, where=f"02 shared-cluster measurement (seed {seed})")


# -- the formula cases --------------------------------------------------------------------------


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
    for algorithm in models.ALGORITHMS:
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
        cross = models.crossover(p, alpha, beta)
        if cross is not None and 4 <= cross <= 1 << 34:
            cases.append(Case("", p, max(1, int(cross / 1.25)), alpha, beta, "just below the crossover"))
            cases.append(Case("", p, int(cross * 1.25) + 1, alpha, beta, "just above the crossover"))
    return cases
