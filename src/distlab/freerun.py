"""``distlab run N``: a free run of a problem's ``main`` program, for the Instrument and Simulate
steps. No grading: the learner sees what the run did (its summary line, the virtual and wall
times, the metrics) and can keep a Chrome trace of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from .bank import Entry
from .errors import UsageError
from .platforms import Platform
from .runs import problem_program, run, run_options
from .runtime.clock.metrics import RunMetrics, format_seconds
from .runtime.clock.replay import Replay
from .runtime.faults.plans import FaultPlan
from .runtime.jobspec import Task, import_program_module, problem_programs
from .runtime.rank.learner import SolutionLoadError, compile_check
from .runtime.supervisor import LaunchResult
from .runtime.trace import chrome


@dataclass(frozen=True)
class RunOptions:
    ranks: int
    backend: str = "mpi"
    platform: str | None = None
    faults: Path | None = None
    trace: Path | None = None
    clock: str = "virtual"  # "virtual" or "wall"
    params: dict[str, str] = field(default_factory=dict)
    seed: int | None = None
    deadline_s: float | None = None


@dataclass
class RunOutcome:
    """What one free run produced; ``result`` says whether it ended well."""

    result: LaunchResult
    platform: Platform
    plan: FaultPlan | None
    summary: Any = None  # rank 0's return value
    traces: dict[int, list[Any]] = field(default_factory=dict)
    played: Replay | None = None
    metrics: RunMetrics | None = None
    # What the problem's model allows for this run, by metric (programs.py's ``bounds``).
    bounds: dict[str, float] = field(default_factory=dict)


def execute(entry: Entry, solution: Path, options: RunOptions) -> RunOutcome:
    """Runs the problem's ``main`` on real ranks and replays it; prints nothing.

    Raises UsageError for bad options and SolutionLoadError for a file that does not compile."""
    card = entry.card()
    run_opts = run_options(
        options.backend, options.platform, default_platform=card.platform,
        allowed_backends=card.backends, problem=entry.number, clock=options.clock,
        faults=options.faults, seed=options.seed, world=options.ranks,
        deadline_s=options.deadline_s, default_deadline_s=float(card.time_limit_s),
    )
    compile_check(solution)
    bounds = free_run_bounds(entry, run_opts.platform, options)  # before the run: a bad param fails fast
    task = Task(ranks=options.ranks, kwargs=dict(options.params), label="the free run")
    done = run(
        problem_program(entry.path, "main", solution), [task], run_opts,
        online_clock=True,  # a free run shows comm.now() figures; checks turn it on when needed
    )
    outcome = RunOutcome(done.result, run_opts.platform, run_opts.faults)
    if done.ok:
        task_run = done.tasks[0]
        outcome.summary = task_run.values[0] if task_run.outcomes else None
        outcome.traces = task_run.traces
        outcome.played = task_run.replay()
        outcome.metrics = task_run.metrics()
        outcome.bounds = bounds
    return outcome


def free_run_bounds(entry: Entry, platform: Platform, options: RunOptions) -> dict[str, float]:
    """The bounds a problem's programs.py gives for one free run, computed here, in the supervisor:
    ``bounds(platform, ranks, **params) -> {metric: value}`` (for example ``{"virtual_s": ...}``,
    the closed form's time on this platform), with the parameters ``main`` takes (the same
    defaults). {} when the problem defines none."""
    file, name = problem_programs(entry.path)
    if "\ndef bounds(" not in file.read_text():
        return {}  # not imported for nothing: a problem's programs.py may import torch
    bounds = getattr(import_program_module(file, name), "bounds", None)
    if bounds is None:
        return {}
    try:
        found = bounds(platform, options.ranks, **options.params)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"problem {entry.number}'s bound for this free run: {exc}") from None
    return {str(k): float(v) for k, v in found.items()}


def free_run(entry: Entry, solution: Path, options: RunOptions, console: Console) -> int:
    """Runs and reports; returns the exit code (0 the run completed, 1 it ended badly)."""
    try:
        compile_check(solution)
    except SolutionLoadError as exc:
        console.print(f"[red]{escape(exc.summary)}[/]\n{escape(exc.detail)}")
        return 1
    platform_name = options.platform or entry.card().platform
    console.print(
        f"[bold]distlab run {entry.number}[/] · {escape(entry.title)} · ranks {options.ranks} · "
        f"backend {options.backend} · platform {platform_name}"
        + (f" · faults {options.faults}" if options.faults else "")
    )
    outcome = execute(entry, solution, options)
    result, plan = outcome.result, outcome.plan
    for event in result.fault_events:
        console.print(f"[yellow]fault:[/] {escape(event)}")
    for reason in result.restarted_after:
        console.print(f"[yellow]restarted:[/] {escape(reason)}")
    if not result.ok:
        console.print(f"[red]the run ended badly:[/] {escape(result.message)}")
        if result.details:
            console.print(escape(result.details), style="dim")
        if plan:
            console.print(f"replay with: --faults {options.faults} --seed {plan.seed}", style="dim")
        return 1
    assert outcome.metrics is not None and outcome.played is not None
    if outcome.summary is not None:
        console.print(f"rank 0: {escape(str(outcome.summary))}")
    metrics = outcome.metrics
    headline = (
        f"virtual {format_seconds(metrics.virtual_s)}"
        if options.clock == "virtual"
        else f"wall {format_seconds(metrics.wall_s)}"
    )
    console.print(f"[bold]{headline}[/] · ranks={options.ranks} · msgs={metrics.messages}")
    bound = outcome.bounds.get("virtual_s")
    if bound and options.clock == "virtual":
        console.print(f"  the problem's bound on this platform: {format_seconds(bound)} "
                      f"({metrics.virtual_s / bound:.3f}x)")
    for line in metrics.lines():
        console.print(f"  {escape(line)}", style="dim")
    if options.trace:
        meta: dict[str, Any] = {"problem": entry.number, "platform": outcome.platform.name,
                                "backend": options.backend, "ranks": options.ranks}
        chrome.export(options.trace, outcome.traces, outcome.played, meta)
        console.print(f"trace written to {options.trace} (open it in Perfetto or chrome://tracing)")
    return 0
