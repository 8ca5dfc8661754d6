"""What a launch ended as, in sentences: the result of a launch, and the explanations the
supervisor writes for each verdict (the failing rank and its error, the deadlock's cycle, what a
fault did, how a crashed rank died, the ranks' stacks and logs).
"""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..comm import rankstate
from ..jobspec import Job, RankOutcome, TaskOutcome, log_path
from . import mpi_monitoring, waitfor
from .crashes import Death, crash_cause, first_death, launcher_tail, stacks
from .process_faults import FaultState
from .processes import rank_pids, signal_quietly
from .start import Processes

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
    # Process faults: how many times the job was started (1 + restarts), every signal the
    # supervisor sent in every attempt as "rank 3 was killed (SIGKILL) at step 30 by fault[1]",
    # and why each attempt before the last one ended (the last one's is ``message``).
    attempts: int = 1
    fault_events: list[str] = field(default_factory=list)
    restarted_after: list[str] = field(default_factory=list)
    # With Job.mpi_monitoring, on a run that ended well: what Open MPI's monitoring counted, per
    # rank that reached MPI_Finalize (mpi_monitoring.py); None when not asked for.
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


def conclude(
    action: str,
    job: Job,
    job_dir: Path,
    procs: Processes,
    outcomes: dict[int, RankOutcome],
    states: list[rankstate.RankState],
    elapsed: float,
    stalled_for: float = 0.0,
    faults: FaultState | None = None,
) -> LaunchResult:
    result = LaunchResult("ok", job.backend, job.world_size, elapsed, dict(outcomes))
    result.task_labels = list(job.task_labels)
    if action == "done":
        result.logs = _logs(job_dir, job.world_size)
        return result
    death = first_death(job, job_dir, procs, set(outcomes)) if action in ("error", "crashed") else None
    if death is None and action == "error" and _peers_lost(outcomes):
        death = _death_behind_lost_peers(job, job_dir, procs, outcomes)
    if death is not None and (action == "crashed" or _peers_lost(outcomes)):
        # The others failed because this rank was gone: it is the one to name.
        others = [r for r in range(job.world_size) if r != death.rank and r not in outcomes]
        result.status, result.failing_rank = "crashed", death.rank
        result.message = death.describe() + (
            f"; the others then ended too (rank(s) {', '.join(map(str, others))})" if others else "")
        result.details = stacks(job_dir, job.world_size, only=[death.rank]) or launcher_tail(job_dir)
        result.failing_task = _task_of(states, death.rank)
    elif action == "error":
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
            lobby = _unadmitted(states, outcomes)
            if hung:
                head = (f"rank(s) {', '.join(map(str, hung))} hung by the fault plan, and every "
                        "other rank waits: the job is stuck")
            elif lobby:
                head = lobby
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
        # The slot of a frozen rank shows the call it was stopped in, not a wait of its own.
        frozen = {a.rank: f"rank {a.rank} is stopped (SIGSTOP) by fault[{i}]: it computes nothing "
                          "and has no stack to show" for i, a in (faults.stops.items() if faults else ())}
        result.details = graph.describe(frozen) + "\n\n" + stacks(job_dir, job.world_size)
        if faults is not None and faults.killed:
            result.details = _dead_lines(faults) + result.details
        blocked = [s.task for s in states if s.state == "blocked"]
        result.failing_task = min(blocked) if blocked else None
    else:  # crashed: the launcher exited before every rank reported
        missing = [r for r in range(job.world_size) if r not in outcomes]
        result.status = "crashed"
        result.failing_rank = missing[0] if missing else None
        cause = crash_cause(job_dir, missing, procs)
        result.message = f"rank(s) {', '.join(map(str, missing))} ended without reporting: {cause}"
        result.details = stacks(job_dir, job.world_size, only=missing) or launcher_tail(job_dir)
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
    for pid in rank_pids(job_dir, job.world_size):
        signal_quietly(pid, signal.SIGUSR1)
    time.sleep(STACK_WAIT_S)
    return waitfor.build(states, job.world_size,
                         rankstate.read_communicators(job_dir, job.world_size))


def _conclude_killed(
    result: LaunchResult,
    job: Job,
    job_dir: Path,
    procs: Processes,
    outcomes: dict[int, RankOutcome],
    states: list[rankstate.RankState],
    stalled_for: float,
    faults: FaultState,
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
        result.details = launcher_tail(job_dir)
    else:
        graph = _collect_stacks(job_dir, job, _alive(states, faults))
        then = "then " + (_unadmitted(_alive(states, faults), outcomes) or (
            f"rank(s) {', '.join(map(str, others))} waited for it and none could go on "
            f"(no progress for {stalled_for:.1f} s)"))
        result.details = (
            _dead_lines(faults) + graph.describe() + "\n\n" + stacks(job_dir, job.world_size, only=others)
        )
    result.message = f"{head}; {then}"


def _unadmitted(states: list[rankstate.RankState], outcomes: dict[int, RankOutcome]) -> str:
    """Why the job is stuck when every rank left waits in the lobby of a running job (joined,
    never admitted), or "" when some other rank waits too."""
    waiting = [s.rank for s in states if s.rank not in outcomes and s.state != "finished"]
    lobby = [s.rank for s in states if s.state == "blocked" and s.op == "Admit"
             and s.peers != (rankstate.ALL_PEERS,)]
    if not lobby or sorted(lobby) != sorted(waiting):
        return ""
    return (f"rank(s) {', '.join(map(str, lobby))} joined the running job and waited to be "
            "admitted, but the others finished without a comm.Admit() after they arrived")


def _alive(states: list[rankstate.RankState], faults: FaultState | None) -> list[rankstate.RankState]:
    """The states of ranks not killed by a fault: a dead rank's slot keeps its last call, which
    would read as a wait of its own in the wait-for graph."""
    if faults is None:
        return states
    return [s for s in states if s.rank not in faults.killed]


def _death_behind_lost_peers(job: Job, job_dir: Path, procs: Processes,
                             outcomes: dict[int, RankOutcome]) -> Death | None:
    """The rank whose death the lost connections report, given a moment to show: a process that
    calls os._exit closes its sockets before it is gone, so its peers can report first."""
    until = time.monotonic() + LOST_PEER_GRACE_S
    while time.monotonic() < until:
        time.sleep(0.05)
        death = first_death(job, job_dir, procs, set(outcomes))
        if death is not None:
            return death
    return None


LOST_PEER_GRACE_S = 2.0


def _peers_lost(outcomes: dict[int, RankOutcome]) -> bool:
    """Every rank that reported an error lost a peer's connection (gloo's words for it)."""
    errors = [o.error for o in outcomes.values() if o.error is not None]
    return bool(errors) and all(_LOST_PEER.search(e.summary) for e in errors)


_LOST_PEER = re.compile(r"Connection reset by peer|Connection closed by peer|Broken pipe")


def _task_of(states: list[rankstate.RankState], rank: int) -> int | None:
    return next((s.task for s in states if s.rank == rank), None)


def _dead_lines(faults: FaultState) -> str:
    return "".join(f"rank {r} is gone: {faults.killed[r]}\n" for r in sorted(faults.killed))


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
