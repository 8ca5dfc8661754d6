"""Checks for problem 08, find the bottleneck.

The story: a training loop written here (declared compute, then an allreduce of the gradient by
point-to-point messages, a direct reduce-scatter and allgather that uses every cable) runs on 6 to
8 ranks of a hidden cluster: a full mesh of cables whose speeds differ by up to 15%, with ranks
whose work differs by up to ~20% (uneven data shards).
Into some runs we slip a straggler (a `slow` fault: one rank computes 1.5-3x longer), a slow
link (a `bandwidth` fault between two ranks: their cable keeps 15-30% of its bandwidth), both,
or nothing. The learner's probes time each step; their `diagnose()` must name exactly what we hid.

Ground truth is the replay of the same run (the virtual clock, computed here from the events the
ranks recorded), never what the ranks say:
- per step and rank, compute = from the "step" mark to the "sync" mark, sync = from the "sync"
  mark to the next "step" (or "trained") mark: the harness's marks bracket exactly the phases the
  probes wrap;
- sync/compute ratio = the sum of sync over every rank and step / the sum of compute over every
  rank and step (the training phase of TaskRun.replay()'s comm_s / compute_s);
- probe overhead = training makespan (the last "trained" mark) with probes / without probes - 1,
  the two runs being the same variant, both run by this file's program.

Hidden variants: every number above comes from the seed (rank counts 6-8, steps, gradient size,
compute, which rank is heavy, which rank straggles and by how much, which link is slow and by how
much, and the cable speeds of the mesh), so a diagnosis cannot be hard-coded. All of it runs in
one launch: the variants are tasks with their own fault plans on the same hidden mesh.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from distlab import Request
from distlab.grading import CheckContext, Checklist, Task, parse_fault_plan
from distlab.platforms import Platform, parse_platform
from distlab.runtime.chrome import validate_chrome_trace
from distlab.runtime.stats import CommStats

WORLD = 8  # devices in the hidden mesh; variants run on the first p of them
LINK_GBPS, LINK_LATENCY_US = 2.0, 25.0  # a healthy cable (an Ethernet-like fabric), before its spread
LINK_SPREAD = 0.15  # healthy cables: bandwidth within +-15% of LINK_GBPS
SLOW_LINK = (0.15, 0.30)  # a slow link keeps this fraction of its bandwidth (3.3-6.7x slower)
STRAGGLER = (1.5, 3.0)  # a straggler computes this many times longer
NORMAL_WORK = (0.96, 1.04)  # per-rank work of ordinary ranks, times the base compute
HEAVY_WORK = (1.12, 1.18)  # the rank with the biggest shard: natural imbalance, not a fault
LIGHT_WORK = (0.85, 0.90)  # the rank with the smallest shard
STEP_NOISE = 0.04  # each step's compute varies by +-4%
SPAN_TOLERANCE = 0.02  # probes: each duration within 2% (+ 0.1 us) of the replay's
RATIO_TOLERANCE = 0.10  # the sync/compute ratio within 10% of the replay's
MAX_OVERHEAD = 0.03  # probes may add at most 3% to the training's virtual time


# -- the variants ---------------------------------------------------------------------------------


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
            i, j = self.slow_link
            parts.append(f"link {i}-{j} at {self.link_factor:.2f}x bandwidth")
        if self.straggler is None and self.slow_link is None:
            parts.append("no fault")
        return ", ".join(parts) + ")"

    def fault_plan(self, seed: int) -> Any:
        faults: list[dict[str, Any]] = []
        if self.straggler is not None:
            faults.append({"kind": "slow", "rank": self.straggler, "factor": self.factor,
                           "note": "a straggler"})
        if self.slow_link is not None:
            i, j = self.slow_link
            faults.append({"kind": "bandwidth", "groups": [[i], [j]], "factor": self.link_factor,
                           "note": "a slow link"})
        if not faults:
            return None
        return parse_fault_plan({"format_version": 1, "seed": seed, "fault": faults},
                                where=f"08 {self.name}")


@dataclass(frozen=True)
class Hidden:
    """Everything a session hides: the mesh's cable speeds and the variants run on it."""

    mesh_seed: int
    variants: tuple[Variant, ...]  # probed runs, each with its own fault plan
    twin: Variant  # variants[0] again, without probes: the baseline of the overhead


def compute_table(p: int, steps: int, base_s: float,
                  rng: np.random.Generator) -> tuple[tuple[tuple[float, ...], ...], list[int]]:
    """Declared compute per rank and step (one heavy rank, one light one, the rest ordinary),
    and the ordinary ranks."""
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
    """The same variants for every check of a session (so they share one launch)."""
    rng = np.random.default_rng([seed, 8])
    small = [int(p) for p in rng.permutation([6, 7])]
    variants = (
        make_variant("healthy", WORLD, rng),
        make_variant("straggler", WORLD, rng, straggler=True),
        make_variant("slow link", WORLD, rng, slow_link=True),
        make_variant("both", small[0], rng, straggler=True, slow_link=True),
        make_variant("healthy", small[1], rng),
    )
    return Hidden(int(rng.integers(1 << 31)), variants, replace(variants[0], probed=False))


def mesh_toml(seed: int) -> str:
    """The hidden cluster: WORLD devices, a cable between every two, speeds spread by +-15%."""
    rng = np.random.default_rng([seed, 88])
    lines = [
        "format_version = 1",
        'name = "mesh-8"',
        'description = "8 accelerators, a direct cable between every two; cable speeds differ"',
        "ranks = [" + ", ".join(f'"acc{r}"' for r in range(WORLD)) + "]",
        "[profile.acc]",
        "flops = 50e12",
        "memory_gib = 40",
        "[[node]]",
        'name = "box"',
        'kind = "host"',
    ]
    for r in range(WORLD):
        lines += ["[[node]]", f'name = "acc{r}"', 'kind = "device"', 'in = "box"', 'profile = "acc"']
    for i in range(WORLD):
        for j in range(i + 1, WORLD):
            gbps = LINK_GBPS * rng.uniform(1 - LINK_SPREAD, 1 + LINK_SPREAD)
            latency = LINK_LATENCY_US * rng.uniform(0.9, 1.1)
            lines += ["[[link]]", f'a = "acc{i}"', f'b = "acc{j}"', f"latency_us = {latency:.4f}",
                      f"bandwidth_gbps = {gbps:.4f}"]
    return "\n".join(lines) + "\n"


def mesh(seed: int) -> Platform:
    return parse_platform(mesh_toml(seed), "08 hidden mesh")


# -- what runs on every rank ----------------------------------------------------------------------


@dataclass
class RankResult:
    report: Any  # rank 0: what diagnose() returned, as plain data; other ranks: None
    trace_json: str | None  # rank 0: the report's "trace" through json.dumps, as a file holds it
    trace_error: str  # why json.dumps failed, if it did
    trained: CommStats  # this rank's counters for the training phase alone


def ring_allreduce(comm: Any, buf: np.ndarray) -> None:
    """Ring reduce-scatter then ring allgather, one Sendrecv per step (the free run's exchange:
    on a platform with one port per rank, such as the laptop, its flows never share a link, so
    the probes' online clock and the replay agree)."""
    p, rank = comm.Get_size(), comm.Get_rank()
    if p == 1:
        return
    bounds = np.linspace(0, buf.size, p + 1).astype(int)
    right, left = (rank + 1) % p, (rank - 1) % p
    incoming = np.empty(int(np.max(np.diff(bounds))), dtype=buf.dtype)

    def chunk(i: int) -> np.ndarray:
        return buf[bounds[i % p] : bounds[i % p + 1]]

    for step in range(p - 1):
        mine = chunk(rank - step - 1)
        comm.Sendrecv(chunk(rank - step), dest=right, recvbuf=incoming[: mine.size], source=left)
        mine += incoming[: mine.size]
    for step in range(p - 1):
        comm.Sendrecv(chunk(rank + 1 - step), dest=right, recvbuf=chunk(rank - step), source=left)


def direct_allreduce(comm: Any, buf: np.ndarray) -> None:
    """Direct reduce-scatter then allgather: every rank sends chunk j to rank j at once, sums
    what arrives for its own chunk, then sends its summed chunk to everyone. On a mesh each
    pair has its own cable, so both phases take one message time: a slow cable slows them."""
    p, rank = comm.Get_size(), comm.Get_rank()
    if p == 1:
        return
    bounds = np.linspace(0, buf.size, p + 1).astype(int)
    chunks = [buf[bounds[i] : bounds[i + 1]] for i in range(p)]
    mine = chunks[rank]
    inbox = np.empty((p, mine.size), dtype=buf.dtype)
    peers = [r for r in range(p) if r != rank]
    requests = [comm.Irecv(inbox[r], source=r, tag=11) for r in peers]
    requests += [comm.Isend(chunks[r], dest=r, tag=11) for r in peers]
    Request.Waitall(requests)
    for r in peers:
        mine += inbox[r]
    requests = [comm.Irecv(chunks[r], source=r, tag=12) for r in peers]
    requests += [comm.Isend(mine, dest=r, tag=12) for r in peers]
    Request.Waitall(requests)


def plain(value: Any, depth: int = 0) -> Any:
    """The learner's answer as data the checker can unpickle (their classes stay on the rank)."""
    if depth > 20:
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.copy() if value.dtype.kind in "biuf" else plain(value.tolist(), depth + 1)
    if isinstance(value, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(plain(v, depth + 1) for v in value)
    if isinstance(value, (list, set, frozenset)):
        return [plain(v, depth + 1) for v in value]
    try:  # a torch tensor
        return np.asarray(value.detach().cpu().numpy()).copy()
    except AttributeError:
        return repr(value)


def run_training(comm: Any, solution: Any, v: Variant) -> Any:
    """The job: steps of compute and gradient exchange, the learner's probes around each phase."""
    rank = comm.Get_rank()
    grad = np.zeros(v.grad_elems, dtype=np.float32)
    probes = solution.Probes(comm) if v.probed else None
    for step in range(v.steps):
        comm.mark("step")
        grad[:] = 1.0 / (rank + step + 1)  # this step's gradient (its values do not matter here)
        if probes is not None:
            probes.start("compute")
        comm.compute(seconds=v.compute[rank][step], label="forward+backward")
        if probes is not None:
            probes.stop("compute")
        comm.mark("sync")
        if probes is not None:
            probes.start("sync")
        (ring_allreduce if v.exchange == "ring" else direct_allreduce)(comm, grad)
        if probes is not None:
            probes.stop("sync")
    comm.mark("trained")
    return probes, comm.stats.snapshot()


def run_variant(comm: Any, solution: Any, v: Variant) -> RankResult:
    """One variant: train with probes, then the learner's diagnose() (collective)."""
    probes, trained = run_training(comm, solution, v)
    if probes is None:
        return RankResult(None, None, "", trained)
    report = plain(solution.diagnose(comm, probes))
    if comm.Get_rank() != 0:
        return RankResult(None, None, "", trained)
    trace_json, trace_error = None, ""
    if isinstance(report, dict) and "trace" in report:
        try:
            trace_json = json.dumps(report.pop("trace"))
        except (TypeError, ValueError) as exc:
            trace_error = f"{type(exc).__name__}: {exc}"
    return RankResult(report, trace_json, trace_error, trained)


def main(comm: Any, solution: Any, steps: str = "12", straggler: str = "-1", factor: str = "2.0",
         grad_kib: str = "1024", compute_ms: str = "1.0") -> Any:
    """A free run (distlab run 08): one job with probes, then diagnose(); rank 0 sums it up.
    The gradients go around a ring here (the checks use a direct exchange on their mesh).

    straggler=R factor=F make rank R declare F times more compute (a straggler); a slow link comes
    from a fault plan (--faults), e.g. a `bandwidth` fault with groups = [[2], [3]]."""
    p, rank = comm.Get_size(), comm.Get_rank()
    base, _ = compute_table(p, int(steps), float(compute_ms) * 1e-3, np.random.default_rng(8))
    table = [list(row) for row in base]
    if 0 <= int(straggler) < p:
        table[int(straggler)] = [float(factor) * x for x in table[int(straggler)]]
    v = Variant("free run", p, int(steps), int(grad_kib) * 256, tuple(tuple(row) for row in table),
                exchange="ring")
    result = run_variant(comm, solution, v)
    if rank != 0:
        return None
    report = result.report if isinstance(result.report, dict) else {}
    ratio = report.get("sync_compute_ratio")
    ratio_text = f"{ratio:.3f}" if isinstance(ratio, (int, float)) else repr(ratio)
    return (f"stragglers {report.get('stragglers')} · slow links {report.get('slow_links')} · "
            f"sync/compute {ratio_text} over the {steps} training steps (p = {p}; the run's figures "
            "below also count diagnose()'s gather and pings)")


# -- the truth, from the replay -------------------------------------------------------------------


@dataclass
class Truth:
    compute: np.ndarray  # (p, steps) seconds, from the replay
    sync: np.ndarray  # (p, steps)
    trained_s: float  # training makespan: the last rank's "trained" mark

    @property
    def ratio(self) -> float:
        return float(self.sync.sum() / self.compute.sum())

    def compute_over_median(self) -> np.ndarray:
        per_rank = self.compute.mean(axis=1)
        return per_rank / float(np.median(per_rank))


def phase_times(marks: list[tuple[str, float]], steps: int) -> tuple[list[float], list[float], float]:
    """(compute per step, sync per step, end of training) of one rank, from its marks."""
    starts = [t for name, t in marks if name == "step"]
    syncs = [t for name, t in marks if name == "sync"]
    trained = next(t for name, t in marks if name == "trained")
    ends = starts[1:steps] + [trained]
    compute = [syncs[k] - starts[k] for k in range(steps)]
    sync = [ends[k] - syncs[k] for k in range(steps)]
    return compute, sync, trained


def truth_of(task_run: Any, v: Variant) -> Truth:
    played = task_run.replay()
    compute, sync, trained = [], [], []
    for rank in range(v.p):
        c, s, end = phase_times(list(played.marks[rank]), v.steps)
        compute.append(c)
        sync.append(s)
        trained.append(end)
    return Truth(np.array(compute), np.array(sync), max(trained))


# -- reading the learner's answer -----------------------------------------------------------------


@dataclass
class Case:
    variant: Variant
    task_run: Any
    truth: Truth
    report: dict[str, Any] | None
    problem: str  # why report is None, else ""
    rank0: RankResult


def launch_all(t: CheckContext) -> tuple[list[Case], Any]:
    """The one launch of the session (cached after the first check): every variant, then the
    twin; returns the cases and the twin's task run."""
    h = hidden(t.seed)
    tasks = [Task(ranks=v.p, args=(v,), faults=v.fault_plan(t.seed), label=f"the {v.label()}")
             for v in h.variants + (h.twin,)]
    tasks[-1] = replace(tasks[-1], label=f"the {h.twin.label()} without probes")
    run = t.launch(run_variant, tasks, online_clock=True, platform=mesh(h.mesh_seed))
    cases = []
    for v, task_run in zip(h.variants, run.tasks):
        rank0: RankResult = task_run.values[0]
        report, problem = rank0.report, ""
        if not isinstance(report, dict):
            problem = f"diagnose() returned {type(report).__name__} on rank 0, not a dict"
            report = None
        cases.append(Case(v, task_run, truth_of(task_run, v), report, problem, rank0))
    return cases, run.tasks[-1]


def answer(t: CheckContext, case: Case, key: str) -> Any:
    if case.report is None:
        t.fail(f"{case.variant.label()}: {case.problem}")
    assert case.report is not None
    if key not in case.report:
        t.fail(f"{case.variant.label()}: diagnose() returned no {key!r} "
               f"(its keys: {', '.join(map(str, case.report)) or 'none'})")
    return case.report[key]


def ranks_of(t: CheckContext, case: Case, value: Any) -> list[int]:
    try:
        ranks = sorted({int(r) for r in value})
    except (TypeError, ValueError):
        t.fail(f"{case.variant.label()}: 'stragglers' must be a list of ranks; saw {value!r}")
    return ranks


def pairs_of(t: CheckContext, case: Case, value: Any) -> list[tuple[int, int]]:
    try:
        pairs = sorted({(min(int(a), int(b)), max(int(a), int(b))) for a, b in value})
    except (TypeError, ValueError):
        t.fail(f"{case.variant.label()}: 'slow_links' must be a list of pairs (i, j); saw {value!r}")
    return pairs


def spans_of(t: CheckContext, case: Case) -> np.ndarray:
    v = case.variant
    raw = answer(t, case, "spans")
    try:
        spans = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError):
        t.fail(f"{v.label()}: 'spans' is not an array of numbers; saw {type(raw).__name__}")
    want = (v.p, v.steps, 4)
    if spans.shape != want:
        why = []
        if spans.ndim == 3 and spans.shape[1] == 0:
            why.append("the probes recorded no step")
        elif spans.ndim == 3 and spans.shape[1] != v.steps:
            why.append(f"{spans.shape[1]} steps recorded, the job ran {v.steps}")
        if spans.ndim == 3 and spans.shape[0] == 1 and v.p > 1:
            why.append("only rank 0's own spans reached rank 0: the aggregation is missing")
        t.fail(f"{v.label()}: expected rank 0 to hold spans of shape {want} (ranks, steps, "
               f"[compute start, compute end, sync start, sync end]); saw {spans.shape}"
               + "".join(f"; {w}" for w in why))
    return spans


def fmt_ranks(ranks: list[int]) -> str:
    return "[" + ", ".join(map(str, ranks)) + "]"


def fmt_pairs(pairs: list[tuple[int, int]]) -> str:
    return "[" + ", ".join(f"({i}, {j})" for i, j in pairs) + "]"


# -- the checks -----------------------------------------------------------------------------------

CHECKS = Checklist()


@CHECKS.check("probes time compute and sync of every step, gathered on rank 0", points=2)
def probes_match_replay(t: CheckContext) -> None:
    cases, _ = launch_all(t)
    t.say(f"{len(cases)} hidden runs of {', '.join(str(c.variant.p) for c in cases)} ranks on an "
          "8-accelerator mesh; each duration is compared with the replay's")
    worst = 0.0
    for case in cases:
        v, truth = case.variant, case.truth
        spans = spans_of(t, case)
        for phase, got, want in (("compute", spans[..., 1] - spans[..., 0], truth.compute),
                                 ("sync", spans[..., 3] - spans[..., 2], truth.sync)):
            error = np.abs(got - want)
            bad = error > SPAN_TOLERANCE * np.abs(want) + 1e-7
            worst = max(worst, float(np.max(error / np.maximum(np.abs(want), 1e-9))))
            if bad.any():
                rank, step = (int(x) for x in np.argwhere(bad)[0])
                short = bool((got[bad] < want[bad]).all())
                hint = ("read comm.now() right before and after each phase" if not short or
                        phase == "compute" else "the step goes on after your stop(\"sync\"): do "
                        "the probes send or wait during training?")
                t.fail(f"{v.label()}: rank {rank}, step {step}: expected {phase} "
                       f"{want[rank, step] * 1e3:.4f} ms (the replay, within 2%); the probes say "
                       f"{got[rank, step] * 1e3:.4f} ms ({int(bad.sum())} of {bad.size} {phase} "
                       f"durations off): {hint}")
    t.metric("worst_relative_error", round(worst, 6))
    t.say(f"every rank's per-step compute and sync agree with the replay (worst {worst:.2%})")


@CHECKS.check("sync/compute ratio within 10% of the replay's, over all ranks and steps", points=2)
def ratio_matches_replay(t: CheckContext) -> None:
    cases, _ = launch_all(t)
    worst = 0.0
    for case in cases:
        v, want = case.variant, case.truth.ratio
        got = answer(t, case, "sync_compute_ratio")
        if not isinstance(got, (int, float)) or isinstance(got, bool) or not np.isfinite(got):
            t.fail(f"{v.label()}: 'sync_compute_ratio' must be a number; saw {got!r}")
        off = abs(got - want) / want
        worst = max(worst, off)
        if off > RATIO_TOLERANCE:
            rank0 = float(case.truth.sync[0].sum() / case.truth.compute[0].sum())
            hint = ""
            if abs(got - rank0) <= 0.02 * rank0:
                hint = (f": that is rank 0's own ratio ({rank0:.3f}); the job's ratio sums sync and "
                        "compute over every rank")
            elif got == 0:
                hint = ": nothing measured"
            t.fail(f"{v.label()}: expected sync/compute {want:.3f} (sum of sync over sum of compute, "
                   f"every rank and step, from the replay) within 10%; saw {got:.3f}{hint}")
        t.say(f"{v.name}: {got:.3f} (replay {want:.3f})")
    t.metric("worst_ratio_error", round(worst, 4))


@CHECKS.check("diagnose() names exactly the stragglers in every hidden run", points=3)
def stragglers_exact(t: CheckContext) -> None:
    cases, _ = launch_all(t)
    for case in cases:
        v = case.variant
        got = ranks_of(t, case, answer(t, case, "stragglers"))
        want = [v.straggler] if v.straggler is not None else []
        ratio = case.truth.compute_over_median()
        missed = [r for r in want if r not in got]
        extra = [r for r in got if r not in want]
        if missed:
            r = missed[0]
            t.fail(f"{v.label()}: expected stragglers {fmt_ranks(want)}; saw {fmt_ranks(got)}: "
                   f"rank {r} computes {ratio[r]:.2f}x the median rank and was not named")
        if extra:
            outside = [r for r in extra if r >= v.p]
            if outside:
                t.fail(f"{v.label()}: expected stragglers {fmt_ranks(want)}; saw {fmt_ranks(got)}: "
                       f"rank {outside[0]} is not in this run of {v.p} ranks")
            ends = set(v.slow_link or ())
            if ends and set(extra) <= ends:
                t.fail(f"{v.label()}: expected stragglers {fmt_ranks(want)}; saw {fmt_ranks(got)}: "
                       f"{' and '.join(f'rank {r}' for r in extra)} "
                       f"{'are the ends' if len(extra) > 1 else 'is an end'} of the slow link "
                       f"{v.slow_link}, computing only "
                       f"{', '.join(f'{ratio[r]:.2f}x' for r in extra)} the median: a slow link makes "
                       "ranks wait, it does not make them compute slower")
            r = extra[0]
            t.fail(f"{v.label()}: expected stragglers {fmt_ranks(want)}; saw {fmt_ranks(got)}: "
                   f"a false positive: rank {r} computes {ratio[r]:.2f}x the median rank, natural "
                   "imbalance (uneven shards, up to ~1.2x), not a straggler (1.5-3x)")
        t.say(f"{v.name}: stragglers {fmt_ranks(got)}")


@CHECKS.check("diagnose() names exactly the slow links in every hidden run", points=3)
def slow_links_exact(t: CheckContext) -> None:
    cases, _ = launch_all(t)
    for case in cases:
        v = case.variant
        got = pairs_of(t, case, answer(t, case, "slow_links"))
        want = [v.slow_link] if v.slow_link is not None else []
        pings = case.report.get("pings") if case.report is not None else None
        rtt = np.asarray(pings, dtype=np.float64) if pings is not None else np.zeros(0)
        missed = [pair for pair in want if pair not in got]
        extra = [pair for pair in got if pair not in want]
        if missed:
            i, j = missed[0]
            seen = ""
            if rtt.shape == (v.p, v.p) and v.p > 2:
                others = [rtt[a, b] for a in range(v.p) for b in range(a + 1, v.p) if (a, b) != (i, j)]
                typical = float(np.median(others))
                if not rtt.any():
                    seen = "; your pings are all zero"
                elif typical > 0:
                    seen = (f"; your pings show {i}-{j} at {rtt[i, j] / typical:.2f}x the median pair: "
                            "a bandwidth fault leaves latency alone, so only pings of many bytes see it")
            t.fail(f"{v.label()}: expected slow links {fmt_pairs(want)}; saw {fmt_pairs(got)}: "
                   f"link {i}-{j} keeps {v.link_factor:.2f}x of its bandwidth and was not named{seen}")
        if extra:
            i, j = extra[0]
            if not (0 <= i < j < v.p):
                t.fail(f"{v.label()}: expected slow links {fmt_pairs(want)}; saw {fmt_pairs(got)}: "
                       f"({i}, {j}) is not a pair of distinct ranks of this run of {v.p}")
            t.fail(f"{v.label()}: expected slow links {fmt_pairs(want)}; saw {fmt_pairs(got)}: "
                   f"a false positive: cable {i}-{j} is healthy (cables differ by up to 15%); "
                   "were both ends of each ping ready when it was timed?")
        t.say(f"{v.name}: slow links {fmt_pairs(got)}")


def trace_tracks(events: list[Any]) -> dict[tuple[Any, Any], list[dict[str, Any]]]:
    """Complete events ("X") by (pid, tid): the tracks a viewer draws."""
    tracks: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for event in events:
        if isinstance(event, dict) and event.get("ph") == "X":
            tracks.setdefault((event.get("pid"), event.get("tid")), []).append(event)
    return tracks


@CHECKS.check("the Chrome trace loads and has one track per rank", points=2)
def trace_has_a_track_per_rank(t: CheckContext) -> None:
    cases, _ = launch_all(t)
    for case in cases:
        v = case.variant
        if case.report is None:
            t.fail(f"{v.label()}: {case.problem}")
        if case.rank0.trace_json is None and not case.rank0.trace_error:
            t.fail(f"{v.label()}: diagnose() returned no 'trace' (a dict with a traceEvents list)")
        if case.rank0.trace_error:
            t.fail(f"{v.label()}: the trace is not JSON, so no viewer can load it: "
                   f"{case.rank0.trace_error} (use plain floats and ints)")
        trace = json.loads(case.rank0.trace_json or "null")
        problems = validate_chrome_trace(trace)
        if problems:
            t.fail(f"{v.label()}: expected a trace in the Chrome trace event format; "
                   f"{len(problems)} problem(s), the first: {problems[0]}")
        tracks = trace_tracks(trace["traceEvents"])
        if len(tracks) != v.p:
            seen = f"{len(tracks)} track(s) holding complete ('X') events"
            if len(tracks) == 1 and v.p > 1:
                seen = (f"all {len(next(iter(tracks.values())))} spans on one track, where the ranks' "
                        "spans overlap: give each rank its own pid (or tid)")
            t.fail(f"{v.label()}: expected one track (pid, tid) per rank, {v.p} in all; saw {seen}")
        want_totals = sorted(case.truth.compute.sum(axis=1) * 1e6)
        got_totals = []
        for key, spans in sorted(tracks.items(), key=lambda kv: str(kv[0])):
            names = [e.get("name") for e in spans]
            for phase in ("compute", "sync"):
                if names.count(phase) != v.steps:
                    t.fail(f"{v.label()}: expected {v.steps} '{phase}' spans on each rank's track; "
                           f"track pid={key[0]}, tid={key[1]} has {names.count(phase)}")
            got_totals.append(sum(float(e.get("dur", 0)) for e in spans if e.get("name") == "compute"))
        got_totals.sort()
        for got, want in zip(got_totals, want_totals):
            if abs(got - want) > SPAN_TOLERANCE * want + 0.1:
                t.fail(f"{v.label()}: expected each track's 'compute' spans to add up to its rank's "
                       f"compute ({', '.join(f'{w / 1e3:.3f}' for w in want_totals)} ms); saw "
                       f"{', '.join(f'{g / 1e3:.3f}' for g in got_totals)} ms: ts and dur are in "
                       "microseconds")
    t.say(f"{len(cases)} traces, each with one track per rank and a compute and sync span per step")


@CHECKS.check("probes add at most 3% to the training's virtual time", points=2)
def probes_are_cheap(t: CheckContext) -> None:
    cases, twin_run = launch_all(t)
    probed = cases[0]  # the twin is this variant, run without probes
    spans_of(t, probed)  # a probe that measures nothing costs nothing, and is of no use
    bare = truth_of(twin_run, probed.variant)
    overhead = probed.truth.trained_s / bare.trained_s - 1
    extra_calls = (sum(sum(r.trained.calls.values()) for r in probed.task_run.values)
                   - sum(sum(r.trained.calls.values()) for r in twin_run.values))
    t.say(f"{probed.variant.label()}: training took {probed.truth.trained_s * 1e3:.3f} ms with "
          f"probes, {bare.trained_s * 1e3:.3f} ms without ({overhead:+.2%}); "
          f"{extra_calls} extra communication calls during training")
    t.metric("overhead", round(overhead, 5))
    t.metric("extra_calls", extra_calls)
    t.performance(probed.truth.trained_s, bare.trained_s, probed.task_run)
    t.expect(overhead <= MAX_OVERHEAD,
             f"at most {bare.trained_s * (1 + MAX_OVERHEAD) * 1e3:.3f} ms of training (3% over the "
             f"{bare.trained_s * 1e3:.3f} ms without probes)",
             f"{probed.truth.trained_s * 1e3:.3f} ms ({overhead:+.1%}) in the {probed.variant.label()}, "
             f"with {extra_calls} extra communication calls during training: keep the numbers on the rank "
             "and send them once, after the last step")
