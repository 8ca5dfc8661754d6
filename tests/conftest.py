"""Shared fixtures: a throwaway workspace per test, the repo's paths, and a leftover-process probe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBLEMS = REPO / "problems"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
DISTLAB = [sys.executable, "-m", "distlab.cli"]


@pytest.fixture(autouse=True)
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    ws = tmp_path / "workspace"
    monkeypatch.setenv("DISTLAB_WORKSPACE", str(ws))
    return ws


def run_cli(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Runs the distlab CLI as a user would, in a child process; returns its exit code and output."""
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1")
    return subprocess.run(
        [*DISTLAB, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd or REPO
    )


def job_processes() -> list[str]:
    """Command lines of live processes that belong to distlab jobs (ranks, mpiexec, prte)."""
    out = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines()[1:]:
        pid, stat, args = line.strip().split(None, 2)
        if stat.startswith("Z") or int(pid) == os.getpid():
            continue
        if "distlab.runtime.worker" in args or "distlab.worker" in args or "prterun" in args or "prted" in args or "mpiexec" in args:
            found.append(args)
    return found
