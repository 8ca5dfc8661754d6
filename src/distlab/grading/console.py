"""Narrating a checking session on the terminal, in the style of a test that tells its story."""

from __future__ import annotations

import re
from pathlib import Path

from rich.console import Console
from rich.markup import escape as escape_markup

from ..bank import Entry
from .results import CheckResult, Results

# Every control character but newline and tab: in a learner's text (an exception's message, its
# output in a failure's details) an escape sequence would move the cursor and rewrite the lines
# an assessor reads ("✓ passed" over a failure).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape(text: str) -> str:
    """``text`` as the terminal should show it: rich's markup escaped, control characters as codes."""
    return escape_markup(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text))


class ConsoleReporter:
    def __init__(self, console: Console, verbose: bool = False) -> None:
        self.console = console
        self.verbose = verbose

    def begin(self, entry: Entry, solution: Path, backend: str, seed: int) -> None:
        self.console.print(
            f"[bold]distlab check {entry.number}[/] · {escape(entry.title)}\n"
            f"  solution {escape(_short(solution))} · backend {backend} · seed {seed}"
        )

    def check_started(self, index: int, title: str) -> None:
        self.console.print(f"[bold]{index}. {escape(title)}[/]")

    def compile_failed(self, summary: str, detail: str) -> None:
        self.console.print(f"[red]✗ {escape(summary)}[/]")
        for line in detail.splitlines():
            self.console.print(f"  {escape(line)}", style="dim")
        self.console.print("  no check ran: fix the file and check again", style="dim")

    def say(self, text: str) -> None:
        self.console.print(f"   {escape(text)}", style="dim")

    def check_ended(self, result: CheckResult) -> None:
        if result.status == "passed":
            self.console.print(f"   [green]✓ passed[/] ({result.wall_s:.1f} s)")
            return
        mark = "✗ failed" if result.status == "failed" else "! error"
        lines = result.message.splitlines() or [""]
        self.console.print(f"   [red]{mark}:[/] {escape(lines[0])}")
        for line in lines[1:]:
            self.console.print(f"     {escape(line)}")
        if result.details and (self.verbose or result.status == "error" or _short_enough(result.details)):
            for line in result.details.splitlines():
                self.console.print(f"     {escape(line)}", style="dim")
        elif result.details:
            self.console.print("     (run with --verbose for stacks and the full trace)", style="dim")

    def end(self, results: Results) -> None:
        style = "bold green" if results.passed else "bold red"
        self.console.print(f"[{style}]{escape(results.footer)}[/]")
        if not results.passed:
            self.console.print(
                f"replay these exact variants with: distlab check {results.problem} --seed {results.seed}",
                style="dim",
            )


def _short_enough(details: str) -> bool:
    return len(details.splitlines()) <= 24


def _short(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
