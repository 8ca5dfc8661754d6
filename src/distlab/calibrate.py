"""``distlab calibrate``: measure this machine's transport and write it down as a platform file.

Call order (``run_calibration``):

1. check the arguments and that the output file can be written, before anything is measured;
2. a ping-pong between ranks 0 and 1 (``calibration_ranks.ping_pong``) through distlab's own
   launcher and comm proxy, sizes 8 B to 4 MiB, the median one-way time per size;
3. a least-squares fit of one-way time = alpha + n * beta (``fit_alpha_beta``, made robust to
   sizes a busy machine spoiled by ``robust_fit``);
4. a platform file: ``ranks`` devices on one switch, every route exactly alpha and beta (the star
   of ``platforms.uniform``), loaded back with ``load_platform`` to prove it is valid;
5. problem 03's reference ring allreduce on ``ranks`` real ranks at a few sizes: the analytic
   ring cost and the replay of the run's own trace on the new platform, against the wall time.

The fit and the file writer are pure functions, tested without processes.
"""

from __future__ import annotations

import json
import math
import os
import platform as host_platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import numpy as np
import psutil  # type: ignore[import-untyped]  # no stubs shipped
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import calibration_ranks
from .bank import Bank
from .errors import HarnessError, UsageError
from .platforms import Platform, load_platform
from .platforms.loader import workspace_platforms_dir
from .runtime.clock.collectives_cost import ring_allreduce_time
from .runtime.clock.metrics import format_seconds
from .runtime.clock.replay import replay
from .runtime.jobspec import Job, Task, TaskOutcome, make_job
from .runtime.supervisor import LaunchResult, launch
from .terminal import folding
from .workspace import write_atomically

BACKENDS = ("mpi", "gloo")
RING_PROBLEM = "03"
# Sizes the ping-pong may spoil on a busy machine: a size whose median is more than this factor
# above the fitted line is set aside and the line fitted again (scheduling only ever adds time).
OUTLIER_FACTOR = 2.0
MIN_FIT_POINTS = 4
ROUTE_TOLERANCE = 1e-9  # relative: the file's route must give back the fitted alpha and beta


@dataclass(frozen=True)
class Plan:
    """How much to measure. ``quick`` trades precision for a run of a few seconds (tests)."""

    ping_sizes: tuple[int, ...]
    ping_reps: int
    ping_warmup: int
    ring_elements: tuple[int, ...]  # float64 elements per allreduce
    ring_reps: int
    ring_warmup: int
    matmul_n: int


def powers(first: int, last: int, factor: int) -> tuple[int, ...]:
    """first, first*factor, ... below last, then last itself: the range always ends at ``last``
    (powers of 4 from 8 B step over 4 MiB)."""
    out = []
    size = first
    while size < last:
        out.append(size)
        size *= factor
    return (*out, last)


KIB, MIB = 1024, 1024 * 1024
FULL_PLAN = Plan(
    ping_sizes=powers(8, 4 * MIB, 2), ping_reps=50, ping_warmup=5,
    ring_elements=(64 * KIB // 8, MIB // 8, 8 * MIB // 8), ring_reps=20, ring_warmup=2,
    matmul_n=512,
)
QUICK_PLAN = Plan(
    ping_sizes=powers(8, 4 * MIB, 4), ping_reps=10, ping_warmup=3,
    ring_elements=(64 * KIB // 8, MIB // 8), ring_reps=3, ring_warmup=1,
    matmul_n=256,
)


# -- the fit ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    alpha_s: float  # one-way latency
    beta_s_per_byte: float
    r2: float  # coefficient of determination on the raw times

    def predict(self, nbytes: float) -> float:
        return self.alpha_s + nbytes * self.beta_s_per_byte


def r_squared(x: np.ndarray, y: np.ndarray, alpha: float, beta: float) -> float:
    ss_res = float(np.sum((y - (alpha + beta * x)) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


def fit_alpha_beta(sizes: Sequence[float], times: Sequence[float]) -> Fit:
    """Least-squares line time = alpha + n * beta through (size, one-way time) points.

    Weighted by 1/time, i.e. least squares on *relative* errors: unweighted, the megabyte sizes
    (a thousand times the latency) decide the whole line, and the intercept alpha comes out as
    their noise, far from the small-message latency and sometimes negative."""
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(times, dtype=float)
    if x.shape != y.shape or len(np.unique(x)) < 2:
        raise ValueError("a line needs points at two different sizes at least")
    if not np.all(y > 0):
        raise ValueError("times must be positive")
    beta, alpha = np.polyfit(x, y, 1, w=1.0 / y)
    return Fit(float(alpha), float(beta), r_squared(x, y, float(alpha), float(beta)))


def robust_fit(sizes: Sequence[int], times: Sequence[float]) -> tuple[Fit, list[int]]:
    """The fit, after setting aside, one at a time and worst first, sizes whose median sits more
    than OUTLIER_FACTOR above the line. Returns the fit and the sizes set aside."""
    kept = list(zip(sizes, times))
    dropped: list[int] = []
    while True:
        fit = fit_alpha_beta([s for s, _ in kept], [t for _, t in kept])
        ratios = [_excess(fit, size, t) for size, t in kept]
        worst = int(np.argmax(ratios))
        if ratios[worst] <= OUTLIER_FACTOR or len(kept) <= MIN_FIT_POINTS:
            return fit, sorted(dropped)
        dropped.append(kept.pop(worst)[0])


def _excess(fit: Fit, size: int, measured: float) -> float:
    """How many times the line's prediction ``measured`` is (inf where the line is not positive)."""
    predicted = fit.predict(size)
    return measured / predicted if predicted > 0 else math.inf


# -- the platform file ------------------------------------------------------------------------


@dataclass(frozen=True)
class MachineModel:
    """What the platform file says about this machine."""

    name: str
    description: str
    ranks: int
    alpha_s: float
    beta_s_per_byte: float
    flops: float
    memory_gib: float
    notes: tuple[str, ...] = ()  # comment lines at the top of the file


def _toml_float(value: float) -> str:
    # repr is the shortest text that reads back as the same float, and is valid TOML for any
    # finite value: the file keeps every bit of the fit.
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    return repr(float(value))


def platform_toml(model: MachineModel) -> str:
    """The platform file (format_version 1): a star of ``ranks`` devices around one switch.

    As in ``platforms.uniform``, each device has its own cable to the switch, so the flows of a
    ring never share a directed link, and each cable carries half the latency: a route (two
    cables) has exactly alpha. Both cables have the full bandwidth 1/beta, so a route's
    bottleneck gives exactly beta."""
    latency_us = model.alpha_s / 2 * 1e6
    bandwidth_gbps = 8 / model.beta_s_per_byte / 1e9  # bytes/s -> Gb/s, as the format wants
    devices = [f"cpu{i}" for i in range(model.ranks)]
    lines = [f"# {note}" for note in model.notes]
    lines += [
        "format_version = 1",
        f"name = {json.dumps(model.name)}",
        f"description = {json.dumps(model.description)}",
        f"ranks = [{', '.join(json.dumps(d) for d in devices)}]",
        "",
        "node = [",
        '  { name = "machine", kind = "host" },',
        '  { name = "switch", kind = "switch", in = "machine" },',
        *(
            f'  {{ name = "{d}", kind = "device", in = "switch", profile = "cpu" }},'
            for d in devices
        ),
        "]",
        "",
        "link = [",
        *(
            f'  {{ a = "{d}", b = "switch", latency_us = {_toml_float(latency_us)}, '
            f'bandwidth_gbps = {_toml_float(bandwidth_gbps)}, label = "measured" }},'
            for d in devices
        ),
        "]",
        "",
        "[profile.cpu]",
        'description = "one rank of this machine (flops: a numpy matmul, all cores)"',
        f"flops = {_toml_float(model.flops)}",
        f"memory_gib = {_toml_float(model.memory_gib)}",
    ]
    return "\n".join(lines) + "\n"


def write_platform(path: Path, model: MachineModel) -> Platform:
    """Writes the file atomically and loads it back: what is returned is what a run would read."""
    try:
        write_atomically(path, platform_toml(model))
    except OSError as exc:
        raise UsageError(f"cannot write the platform file {path}: {exc.strerror or exc}") from None
    platform = load_platform(path)
    route = platform.route(0, 1)
    alpha, beta = model.alpha_s, model.beta_s_per_byte
    if not (_close(route.alpha_s, alpha) and _close(route.beta_s_per_byte, beta)):
        raise HarnessError(
            f"{path}: route 0 -> 1 reads back as alpha={route.alpha_s!r}, "
            f"beta={route.beta_s_per_byte!r}, not the fitted {alpha!r}, {beta!r}"
        )
    return platform


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= ROUTE_TOLERANCE * abs(b)


def default_output(backend: str) -> Path:
    """In the workspace's platforms/, where ``--platform calibrated-BACKEND`` finds it by name."""
    return workspace_platforms_dir() / f"calibrated-{backend}.toml"


def platform_option(path: Path) -> str:
    """What to give --platform for the file at ``path``: its name if lookup finds it, else the path."""
    from .platforms.loader import workspace_names

    if path.parent == workspace_platforms_dir() and path.suffix == ".toml" and path.stem in workspace_names():
        return path.stem
    return str(path)


def check_writable(path: Path) -> None:
    """Fails now, in one sentence, if ``path`` cannot be written: not after the measurements."""
    if path.is_dir():
        raise UsageError(f"cannot write the platform file {path}: it is a folder")
    blocker = next((p for p in path.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise UsageError(f"cannot write the platform file {path}: {blocker} is a file, not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A real trial file, because os.access says yes to root whatever the permissions are.
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}."):
            pass
    except OSError as exc:
        raise UsageError(f"cannot write the platform file {path}: {exc.strerror or exc}") from None


# -- measurements on real ranks ---------------------------------------------------------------


def _job(program: str, tasks: Sequence[Task], backend: str, solution: Path | None) -> Job:
    program_file = Path(calibration_ranks.__file__)
    return make_job(program_file, program, tasks, backend, solution,
                    program_module=calibration_ranks.__name__)


def _launch(job: Job, what: str, deadline_s: float) -> LaunchResult:
    result = launch(job, deadline_s=deadline_s)
    if not result.ok:
        detail = f"\n{result.details}" if result.details else ""
        raise HarnessError(f"the {what} on {job.backend} ended badly: {result.message}{detail}")
    return result


def measure_ping_pong(backend: str, plan: Plan) -> list[float]:
    """Median one-way time per size of ``plan.ping_sizes``, measured inside rank 0."""
    args = (list(plan.ping_sizes), plan.ping_reps, plan.ping_warmup)
    task = Task(ranks=2, args=args, label="ping-pong")
    result = _launch(_job("ping_pong", [task], backend, None), "ping-pong", deadline_s=180)
    medians = result.task_outcomes(0)[0].value
    return [float(t) for t in medians]


def measure_flops(n: int, reps: int = 3) -> float:
    """FLOP/s of an n x n float64 matmul, best of ``reps``: a rough figure (numpy's BLAS may use
    every core, and other load on the machine lowers it), but this machine's, not a guess."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    best = math.inf
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best


@dataclass(frozen=True)
class RingRow:
    nbytes: int
    analytic_s: float  # 2(p-1)alpha + 2(p-1)/p n beta
    replayed_s: float  # the run's own trace on the calibrated platform
    measured_s: float  # wall: median over repetitions of the slowest rank

    @property
    def ratio_analytic(self) -> float:
        return self.measured_s / self.analytic_s

    @property
    def ratio_replayed(self) -> float:
        return self.measured_s / self.replayed_s


def ring_reference() -> Path:
    return Bank.default().ready_problem(RING_PROBLEM).path / "reference.py"


def measure_ring(backend: str, ranks: int, plan: Plan, platform: Platform) -> list[RingRow]:
    """Problem 03's reference on ``ranks`` real ranks, every size in one launch (one task each)."""
    tasks = [
        Task(ranks, args=(n, plan.ring_reps, plan.ring_warmup), label=f"allreduce of {n * 8} B")
        for n in plan.ring_elements
    ]
    job = _job("ring_allreduce", tasks, backend, ring_reference())
    result = _launch(job, "ring allreduce", deadline_s=300)
    route = platform.route(0, 1)  # every route of the star is the same
    rows = []
    for i, n in enumerate(plan.ring_elements):
        outcomes = result.task_outcomes(i)
        rows.append(RingRow(
            nbytes=n * 8,
            analytic_s=ring_allreduce_time(ranks, n * 8, route.alpha_s, route.beta_s_per_byte),
            replayed_s=replayed_time(outcomes, platform),
            measured_s=measured_time(outcomes),
        ))
    return rows


def measured_time(outcomes: Sequence[TaskOutcome]) -> float:
    """Median over repetitions of the slowest rank's wall time (a call ends with its last rank)."""
    per_rank: list[list[float]] = [o.value for o in outcomes]
    slowest = [max(times) for times in zip(*per_rank)]
    return statistics.median(slowest)


def replayed_time(outcomes: Sequence[TaskOutcome], platform: Platform) -> float:
    """The same calls on the virtual clock: the replay's time between each rank's begin and end
    marks, the slowest rank per call, the median over calls (the same statistic as the wall)."""
    traces = {rank: o.trace or [] for rank, o in enumerate(outcomes)}
    played = replay(traces, platform)
    per_rank = []
    for rank in sorted(played.marks):
        marks = played.marks[rank]
        begins = [t for name, t in marks if name == calibration_ranks.BEGIN_MARK]
        ends = [t for name, t in marks if name == calibration_ranks.END_MARK]
        per_rank.append([end - begin for begin, end in zip(begins, ends)])
    slowest = [max(spans) for spans in zip(*per_rank)]
    return statistics.median(slowest)


# -- reporting --------------------------------------------------------------------------------


def format_bytes(n: int) -> str:
    for unit, size in (("MiB", MIB), ("KiB", KIB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def ping_table(
    sizes: Sequence[int], times: Sequence[float], fit: Fit, dropped: Sequence[int]
) -> Table:
    table = Table(
        title="ping-pong, one-way time (median)", title_justify="left", box=box.SIMPLE_HEAD
    )
    for header in ("size", "measured", "fit", "measured/fit"):
        table.add_column(header, justify="right")
    for size, t in zip(sizes, times):
        note = " (set aside)" if size in dropped else ""
        table.add_row(format_bytes(size), format_seconds(t), format_seconds(fit.predict(size)),
                      f"{t / fit.predict(size):.2f}{note}")
    return folding(table)


def ring_table(rows: Sequence[RingRow], ranks: int, backend: str) -> Table:
    table = Table(
        title=f"ring allreduce (problem {RING_PROBLEM} reference), {ranks} ranks, float64, "
        f"{backend}: predicted vs measured wall (median, slowest rank)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    # Short headers, so that the table fits an 80-column terminal; on a narrower one it folds.
    headers = ("size", "analytic", "replayed", "wall", "wall/analytic", "wall/replayed")
    for header in headers:
        table.add_column(header, justify="right")
    for row in rows:
        table.add_row(
            format_bytes(row.nbytes),
            format_seconds(row.analytic_s),
            format_seconds(row.replayed_s),
            format_seconds(row.measured_s),
            f"{row.ratio_analytic:.2f}",
            f"{row.ratio_replayed:.2f}",
        )
    return folding(table)


def gap_sentence(ranks: int, cores: int) -> str:
    """What a ratio above 1 means on this machine, in one line."""
    left_out = "the reductions' arithmetic and the proxy's per-call work"
    if ranks > cores:
        return (
            f"A ratio above 1 is what the alpha-beta model does not know: {ranks} ranks share "
            f"{cores} cores, so the wall time includes OS scheduling, plus {left_out}."
        )
    return (
        f"A ratio above 1 is what the alpha-beta model does not know ({left_out}, other load on "
        f"the machine); near 1, the calibrated platform predicts this machine well."
    )


# -- the command ------------------------------------------------------------------------------


def check_arguments(backend: str, ranks: int) -> None:
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}: use {' or '.join(BACKENDS)}")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise UsageError(
            f"calibration needs at least 2 ranks (a ping-pong has two ends); got {ranks!r}"
        )


def machine_model(backend: str, ranks: int, fit: Fit, flops: float) -> MachineModel:
    cores = os.cpu_count() or 1
    memory_gib = round(psutil.virtual_memory().total / 2**30 / ranks, 3)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return MachineModel(
        name=f"calibrated-{backend}",
        description=(
            f"this machine ({host_platform.node() or 'unknown host'}, {cores} cores), measured by "
            f"distlab calibrate over {backend}: {ranks} ranks on one switch, every route "
            f"alpha={fit.alpha_s:.3g} s, beta={fit.beta_s_per_byte:.3g} s/B"
        ),
        ranks=ranks,
        alpha_s=fit.alpha_s,
        beta_s_per_byte=fit.beta_s_per_byte,
        flops=flops,
        memory_gib=max(memory_gib, 0.001),
        notes=(
            f"Written by distlab calibrate (backend {backend}, {ranks} ranks) on {when}.",
            f"Fitted one-way time = alpha + n * beta: alpha = {fit.alpha_s!r} s, "
            f"beta = {fit.beta_s_per_byte!r} s/B, R^2 = {fit.r2:.6f}.",
            "Links carry alpha/2 each way, so every rank-to-rank route has exactly alpha and beta.",
        ),
    )


def _fit_or_fail(sizes: Sequence[int], times: Sequence[float]) -> tuple[Fit, list[int]]:
    fit, dropped = robust_fit(sizes, times)
    if fit.alpha_s <= 0 or fit.beta_s_per_byte <= 0:
        raise HarnessError(
            f"the ping-pong fit gave alpha = {fit.alpha_s:.3g} s and beta = "
            f"{fit.beta_s_per_byte:.3g} s/B, which are not a latency and a bandwidth; the machine "
            f"was probably too busy: run distlab calibrate again"
        )
    return fit, dropped


def run_calibration(
    console: Console, backend: str, ranks: int, out: Path | None, quick: bool
) -> Path:
    """Measures, writes the platform file, compares its predictions with a real run; returns the
    file's path. Raises UsageError for bad arguments or an unwritable path, HarnessError when a
    run or the fit fails."""
    check_arguments(backend, ranks)
    path = (Path(out).expanduser() if out is not None else default_output(backend)).absolute()
    check_writable(path)
    plan = QUICK_PLAN if quick else FULL_PLAN
    console.print(
        f"[bold]distlab calibrate[/] · backend {backend} · ranks {ranks}"
        + (" · quick" if quick else "")
    )

    times = measure_ping_pong(backend, plan)
    fit, dropped = _fit_or_fail(plan.ping_sizes, times)
    console.print(ping_table(plan.ping_sizes, times, fit, dropped))
    _print_fit(console, fit, dropped)

    model = machine_model(backend, ranks, fit, measure_flops(plan.matmul_n))
    platform = write_platform(path, model)
    console.print(
        f"wrote [bold]{escape(str(path))}[/] (platform {platform.name}, {ranks} devices, "
        f"{model.flops / 1e9:.1f} GFLOP/s per device); use it with "
        f"--platform {escape(platform_option(path))}"
    )

    rows = measure_ring(backend, ranks, plan, platform)
    console.print(ring_table(rows, ranks, backend))
    console.print(gap_sentence(ranks, os.cpu_count() or 1))
    return path


def _print_fit(console: Console, fit: Fit, dropped: Sequence[int]) -> None:
    bandwidth = 1 / fit.beta_s_per_byte
    console.print(
        f"alpha = [bold]{format_seconds(fit.alpha_s)}[/] · "
        f"beta = [bold]{fit.beta_s_per_byte:.4g} s/B[/] ({bandwidth / 1e9:.2f} GB/s) · "
        f"R^2 = {fit.r2:.4f}"
    )
    if dropped:
        sizes = ", ".join(format_bytes(s) for s in dropped)
        console.print(
            f"set aside from the fit (more than {OUTLIER_FACTOR:g}x the line: a scheduling stall "
            f"or a transport quirk at that size): {sizes}",
            style="dim",
        )


__all__ = [
    "FULL_PLAN", "QUICK_PLAN", "Fit", "MachineModel", "Plan", "RingRow", "check_arguments",
    "default_output", "fit_alpha_beta", "platform_toml", "robust_fit", "run_calibration",
    "write_platform",
]
