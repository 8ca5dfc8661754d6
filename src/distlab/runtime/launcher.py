"""Starting a job's ranks as real processes and watching them until they finish or must be ended.

Call order: ``launch(job)`` writes the job folder, starts the ranks (mpiexec, or one process per
rank with torchrun's variables for gloo), then polls every 50 ms: outcome files, the launcher's
exit, the ranks' state slots and the deadline. It always ends with every process of the job gone,
whatever happened: a pass, a learner exception, a crash, a deadlock, the deadline, or Ctrl-C.

The decision of what a poll means (``judge``) is a pure function of what was observed, kept apart
from the side effects so it is tested without processes.

Process faults (``job.faults``: kill, stop, restart; docs/fault-plans.md). On each poll the
supervisor reads every rank's step from its state slot, asks ``ProcessFaults.due`` (through the pure
``due_signals``) which signals are due, sends them to the rank's pid (SIGKILL, SIGSTOP, SIGCONT
``cont_after_s`` later) and records each action's sentence in ``LaunchResult.fault_events``. A rank
killed by a fault makes the run "crashed" with the fault named, unless the other ranks carry on and
finish without it (code that survives a peer's death), which is a pass. While a fault holds a rank
stopped, the stall rule declares no deadlock: the job is meant to look stuck; the deadline still
holds. With a ``restart`` fault, a run that crashed starts again, in a fresh job folder, up to
``max_restarts`` times within the one deadline; the ranks read which attempt they are from the
environment variable ``DISTLAB_ATTEMPT`` (0 first, n after the nth restart). Each kill or stop fires
once per run, restarts included, and ``at_s`` triggers count from the first attempt's start.
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HarnessError
from . import mpi_monitoring, rankstate, waitfor
from .faults import FaultPlan, ProcessAction, ProcessFaults
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
ATTEMPT_ENV = "DISTLAB_ATTEMPT"  # which attempt a rank belongs to: 0, then 1 after a restart, ...
_SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT}


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
    # Process faults: how many times the job was started (1 + restarts), every signal the
    # supervisor sent in every attempt as "rank 3 was killed (SIGKILL) at step 30 by fault[1]",
    # and why each attempt before the last one ended (the last one's is ``message``).
    attempts: int = 1
    fault_events: list[str] = field(default_factory=list)
    restarted_after: list[str] = field(default_factory=list)
    # With Job.mpi_monitoring, on a run that ended well: what Open MPI's monitoring counted, per
    # rank that reached MPI_Finalize (runtime/mpi_monitoring.py); None when not asked for.
    mpi_traffic: dict[int, mpi_monitoring.RankMonitoring] | None = None

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
    killed: frozenset[int] = frozenset()  # ranks a fault SIGKILLed in this attempt
    stopped: frozenset[int] = frozenset()  # ranks a fault holds SIGSTOPped now (no SIGCONT yet)


@dataclass(frozen=True)
class Verdict:
    action: str  # "wait", "done", "error", "crashed", "deadlock", "timeout", "killed"


def judge(obs: Observation, world_size: int, deadline_s: float, stall_s: float) -> Verdict:
    """Decides what a poll means. Pure: tested with made-up observations."""
    failed = any(o.error is not None for o in obs.outcomes.values())
    if obs.killed:
        # A rank is gone on purpose. Its peers either carry on without it (all of them report:
        # a pass) or fail, end, or wait for it for ever; every way, the kill is the story.
        survivors = set(range(world_size)) - obs.killed
        if not failed and survivors.issubset(obs.outcomes):
            return Verdict("done")
        if failed or obs.launcher_exited:
            return Verdict("killed")
        if obs.stalled_for_s >= stall_s and not obs.stopped and survivors_stuck(
            obs.states, world_size, obs.killed
        ):
            return Verdict("killed")
    if failed:
        return Verdict("error")
    if len(obs.outcomes) == world_size:
        return Verdict("done")
    if obs.launcher_exited:
        return Verdict("crashed")
    # A rank stopped by a fault is meant to make the job look stuck (problems detect it from
    # inside): only the deadline ends such a run.
    if obs.stalled_for_s >= stall_s and not obs.stopped and is_stuck(obs.states, world_size):
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


def survivors_stuck(
    states: list[rankstate.RankState], world_size: int, killed: frozenset[int]
) -> bool:
    """Every rank still alive waits in a call or between tasks: with a peer gone for good, even a
    collective they all sit in can never complete (``is_stuck`` would call that progress)."""
    live = [s for s in states if s.rank not in killed]
    if len(live) < world_size - len(killed):
        return False
    return all(s.state in ("blocked", "idle", "finished") for s in live)


def due_signals(
    faults: ProcessFaults,
    states: list[rankstate.RankState],
    skip: frozenset[int],
    elapsed_s: float,
    fired: frozenset[int],
    stopped_at_s: Mapping[int, float],
) -> list[ProcessAction]:
    """The signals due now, in rank order then plan order. Pure: the caller sends them.

    ``states`` are the ranks seen running (a slot exists); ``skip`` holds ranks not to touch:
    those that reported (their work is done; killing one would fail a finished run), those already
    killed, and those whose pid is not known yet.
    """
    actions: list[ProcessAction] = []
    for s in sorted(states, key=lambda s: s.rank):
        if s.rank not in skip:
            actions += faults.due(s.rank, s.step, elapsed_s, fired, stopped_at_s)
    return actions


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


def should_restart(status: str, attempt: int, restarts_allowed: int, time_left_s: float) -> bool:
    """A crash (a kill included) starts the job again while the plan's budget and the deadline
    allow. An exception in the learner's code is not retried: it would only fail the same way."""
    return status == "crashed" and attempt < restarts_allowed and time_left_s > 0


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


def mpi_env() -> dict[str, str]:
    """The environment of mpiexec for a job (and for the benchmarks, which measure the same)."""
    env = rank_env()
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


class _FaultState:
    """What the supervisor has done with a plan's process faults.

    ``fired`` and ``events`` span the whole run (each kill/stop fires once, restarts included);
    the rest describes the processes of the current attempt and starts empty with each attempt.
    """

    def __init__(self, plan: FaultPlan) -> None:
        self.faults = ProcessFaults(plan)
        self.restarts = self.faults.restarts_allowed()
        self.fired: set[int] = set()
        self.events: list[str] = []
        self.new_attempt()

    def new_attempt(self) -> None:
        self.stopped_at_s: dict[int, float] = {}  # stop fault index -> elapsed at its SIGSTOP
        self.stops: dict[int, ProcessAction] = {}  # stop fault index -> its action, until SIGCONT
        self.killed: dict[int, str] = {}  # rank -> the sentence of its kill

    def stopped(self) -> frozenset[int]:
        return frozenset(a.rank for a in self.stops.values())

    def apply(self, action: ProcessAction, pid: int, elapsed_s: float) -> None:
        """Sends the action's signal and records it, as ``ProcessFaults.due`` expects."""
        signal_quietly(pid, _SIGNALS[action.kind])
        self.events.append(action.describe())
        if action.kind == "cont":
            self.stopped_at_s.pop(action.fault_index, None)
            self.stops.pop(action.fault_index, None)
            return
        self.fired.add(action.fault_index)
        if action.kind == "stop":
            self.stopped_at_s[action.fault_index] = elapsed_s
            self.stops[action.fault_index] = action
            return
        self.killed[action.rank] = action.describe()
        # SIGKILL ends a stopped process too: it is no longer held, and gets no SIGCONT.
        for index in [i for i, a in self.stops.items() if a.rank == action.rank]:
            self.stopped_at_s.pop(index, None)
            self.stops.pop(index)


def _process_faults(job: Job) -> _FaultState | None:
    """The job's process faults, checked against its world before anything starts; None if the
    plan has none (then the poll loop does no fault work at all)."""
    plan = job.faults
    if not isinstance(plan, FaultPlan) or not plan.of_kind("kill", "stop", "restart"):
        return None
    return _FaultState(plan.validate_for(job.world_size))


def _start(job: Job, job_dir: Path, attempt: int = 0) -> _Processes:
    procs = _Processes()
    worker = [sys.executable, "-m", "distlab.runtime.worker", "--job", str(job_dir)]
    out = open(job_dir / "launcher.log", "wb")
    if job.backend == "mpi":
        command = [
            mpiexec_path(), "-n", str(job.world_size), "--oversubscribe", "--bind-to", "none",
            *worker,
        ]
        # mpiexec hands its environment to the ranks it starts on this host.
        env = mpi_env()
        env[ATTEMPT_ENV] = str(attempt)
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
            env = rank_env()
            env[ATTEMPT_ENV] = str(attempt)
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
    """Runs the job to its end and returns what happened; never leaves a process behind.

    With a ``restart`` fault in ``job.faults``, a crashed attempt is followed by another in a fresh
    job folder (``keep_dir/attempt-N`` when folders are kept), within the same deadline; the result
    is the last attempt's, with ``attempts`` and the fault events of every attempt.
    """
    if keep_dir is None and os.environ.get("DISTLAB_KEEP_JOBS"):
        # For debugging the harness: leave every job folder (logs, stacks, states) in place.
        keep_root = Path(os.environ["DISTLAB_KEEP_JOBS"])
        keep_root.mkdir(parents=True, exist_ok=True)
        keep_dir = Path(tempfile.mkdtemp(prefix="distlab-job-", dir=keep_root))
    faults = _process_faults(job)
    started = time.monotonic()  # the clock of the deadline and of at_s triggers, for every attempt
    earlier: list[str] = []
    attempt = 0
    start_retried = False
    while True:
        kept = keep_dir if keep_dir is None or attempt == 0 else keep_dir / f"attempt-{attempt}"
        result = _run_attempt(job, attempt, started, deadline_s, stall_s, kept, faults)
        time_left = deadline_s - (time.monotonic() - started)
        if not start_retried and failed_to_start(result) and time_left > 5:
            # Open MPI's launcher sometimes fails to start on a heavily loaded machine before any
            # rank runs; nothing of the learner's ran, so trying once more is safe.
            start_retried = True
            continue
        if faults is None or not should_restart(result.status, attempt, faults.restarts, time_left):
            break
        earlier.append(f"attempt {attempt} {result.status}: {result.message}")
        attempt += 1
    result.attempts = attempt + 1
    result.restarted_after = earlier
    result.fault_events = list(faults.events) if faults is not None else []
    return result


def _run_attempt(
    job: Job,
    attempt: int,
    started: float,
    deadline_s: float,
    stall_s: float,
    keep_dir: Path | None,
    faults: _FaultState | None,
) -> LaunchResult:
    """One start of the job's ranks, polled to its end; every process of it is gone on return."""
    job_dir = Path(tempfile.mkdtemp(prefix="distlab-job-")) if keep_dir is None else keep_dir
    job_dir.mkdir(parents=True, exist_ok=True)
    write_pickle_atomically(job_dir / JOB_FILE, job)
    if faults is not None:
        faults.new_attempt()
    procs = _start(job, job_dir, attempt)
    outcomes: dict[int, RankOutcome] = {}
    pids: dict[int, int] = {}  # rank -> pid, once its pid file is there (fixed for the attempt)
    last_seqs: tuple[int, ...] = ()
    last_change = time.monotonic()
    try:
        while True:
            time.sleep(POLL_S)
            now = time.monotonic()
            _collect_outcomes(job_dir, job.world_size, outcomes)
            states = [s for r in range(job.world_size) if (s := rankstate.read_state(job_dir, r))]
            seqs = tuple(s.seq for s in states)
            if seqs != last_seqs:
                last_seqs, last_change = seqs, now
            killed: frozenset[int] = frozenset()
            stopped: frozenset[int] = frozenset()
            if faults is not None:
                if _apply_faults(faults, job_dir, job.world_size, states, outcomes, pids, now - started):
                    # A rank just continued: it had no chance to move yet, so the stall clock
                    # starts again rather than counting its frozen time as no progress.
                    last_change = now
                killed, stopped = frozenset(faults.killed), faults.stopped()
            obs = Observation(
                now - started, procs.exited(), outcomes, states, now - last_change, killed, stopped
            )
            verdict = judge(obs, job.world_size, deadline_s, stall_s)
            if verdict.action == "wait":
                continue
            if verdict.action == "done":
                # Monitoring files are written at MPI_Finalize: give the ranks longer to get there.
                _wait_briefly(procs, 10.0 if job.mpi_monitoring else 3.0)
            result = _conclude(
                verdict.action, job, job_dir, procs, outcomes, states, now - started,
                obs.stalled_for_s, faults,
            )
            break
    except BaseException:
        procs.kill_all(_rank_pids(job_dir, job.world_size))
        _cleanup(job_dir, keep_dir)
        raise
    # SIGKILL ends stopped ranks as well, and mpiexec/prterun never learn of a stop (they wait for
    # exits only), so no SIGCONT is needed first.
    procs.kill_all(_rank_pids(job_dir, job.world_size))
    if job.mpi_monitoring and job.backend == "mpi" and result.ok:
        result.mpi_traffic = mpi_monitoring.read_job(job_dir, job.world_size)
    _cleanup(job_dir, keep_dir)
    return result


def _apply_faults(
    faults: _FaultState,
    job_dir: Path,
    world: int,
    states: list[rankstate.RankState],
    outcomes: Mapping[int, RankOutcome],
    pids: dict[int, int],
    elapsed_s: float,
) -> bool:
    """Sends the signals due now; True if one of them was a SIGCONT."""
    for rank in range(world):
        if rank not in pids:
            try:
                pids[rank] = int(pid_path(job_dir, rank).read_text())
            except (OSError, ValueError):  # not started yet, or the file is half written
                pass
    skip = frozenset(outcomes) | frozenset(faults.killed) | (frozenset(range(world)) - pids.keys())
    actions = due_signals(
        faults.faults, states, skip, elapsed_s, frozenset(faults.fired), faults.stopped_at_s
    )
    for action in actions:
        faults.apply(action, pids[action.rank], elapsed_s)
    return any(a.kind == "cont" for a in actions)


def _wait_briefly(procs: _Processes, seconds: float = 3.0) -> None:
    # Ranks that wrote their outcome are finalizing; give them a moment to leave on their own.
    end = time.monotonic() + seconds
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
    faults: _FaultState | None = None,
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
    elif action == "killed":
        assert faults is not None
        _conclude_killed(result, job, job_dir, procs, outcomes, states, stalled_for, faults)
    elif action in ("deadlock", "timeout"):
        graph = _collect_stacks(job_dir, job, _alive(states, faults))
        result.status = action
        if action == "deadlock":
            hung = [st.rank for st in states if st.state == "blocked" and st.op == "hung"]
            if hung:
                head = (f"rank(s) {', '.join(map(str, hung))} hung by the fault plan, and every "
                        "other rank waits: the job is stuck")
            elif graph.cycle:
                head = waitfor.cycle_sentence(graph.cycle) + ": a deadlock"
            else:
                head = "every rank waits and none can go on: a deadlock"
            result.message = f"{head} (no rank made progress for {stalled_for:.1f} s)"
        else:
            result.message = f"the run passed its deadline of {elapsed:.0f} s"
            # A stopped or killed rank's slot may still say "running": it computes nothing.
            held = faults.stopped() | frozenset(faults.killed) if faults is not None else frozenset()
            running = [s.rank for s in states if s.state == "running" and s.rank not in held]
            if running:
                result.message += f"; rank(s) {', '.join(map(str, running))} still computing"
            if faults is not None:
                result.message += "".join(
                    f"; {a.describe()} and was not continued" for a in faults.stops.values()
                )
                result.message += "".join(f"; {k}" for k in faults.killed.values())
        result.details = graph.describe() + "\n\n" + _stacks(job_dir, job)
        if faults is not None and faults.stops:
            # The slot of a frozen rank shows the call it was stopped in, not a wait of its own.
            frozen = "".join(
                f"rank {a.rank} is frozen by fault[{i}] (SIGSTOP): its line below is where it "
                "stopped, and it has no stack to show\n"
                for i, a in faults.stops.items()
            )
            result.details = frozen + result.details
        if faults is not None and faults.killed:
            result.details = _dead_lines(faults) + result.details
        blocked = [s.task for s in states if s.state == "blocked"]
        result.failing_task = min(blocked) if blocked else None
    else:  # crashed: the launcher exited before every rank reported
        missing = [r for r in range(job.world_size) if r not in outcomes]
        result.status = "crashed"
        result.failing_rank = missing[0] if missing else None
        cause = _crash_cause(job_dir, missing, procs)
        result.message = f"rank(s) {', '.join(map(str, missing))} ended without reporting: {cause}"
        result.details = _stacks(job_dir, job, only=missing) or _launcher_tail(job_dir)
    if faults is not None and faults.events:
        applied = "\n".join(f"  {e}" for e in faults.events)
        result.details = f"{result.details}\n\nprocess faults applied (fault plan):\n{applied}".lstrip()
    result.logs = _logs(job_dir, job.world_size)
    return result


def _collect_stacks(
    job_dir: Path, job: Job, states: list[rankstate.RankState]
) -> waitfor.WaitForGraph:
    """Asks every rank for its stack (SIGUSR1; a stopped rank cannot answer) and returns the
    wait-for graph of the last poll."""
    for pid in _rank_pids(job_dir, job.world_size):
        signal_quietly(pid, signal.SIGUSR1)
    time.sleep(STACK_WAIT_S)
    return waitfor.build(states, job.world_size)


def _conclude_killed(
    result: LaunchResult,
    job: Job,
    job_dir: Path,
    procs: _Processes,
    outcomes: dict[int, RankOutcome],
    states: list[rankstate.RankState],
    stalled_for: float,
    faults: _FaultState,
) -> None:
    """A fault killed a rank and the others could not finish without it: the kill leads the
    message, then what became of the rest (an error, an exit, or waiting for ever)."""
    killed = sorted(faults.killed)
    result.status = "crashed"
    result.failing_rank = killed[0]
    result.failing_task = next((s.task for s in states if s.rank == killed[0]), None)
    head = "; ".join(faults.killed[r] for r in killed)
    others = [r for r in range(job.world_size) if r not in outcomes and r not in faults.killed]
    failed = [(r, o.error) for r, o in sorted(outcomes.items()) if o.error is not None]
    if failed:
        rank, err = failed[0]
        assert err is not None
        at = f" at {err.where}" if err.where else ""
        then = f"then rank {rank} failed: {err.summary}{at}"
        result.details = err.traceback
    elif procs.exited():
        then = (
            f"then rank(s) {', '.join(map(str, others))} ended without reporting"
            if others else "then the job ended"
        )
        result.details = _launcher_tail(job_dir)
    else:
        graph = _collect_stacks(job_dir, job, _alive(states, faults))
        then = (
            f"then rank(s) {', '.join(map(str, others))} waited for it and none could go on "
            f"(no progress for {stalled_for:.1f} s)"
        )
        result.details = (
            _dead_lines(faults) + graph.describe() + "\n\n" + _stacks(job_dir, job, only=others)
        )
    result.message = f"{head}; {then}"


def _alive(states: list[rankstate.RankState], faults: _FaultState | None) -> list[rankstate.RankState]:
    """The states of ranks not killed by a fault: a dead rank's slot keeps its last call, which
    would read as a wait of its own in the wait-for graph."""
    if faults is None:
        return states
    return [s for s in states if s.rank not in faults.killed]


def _dead_lines(faults: _FaultState) -> str:
    return "".join(f"rank {r} is gone: {faults.killed[r]}\n" for r in sorted(faults.killed))


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
