"""``distlab bench``: speed figures measured in one run, each beside its baseline and its target.

1. Problem 03's reference ring allreduce, through the learner's ``Comm`` proxy, against the
   built-in MPI Allreduce at 4 KiB, 1 MiB and 16 MiB on 4 ranks (target: ring <= 1.2x at 16 MiB).
2. The proxy's own cost against raw mpi4py: an 8-byte Send/Recv ping-pong (target: <= 30 us added
   per message) and a 1 MiB Sendrecv ring exchange (target: <= 5% slower).
3. The wall time of ``distlab check 03 --solution reference``, as a learner runs it (sealed, the
   default; target: <= 10 s).
4. What the proxy's Python costs per Sendrecv with no transport underneath, hot and after a
   cache-clearing copy (``proxy_cost.py``): report-only rows that explain figure 2.
5. What the seal costs (``seal_cost.py``): a call of one rank to itself, of 8 bytes and 1 MiB,
   sealed against unsealed (target: <= 30 us added per small call), the same as a two-rank
   ping-pong's messages (report-only), and check 03 sealed against unsealed (<= 1.5x).
6. What a launch of 8 ranks costs with ranks forked from the zygote against ranks started afresh
   (``start_cost.py``), on each engine (target on gloo: forked <= 0.5x).
7. Runtime II's side channels (``survivor_cost.py``): a SIGKILL to the survivors' PeerFailed, and
   their Revoke, Shrink and first Allreduce, against a 4-rank Allreduce (MPI under ULFM, and gloo
   over the store's notices); an elastic step's comm.Admit(), empty and with a joiner; a store
   set and get against an 8-byte MPI round trip (report-only rows).

The MPI figures come from one ``mpiexec -n 4`` run of ``distlab.bench.mpi_ranks``, which
writes raw timings as JSON; this module derives ratios, judges targets, prints a table and saves
everything to ``bench-results/bench.json`` so a later run can be compared with this one. The
targets live here and not in tests: timings on a shared machine are for people to read.
"""

from __future__ import annotations

import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from ..errors import HarnessError
from ..runtime.supervisor import mpi_env, mpiexec_failed_to_start, mpiexec_path
from ..runtime.supervisor.processes import kill_session
from ..terminal import folding
from . import proxy_cost, seal_cost, start_cost, survivor_cost
from .timings import (
    PINGPONG_BYTES,
    RANKS,
    SENDRECV_BYTES,
    AllreduceTiming,
    MpiTimings,
    write_json_atomically,
)

RESULTS_FILE = Path("bench-results") / "bench.json"
RING_LIMIT_X = 1.2  # ring / built-in at 16 MiB
RING_TARGET_BYTES = 16 * 1024 * 1024
SMALL_OP_LIMIT_US = 30.0  # added per 8-byte message
LARGE_OP_LIMIT_PCT = 5.0  # added to a 1 MiB Sendrecv
CLOCKED_OP_LIMIT_PCT = 10.0  # added to a 1 MiB Sendrecv with the online clock on
CHECK_LIMIT_S = 10.0
RUN32_LIMIT_S = 120.0  # 32 ranks on 2 cores must complete; the figure says how long it takes
MPI_TIMEOUT_S = 300.0  # far above the ~30 s a full run takes, even on a loaded machine
CHECK_TIMEOUT_S = 120.0
TERM_GRACE_S = 3.0


@dataclass(frozen=True)
class Figure:
    """One row: a measured time, what it is compared with, and the quantity held to a target."""

    name: str
    value_s: float
    baseline: str
    baseline_s: float | None
    judged: float  # the quantity compared with ``limit``, in ``unit`` (x, us per message, %, s)
    unit: str
    limit: float | None  # judged <= limit is the target; None: reported only

    @property
    def ratio(self) -> float | None:
        return self.value_s / self.baseline_s if self.baseline_s else None

    @property
    def met(self) -> bool | None:
        return None if self.limit is None else self.judged <= self.limit


# -- running the two halves ---------------------------------------------------------------------


def mpi_command(out: Path, quick: bool) -> list[str]:
    ranks = [sys.executable, "-P", "-m", "distlab.bench.mpi_ranks", "--out", str(out)]
    flags = ["--quick"] if quick else []
    launcher = [mpiexec_path(), "-n", str(RANKS), "--oversubscribe", "--bind-to", "none"]
    return [*launcher, *ranks, *flags]


def run_to_end(command: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, str]:
    """(exit code, output) of ``command``; on a timeout or Ctrl-C every process it started ends."""
    process = subprocess.Popen(
        command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _end(process)
        raise HarnessError(f"{' '.join(command[:6])} ... ran past {timeout_s:.0f} s") from None
    except BaseException:
        _end(process)
        raise
    return process.returncode, output


def _end(process: subprocess.Popen[str]) -> None:
    # SIGTERM first: mpiexec and distlab's CLI both clean up their ranks on it; then no survivors.
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    kill_session(process.pid)
    process.wait()


def run_mpi_timings(out: Path, quick: bool, attempts: int = 3) -> MpiTimings:
    """Runs the MPI half on 4 ranks; rank 0 writes ``out``, which is read back. Started again
    after Open MPI's known start-up failure (nothing was measured then)."""
    for _ in range(attempts):
        code, output = run_to_end(mpi_command(out, quick), mpi_env(), MPI_TIMEOUT_S)
        if code == 0 or not mpiexec_failed_to_start(output):
            break
    if code != 0 or not out.exists():
        raise HarnessError(f"the MPI benchmark failed (exit {code}):\n{_tail(output)}")
    return MpiTimings.read(out)


def time_check_03(extra: tuple[str, ...] = ()) -> float:
    """Wall time of ``distlab check 03 --solution reference [extra]`` in a fresh workspace."""
    command = [sys.executable, "-P", "-m", "distlab.cli", "check", "03", "--solution", "reference", *extra]
    with tempfile.TemporaryDirectory(prefix="distlab-bench-ws-") as workspace:
        env = dict(os.environ, DISTLAB_WORKSPACE=workspace)
        start = time.perf_counter()
        code, output = run_to_end(command, env, CHECK_TIMEOUT_S)
        wall_s = time.perf_counter() - start
    if code != 0:
        raise HarnessError(f"checking 03 with the reference failed (exit {code}):\n{_tail(output)}")
    return wall_s


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# -- from timings to figures --------------------------------------------------------------------


def allreduce_figure(timing: AllreduceTiming) -> Figure:
    limit = RING_LIMIT_X if timing.nbytes == RING_TARGET_BYTES else None
    return Figure(
        name=f"ring allreduce {_size(timing.nbytes)}",
        value_s=timing.ring_s,
        baseline="built-in Allreduce in place",
        baseline_s=timing.builtin_s,
        judged=timing.ring_s / timing.builtin_s,
        unit="x",
        limit=limit,
    )


def small_op_figure(timings: MpiTimings) -> Figure:
    # A round trip carries two messages, each a Send and its matching Recv, one after the other:
    # half the extra round-trip time is what the proxy adds to one message.
    added_us = (timings.pingpong_proxy_s - timings.pingpong_raw_s) / 2 * 1e6
    return Figure(
        name=f"ping-pong {PINGPONG_BYTES} B",
        value_s=timings.pingpong_proxy_s,
        baseline="raw mpi4py",
        baseline_s=timings.pingpong_raw_s,
        judged=added_us,
        unit="us",
        limit=SMALL_OP_LIMIT_US,
    )


def large_op_figure(timings: MpiTimings) -> Figure:
    added_pct = (timings.sendrecv_proxy_s / timings.sendrecv_raw_s - 1) * 100
    return Figure(
        name=f"Sendrecv {_size(SENDRECV_BYTES)}",
        value_s=timings.sendrecv_proxy_s,
        baseline="raw mpi4py",
        baseline_s=timings.sendrecv_raw_s,
        judged=added_pct,
        unit="%",
        limit=LARGE_OP_LIMIT_PCT,
    )


def clocked_op_figure(timings: MpiTimings) -> Figure:
    added_pct = (timings.clocked_proxy_s / timings.clocked_raw_s - 1) * 100
    return Figure(
        name=f"Sendrecv {_size(SENDRECV_BYTES)}, proxy + clock",
        value_s=timings.clocked_proxy_s,
        baseline="raw mpi4py",
        baseline_s=timings.clocked_raw_s,
        judged=added_pct,
        unit="%",
        limit=CLOCKED_OP_LIMIT_PCT,
    )


def time_free_run_32() -> float:
    """Wall time of a free run of problem 03 on 32 ranks (all on this machine's cores)."""
    command = [sys.executable, "-P", "-m", "distlab.cli", "run", "03", "--solution", "reference",
               "--ranks", "32", "--param", "n=262144"]
    with tempfile.TemporaryDirectory(prefix="distlab-bench-ws-") as workspace:
        env = dict(os.environ, DISTLAB_WORKSPACE=workspace)
        start = time.perf_counter()
        code, output = run_to_end(command, env, CHECK_TIMEOUT_S * 6)
        wall_s = time.perf_counter() - start
    if code != 0:
        raise HarnessError(f"the 32-rank run of 03 failed (exit {code}):\n{_tail(output)}")
    return wall_s


def run32_figure(wall_s: float) -> Figure:
    return Figure(
        name="run 03 on 32 ranks",
        value_s=wall_s,
        baseline="",
        baseline_s=None,
        judged=wall_s,
        unit="s",
        limit=RUN32_LIMIT_S,
    )


def check_figure(wall_s: float) -> Figure:
    return Figure(
        name="check 03 reference",
        value_s=wall_s,
        baseline="",
        baseline_s=None,
        judged=wall_s,
        unit="s",
        limit=CHECK_LIMIT_S,
    )


def proxy_cost_figures(cost: proxy_cost.ProxyCost) -> list[Figure]:
    """The proxy's Python per Sendrecv over a stub engine, against a plain call of the stub."""
    rows = []
    for when, proxy_s, plain_s in (
        ("hot", cost.proxy_hot_s, cost.plain_hot_s),
        ("cache cleared", cost.proxy_cold_s, cost.plain_cold_s),
    ):
        rows.append(Figure(
            name=f"proxy Python per Sendrecv, {when}",
            value_s=proxy_s,
            baseline="a plain call",
            baseline_s=plain_s,
            judged=(proxy_s - plain_s) * 1e6,
            unit="us",
            limit=None,
        ))
    return rows


def seal_figures(t: seal_cost.SealTimings) -> list[Figure]:
    """A call, a message and check 03, sealed against unsealed (seal_cost.py)."""
    def added(name: str, pair: seal_cost.Pair, limit: float | None) -> Figure:
        return Figure(name, pair.sealed_s, "unsealed", pair.plain_s,
                      (pair.sealed_s - pair.plain_s) * 1e6, "us", limit)
    return [
        added("sealed call 8 B (Sendrecv to itself)", t.call_small, seal_cost.SEALED_CALL_LIMIT_US),
        added("sealed call 1 MiB (Sendrecv to itself)", t.call_large, None),
        added("sealed message 8 B (ping-pong, 2 ranks)", t.message_small, None),
        added("sealed message 1 MiB (ping-pong, 2 ranks)", t.message_large, None),
        Figure("check 03 reference, sealed", t.check.sealed_s, "unsealed", t.check.plain_s,
               t.check.sealed_s / t.check.plain_s, "x", seal_cost.SEALED_CHECK_LIMIT_X),
    ]


def start_figures(t: start_cost.StartTimings) -> list[Figure]:
    """An 8-rank launch forked from the zygote against started afresh (start_cost.py)."""
    def launch(engine: str, forked: float, fresh: float, limit: float | None) -> Figure:
        return Figure(f"launch of {start_cost.RANKS} ranks, {engine}, forked", forked,
                      "started afresh", fresh, forked / fresh, "x", limit)
    return [launch("mpi", *t.mpi, None), launch("gloo", *t.gloo, start_cost.FORKED_GLOO_LIMIT_X)]


def survivor_figures(t: survivor_cost.SurvivorTimings) -> list[Figure]:
    """A peer's death as the survivors meet it, and the store's round trip (survivor_cost.py)."""
    def row(name: str, value: float, baseline: str, base: float) -> Figure:
        return Figure(name, value, baseline, base, value / base, "x", None)
    allreduce = f"Allreduce of 8 KiB, {survivor_cost.RANKS} ranks"
    rows = []
    for engine, death in (("MPI, ULFM", t.mpi), ("gloo, store notices", t.gloo)):
        rows += [row(f"SIGKILL to PeerFailed ({engine})", death.detect_s, allreduce,
                     death.allreduce_s),
                 row(f"survivors revoke, shrink, finish an Allreduce ({engine})",
                     death.shrink_and_finish_s, allreduce, death.allreduce_s)]
    for engine, join, death in (("MPI", t.mpi_join, t.mpi), ("gloo", t.gloo_join, t.gloo)):
        rows += [row(f"Admit with no one waiting ({engine})", join.admit_s, allreduce,
                     death.allreduce_s),
                 row(f"Admit a joiner, then the grown group's Allreduce ({engine})", join.reform_s,
                     allreduce, death.allreduce_s)]
    return [*rows, row("store set + get, 8 B", t.store_s, "8 B MPI round trip", t.pingpong_s)]


def figures_from(
    timings: MpiTimings, check_s: float, run32_s: float,
    cost: proxy_cost.ProxyCost | None = None,
) -> list[Figure]:
    rows = [allreduce_figure(t) for t in timings.allreduce]
    extra = proxy_cost_figures(cost) if cost is not None else []
    return [*rows, small_op_figure(timings), large_op_figure(timings), clocked_op_figure(timings),
            *extra, check_figure(check_s), run32_figure(run32_s)]


# -- printing and saving ------------------------------------------------------------------------


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _overhead(figure: Figure) -> str:
    # Only the proxy rows are judged on what the proxy adds; the others on a ratio or a time.
    return f"{figure.judged:+.1f} {figure.unit}" if figure.unit in ("us", "%") else "-"


def _target(figure: Figure) -> str:
    if figure.limit is None:
        return "-"
    return f"<= {figure.limit:g}{'' if figure.unit in ('x', '%') else ' '}{figure.unit}"


def _met(figure: Figure) -> str:
    return {None: "[dim]-[/]", True: "[green]yes[/]", False: "[red]no[/]"}[figure.met]


TABLE_CAPTION = (
    "measured: through distlab's Comm, 4 ranks (ping-pong: 2, one round trip); baseline: the "
    "built-in Allreduce in place (like the ring) or raw mpi4py; each the median over repetitions "
    "of the slowest rank (the out-of-place built-in is in bench.json). "
    "overhead: what the proxy adds per message, or per Sendrecv in %. proxy Python: one process, "
    "no transport; \"cache cleared\" copies 4 MiB before each call, as a 1 MiB exchange does."
)


def figures_table(figures: list[Figure], title: str) -> Table:
    table = Table(
        title=title, title_justify="left", caption=TABLE_CAPTION, caption_justify="left",
        box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0),
    )
    for header in ("benchmark", "measured", "baseline", "ratio", "overhead", "target", "met"):
        first = header == "benchmark"
        table.add_column(header, justify="left" if first else "right")
    for f in figures:
        baseline = _duration(f.baseline_s) if f.baseline_s else "-"
        ratio = f"{f.ratio:.2f}x" if f.ratio is not None else "-"
        table.add_row(
            f.name, _duration(f.value_s), baseline, ratio, _overhead(f), _target(f), _met(f)
        )
    # On a narrow terminal the columns wrap and fold: a figure cut to "measu…" is no figure.
    return folding(table)


def results_json(
    timings: MpiTimings, check_s: float, figures: list[Figure], run32_s: float = 0.0
) -> dict[str, Any]:
    # The load average is saved with the figures: on a shared machine it explains most surprises.
    return {
        "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "quick": timings.quick,
        "host": {
            "cpus": os.cpu_count(),
            "load_average": list(os.getloadavg()),
            "python": platform.python_version(),
        },
        "figures": [
            {**asdict(f), "ratio": f.ratio, "met": f.met} for f in figures
        ],
        "mpi_timings": timings.to_json(),
        "check_03_s": check_s,
        "run_03_32_ranks_s": run32_s,
    }


def run_benchmarks(console: Console, quick: bool = False) -> None:
    """Runs every benchmark, prints the table and writes bench-results/bench.json."""
    console.print(f"[dim]MPI benchmarks on {RANKS} ranks{' (quick)' if quick else ''}...[/]")
    with tempfile.TemporaryDirectory(prefix="distlab-bench-") as tmp:
        timings = run_mpi_timings(Path(tmp) / "timings.json", quick)
    # One check run in --quick mode; otherwise the median of three, as one run is too noisy here.
    runs = 1 if quick else 3
    console.print(f"[dim]timing distlab check 03 --solution reference ({runs}x)...[/]")
    check_s = statistics.median(time_check_03() for _ in range(runs))
    console.print("[dim]running problem 03 on 32 ranks...[/]")
    run32_s = time_free_run_32()
    console.print("[dim]timing the proxy's own Python...[/]")
    cost = proxy_cost.measure(rounds=3 if quick else 7)
    console.print("[dim]timing the seal: a message and check 03, sealed and not...[/]")
    sealed = seal_figures(seal_cost.measure(quick, time_check_03))
    console.print("[dim]timing launches, ranks forked from the zygote and started afresh...[/]")
    started = start_figures(start_cost.measure(quick))
    console.print("[dim]timing a peer's death on MPI under ULFM and on gloo, and the task's store...[/]")
    survived = survivor_figures(survivor_cost.measure(quick, run_to_end, mpiexec_path(), mpi_env()))
    figures = [*figures_from(timings, check_s, run32_s, cost), *sealed, *started, *survived]
    console.print(figures_table(figures, f"distlab bench{' --quick' if quick else ''}"))
    met = [f.met is True for f in figures if f.limit is not None]
    # Other work on the machine skews every figure: the load says how much to trust this run.
    load = os.getloadavg()[0]
    console.print(
        f"{sum(met)} of {len(met)} targets met [dim](load average {load:.1f} on "
        f"{os.cpu_count()} CPUs)[/]"
    )
    write_json_atomically(RESULTS_FILE, results_json(timings, check_s, figures, run32_s))
    console.print(f"[dim]wrote {RESULTS_FILE}[/]")
