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
from .platforms import Platform
from .runs import problem_program, run, run_options
from .runtime.clock.metrics import RunMetrics, format_seconds
from .runtime.clock.replay import Replay
from .runtime.faults.plans import FaultPlan
from .runtime.jobspec import Task
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
    return outcome


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
    for line in metrics.lines():
        console.print(f"  {escape(line)}", style="dim")
    if options.trace:
        meta: dict[str, Any] = {"problem": entry.number, "platform": outcome.platform.name,
                                "backend": options.backend, "ranks": options.ranks}
        chrome.export(options.trace, outcome.traces, outcome.played, meta)
        console.print(f"trace written to {options.trace} (open it in Perfetto or chrome://tracing)")
    return 0
