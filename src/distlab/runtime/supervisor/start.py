"""Starting a job's processes: mpiexec for MPI (the Open MPI wheel beside the interpreter), or one
process per rank with torchrun's variables on a free port for gloo. Each start is a new session,
so that every process of it can be found and killed. Also the direct mpiexec runs of tests and
benchmarks, started again after Open MPI's known start-up failure.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ...errors import HarnessError
from ..jobspec import (
    ATTEMPT_ENV,
    JOINED_ENV,
    RANK_MODULE,
    RESTARTED_ENV,
    SPAWN_ENV,
    Job,
)
from ..zygote import wire as zygote_wire
from ..zygote.client import STAND_IN, ForkedRank, Zygote, preload_for, zygote_for
from . import mpi_monitoring
from .leftovers import TMP_FOLDER, shared_memory_dir
from .processes import kill_session

if TYPE_CHECKING:
    from .verdicts import LaunchResult



STARTUP_FAILURES = ("PMIx server's listener thread failed to start", "PRTE has lost communication")


def mpiexec_failed_to_start(output: str) -> bool:
    """Open MPI 5's launcher sometimes dies at start-up on a loaded machine (its PMIx listener
    thread does not come up); nothing ran, and a second start works."""
    return any(reason in output for reason in STARTUP_FAILURES)


def run_mpiexec(
    command: list[str], env: dict[str, str], timeout_s: float, cwd: Path | None = None,
    attempts: int = 3,
) -> subprocess.CompletedProcess[str]:
    """Runs an mpiexec command line to its end, starting it again after a known start-up failure.
    For direct runs (an external-launcher test, a benchmark); jobs get the same from ``launch``."""
    for _ in range(attempts):
        done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        if done.returncode == 0 or not mpiexec_failed_to_start(done.stdout + done.stderr):
            break
    return done


def failed_to_start(result: LaunchResult) -> bool:
    """The launcher died before any rank reported anything, for a known start-up reason."""
    return (result.status == "crashed" and not result.outcomes
            and mpiexec_failed_to_start(result.details))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mpiexec_path() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if not found:
        raise HarnessError(
            "mpiexec not found: run scripts/setup.sh (it installs the Open MPI wheel into .venv)"
        )
    return found


def rank_env() -> dict[str, str]:
    """What every rank inherits: one math thread per rank unless the user asked otherwise (as
    torchrun does), because several ranks share the cores and spinning threads steal them."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


# How long an MPI rank that found nothing to progress sleeps before it polls again (idle_sleep).
IDLE_SLEEP_NS = 1_000_000


def mpi_env(idle_sleep: bool = False) -> dict[str, str]:
    """The environment of mpiexec for a job (and for the benchmarks, which measure the same).

    Oversubscribed ranks give the core away while they poll for messages (yield_when_idle), by
    default with sched_yield, which returns at once when the other ranks are waiting too: eight
    ranks in a deadlock kept both cores busy in the kernel (check 03's deadlock fixture: 28.7 s of
    CPU in 14.4 s). ``idle_sleep`` sleeps IDLE_SLEEP_NS instead (plus the kernel's timer slack):
    that fixture then takes 8 s of CPU, and problems 03 and 05's test files on two cores ran in
    100 s instead of 132 s. A sleep of 1 ms rather than 50 us: a dozen idle ranks no longer wake
    tens of thousands of times a second each (problem 12's fixtures, 38.5 s of CPU -> 31.6 s;
    four problems' test files side by side, 225 s -> 200 s). A message that lands during the sleep waits for its end, which the
    virtual clock does not see; a job graded on wall time (--clock wall) keeps sched_yield."""
    env = rank_env()
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_mpi_yield_when_idle="1",
        OMPI_MCA_btl="self,sm,tcp",
        PRTE_MCA_prte_silence_shared_fs="1",
    )
    if idle_sleep:
        env.update(OMPI_MCA_threads_pthreads_yield_strategy="nanosleep",
                   OMPI_MCA_threads_pthreads_nanosleep_time=str(IDLE_SLEEP_NS))
    return env


class Processes:
    """The started processes of one job, and how to end them all: mpiexec, or one per gloo rank
    (a ``Popen``, or a ``ForkedRank`` of the zygote, which answers the same questions)."""

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen[bytes] | ForkedRank] = []

    def exited(self) -> bool:
        return all(p.poll() is not None for p in self.popens)

    def kill_all(self, rank_pids: list[int]) -> None:
        for p in self.popens:
            kill_session(p.pid, rank_pids)
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass


def rank_command() -> list[str]:
    """How a rank process starts: the worker module, with -P, as every process of the harness:
    ``python -m`` alone would put the current folder first on the import path, and a json.py of
    the candidate's there ran as root in every rank and the zygote."""
    return [sys.executable, "-P", "-m", RANK_MODULE]


def rank_args(job: Job, job_dir: Path) -> list[str]:
    return ["--job", str(job_dir), *(["--sealed"] if job.seal else [])]


def start_ranks(job: Job, job_dir: Path, attempt: int = 0) -> Processes:
    procs = Processes()
    # What the processes write to TMPDIR (Open MPI's session folder, the learner's temporary
    # files) stays in the job folder and is removed with it (leftovers.py).
    scratch = {"TMPDIR": str(job_dir / TMP_FOLDER)}
    worker = [*rank_command(), *rank_args(job, job_dir)]
    out = open(job_dir / "launcher.log", "ab")  # forked ranks append to it too
    # Ranks fork from a zygote that has imported what they import, where it runs (runtime/zygote/).
    preload = preload_for(job.backend, job.program_file, job.seal, job.store, _probed_solution(job))
    zygote = zygote_for(rank_env(), preload)
    if job.backend == "mpi":
        asks_zygote = [sys.executable, "-S", "-E", "-s", str(STAND_IN)]
        stand_in = [*asks_zygote, *rank_args(job, job_dir)]
        # Survivors: Open MPI's user-level failure mitigation, whose failure detection needs
        # the TCP transport (docs/architecture.md, "Survivors").
        ulfm = ["--with-ft", "ulfm"] if job.survivors else []
        command = [
            mpiexec_path(), "-n", str(job.world_size), "--oversubscribe", "--bind-to", "none",
            *ulfm, *(worker if zygote is None else stand_in),
        ]
        # mpiexec hands its environment to the ranks it starts on this host.
        env = mpi_env(idle_sleep=not job.wall_clock)
        if job.survivors:
            env["OMPI_MCA_btl"] = "self,tcp"
        env[ATTEMPT_ENV] = str(attempt)
        env.update(scratch)
        segments = shared_memory_dir(job_dir)
        if segments is not None:  # removed with the job, however its ranks end (leftovers.py)
            env["OMPI_MCA_btl_sm_backing_directory"] = str(segments)
        if zygote is not None:
            env[zygote_wire.ZYGOTE_ENV] = zygote.address
        if job.survivors:  # what a newcomer's spawn runs (rank/survival.py)
            env[SPAWN_ENV] = json.dumps(rank_command() if zygote is None else asks_zygote)
        if job.mpi_monitoring:
            env.update(mpi_monitoring.monitoring_env(job_dir))
        procs.popens.append(
            subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True,
            )
        )
    elif job.backend == "gloo":
        port = free_port()
        for rank in range(job.world_size):
            env = _gloo_env(job, attempt, rank, port, scratch)
            zygote = _start_gloo_rank(procs, worker, env, zygote, job_dir, out)
    else:
        raise HarnessError(f"unknown backend {job.backend!r}: use mpi or gloo")
    out.close()
    return procs


def start_newcomer(job: Job, job_dir: Path, attempt: int, world_rank: int, procs: Processes,
                   restarted: int | None = None) -> None:
    """A rank that joins the running gloo job (supervisor/newcomers.py): a process like the
    others, rank ``world_rank`` (the next one of the job), told in its environment that it joins
    (it finds the job through the launch's store and waits there to be admitted) and, for a dead
    rank started again alone, which rank that was."""
    env = _gloo_env(job, attempt, world_rank, 0, {"TMPDIR": str(job_dir / TMP_FOLDER)})
    env[JOINED_ENV] = "1"
    if restarted is not None:
        env[RESTARTED_ENV] = str(restarted)
    worker = [*rank_command(), *rank_args(job, job_dir)]
    zygote = zygote_for(rank_env(), preload_for(job.backend, job.program_file, job.seal, job.store,
                                              _probed_solution(job)))
    with open(job_dir / "launcher.log", "ab") as out:
        _start_gloo_rank(procs, worker, env, zygote, job_dir, out)


def _probed_solution(job: Job) -> str | None:
    """The learner's file, where the job reads its memory (its heavy imports are then preloaded)."""
    return job.solution_file if job.memory_probe else None


def _gloo_env(job: Job, attempt: int, rank: int, port: int, scratch: dict[str, str]) -> dict[str, str]:
    """A gloo rank's environment: torchrun's variables, the attempt, the job's scratch folder."""
    env = rank_env()
    env[ATTEMPT_ENV] = str(attempt)
    env.update(scratch)
    env.update(
        RANK=str(rank), WORLD_SIZE=str(job.world_size), LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(job.world_size), GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    return env


def _start_gloo_rank(procs: Processes, worker: list[str], env: dict[str, str],
                     zygote: Zygote | None, job_dir: Path, out: IO[bytes]) -> Zygote | None:
    """Starts one gloo rank, forked from the zygote where it can; the zygote for the next one
    (None once it refused: the ranks not forked yet start as plain processes)."""
    if zygote is not None:
        try:
            procs.popens.append(zygote.fork(worker[len(rank_command()):], env, job_dir / "launcher.log"))
            return zygote
        except zygote_wire.Refused:
            zygote = None
    procs.popens.append(
        subprocess.Popen(
            worker, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            start_new_session=True,
        )
    )
    return zygote
