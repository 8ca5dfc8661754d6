"""The cases of problem 08, all drawn from the seed: the hidden runs (Variant: rank count, steps,
gradient, compute, which rank is heavy, which straggles, which link is slow) and the hidden mesh.
A draw where a common wrong sync/compute ratio would land near the job's is drawn again."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from distlab.grading import Platform, Widener, faults, parse_platform

WORLD = 8  # devices in the hidden mesh; variants run on the first p of them
LINK_GBPS, LINK_LATENCY_US = 2.0, 25.0  # a healthy cable (an Ethernet-like fabric), before its spread
LINK_SPREAD = 0.15  # healthy cables: bandwidth within +-15% of LINK_GBPS
SLOW_LINK = (0.15, 0.30)  # a slow link keeps this fraction of its bandwidth (3.3-6.7x slower)
STRAGGLER = (1.5, 3.0)  # a straggler computes this many times longer
NORMAL_WORK = (0.96, 1.04)  # per-rank work of ordinary ranks, times the base compute
HEAVY_WORK = (1.12, 1.18)  # the rank with the biggest shard: natural imbalance, not a fault
LIGHT_WORK = (0.85, 0.90)  # the rank with the smallest shard
STEP_NOISE = 0.04  # each step's compute varies by +-4%
RATIO_TOLERANCE = 0.03  # the checked sync/compute ratio: within 3% of the replay's


@dataclass(frozen=True)
class Variant:
    """One hidden run: the job, its natural imbalance and the faults slipped into it."""

    name: str  # "healthy", "straggler", "slow link", "both"
    p: int
    steps: int
    grad_elems: int  # float32 gradient exchanged every step
    compute: tuple[tuple[float, ...], ...]  # declared seconds per rank and step (before faults)
    straggler: int | None = None
    factor: float = 1.0  # the straggler's slowdown
    slow_link: tuple[int, int] | None = None
    link_factor: float = 1.0  # fraction of bandwidth the slow link keeps
    probed: bool = True
    exchange: str = "direct"  # the gradient exchange: "direct" (checks, every cable) or "ring"

    def label(self) -> str:
        parts = [f"variant '{self.name}' (p = {self.p}, {self.steps} steps"]
        if self.straggler is not None:
            parts.append(f"rank {self.straggler} computes {self.factor:.2f}x longer")
        if self.slow_link is not None:
            parts.append(f"link {self.slow_link[0]}-{self.slow_link[1]} at {self.link_factor:.2f}x bandwidth")
        if self.straggler is None and self.slow_link is None:
            parts.append("no fault")
        return ", ".join(parts) + ")"

    def fault_plan(self, seed: int) -> faults.FaultPlan | None:
        entries = []
        if self.straggler is not None:
            entries.append(faults.slow(rank=self.straggler, factor=self.factor, note="a straggler"))
        if self.slow_link is not None:
            entries.append(faults.bandwidth(factor=self.link_factor, note="a slow link",
                                            groups=[[end] for end in self.slow_link]))
        return faults.plan(*entries, seed=seed, where=f"08 {self.name}") if entries else None

    def for_rank(self, rank: int) -> Part:
        """What rank ``rank``'s process is handed (runtime/rank/views.py): its own declared compute
        and the job's shape, never the name, the straggler or the slow link. Those are facts about
        the whole run that diagnose() must find: the agents apply them as faults (a straggler's
        rank computes longer, the slow cable moves bytes slower), and only the checker knows them."""
        return Part(self.p, self.steps, self.grad_elems, rank, self.compute[rank], self.probed, self.exchange)

    def declared(self, rank: int) -> tuple[float, ...]:
        """The compute seconds rank ``rank`` declares per step as the replay times them: the
        harness's, times the straggler's factor on the straggler (its `slow` fault)."""
        factor = self.factor if rank == self.straggler else 1.0
        return tuple(seconds * factor for seconds in self.compute[rank])


@dataclass(frozen=True)
class Part:
    """One rank's share of a Variant: all its harness code needs to behave (run_variant)."""

    p: int
    steps: int
    grad_elems: int
    rank: int
    compute: tuple[float, ...]  # this rank's declared seconds per step (a straggler's agent slows them)
    probed: bool = True
    exchange: str = "direct"


@dataclass(frozen=True)
class Hidden:
    """Everything a session hides: the mesh's cable speeds and the variants run on it."""

    mesh_seed: int
    variants: tuple[Variant, ...]  # probed runs, each with its own fault plan
    twin: Variant  # the healthy job on every rank again, without probes: the baseline of the overhead


def compute_table(p: int, steps: int, base_s: float,
                  rng: np.random.Generator) -> tuple[tuple[tuple[float, ...], ...], list[int]]:
    """Declared compute per rank and step (one heavy rank, one light, the rest ordinary); ordinary ranks."""
    work = rng.uniform(*NORMAL_WORK, size=p)
    heavy, light = (int(r) for r in rng.choice(p, size=2, replace=False))
    work[heavy] = rng.uniform(*HEAVY_WORK)
    work[light] = rng.uniform(*LIGHT_WORK)
    noise = rng.uniform(-STEP_NOISE, STEP_NOISE, size=(p, steps))
    table = base_s * work[:, None] * (1 + noise)
    ordinary = [r for r in range(p) if r not in (heavy, light)]
    return tuple(tuple(float(x) for x in row) for row in table), ordinary


def make_variant(name: str, p: int, rng: np.random.Generator, straggler: bool = False,
                 slow_link: bool = False) -> Variant:
    steps = int(rng.integers(6, 11))
    grad_elems = int(rng.integers(32, 64)) * 1024  # 128-252 KiB of float32
    base_s = float(rng.uniform(0.6, 1.5)) * 1e-3
    table, ordinary = compute_table(p, steps, base_s, rng)
    v = Variant(name, p, steps, grad_elems, table)
    if straggler:  # an ordinary rank: slowed 1.5x, it stands at least ~1.4x above the median
        v = replace(v, straggler=int(rng.choice(ordinary)), factor=round(float(rng.uniform(*STRAGGLER)), 3))
    if slow_link:  # any pair: the gradient exchange uses every cable
        i, j = sorted(int(x) for x in rng.choice(p, size=2, replace=False))
        v = replace(v, slow_link=(i, j), link_factor=round(float(rng.uniform(*SLOW_LINK)), 3))
    return v


def hidden(seed: int) -> Hidden:
    """The same variants for every check of a session (so they share one launch). Drawn again
    until every look-alike of the ratio stands at least twice the tolerance from the job's on
    each variant with a straggler (about 1 draw in 8 is; a healthy job's ranks all wait alike,
    so there no look-alike can stand apart)."""
    rng, widen = np.random.default_rng([seed, 8]), Widener(seed, 8)
    while True:
        small = [int(p) for p in rng.permutation([6, 7])]
        variants = (
            make_variant("healthy", WORLD, rng),
            make_variant("straggler", WORLD, rng, straggler=True),
            make_variant("slow link", WORLD, rng, slow_link=True),
            make_variant("both", small[0], rng, straggler=True, slow_link=True),
            make_variant("healthy", small[1], rng),
        )
        h = Hidden(widen(int(rng.integers(1 << 31))), variants, replace(variants[0], probed=False))
        if separation(h) >= 2 * RATIO_TOLERANCE:
            return shuffled(h, seed)


def shuffled(h: Hidden, seed: int) -> Hidden:
    """The variants in an order of the seed's own: one learner process runs them all, and in a fixed
    order its diagnose() could answer by counting its calls (an outside tester's attack: 14/14 naming
    the straggler on the 2nd and 4th calls, none elsewhere)."""
    order = np.random.default_rng([seed, 8, 1]).permutation(len(h.variants))
    return replace(h, variants=tuple(h.variants[int(i)] for i in order))


def look_alikes(compute: np.ndarray, sync: np.ndarray) -> dict[str, float]:
    """Common wrong answers for the job's ratio sum(sync) / sum(compute), from (p, steps) tables."""
    return {"rank 0's own ratio": float(sync[0].sum() / compute[0].sum()),
            "the mean of the per-rank ratios": float(np.mean(sync.sum(axis=1) / compute.sum(axis=1))),
            "sync over sync + compute (a fraction of the time, not a ratio)":
                float(sync.sum() / (sync.sum() + compute.sum()))}


def separation(h: Hidden) -> float:
    """The nearest look-alike's distance from the job's ratio, relative, on variants with a straggler."""
    platform, gaps = mesh(h.mesh_seed), []
    for v in (v for v in h.variants if v.straggler is not None):
        compute, sync = replayed(v, platform)
        ratio = sync.sum() / compute.sum()
        gaps += [abs(wrong - ratio) / ratio for wrong in look_alikes(compute, sync).values()]
    return float(min(gaps))


def replayed(v: Variant, platform: Platform) -> tuple[np.ndarray, np.ndarray]:
    """(compute, sync) per rank and step as the replay times them, to first order: declared
    compute (the straggler's times its factor), then the direct exchange's two phases, each
    message on its own cable (the slow one at its fraction of the bandwidth)."""
    compute = np.array(v.compute)
    if v.straggler is not None:
        compute[v.straggler] *= v.factor
    routes = [[platform.route(j, r) for r in range(v.p)] for j in range(v.p)]
    alpha = np.array([[route.alpha_s for route in row] for row in routes])
    beta = np.array([[route.beta_s_per_byte for route in row] for row in routes])
    if v.slow_link is not None:
        i, j = v.slow_link
        beta[i, j], beta[j, i] = beta[i, j] / v.link_factor, beta[j, i] / v.link_factor
    nbytes = 4 * np.diff(np.linspace(0, v.grad_elems, v.p + 1).astype(int))
    to_owner = alpha + beta * nbytes[None, :]  # reduce-scatter: rank j sends rank r's chunk
    from_owner = alpha + beta * nbytes[:, None]  # allgather: rank j sends its own chunk
    np.fill_diagonal(to_owner, 0.0)
    np.fill_diagonal(from_owner, 0.0)
    sync, start = np.zeros_like(compute), np.zeros(v.p)
    for k in range(v.steps):
        done = start + compute[:, k]
        reduced = (done[:, None] + to_owner).max(axis=0)
        start = (reduced[:, None] + from_owner).max(axis=0)
        sync[:, k] = start - done
    return compute, sync


def harness_training(v: Variant, rank: int) -> list[tuple[Any, ...]]:
    """The harness's training without probes as rank ``rank``'s agent records it, call by call up to its
    "trained" mark, in judging.recorded()'s terms. Per step run_variant marks "step", declares its compute, marks
    "sync", then each phase of direct_allreduce posts a receive from every peer and a send to every peer
    (tag 11: the peer's chunk of the gradient out, this rank's in; tag 12: this rank's summed chunk out,
    the peer's in) and waits for them all."""
    chunk = [int(n) for n in 4 * np.diff(np.linspace(0, v.grad_elems, v.p + 1).astype(int))]
    peers = [r for r in range(v.p) if r != rank]
    calls: list[tuple[Any, ...]] = []
    for seconds in v.declared(rank):
        calls += [("mark", "step"), ("compute", "forward+backward", seconds), ("mark", "sync")]
        calls += [("recv", r, 11, chunk[rank]) for r in peers] + [("send", r, 11, chunk[r]) for r in peers]
        calls.append(("wait", tuple((r, 11) for r in peers)))
        calls += [("recv", r, 12, chunk[r]) for r in peers] + [("send", r, 12, chunk[rank]) for r in peers]
        calls.append(("wait", tuple((r, 12) for r in peers)))
    return calls + [("mark", "trained")]


def mesh_toml(seed: int) -> str:
    """The hidden cluster: WORLD devices, a cable between every two, speeds spread by +-15%."""
    rng = np.random.default_rng([seed, 88])
    lines = ["format_version = 1", 'name = "mesh-8"',
             'description = "8 accelerators, a direct cable between every two; cable speeds differ"',
             "ranks = [" + ", ".join(f'"acc{r}"' for r in range(WORLD)) + "]",
             "[profile.acc]", "flops = 50e12", "memory_gib = 40",
             "[[node]]", 'name = "box"', 'kind = "host"']
    for r in range(WORLD):
        lines += ["[[node]]", f'name = "acc{r}"', 'kind = "device"', 'in = "box"', 'profile = "acc"']
    for i in range(WORLD):
        for j in range(i + 1, WORLD):
            gbps = LINK_GBPS * rng.uniform(1 - LINK_SPREAD, 1 + LINK_SPREAD)
            latency = LINK_LATENCY_US * rng.uniform(0.9, 1.1)
            lines += ["[[link]]", f'a = "acc{i}"', f'b = "acc{j}"', f"latency_us = {latency:.4f}",
                      f"bandwidth_gbps = {gbps:.4f}"]
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=8)  # hidden() reads it too, to draw again
def mesh(seed: int) -> Platform:
    return parse_platform(mesh_toml(seed), "08 hidden mesh")
