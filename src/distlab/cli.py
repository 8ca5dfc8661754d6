"""The command line: parses, calls the library, prints. Errors are one sentence and exit code 2.

Exit codes: 0 passed (or the command did its job), 1 a check failed, 2 usage or harness error,
130 interrupted.
"""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from . import options as opts
from .bank import TIERS, Bank, Entry, resolve_solution
from .errors import CardError, DistlabError, UsageError
from .terminal import folding, make_console, print_code, reading_width
from .workspace import Workspace

app = typer.Typer(
    add_completion=False,
    help="distlab: distributed-training problems, checked on real processes. "
    "With no command: watch mode on the next problem.",
)
console: Console = make_console()


def _bank() -> Bank:
    return Bank.default()


# Code spans (`...`) are the Markdown a card may use on purpose; everything else in card text is
# the author's prose, in which brackets are code (buf[lo:hi]) and never a link.
_CODE_SPAN = re.compile(r"(`+)(?:.+?)\1", re.DOTALL)


def markdown_literal(text: str) -> str:
    """Card text for Markdown: backslashes and square brackets outside code spans escaped, so
    that ``x[i](y)`` or ``\\[x]`` print as written; code spans are kept (they escape nothing)."""
    out, last = [], 0
    for span in _CODE_SPAN.finditer(text):
        out.append(_escape_md(text[last:span.start()]))
        out.append(span.group(0))
        last = span.end()
    out.append(_escape_md(text[last:]))
    return "".join(out)


def _escape_md(text: str) -> str:
    return text.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")


@app.command("list")
def list_problems() -> None:
    """The 25 problems by tier, with your progress."""
    bank, ws = _bank(), Workspace()
    progress = ws.load_progress()
    if progress.warning:
        console.print(f"[yellow]{escape(progress.warning)}[/]")
    for tier in TIERS:
        table = Table(title=f"{tier} tier", title_justify="left", show_header=False, box=None)
        for entry in (e for e in bank.entries if e.tier == tier):
            state = progress.problems.get(entry.number)
            if not entry.ready:
                status = "[dim]coming[/]"
            elif not _card_loads(entry):
                status = f"[red]broken[/]: its card does not load (`distlab show {entry.number}` says why)"
            elif state and state.passed:
                status = "[green]passed[/]"
            elif state and state.attempts:
                status = "[yellow]in progress[/]"
            else:
                status = "ready"
            table.add_row(f"  {entry.number}", escape(entry.title), status)
        console.print(folding(table))


def _card_loads(entry: Entry) -> bool:
    try:
        entry.card()
    except CardError:
        return False
    return True


@app.command()
def show(problem: str = typer.Argument(..., help="number or slug")) -> None:
    """The problem's scenario card."""
    # Imported here: 30 ms of imports that no other command needs.
    from rich.markdown import Markdown

    entry = _bank().ready_problem(problem)
    card = entry.card()
    s = card.scenario
    md = markdown_literal
    bullets = lambda items: "\n".join(f"- {md(i)}" for i in items)  # noqa: E731
    text = (
        f"**{card.tier} tier** · ranks {', '.join(map(str, card.world_sizes))} · platform "
        f"`{card.platform}` · time limit {card.time_limit_s} s · tags: {md(', '.join(card.tags))}\n\n"
        f"## Background\n{md(s.background.strip())}\n\n## Constraints\n{bullets(s.constraints)}\n\n"
        f"## Fault injection\n{bullets(s.faults)}\n\n## Monitoring metrics\n{bullets(s.metrics)}\n\n"
        f"## Your path\n- **Define**: {md(card.steps.define)}\n- **Instrument**: {md(card.steps.instrument)}\n"
        f"- **Simulate**: {md(card.steps.simulate)}\n- **Tune**: {md(card.steps.tune)}\n\n"
        f"Start with `distlab start {entry.number}`; {len(card.hints)} hints with "
        f"`distlab hint {entry.number}`."
    )
    console.print(Panel(Markdown(text), title=f"{entry.number} · {escape(card.title)}", expand=False,
                        width=reading_width(console) if not console.is_terminal else None))


@app.command()
def start(problem: str = typer.Argument(..., help="number or slug")) -> None:
    """Copies the starter into your workspace (never overwrites your file)."""
    entry = _bank().ready_problem(problem)
    path, created = Workspace().start(entry)
    if created:
        console.print(f"wrote {escape(str(path))}\nedit it, then run: distlab check {entry.number}")
    else:
        console.print(f"{escape(str(path))} already exists; left it as it is. "
                      f"Check it: distlab check {entry.number}")


def _solution_for(entry: Entry, solution: Optional[str], ws: Workspace) -> Path:
    if solution:
        return resolve_solution(entry, solution)
    mine = ws.solution_path(entry)
    if mine.exists():
        return mine
    console.print(
        f"[dim]no {escape(mine.name)} in your workspace yet: checking the starter "
        f"(`distlab start {entry.number}` copies it for you to edit)[/]"
    )
    return entry.path / "starter.py"


def _check_and_record(entry: Entry, path: Path, options: "Any", verbose: bool, own: bool) -> "Any":
    """Checks, writes the results file, and records progress when it is the learner's own file."""
    from .grading import results as results_io
    from .grading.console import ConsoleReporter
    from .grading.runner import check_problem

    ws = Workspace()
    if verbose and options.seal:
        from .runtime.seal import memgroup
        from .runtime.seal.sandbox import expected

        console.print(escape(f"seal: the learner's code runs in {expected()}; {memgroup.available()}"),
                      style="dim")
    results = check_problem(entry, path, options, ConsoleReporter(console, verbose))
    results_io.write(results, ws.results_path(entry))
    if options.faults is not None:
        # Checks of time against a bound report, not grade, under the learner's own fault plan (the
        # bound knows none of its delays): a plan that delays nothing once turned them into passes.
        console.print("not recorded in your progress: your fault plan (--faults) was in force, so the "
                      "checks of time were reported, not graded", style="dim", markup=False)
    elif own and path == ws.solution_path(entry):
        progress = ws.load_progress()
        state = progress.of(entry.number)
        state.attempts += 1
        state.max_score = results.max_score
        state.best_score = max(state.best_score, results.score)
        state.passed = state.passed or results.passed
        ws.save_progress(progress)
    return results


@app.callback(invoke_without_command=True)
def watch_mode(
    ctx: typer.Context,
    poll: bool = typer.Option(False, "--poll", help="watch mode: poll the file instead of notifications"),
) -> None:
    """Watch mode when no command is given: the next problem, re-checked on every save."""
    if ctx.invoked_subcommand is not None:
        return
    from . import watch
    from .grading.runner import Options

    def check_it(entry: Entry, path: Path) -> bool:  # as `distlab check` grades by default: sealed
        return bool(_check_and_record(entry, path, Options(seal=opts.seal(None)), False, own=True).passed)

    raise typer.Exit(watch.run(_bank(), Workspace(), console, poll, check_it,
                               lambda entry: hint(entry.number), list_problems))


@app.command()
def check(
    problem: str = typer.Argument(..., help="number or slug"),
    solution: Optional[list[str]] = typer.Option(
        None, help="'reference', 'starter' or a path (default: your workspace file); give it again "
        "to grade several solutions on the same hidden variants, one after the other"
    ),
    backend: str = typer.Option("mpi", help="mpi or gloo"),
    seed: Optional[int] = typer.Option(None, help="replay the hidden variants of a seed"),
    json_out: Optional[Path] = typer.Option(
        None, "--json", help="also write the results here (several solutions: a list, in order)"
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="stacks and traces in full"),
    time_limit: Optional[float] = typer.Option(
        None, "--time-limit", help="seconds each run may take (default: the card's time limit)"
    ),
    platform: Optional[str] = typer.Option(None, help="model another platform than the card's"),
    faults: Optional[Path] = typer.Option(None, help="a fault plan (.toml) for every run"),
    clock: str = typer.Option(
        "virtual", help="grade performance on the virtual clock, or on wall time (real clusters)"
    ),
    seal: Optional[str] = typer.Option(
        None, help="on (the default; off with --clock wall): the learner's code runs in a process of "
        "its own per rank, out of the grader's reach; off: in the rank, its counters only advise"
    ),
) -> None:
    """Runs the problem's checks on real ranks and grades the solution."""
    from .grading import results as results_io
    from .grading.runner import Options, draw_seed

    backend, seed, time_limit = opts.backend(backend), opts.seed(seed), opts.time_limit(time_limit)
    entry = _bank().ready_problem(problem)
    ws = Workspace()
    paths = [_solution_for(entry, s, ws) for s in solution] if solution else [_solution_for(entry, None, ws)]
    clock = opts.clock(clock)
    sealed = opts.seal(seal, clock)
    # Refused now, not after the checks: the results must have somewhere to go, and never over
    # the learner's progress or their own files.
    json_out = opts.json_path(json_out, keep={
        "your progress file": ws.progress_file,
        **{f"the solution file {p.name} being checked": p for p in paths},
    })
    if len(paths) > 1 and seed is None:
        seed = draw_seed()  # one draw for all: each solution meets the same hidden variants
    options = Options(backend, seed, time_limit, platform, faults, clock, seal=sealed)
    graded = [_check_and_record(entry, path, options, verbose, own=not solution) for path in paths]
    if len(graded) > 1:
        _print_batch(graded)
    if json_out:
        results_io.write(graded[0] if len(graded) == 1 else graded, json_out)
    raise typer.Exit(0 if all(results.passed for results in graded) else 1)


def _print_batch(graded: list["Any"]) -> None:
    """The scores of several solutions checked in one command, in the order given."""
    table = Table(title=f"{len(graded)} solutions · seed {graded[0].seed}", title_justify="left")
    for column in ("solution", "score", "verdict"):
        table.add_column(column)
    for results in graded:
        table.add_row(escape(results.solution), f"{results.score}/{results.max_score}",
                      "passed" if results.passed else "failed")
    console.print(table)


@app.command()
def run(
    problem: str = typer.Argument(..., help="number or slug"),
    solution: Optional[str] = typer.Option(
        None, help="'reference', 'starter' or a path (default: your workspace file)"
    ),
    ranks: Optional[int] = typer.Option(None, help="number of ranks (default: the card's, 4 for most)"),
    backend: str = typer.Option("mpi", help="mpi or gloo"),
    platform: Optional[str] = typer.Option(None, help="a shipped platform or a .toml file"),
    faults: Optional[Path] = typer.Option(None, help="a fault plan (.toml)"),
    trace: Optional[Path] = typer.Option(None, help="write a Chrome trace (Perfetto) here"),
    clock: str = typer.Option("virtual", help="virtual (the modelled cluster) or wall"),
    seed: Optional[int] = typer.Option(None, help="seed for the fault plan's random draws"),
    param: list[str] = typer.Option([], help="NAME=VALUE passed to the problem's main()"),
) -> None:
    """A free run of the problem on real ranks: its summary, times, metrics, trace."""
    from .freerun import RunOptions, free_run

    backend = opts.backend(backend)
    if ranks is not None and ranks < 1:
        raise UsageError("--ranks must be at least 1")
    bad = [p for p in param if "=" not in p]
    if bad:
        raise UsageError(f"--param takes NAME=VALUE; got {bad[0]!r}")
    seed = opts.seed(seed)
    entry = _bank().ready_problem(problem)
    ranks = ranks or entry.card().free_run_ranks
    path = _solution_for(entry, solution, Workspace())
    params = dict(p.split("=", 1) for p in param)
    options = RunOptions(ranks, backend, platform, faults, trace, clock, params, seed)
    raise typer.Exit(free_run(entry, path, options, console))


@app.command()
def tune(
    problem: str = typer.Argument(..., help="number or slug"),
    param: str = typer.Option(..., "--param", help="NAME=V1,V2,... passed to the problem's main()"),
    metric: str = typer.Option("virtual_s", help="a run metric (virtual_s, idle_fraction, ...) or a key main() returns"),
    beside: Optional[str] = typer.Option(None, help="a second metric, drawn on a right-hand axis of the same plot"),
    solution: Optional[str] = typer.Option(None, help="'reference', 'starter' or a path"),
    ranks: Optional[int] = typer.Option(None, help="number of ranks (default: the card's, 4 for most)"),
    backend: str = typer.Option("mpi", help="mpi or gloo"),
    platform: Optional[str] = typer.Option(None, help="a shipped platform or a .toml file"),
    fixed: list[str] = typer.Option([], "--fixed", help="NAME=VALUE held fixed in every run"),
    out: Optional[Path] = typer.Option(None, help="output prefix (default: workspace/tune/NN-NAME, then each --fixed NAME-VALUE)"),
) -> None:
    """The Tune step: sweeps one parameter, writes the data (CSV) and the curve (PNG)."""
    from .freerun import RunOptions
    from .tune import parse_param, sweep

    name, values = parse_param(param)
    bad = [p for p in fixed if "=" not in p]
    if bad:
        raise UsageError(f"--fixed takes NAME=VALUE; got {bad[0]!r}")
    entry = _bank().ready_problem(problem)
    ws = Workspace()
    path = _solution_for(entry, solution, ws)
    base = RunOptions(ranks or entry.card().free_run_ranks, backend, platform,
                      params=dict(p.split("=", 1) for p in fixed))
    # Sweeps with other fixed values keep their own files (09: method=yours beside method=flat).
    held = "".join(f"-{p.replace('=', '-')}" for p in fixed)
    prefix = out or ws.root / "tune" / f"{entry.number}-{name}{held}"
    csv_path, png = sweep(entry, path, base, name, values, metric, prefix, console, beside)
    console.print(escape(f"wrote {csv_path}" + (f" and {png}" if png else " (no point to plot)")))


@app.command()
def report(
    problem: Optional[str] = typer.Argument(None, help="number or slug"),
    all_problems: bool = typer.Option(False, "--all", help="one page per written problem"),
    solution: Optional[str] = typer.Option(None, help="'reference', 'starter' or a path"),
    out: Optional[Path] = typer.Option(None, help="the HTML file (or folder with --all)"),
) -> None:
    """A self-contained HTML report: card, results, timeline, metrics, sweeps."""
    from .report import build
    from .workspace import write_atomically

    bank, ws = _bank(), Workspace()
    if all_problems == (problem is not None):
        raise UsageError("give a problem number, or --all")
    entries = [e for e in bank.entries if e.ready] if all_problems else [bank.ready_problem(problem or "")]
    for entry in entries:
        path = _solution_for(entry, solution, ws)
        if all_problems:
            target = (out or ws.root / "reports") / f"{entry.number}.html"
        else:
            target = out or ws.root / "reports" / f"{entry.number}.html"
        write_atomically(target, build(entry, path, ws))
        console.print(f"wrote {escape(str(target))}")


@app.command()
def exam(
    out: Path = typer.Option(..., help="the exam folder (for the candidate's files and the results)"),
    problems: Optional[str] = typer.Option(None, help="comma-separated problem numbers, to open an exam"),
    time_limit: Optional[str] = typer.Option(None, "--time", help="duration, e.g. 90m or 1h30m"),
    submit: bool = typer.Option(False, "--submit", help="grade the exam in --out"),
    verify: bool = typer.Option(
        False, "--verify", help="say whether --out's results and kept files are as they were graded"
    ),
    seal: str = typer.Option("on", help="on: the candidate's code runs sealed, out of the grader's reach"),
    allow_unsealed: bool = typer.Option(
        False, "--allow-unsealed", help="grade with --seal off all the same (the results say so)"
    ),
) -> None:
    """A timed assessment: open it (--problems, --time), grade it (--submit), and later check that
    its results are as graded (--verify)."""
    from . import exam as exams

    bank = _bank()
    out = out.resolve()  # the ranks read the kept files from their own working folders
    sealed = opts.seal(seal)
    if not sealed and not allow_unsealed:
        raise UsageError("an exam grades sealed: with --seal off the candidate's code shares its "
                         "process with what grades it; add --allow-unsealed to grade so anyway")
    if verify and submit:
        raise UsageError("--submit grades the exam, --verify checks a graded one: give one of them")
    if verify:
        found = exams.verify_results(out)
        for finding in found:
            console.print(escape(f"does not hold: {finding}"))
        if found:
            raise typer.Exit(1)
        console.print(escape(f"{out / 'results.json'} holds: signed by this installation, every "
                             "submitted file as graded"))
        return
    if submit:
        summary = exams.submit(bank, out, console, seal=sealed)
        console.print(escape(f"exam score {summary['score']}/{summary['max_score']}: "
                             f"{out / 'results.json'} and {out / 'report.html'}"))
        return
    if not problems or not time_limit:
        raise UsageError("open an exam with --problems and --time, or grade one with --submit")
    opened = exams.open_exam(bank, [p.strip() for p in problems.split(",")],
                             exams.parse_duration(time_limit), out)
    console.print(escape(f"exam open until {exams._iso(opened.deadline)}: edit the files in "
                         f"{out / 'work'}, then run: distlab exam --out {out} --submit"))


@app.command()
def hint(problem: str = typer.Argument(..., help="number or slug")) -> None:
    """Shows one more hint each time."""
    entry = _bank().ready_problem(problem)
    hints = entry.card().hints
    ws = Workspace()
    progress = ws.load_progress()
    state = progress.of(entry.number)
    state.hints_shown = min(state.hints_shown + 1, len(hints))
    ws.save_progress(progress)
    for i in range(state.hints_shown):
        style = "bold" if i == state.hints_shown - 1 else "dim"
        console.print(f"hint {i + 1}/{len(hints)}: {escape(hints[i])}", style=style)
    if state.hints_shown == len(hints):
        console.print("[dim]that was the last hint[/]")


@app.command()
def solution(
    problem: str = typer.Argument(..., help="number or slug"),
    force: bool = typer.Option(False, "--force", help="show it even before you passed"),
) -> None:
    """Shows the reference solution, once you have passed the problem."""
    entry = _bank().ready_problem(problem)
    passed = Workspace().load_progress().of(entry.number).passed
    if not (passed or force):
        raise UsageError(
            f"the reference of {entry.number} opens once your solution passes "
            f"(`distlab check {entry.number}`), or with --force"
        )
    print_code(console, (entry.path / "reference.py").read_text())



@app.command()
def progress() -> None:
    """Your progress by tier, and the next problem to work on."""
    bank, ws = _bank(), Workspace()
    state = ws.load_progress()
    if state.warning:
        console.print(f"[yellow]{escape(state.warning)}[/]")
    table = Table(show_header=False, box=None, padding=(0, 1))
    for tier in TIERS:
        entries = [e for e in bank.entries if e.tier == tier]
        done = sum(1 for e in entries if state.of(e.number).passed)
        width = 24
        filled = round(width * done / len(entries)) if entries else 0
        bar = f"[green]{'█' * filled}[/][dim]{'░' * (width - filled)}[/]"
        table.add_row(f"{tier} tier", bar, f"{done}/{len(entries)} passed")
    console.print(folding(table))
    upcoming = [e for e in bank.entries if e.ready and not state.of(e.number).passed]
    if upcoming:
        nxt = upcoming[0]
        started = ws.solution_path(nxt).exists()
        verb = "check" if started else "start"
        console.print(f"next: {nxt.number} · {escape(nxt.title)} (`distlab {verb} {nxt.number}`)")
    else:
        console.print("every written problem has passed: well done")


@app.command()
def platforms() -> None:
    """The shipped platforms (the clusters the virtual clock can model)."""
    from .platforms import list_platforms

    list_platforms(console)


platform_app = typer.Typer(help="Platforms: show one.", no_args_is_help=True)
app.add_typer(platform_app, name="platform")


@platform_app.command("show")
def platform_show(name: str = typer.Argument(..., help="a shipped name or a platform file")) -> None:
    """Draws a platform's topology: groups, devices, ranks, links."""
    from .platforms import show_platform

    show_platform(name, console)


@app.command()
def calibrate(
    backend: str = typer.Option("mpi", help="mpi or gloo"),
    ranks: int = typer.Option(4, help="ranks for the ring allreduce comparison"),
    out: Optional[Path] = typer.Option(None, help="platform file to write"),
    quick: bool = typer.Option(False, "--quick", help="fewer sizes and repetitions"),
) -> None:
    """Measures this machine's alpha and beta, writes a platform file, compares model and wall."""
    from .calibrate import run_calibration

    run_calibration(console, backend, ranks, out, quick)


@app.command()
def bench(
    quick: bool = typer.Option(False, "--quick", help="fewer repetitions, smaller sizes"),
) -> None:
    """Benchmarks: ring vs built-in Allreduce, proxy overhead, wall time of checking 03."""
    from .bench import run_benchmarks

    run_benchmarks(console, quick=quick)


dev_app = typer.Typer(help="For authors: lint the bank, scaffold a problem.", no_args_is_help=True)
app.add_typer(dev_app, name="dev")


@dev_app.command("lint")
def dev_lint(
    problems: Optional[str] = typer.Option(None, help="comma-separated numbers (default: all written)"),
    run: bool = typer.Option(True, help="also prove starters fail and references pass"),
    jobs: int = typer.Option(2, help="problems checked at the same time"),
) -> None:
    """Validates every card; proves every starter fails and every reference passes."""
    from .devkit import lint

    only = [f"{int(p):02d}" for p in problems.split(",")] if problems else None
    findings = lint(_bank(), only=only, run=run, jobs=jobs)
    table = Table("problem", "", "what", "finding", box=None)
    for f in findings:
        table.add_row(f.problem, "[green]ok[/]" if f.ok else "[red]FAIL[/]", escape(f.what), escape(f.message))
    console.print(folding(table))
    bad = [f for f in findings if not f.ok]
    console.print(f"{len(findings) - len(bad)} ok, {len(bad)} failing")
    raise typer.Exit(1 if bad else 0)


@dev_app.command("new")
def dev_new(
    slug: str = typer.Argument(..., help="lower-case-with-dashes"),
    title: Optional[str] = typer.Option(None, help="the problem's title"),
    tier: str = typer.Option("advanced", help="basic, advanced or expert"),
) -> None:
    """Scaffolds problems/NN-SLUG with a valid card, starter, reference and check."""
    from .devkit import new_problem

    if tier not in TIERS:
        raise UsageError(f"tier must be one of {', '.join(TIERS)}")
    folder = new_problem(_bank(), slug, title, tier)
    console.print(escape(f"wrote {folder} and added it to the index; "
                         f"next: distlab dev lint --problems {folder.name[:2]}"))


def _terminate(signum: int, frame: Optional[FrameType]) -> None:
    # SIGTERM takes the same path as Ctrl-C, so the launcher's cleanup ends every rank.
    raise KeyboardInterrupt


def _interrupted() -> None:
    console.print("[yellow]interrupted: every rank was stopped[/]")
    sys.exit(130)


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code = app(standalone_mode=False)
        code = code if isinstance(code, int) else 0
    except DistlabError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        sys.exit(2)
    except typer.Exit as exc:
        code = exc.exit_code
    except KeyboardInterrupt:
        _interrupted()
    except Exception as exc:  # the CLI library's own usage errors, and anything unforeseen
        from typer.exceptions import Abort, TyperException

        if isinstance(exc, TyperException):
            show = getattr(exc, "show", None)
            if callable(show):
                show()
            else:
                console.print(f"[red]error:[/] {escape(exc.format_message())}")
            sys.exit(2)
        if isinstance(exc, Abort):  # the library's wrapping of Ctrl-C
            _interrupted()
        console.print(f"[red]internal error:[/] {escape(f'{type(exc).__name__}: {exc}')}")
        sys.exit(2)
    if code == 130:  # typer turns Ctrl-C into Exit(130) after the launcher has cleaned up
        _interrupted()
    sys.exit(code)


if __name__ == "__main__":
    main()
