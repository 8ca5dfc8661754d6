"""Watch mode: `distlab` with no arguments, the way rustlings works.

It opens the next problem not yet passed (copying its starter into the workspace if needed),
checks it, and checks it again each time the learner saves the file. Keys: h a hint, n the next
problem, l the list, r check again, q quit. File notifications come from the operating system
(watchfiles); where they do not work (some network or container file systems), the loop says so
and falls back to polling the file's modification time, which `--poll` also asks for. A file
that disappears (an editor's save can remove it before renaming the new one in place, or an
`rm`) is waited for, and checked when it is back; the key line is printed after every check.

The decisions (which problem is next, what a key does) are plain functions; the loop around them
owns the terminal and the watcher.
"""

from __future__ import annotations

import os
import queue
import select
import sys
import termios
import threading
import time
import tty
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.markup import escape

from .bank import Bank, Entry
from .errors import DistlabError
from .workspace import Workspace

KEYS = {"h": "hint", "n": "next", "l": "list", "r": "check", "q": "quit"}
POLL_S = 0.5


def next_problem(bank: Bank, ws: Workspace, after: str | None = None) -> Entry | None:
    """The first written problem not passed yet (after ``after``, wrapping round)."""
    progress = ws.load_progress()
    ready = [e for e in bank.entries if e.ready]
    if after is not None:
        later = [e for e in ready if e.number > after]
        ready = later + [e for e in ready if e.number <= after]
    pending = [e for e in ready if not progress.of(e.number).passed]
    return pending[0] if pending else None


def action_for(key: str) -> str | None:
    return KEYS.get(key.lower())


@dataclass
class Watcher:
    """Puts "changed" on a queue whenever ``path`` is written; notifications or polling."""

    path: Path
    events: "queue.Queue[str]"
    poll: bool
    stop: threading.Event

    def start(self) -> None:
        target = self._poll if self.poll else self._notify
        threading.Thread(target=target, daemon=True).start()

    def _notify(self) -> None:
        try:
            from watchfiles import watch

            for changes in watch(self.path.parent, stop_event=self.stop, yield_on_timeout=True,
                                 rust_timeout=300, debounce=200):
                if any(Path(p).name == self.path.name for _, p in changes):
                    self.events.put("changed")
        except Exception as exc:  # noqa: BLE001 - any failure of notifications falls back
            self.events.put(f"fallback:{exc}")
            self._poll()

    def _poll(self) -> None:
        last = _mtime(self.path)
        while not self.stop.is_set():
            time.sleep(POLL_S)
            now = _mtime(self.path)
            if now != last:
                last = now
                self.events.put("changed")


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


class Keys:
    """Single key presses from the terminal (raw mode), or lines from a pipe."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno()
        self.tty = os.isatty(self.fd)
        self.saved = termios.tcgetattr(self.fd) if self.tty else None

    def __enter__(self) -> "Keys":
        if self.tty:
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def read(self, timeout: float) -> str | None:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return None
        data = os.read(self.fd, 1).decode(errors="ignore")
        return data or "q"  # end of input: quit


@dataclass
class _Rechecker:
    """Checks the file again and prints the key line after it; a file that is gone for a moment
    (an editor's save that removes and renames, an `rm`) is waited for, not an error."""

    entry: Entry
    path: Path
    check: Callable[[Entry, Path], bool]
    console: Console
    keys_line: str
    waiting: bool = False

    def __call__(self) -> None:
        if not self.path.exists():
            self._wait()
            return
        try:
            passed = self.check(self.entry, self.path)
        except DistlabError:
            if self.path.exists():
                raise
            self._wait()  # it went away while it was being read
            return
        self.waiting = False
        self.console.print(self.keys_line)
        if passed:
            self.console.print("[green]passed![/] press n for the next problem")

    def _wait(self) -> None:
        if not self.waiting:  # once, not at every poll
            self.console.print(f"[yellow]{escape(self.path.name)} is gone; waiting for it to come "
                               "back (q quits)[/]")
        self.waiting = True


def run(bank: Bank, ws: Workspace, console: Console, poll: bool,
        check: Callable[[Entry, Path], bool], show_hint: Callable[[Entry], None],
        show_list: Callable[[], None]) -> int:
    entry = next_problem(bank, ws)
    if entry is None:
        console.print("every written problem has passed: well done")
        return 0
    with Keys() as keys:
        while entry is not None:
            path, created = ws.start(entry)
            if created:
                console.print(f"wrote {escape(str(path))}")
            keys_line = (f"[bold]watching {escape(path.name)}[/] "
                         f"({'polling' if poll else 'notifications'}) · "
                         "save to check again · h hint · n next · l list · r check · q quit")
            stop = threading.Event()
            events: "queue.Queue[str]" = queue.Queue()
            Watcher(path, events, poll, stop).start()
            recheck = _Rechecker(entry, path, check, console, keys_line)
            recheck()
            move: str | None = None
            while move is None:
                key = keys.read(0.2)
                try:
                    event = events.get_nowait()
                except queue.Empty:
                    event = None
                if event and event.startswith("fallback:"):
                    console.print(f"[yellow]file notifications do not work here ({escape(event[9:])}); "
                                  "polling instead (`distlab --poll` asks for it directly)[/]")
                elif event == "changed":
                    recheck()
                action = action_for(key) if key else None
                if action == "quit":
                    move = "quit"
                elif action == "next":
                    move = "next"
                elif action == "hint":
                    show_hint(entry)
                elif action == "list":
                    show_list()
                elif action == "check":
                    recheck()
            stop.set()
            if move == "quit":
                console.print("bye: your progress is saved")
                return 0
            entry = next_problem(bank, ws, after=entry.number)
            if entry is None:
                console.print("every written problem has passed: well done")
    return 0
