"""``distlab calibrate``: measure this machine's transport and write it down as a platform file.

Call order (``run_calibration``):

1. check the arguments and that the output file can be written, before anything is measured;
2. a ping-pong between ranks 0 and 1 (``ranks.ping_pong``) through distlab's own
   launcher and comm proxy, sizes 8 B to 4 MiB, the median one-way time per size;
3. a least-squares fit of one-way time = alpha + n * beta (``fit_alpha_beta``, made robust to
   sizes a busy machine spoiled by ``robust_fit``); a fit that is not a latency and a bandwidth
   has the ping-pong measured again, up to PING_PONG_TRIES times (``_ping_pong_fit``);
4. a platform file: ``ranks`` devices on one switch, every route exactly alpha and beta (the star
   of ``platforms.uniform``), loaded back with ``load_platform`` to prove it is valid;
5. problem 03's reference ring allreduce on ``ranks`` real ranks at a few sizes: the analytic
   ring cost and the replay of the run's own trace on the new platform, against the wall time.

The fit and the file writer are pure functions, tested without processes.
"""

from __future__ import annotations

import os
import platform as host_platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import psutil  # type: ignore[import-untyped]  # no stubs shipped
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import options as opts
from ..errors import HarnessError, UsageError
from ..runtime.clock.metrics import format_seconds
from ..terminal import folding
from .fit import (
    FULL_PLAN,
    KIB,
    MIB,
    OUTLIER_FACTOR,
    QUICK_PLAN,
    RING_PROBLEM,
    Fit,
    Plan,
    robust_fit,
)
from .measure import RingRow, measure_flops, measure_ping_pong, measure_ring
from .platform_file import (
    MachineModel,
    check_writable,
    default_output,
    platform_option,
    write_platform,
)

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
    opts.backend(backend)
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


# A fit that is not a latency and a bandwidth comes from a machine too busy to time: ranks
# descheduled for a scheduler tick on every round trip make small and large messages cost the same.
# Such load comes and goes, so the ping-pong is measured again, as a user would, before giving up.
PING_PONG_TRIES = 3


def _ping_pong_fit(console: Console, backend: str, plan: Plan) -> tuple[list[float], Fit, list[int]]:
    """The ping-pong's times, their fit and the sizes set aside; measured up to PING_PONG_TRIES
    times while the fit is not physical (HarnessError after the last)."""
    attempt = 1
    while True:
        times = measure_ping_pong(backend, plan)
        fit, dropped = robust_fit(plan.ping_sizes, times)
        if fit.alpha_s > 0 and fit.beta_s_per_byte > 0:
            return times, fit, dropped
        said = (f"the ping-pong fit gave alpha = {fit.alpha_s:.3g} s and beta = "
                f"{fit.beta_s_per_byte:.3g} s/B, which are not a latency and a bandwidth")
        if attempt == PING_PONG_TRIES:
            raise HarnessError(f"{said}, in each of {PING_PONG_TRIES} tries; the machine was probably "
                               f"too busy: run distlab calibrate again when it is quieter")
        attempt += 1
        console.print(f"{said}: the machine is probably busy; measuring again "
                      f"(try {attempt} of {PING_PONG_TRIES})")


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

    times, fit, dropped = _ping_pong_fit(console, backend, plan)
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
