"""Running every check of a problem against one solution, in order, and scoring the session.

Call order: ``check_problem`` compiles the solution first (a syntax error is reported at once,
before any process starts), loads the problem's ``check.py``, then runs each declared check with a
``CheckContext``. A check passes by returning; it fails by raising CheckFailed (a wrong answer, or
a run that ended badly); any other exception is a bug in the check and is reported as an error.
"""

from __future__ import annotations

import datetime
import importlib
import secrets
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Protocol

from .. import options as opts
from ..bank import Entry
from ..errors import CardError
from ..runs import run_options
from ..runtime.clock.metrics import format_seconds
from ..runtime.faults.model import MAX_SEED
from ..runtime.jobspec import problem_package
from ..runtime.rank.learner import SolutionLoadError, compile_check
from .api import CheckContext, CheckFailed, Checklist, RunFailed, Session
from .results import CheckResult, Results


class Reporter(Protocol):
    """Where the narration goes (the terminal, or nowhere)."""

    def begin(self, entry: Entry, solution: Path, backend: str, seed: int) -> None: ...
    def check_started(self, index: int, title: str) -> None: ...
    def compile_failed(self, summary: str, detail: str) -> None: ...
    def say(self, text: str) -> None: ...
    def check_ended(self, result: CheckResult) -> None: ...
    def end(self, results: Results) -> None: ...


@dataclass(frozen=True)
class Options:
    backend: str = "mpi"
    seed: int | None = None
    deadline_s: float | None = None
    platform: str | None = None  # a shipped name or a file; default: the card's
    faults: Path | None = None  # a fault plan for every run of the checks
    clock: str = "virtual"  # or "wall"
    # Count what MPI carries below the proxy (Open MPI's monitoring), for exam grading; MPI only.
    mpi_monitoring: bool = False
    seal: bool = False  # learner code in a process of its own per rank (runtime/seal/)
    private: tuple[str, ...] = ()  # paths sealed code must not see (the exam's state)


def load_checklist(entry: Entry) -> Checklist:
    path = entry.path / "check.py"
    if not (entry.path / "programs.py").is_file():
        raise CardError(f"{entry.path}: no programs.py; a problem is a package of check.py, "
                        "programs.py and, where needed, cases.py and judging.py (docs/problem-format.md)")
    module: ModuleType = importlib.import_module(problem_package(entry.path) + ".check")
    checks = getattr(module, "CHECKS", None)
    if not isinstance(checks, Checklist) or not checks.checks:
        raise CardError(f"{path}: must define CHECKS = Checklist() with at least one check")
    undeclared = checks.undeclared()
    if undeclared:
        raise CardError(f"{path}: no @CHECKS.run declares what these ask for: {', '.join(undeclared)}")
    return checks


def draw_seed() -> int:
    """A session's seed when none is given, as wide as a seed may be (``--seed``'s 0..2**63-1), as
    the exam's are: the hidden variants follow from the seed, and cases.py is read in the ranks.
    Below 10**9 an outside tester's ranks found theirs in 21 s (numpy's seeding and draws redone in
    C, each candidate tried against the shapes and data they were handed) and then held every
    other rank's data."""
    return secrets.randbelow(MAX_SEED + 1)


def check_problem(entry: Entry, solution: Path, options: Options, reporter: Reporter) -> Results:
    card = entry.card()
    opts.backend(options.backend, card.backends, entry.number)
    seed = options.seed if options.seed is not None else draw_seed()
    started = time.monotonic()
    try:
        compile_check(solution)
    except SolutionLoadError as exc:
        return not_run(entry, solution, options, reporter, exc.summary, exc.detail, seed)
    results = _begin(entry, solution, options, reporter, seed)
    checklist = load_checklist(entry)

    run_opts = run_options(
        options.backend, options.platform, default_platform=card.platform,
        allowed_backends=card.backends, problem=entry.number, clock=options.clock,
        faults=options.faults, seed=seed, deadline_s=options.deadline_s,
        default_deadline_s=float(card.time_limit_s), mpi_monitoring=options.mpi_monitoring,
        seal=options.seal, private=options.private,
    )
    session = Session(solution, seed, reporter, run_opts, card.platform)
    for index, spec in enumerate(checklist.checks, start=1):
        reporter.check_started(index, spec.title)
        ctx = CheckContext(session, index)
        t0 = time.monotonic()
        status, message, details = "passed", "", ""
        try:
            checklist.call(spec.fn, ctx)
        except RunFailed as exc:
            status = "failed"
            if exc.first_report:
                message, details = _describe_run_failure(exc), exc.result.details
            else:
                message = f"not graded: its run failed in an earlier check ({exc.result.message})"
        except CheckFailed as exc:
            status, message = "failed", str(exc)
        except Exception:  # noqa: BLE001 - a bug in check.py must not lose the other results
            status = "error"
            message = f"the check itself crashed (a bug in {entry.path.name}/check.py)"
            details = traceback.format_exc()
        result = CheckResult(
            name=spec.title,
            status=status,
            score=spec.points if status == "passed" else 0,
            max_score=spec.points,
            message=message,
            seed=seed,
            wall_s=round(time.monotonic() - t0, 3),
            metrics=ctx.metrics,
            details=details,
        )
        results.checks.append(result)
        reporter.check_ended(result)
    totals = session.totals
    results.launches, results.messages, results.bytes = totals.launches, totals.messages, totals.bytes
    results.virtual_s, results.bound_s = totals.virtual_s, totals.bound_s
    results.summary, results.clock = totals.summary, options.clock
    results.ranks = sorted({totals.min_ranks, totals.max_ranks} - {0})
    if run_opts.mpi_monitoring:
        results.below_proxy = session.below_proxy.to_json()
    return _finish(results, started, reporter)


def _describe_run_failure(exc: RunFailed) -> str:
    result = exc.result
    text = result.message
    if result.failing_task is not None:
        if result.failing_task < len(result.task_labels):
            text += f" (while running {result.task_labels[result.failing_task]})"
    log = result.logs.get(result.failing_rank) if result.failing_rank is not None else None
    if log:
        tail = "\n".join(log.strip().splitlines()[-5:])
        text += f"\nlast output of rank {result.failing_rank}:\n{tail}"
    return text


def not_run(entry: Entry, solution: Path, options: Options, reporter: Reporter, summary: str,
            detail: str = "", seed: int | None = None) -> Results:
    """Every check failed with ``summary``, nothing run: a file that does not compile, or one an
    exam refused to take. The score keeps its maximum."""
    started = time.monotonic()
    seed = seed if seed is not None else options.seed if options.seed is not None else draw_seed()
    results = _begin(entry, solution, options, reporter, seed)
    for spec in load_checklist(entry).checks:
        results.checks.append(CheckResult(
            spec.title, "failed", 0, spec.points, f"not run: {summary}", seed, 0.0, details=detail,
        ))
    reporter.compile_failed(summary, detail)
    return _finish(results, started, reporter)


def _begin(entry: Entry, solution: Path, options: Options, reporter: Reporter, seed: int) -> Results:
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    reporter.begin(entry, solution, options.backend, seed)
    return Results(entry.number, entry.title, str(solution), options.backend, seed, stamp, 0.0, [],
                   sealed=options.seal)


def _finish(results: Results, started: float, reporter: Reporter) -> Results:
    results.wall_s = time.monotonic() - started
    verdict = "passed" if results.passed else "failed"
    ranks = "-".join(str(r) for r in results.ranks) or "0"
    virtual = ""
    if results.virtual_s is not None:
        virtual = f"{results.clock} {format_seconds(results.virtual_s)}"
        if results.bound_s is not None:
            virtual += f" (bound {format_seconds(results.bound_s)})"
        virtual += " · "
    results.footer = (
        f"{verdict} {results.problem} · {results.wall_s:.1f} s · ranks={ranks} · "
        f"msgs={results.messages} · bytes={_human_bytes(results.bytes)} · {virtual}"
        f"score {results.score}/{results.max_score} · seed {results.seed}"
        + ("" if results.sealed else " · unsealed: its counters only advise (--seal on)")
    )
    reporter.end(results)
    return results


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
