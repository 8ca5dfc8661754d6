"""Shared fixtures: a throwaway workspace per test, the repo's paths, and a leftover-process probe."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBLEMS = REPO / "problems"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
DISTLAB = [sys.executable, "-m", "distlab.cli"]

# Python caches bytecode next to the sources, as it does by default: an environment that forbids
# it (PYTHONDONTWRITEBYTECODE, as this machine's does) would make each of the suite's thousands
# of processes (CLI runs, ranks) compile distlab and the problems anew. Learner files are never
# run from a cache (rank/learner.py), and a sealed learner cannot read the bank's (rank/sealed.py).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    ws = tmp_path / "workspace"
    monkeypatch.setenv("DISTLAB_WORKSPACE", str(ws))
    return ws


def run_cli(
    *args: str, timeout: float = 120, cwd: Path | None = None, workspace: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs the distlab CLI as a user would, in a child process; returns its exit code and output.
    ``env`` adds to (or overrides) the variables it runs with."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})}
    if workspace is not None:
        env["DISTLAB_WORKSPACE"] = str(workspace)
    return subprocess.run(
        [*DISTLAB, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd or REPO
    )


# Every process this test session starts inherits this tag, so the leftover probe sees only our
# own jobs (not those of another test run on the same machine).
TEST_TAG = f"DISTLAB_TEST_TAG=pytest-{os.getpid()}"
os.environ["DISTLAB_TEST_TAG"] = TEST_TAG.split("=", 1)[1]
# The exams the tests open are signed with a key of the test session's, not the account's.
os.environ["DISTLAB_EXAM_KEY"] = str(Path(tempfile.mkdtemp(prefix="distlab-exam-key-")) / "exam-key")


def job_processes() -> list[str]:
    """Command lines of live processes of this test session's distlab jobs (ranks, mpiexec, prte)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2] == "Z" or TEST_TAG.encode() not in environ:
            continue
        if any(word in args for word in ("distlab.runtime.rank.worker", "distlab.worker", "prterun", "prted", "mpiexec")):
            found.append(args)
    return found
