"""The supervisor's decisions, pure functions of what a poll observed: what the poll means
(``judge``), whether the job is stuck, which process-fault signals are due, whether a crashed run
starts again. Kept apart from the side effects so they are tested with made-up observations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..comm import rankstate
from ..faults.plans import ProcessAction, ProcessFaults
from ..jobspec import RankOutcome


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
    # The sub-communicators the ranks made, by context (read only once the job looks stalled).
    communicators: Mapping[int, rankstate.Communicator] = field(default_factory=dict)


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
    if obs.stalled_for_s >= stall_s and not obs.stopped and is_stuck(obs.states, world_size,
                                                                      obs.communicators):
        return Verdict("deadlock")
    if obs.elapsed_s >= deadline_s:
        return Verdict("timeout")
    return Verdict("wait")


def is_stuck(states: list[rankstate.RankState], world_size: int,
             communicators: Mapping[int, rankstate.Communicator] | None = None) -> bool:
    """Every unfinished rank waits in a call, none of them in a call with a timeout (it returns
    by itself) and none in a collective that every member of its communicator has entered
    (that one is under way, and its ranks go on after it)."""
    if len(states) < world_size:
        return False
    waiting = [s for s in states if s.state not in ("finished", "idle")]
    if not waiting or any(s.state != "blocked" or s.timed for s in waiting):
        return False
    return not any(in_full_collective(s, states, communicators or {}) for s in waiting)


def in_full_collective(state: rankstate.RankState, states: list[rankstate.RankState],
                       communicators: Mapping[int, rankstate.Communicator]) -> bool:
    """The rank waits in a collective that every member of its communicator waits in too: on a
    sub-communicator its registered members, on the task's every rank still in the task."""
    if state.peers != (rankstate.ALL_PEERS,):
        return False

    def entered(other: rankstate.RankState | None) -> bool:
        return (other is not None and other.state == "blocked" and other.op == state.op
                and other.peers == state.peers and other.comm == state.comm)

    registered = communicators.get(state.comm)
    if registered is not None:
        by_rank = {s.rank: s for s in states}
        return all(entered(by_rank.get(m)) for m in registered.members)
    return all(entered(s) for s in states if s.state != "idle")


def survivors_stuck(
    states: list[rankstate.RankState], world_size: int, killed: frozenset[int]
) -> bool:
    """Every rank still alive waits in a call or between tasks: with a peer gone for good, even a
    collective they all sit in can never complete (``is_stuck`` would call that progress). A
    call with a timeout is not stuck: it returns, and its rank may find out the peer is gone."""
    live = [s for s in states if s.rank not in killed]
    if len(live) < world_size - len(killed):
        return False
    return all(s.state in ("blocked", "idle", "finished") and not s.timed for s in live)


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
            marks = faults.marks_reached(s.rank, s.marks) if s.marks else frozenset()
            actions += faults.due(s.rank, s.step, elapsed_s, fired, stopped_at_s, marks)
    return actions


def should_restart(status: str, attempt: int, restarts_allowed: int, time_left_s: float) -> bool:
    """A crash (a kill included) starts the job again while the plan's budget and the deadline
    allow. An exception in the learner's code is not retried: it would only fail the same way."""
    return status == "crashed" and attempt < restarts_allowed and time_left_s > 0
