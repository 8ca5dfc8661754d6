"""Watch mode driven through a real pseudo-terminal: it opens the next problem, re-checks on
save, answers keys (h, q), and saves progress. Run once with notifications, once polling."""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PROBLEMS, REPO

from distlab.bank import Bank
from distlab.watch import action_for, next_problem
from distlab.workspace import Workspace


class Terminal:
    """A child process on a pty; `expect` reads its screen until a text shows up."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO,
                                     close_fds=True)
        os.close(slave)
        self.screen = ""

    def expect(self, text: str, timeout: float = 90) -> None:
        end = time.monotonic() + timeout
        while text not in self.screen:
            if time.monotonic() > end:
                raise AssertionError(f"{text!r} never showed; screen:\n{self.screen[-3000:]}")
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    self.screen += os.read(self.master, 65536).decode(errors="replace")
                except OSError:  # the child has gone: the text will not come
                    raise AssertionError(f"{text!r} never showed; screen:\n{self.screen[-3000:]}")

    def press(self, key: str) -> None:
        os.write(self.master, key.encode())

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=30)
        finally:
            os.close(self.master)


TINY = Path(__file__).resolve().parent / "tiny_bank"  # watch mode is the same on any problem: the
TINY_PROBLEM = TINY / "01-tiny-max"                     # tiny one checks in a third of 03's time


@pytest.fixture
def one_problem_bank(tmp_path: Path) -> Path:
    root = tmp_path / "problems"
    shutil.copytree(TINY, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.mark.parametrize("poll", [False, True])
def test_watch_mode_rechecks_on_save_and_answers_keys(one_problem_bank: Path, workspace: Path,
                                                      poll: bool) -> None:
    env = dict(os.environ, DISTLAB_PROBLEMS=str(one_problem_bank), DISTLAB_WORKSPACE=str(workspace),
               COLUMNS="120", NO_COLOR="1")
    term = Terminal([sys.executable, "-m", "distlab.cli", *(["--poll"] if poll else [])], env)
    term.expect("watching 01-tiny-max.py")
    assert "failed 01" in term.screen  # the starter, checked at once
    term.press("h")
    term.expect("hint 1/3")
    time.sleep(0.5)
    mine = workspace / "01-tiny-max.py"
    mine.write_text((TINY_PROBLEM / "reference.py").read_text())
    term.expect("passed!")
    assert "unsealed" not in term.screen  # graded sealed, as `distlab check` grades
    term.press("q")
    term.expect("bye")
    assert term.close() == 0
    assert Workspace(workspace).load_progress().of("01").passed


def test_watch_mode_waits_for_a_file_that_disappears_and_reprints_the_keys(
        one_problem_bank: Path, workspace: Path) -> None:
    env = dict(os.environ, DISTLAB_PROBLEMS=str(one_problem_bank), DISTLAB_WORKSPACE=str(workspace),
               COLUMNS="160", NO_COLOR="1")
    term = Terminal([sys.executable, "-m", "distlab.cli", "--poll"], env)
    term.expect("watching 01-tiny-max.py")
    keys = "h hint · n next · l list · r check · q quit"
    mine = workspace / "01-tiny-max.py"
    mine.unlink()  # an editor's save (write aside, remove, rename) or a plain rm
    term.expect("waiting for it to come back")
    time.sleep(1.5)  # several polls with the file gone
    assert term.proc.poll() is None, term.screen
    shown = term.screen.count(keys)
    mine.write_text((TINY_PROBLEM / "reference.py").read_text())
    term.expect("passed!")
    term.expect(keys)  # the key line again, after the re-check
    assert term.screen.count(keys) > shown, term.screen
    term.press("q")
    term.expect("bye")
    assert term.close() == 0


def test_the_next_problem_skips_passed_ones_and_wraps(tmp_path: Path) -> None:
    bank = Bank(PROBLEMS)
    ws = Workspace(tmp_path)
    first = next_problem(bank, ws)
    assert first is not None and first.ready
    progress = ws.load_progress()
    progress.of(first.number).passed = True
    ws.save_progress(progress)
    later = next_problem(bank, ws)
    assert later is None or later.number != first.number
    assert action_for("Q") == "quit" and action_for("x") is None
