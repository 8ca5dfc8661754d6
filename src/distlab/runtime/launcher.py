"""Starting a job's ranks as real processes and watching them until they finish or must be ended.

Call order: ``launch(job)`` writes the job folder, starts the ranks (mpiexec, or one process per
rank with torchrun's variables for gloo), then polls every 50 ms: outcome files, the launcher's
exit, the ranks' state slots and the deadline. It always ends with every process of the job gone,
whatever happened: a pass, a learner exception, a crash, a deadlock, the deadline, or Ctrl-C.

The decision of what a poll means (``judge``) is a pure function of what was observed, kept apart
from the side effects so it is tested without processes.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HarnessError
from . import rankstate, waitfor
from .jobspec import (
    JOB_FILE,
    Job,
    RankOutcome,
    TaskOutcome,
    log_path,
    outcome_path,
    pid_path,
    stack_path,
    write_pickle_atomically,
)
from .processes import kill_session, signal_quietly

POLL_S = 0.05
STACK_WAIT_S = 0.5


@dataclass
class LaunchResult:
    """What happened to one launch. ``status`` is one of ok, error, deadlock, timeout, crashed."""

    status: str
    backend: str
    world_size: int
    wall_s: float
    outcomes: dict[int, RankOutcome] = field(default_factory=dict)
    message: str = ""
    details: str = ""
    failing_rank: int | None = None
    failing_task: int | None = None
    logs: dict[int, str] = field(default_factory=dict)
    task_labels: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def task_outcomes(self, index: int) -> list[TaskOutcome]:
        """Per-rank outcomes of task ``index`` (ranks that took part, in rank order)."""
        found = []
        for rank in sorted(self.outcomes):
            tasks = self.outcomes[rank].tasks
            if index < len(tasks) and tasks[index] is not None:
                found.append(tasks[index])
        return found  # type: ignore[return-value]


@dataclass(frozen=True)
class Observation:
    """One poll of a running job."""

    elapsed_s: float
    launcher_exited: bool
    outcomes: dict[int, RankOutcome]
    states: list[rankstate.RankState]
    stalled_for_s: float


@dataclass(frozen=True)
class Verdict:
    action: str  # "wait", "done", "error", "crashed", "deadlock", "timeout"


def judge(obs: Observation, world_size: int, deadline_s: float, stall_s: float) -> Verdict:
    """Decides what a poll means. Pure: tested with made-up observations."""
    if any(o.error is not None for o in obs.outcomes.values()):
        return Verdict("error")
    if len(obs.outcomes) == world_size:
        return Verdict("done")
    if obs.launcher_exited:
        return Verdict("crashed")
    if obs.stalled_for_s >= stall_s and is_stuck(obs.states, world_size):
        return Verdict("deadlock")
    if obs.elapsed_s >= deadline_s:
        return Verdict("timeout")
    return Verdict("wait")


def is_stuck(states: list[rankstate.RankState], world_size: int) -> bool:
    """Every unfinished rank waits in a call, and not all of them in one collective together."""
    if len(states) < world_size:
        return False
    waiting = [s for s in states if s.state not in ("finished", "idle")]
    if not waiting or any(s.state != "blocked" for s in waiting):
        return False
    same_collective = all(s.peers == (rankstate.ALL_PEERS,) for s in waiting) and len(
        {s.op for s in waiting}
    ) == 1 and len(waiting) + sum(s.state == "idle" for s in states) == world_size
    return not same_collective


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


def _mpi_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        # Oversubscribed ranks must give the core away while they poll for messages.
        OMPI_MCA_mpi_yield_when_idle="1",
        OMPI_MCA_btl="self,sm,tcp",
        PRTE_MCA_prte_silence_shared_fs="1",
    )
    return env


class _Processes:
    """The started processes of one job, and how to end them all."""

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen[bytes]] = []

    def exited(self) -> bool:
        return all(p.poll() is not None for p in self.popens)

    def kill_all(self, rank_pids: list[int]) -> None:
        for p in self.popens:
            kill_session(p.pid, rank_pids)
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass


def _start(job: Job, job_dir: Path) -> _Processes:
    procs = _Processes()
    worker = [sys.executable, "-m", "distlab.runtime.worker", "--job", str(job_dir)]
    out = open(job_dir / "launcher.log", "wb")
    if job.backend == "mpi":
        command = [
            mpiexec_path(), "-n", str(job.world_size), "--oversubscribe", "--bind-to", "none",
            *worker,
        ]
        procs.popens.append(
            subprocess.Popen(
                command, env=_mpi_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True,
            )
        )
    elif job.backend == "gloo":
        port = free_port()
        for rank in range(job.world_size):
            env = dict(os.environ)
            env.update(
                RANK=str(rank), WORLD_SIZE=str(job.world_size), LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(job.world_size), GROUP_RANK="0",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
            )
            procs.popens.append(
                subprocess.Popen(
                    worker, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                    start_new_session=True,
                )
            )
    else:
        raise HarnessError(f"unknown backend {job.backend!r}: use mpi or gloo")
    out.close()
    return procs


def launch(
    job: Job,
    deadline_s: float = 60.0,
    stall_s: float = 3.0,
    keep_dir: Path | None = None,
) -> LaunchResult:
    """Runs the job to its end and returns what happened; never leaves a process behind."""
    if keep_dir is None and os.environ.get("DISTLAB_KEEP_JOBS"):
        # For debugging the harness: leave every job folder (logs, stacks, states) in place.
        keep_dir = Path(tempfile.mkdtemp(prefix="distlab-job-", dir=os.environ["DISTLAB_KEEP_JOBS"]))
    job_dir = Path(tempfile.mkdtemp(prefix="distlab-job-")) if keep_dir is None else keep_dir
    job_dir.mkdir(parents=True, exist_ok=True)
    write_pickle_atomically(job_dir / JOB_FILE, job)
    started = time.monotonic()
    procs = _start(job, job_dir)
    outcomes: dict[int, RankOutcome] = {}
    last_seqs: tuple[int, ...] = ()
    last_change = started
    try:
        while True:
            time.sleep(POLL_S)
            now = time.monotonic()
            _collect_outcomes(job_dir, job.world_size, outcomes)
            states = [s for r in range(job.world_size) if (s := rankstate.read_state(job_dir, r))]
            seqs = tuple(s.seq for s in states)
            if seqs != last_seqs:
                last_seqs, last_change = seqs, now
            obs = Observation(now - started, procs.exited(), outcomes, states, now - last_change)
            verdict = judge(obs, job.world_size, deadline_s, stall_s)
            if verdict.action == "wait":
                continue
            if verdict.action == "done":
                _wait_briefly(procs)
            result = _conclude(
                verdict.action, job, job_dir, procs, outcomes, states, now - started, obs.stalled_for_s
            )
            break
    except BaseException:
        procs.kill_all(_rank_pids(job_dir, job.world_size))
        _cleanup(job_dir, keep_dir)
        raise
    procs.kill_all(_rank_pids(job_dir, job.world_size))
    _cleanup(job_dir, keep_dir)
    return result


def _wait_briefly(procs: _Processes) -> None:
    # Ranks that wrote their outcome are finalizing; give them a moment to leave on their own.
    end = time.monotonic() + 3.0
    while not procs.exited() and time.monotonic() < end:
        time.sleep(POLL_S)


def _collect_outcomes(job_dir: Path, world: int, outcomes: dict[int, RankOutcome]) -> None:
    for rank in range(world):
        if rank in outcomes:
            continue
        path = outcome_path(job_dir, rank)
        if path.exists():
            with open(path, "rb") as f:
                outcomes[rank] = pickle.load(f)


def _rank_pids(job_dir: Path, world: int) -> list[int]:
    pids = []
    for rank in range(world):
        try:
            pids.append(int(pid_path(job_dir, rank).read_text()))
        except (OSError, ValueError):
            pass
    return pids


def _conclude(
    action: str,
    job: Job,
    job_dir: Path,
    procs: _Processes,
    outcomes: dict[int, RankOutcome],
    states: list[rankstate.RankState],
    elapsed: float,
    stalled_for: float = 0.0,
) -> LaunchResult:
    result = LaunchResult("ok", job.backend, job.world_size, elapsed, dict(outcomes))
    result.task_labels = list(job.task_labels)
    if action == "done":
        result.logs = _logs(job_dir, job.world_size)
        return result
    if action == "error":
        rank, outcome = min(
            ((r, o) for r, o in outcomes.items() if o.error is not None), key=lambda ro: ro[0]
        )
        assert outcome.error is not None
        err = outcome.error
        result.status = "error"
        result.failing_rank, result.failing_task = rank, err.task_index
        at = f" at {err.where}" if err.where else ""
        result.message = f"rank {rank}: {err.summary}{at}"
        result.details = err.traceback
    elif action in ("deadlock", "timeout"):
        pids = _rank_pids(job_dir, job.world_size)
        for pid in pids:
            signal_quietly(pid, signal.SIGUSR1)
        time.sleep(STACK_WAIT_S)
        graph = waitfor.build(states, job.world_size)
        result.status = action
        if action == "deadlock":
            head = (
                waitfor.cycle_sentence(graph.cycle) + ": a deadlock"
                if graph.cycle
                else "every rank waits and none can go on: a deadlock"
            )
            result.message = f"{head} (no rank made progress for {stalled_for:.1f} s)"
        else:
            result.message = f"the run passed its deadline of {elapsed:.0f} s"
            running = [s.rank for s in states if s.state == "running"]
            if running:
                result.message += f"; rank(s) {', '.join(map(str, running))} still computing"
        result.details = graph.describe() + "\n\n" + _stacks(job_dir, job)
        blocked = [s.task for s in states if s.state == "blocked"]
        result.failing_task = min(blocked) if blocked else None
    else:  # crashed: the launcher exited before every rank reported
        missing = [r for r in range(job.world_size) if r not in outcomes]
        result.status = "crashed"
        result.failing_rank = missing[0] if missing else None
        cause = _crash_cause(job_dir, missing, procs)
        result.message = f"rank(s) {', '.join(map(str, missing))} ended without reporting: {cause}"
        result.details = _stacks(job_dir, job, only=missing) or _launcher_tail(job_dir)
    result.logs = _logs(job_dir, job.world_size)
    return result


def _crash_cause(job_dir: Path, missing: list[int], procs: _Processes) -> str:
    texts = []
    for rank in missing:
        try:
            texts.append(stack_path(job_dir, rank).read_text())
        except OSError:
            pass
    blob = "\n".join(texts)
    for needle, cause in (
        ("Aborted", "killed by SIGABRT (abort() was called)"),
        ("Segmentation fault", "segmentation fault"),
        ("Floating-point exception", "floating-point exception"),
        ("Bus error", "bus error"),
    ):
        if needle in blob:
            return cause
    codes = [p.returncode for p in procs.popens if p.returncode is not None and p.returncode < 0]
    if codes:
        return f"killed by signal {signal.Signals(-codes[0]).name}"
    log = (job_dir / "launcher.log").read_text(errors="replace") if (job_dir / "launcher.log").exists() else ""
    if "signal 9" in log or "Killed" in log:
        return "killed by SIGKILL (out of memory, or killed from outside)"
    return "the process exited without writing its outcome (os._exit or a signal)"


def _stacks(job_dir: Path, job: Job, only: list[int] | None = None) -> str:
    parts = []
    for rank in only if only is not None else range(job.world_size):
        try:
            text = stack_path(job_dir, rank).read_text()
        except OSError:
            continue
        trimmed = _main_thread(text)
        if trimmed:
            parts.append(f"rank {rank} stack (most recent call first):\n{trimmed}")
    return "\n".join(parts)


def _main_thread(dump: str) -> str:
    """The frames of the thread that took the signal, without harness-internal frames."""
    blocks = dump.split("\n\n")
    chosen = next((b for b in blocks if "Current thread" in b or "Fatal Python error" in b), "")
    lines = [
        line for line in chosen.splitlines()
        if line.startswith("  File") and "/distlab/runtime/" not in line
    ]
    return "\n".join(lines[:12])


def _launcher_tail(job_dir: Path) -> str:
    try:
        text = (job_dir / "launcher.log").read_text(errors="replace")
    except OSError:
        return ""
    return "launcher output:\n" + "\n".join(text.strip().splitlines()[-15:])


def _logs(job_dir: Path, world: int) -> dict[int, str]:
    logs = {}
    for rank in range(world):
        try:
            text = log_path(job_dir, rank).read_text(errors="replace")
        except OSError:
            continue
        if text.strip():
            logs[rank] = text[-4000:]
    return logs


def _cleanup(job_dir: Path, keep_dir: Path | None) -> None:
    if keep_dir is None:
        shutil.rmtree(job_dir, ignore_errors=True)
