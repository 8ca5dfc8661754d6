"""Shared fixtures: a throwaway workspace per test, the repo's paths, and a leftover-process probe."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from distlab.runtime.rank.learner_fork import LEARNER_PROCESS_NAME
from distlab.runtime.zygote.client import ZYGOTE_MODULE
from distlab.runtime.zygote.server import RANK_PROCESS_NAME

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
# Open MPI's shared-memory segments of the MPI the tests start themselves (an mpi4py imported in a
# test's process, a plain mpiexec), in a folder of the session's that goes with it: a process that
# ends without MPI_Finalize (a pytest-xdist worker does) left one in /dev/shm per run. Jobs get one
# of their own (runtime/supervisor/leftovers.py); the workers inherit the session's.
if "OMPI_MCA_btl_sm_backing_directory" not in os.environ:
    _SEGMENTS = tempfile.mkdtemp(prefix="distlab-test-shm-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    atexit.register(shutil.rmtree, _SEGMENTS, ignore_errors=True)
    os.environ["OMPI_MCA_btl_sm_backing_directory"] = _SEGMENTS
# The exams the tests open are signed with a key of the test session's, not the account's.
_EXAM_KEY_FOLDER = tempfile.mkdtemp(prefix="distlab-exam-key-")
atexit.register(shutil.rmtree, _EXAM_KEY_FOLDER, ignore_errors=True)
os.environ["DISTLAB_EXAM_KEY"] = str(Path(_EXAM_KEY_FOLDER) / "exam-key")


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
        if is_rank_process(entry) or any(word in args for word in JOB_COMMANDS):
            found.append(args)
        elif ZYGOTE_MODULE in args and int(stat[stat.rfind(")") + 2 :].split()[1]) != os.getpid():
            found.append(args)  # a zygote is this test process's own, or one that outlived its CLI
    return found


JOB_COMMANDS = ("distlab.runtime.rank.worker", "distlab.runtime.rank.learner_fork", "distlab.worker",
                "prterun", "prted", "mpiexec")


def is_rank_process(proc: Path) -> bool:
    """A rank forked by a zygote runs under the zygote's command line and this name; a learner
    process forked by its rank, under the rank's, and its own name."""
    try:
        return (proc / "comm").read_bytes().strip() in (RANK_PROCESS_NAME, LEARNER_PROCESS_NAME)
    except OSError:
        return False


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One worker more than the cores (pyproject caps it at 4): a test waits on its job's processes
    part of the time (a deadlock to be named, a deadline, a rank to start), and a third worker on 2
    cores used that time: the suite took 768 s against 855 s with two, on the same tree."""
    return len(os.sched_getaffinity(0)) + 1


# The files that keep a worker longest (a batch of fixture checks, trainings, exams: one to four
# minutes each under the suite's load), longest first, as a fresh clone's .ci/run measured them.
# xdist hands out whole files in the order collected (pyproject turns off its reordering by test
# count, which put these last): started first, no worker is left with one of them at the end
# while the others idle. The order changes only the wall time, never what a test sees.
LONGEST_FIRST = (
    "test_problem13.py", "test_problem03_e2e.py", "test_problem04.py", "test_problem14.py", "test_exam.py",
    "test_problem12.py", "test_problem07.py", "test_problem15.py", "test_problem06.py", "test_problem02.py",
    "test_problem05.py", "test_seal_attacks.py", "test_problem09.py", "test_problem11.py", "test_problem10.py",
    "test_process_faults.py", "test_cli.py", "test_engine_gloo.py", "test_bound_in_force.py",
    "test_problem01.py", "test_problem08.py", "test_bench.py", "test_problem16.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    place = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: place.get(item.path.name, len(place)))  # stable: the rest as collected
