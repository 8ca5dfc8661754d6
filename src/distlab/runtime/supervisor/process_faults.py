"""Process faults (kill, stop, cont, reclaim, restart) as the supervisor applies them: real
signals to a rank's pid when ``judge.due_signals`` says they are due, and the record of what was
done. A reclaim is a SIGTERM (the notice a spot instance gets), then a SIGKILL after its grace
period; the rank counts as killed from the notice on (its instance is going away).
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from pathlib import Path

from ..comm import rankstate
from ..faults.plans import FaultPlan, ProcessAction, ProcessFaults, parse_fault_plan
from ..jobspec import Job, RankOutcome, learner_pid_path, pid_path
from .judge import due_signals
from .processes import signal_quietly

_SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT,
            "term": signal.SIGTERM}


class FaultState:
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
        # stop (reclaim) fault index -> elapsed at its SIGSTOP (SIGTERM), until its SIGCONT (SIGKILL)
        self.stopped_at_s: dict[int, float] = {}
        self.stops: dict[int, ProcessAction] = {}  # stop fault index -> its action, until SIGCONT
        self.killed: dict[int, str] = {}  # rank -> the sentence of its kill (or reclaim notice)
        self.reclaiming: dict[int, int] = {}  # reclaim fault index -> its rank, until the SIGKILL

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
        if action.kind == "term":  # the grace period runs from now; the rank is gone for good
            self.stopped_at_s[action.fault_index] = elapsed_s
            self.reclaiming[action.fault_index] = action.rank
            self.killed[action.rank] = action.describe()
            return
        if action.kind == "stop":
            self.stopped_at_s[action.fault_index] = elapsed_s
            self.stops[action.fault_index] = action
            return
        self.stopped_at_s.pop(action.fault_index, None)  # a reclaim's grace is over
        self.reclaiming.pop(action.fault_index, None)
        self.killed[action.rank] = self.killed.get(action.rank, action.describe())
        # SIGKILL ends a stopped process too: it is no longer held, and gets no SIGCONT.
        for index in [i for i, a in self.stops.items() if a.rank == action.rank]:
            self.stopped_at_s.pop(index, None)
            self.stops.pop(index)


def process_faults(job: Job) -> FaultState | None:
    """The job's process faults, checked against its world before anything starts; None if the
    plan has none (then the poll loop does no fault work at all). A job with survivors always
    has one: its deaths are recorded there (deaths.py), with or without a plan."""
    plan = job.faults
    if not isinstance(plan, FaultPlan) or not plan.of_kind("kill", "stop", "reclaim", "restart"):
        if not job.survivors:
            return None
        plan = plan if isinstance(plan, FaultPlan) else parse_fault_plan({"format_version": 1},
                                                                          where="survivors")
    return FaultState(plan.validate_for(job.world_size))


def apply_due_faults(
    faults: FaultState,
    job_dir: Path,
    world: int,
    states: list[rankstate.RankState],
    outcomes: Mapping[int, RankOutcome],
    pids: dict[int, int],
    elapsed_s: float,
    *,
    founders: int,
) -> bool:
    """Sends the signals due now; True if one of them was a SIGCONT. ``founders``: the ranks the
    launch started with; until each has begun its first task (so has met its peers in the engine),
    nothing is sent and no paused rank goes on: a rank killed while a peer still meets it failed
    that peer's set-up (gloo: "Connection closed by peer" in connectFullMesh), a death no survivor
    comes back from."""
    if not _all_joined(states, founders):
        return False
    for rank in range(world):
        if rank not in pids:
            try:
                pids[rank] = int(pid_path(job_dir, rank).read_text())
            except (OSError, ValueError):  # not started yet, or the file is half written
                pass
    # A reclaimed rank is killed for the verdict from its notice on, but still gets its SIGKILL.
    gone = frozenset(faults.killed) - frozenset(faults.reclaiming.values())
    skip = frozenset(outcomes) | gone | (frozenset(range(world)) - pids.keys())
    actions = due_signals(
        faults.faults, states, skip, elapsed_s, frozenset(faults.fired), faults.stopped_at_s
    )
    for action in actions:
        pid = pids[action.rank]
        if action.kind == "term":
            # A reclaim's notice is for the learner's code, which may catch it to checkpoint:
            # sealed, that code runs in the learner process (its pid beside the rank's), and the
            # agent, left alone, serves on until the SIGKILL; if the learner dies of the notice,
            # its agent ends the same way (rank/sealed.py).
            pid = _learner_pid(job_dir, action.rank) or pid
        faults.apply(action, pid, elapsed_s)
    # Ranks paused at a trigger step or mark go on (a stopped one once continued): what was due
    # there has been done (or was done in an earlier attempt). A rank whose pid is not known yet
    # waits for the next poll, which can signal it.
    for state in states:
        if state.pauses != state.acked and state.rank in pids:
            rankstate.acknowledge(job_dir, state.rank, state.pauses)
    return any(a.kind == "cont" for a in actions)


def _all_joined(states: list[rankstate.RankState], founders: int) -> bool:
    begun = {s.rank for s in states if s.state != "starting"}
    return all(rank in begun for rank in range(founders))


def _learner_pid(job_dir: Path, rank: int) -> int | None:
    try:
        return int(learner_pid_path(job_dir, rank).read_text())
    except (OSError, ValueError):  # unsealed, or not written yet
        return None
