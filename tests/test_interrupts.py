"""Ctrl-C on the CLI, and a harness killed outright: no rank may outlive either."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
from conftest import DISTLAB, REPO, is_rank_process, job_processes


def _as_in_a_terminal() -> None:
    # A suite started in the background by a non-interactive shell (`.ci/run &`) inherits SIGINT
    # ignored, and an ignored signal stays ignored across exec; a CLI in a terminal has Python's
    # own handler. Give the child the terminal's disposition.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_check() -> subprocess.Popen[str]:
    env = dict(os.environ, NO_COLOR="1")
    return subprocess.Popen(
        [*DISTLAB, "check", "03", "--solution", "reference"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_as_in_a_terminal,
    )


def _wait_for_ranks(cli: subprocess.Popen[str], timeout: float = 20) -> None:
    """Returns once a rank of *this* CLI's job runs (a process below it in the tree): a rank of an
    earlier test still on its way out must not count, or the signal would come too early."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            below = psutil.Process(cli.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for child in below:
            try:
                if "distlab.runtime.rank.worker" in " ".join(child.cmdline()) or is_rank_process(
                    Path(f"/proc/{child.pid}")
                ):
                    return
            except psutil.Error:
                continue
        time.sleep(0.05)
    raise AssertionError("no rank started")


def _wait_until_gone(timeout: float) -> list[str]:
    end = time.monotonic() + timeout
    while job_processes() and time.monotonic() < end:
        time.sleep(0.1)
    return job_processes()


def test_ctrl_c_stops_every_rank_and_says_so() -> None:
    cli = _start_check()
    _wait_for_ranks(cli)
    cli.send_signal(signal.SIGINT)
    out, _ = cli.communicate(timeout=20)
    assert cli.returncode == 130, out
    assert "interrupted" in out
    assert _wait_until_gone(3) == []


def test_sigterm_takes_the_same_path_as_ctrl_c() -> None:
    cli = _start_check()
    _wait_for_ranks(cli)
    cli.send_signal(signal.SIGTERM)
    out, _ = cli.communicate(timeout=20)
    assert cli.returncode == 130, out
    assert _wait_until_gone(3) == []


def test_a_harness_killed_outright_leaves_no_rank_behind() -> None:
    cli = _start_check()
    _wait_for_ranks(cli)
    cli.kill()  # SIGKILL: no cleanup code runs in the CLI; the ranks' watchdogs must notice
    cli.wait(timeout=10)
    assert _wait_until_gone(6) == []
