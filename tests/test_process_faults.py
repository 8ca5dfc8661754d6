"""Process faults applied by the supervisor: real SIGKILL, SIGSTOP and SIGCONT, and restarts.

Each scenario runs ``token_steps`` (tests/programs.py) on real MPI ranks: a token goes round the
ring once per step, each step marked with ``comm.mark("step")``, and rank 0 holds it a moment so
the others sit blocked in Recv at each step. A fault plan then kills or stops one rank at a step or
a wall time; the test checks the verdict, the sentence naming the fault, and that no process of
the job survives. The verdict rules themselves are checked first, on made-up observations.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Any

import pytest
from test_launcher import assert_nothing_left, make_job

from distlab.grading import Task as GradingTask
from distlab.runs import Program, run_options
from distlab.runs import run as run_program
from distlab.runtime.comm.rankstate import ALL_PEERS, RankState
from distlab.runtime.faults.plans import FaultPlan, ProcessFaults, parse_fault_plan
from distlab.runtime.jobspec import Job, Task
from distlab.runtime.supervisor import LaunchResult, launch
from distlab.runtime.supervisor.judge import Observation, due_signals, judge, should_restart

PAUSE_S = 0.25  # rank 0 holds the token this long per step: the supervisor polls every 50 ms


def plan(*faults: dict[str, Any]) -> FaultPlan:
    return parse_fault_plan({"format_version": 1, "seed": 1, "fault": list(faults)}, where="test")


def token_job(faults: FaultPlan, ranks: int = 3, steps: int = 5, backend: str = "mpi") -> Job:
    job = make_job("token_steps", [Task(ranks=ranks, args=(steps, PAUSE_S))], backend=backend)
    return dataclasses.replace(job, faults=faults)


def run(job: Job, **kw: float) -> LaunchResult:
    result = launch(job, **kw)
    assert_nothing_left()  # stopped ranks included
    return result


# -- the decisions, without processes ------------------------------------------------------------


def st(rank: int, state: str = "blocked", op: str = "Recv", peers: tuple[int, ...] = (),
       step: int = 0) -> RankState:
    return RankState(rank, state, op, peers, 0, 1, 0.0, 0, step)


def test_a_stopped_rank_is_never_called_a_deadlock_but_the_deadline_holds() -> None:
    ring = [st(0, peers=(2,)), st(1, peers=(0,)), st(2, peers=(1,))]
    stuck = Observation(1.0, False, {}, ring, 10.0)
    assert judge(stuck, 3, deadline_s=60, stall_s=3).action == "deadlock"
    held = dataclasses.replace(stuck, stopped=frozenset({1}))
    assert judge(held, 3, deadline_s=60, stall_s=3).action == "wait"
    assert judge(dataclasses.replace(held, elapsed_s=61.0), 3, 60, 3).action == "timeout"


def test_a_kill_explains_the_exit_the_failure_or_the_wait_that_follows() -> None:
    killed = frozenset({1})
    in_barrier = [st(0, op="Barrier", peers=(ALL_PEERS,)), st(1, state="running"),
                  st(2, op="Barrier", peers=(ALL_PEERS,))]
    base = Observation(1.0, False, {}, in_barrier, 0.1, killed=killed)
    assert judge(base, 3, 60, 3).action == "wait"
    assert judge(dataclasses.replace(base, launcher_exited=True), 3, 60, 3).action == "killed"
    # Survivors all in one collective would be progress without a kill; with a dead member, stuck.
    assert judge(dataclasses.replace(base, stalled_for_s=5.0), 3, 60, 3).action == "killed"
    assert judge(dataclasses.replace(base, states=[], stalled_for_s=5.0), 3, 60, 3).action == "wait"


def test_survivors_that_finish_without_the_killed_rank_pass() -> None:
    from distlab.runtime.jobspec import RankOutcome

    outcomes = {0: RankOutcome(0, []), 2: RankOutcome(2, [])}
    obs = Observation(1.0, True, outcomes, [], 0.0, killed=frozenset({1}))
    assert judge(obs, 3, 60, 3).action == "done"


def test_due_signals_skips_finished_killed_and_unknown_ranks() -> None:
    faults = ProcessFaults(plan({"kind": "kill", "rank": 1, "at_step": 3},
                                {"kind": "stop", "rank": 2, "at_s": 1.0, "cont_after_s": 0.5}))
    states = [st(0, step=5), st(1, step=3), st(2, step=3)]
    actions = due_signals(faults, states, frozenset(), 1.2, frozenset(), {})
    assert [a.describe() for a in actions] == [
        "rank 1 was killed (SIGKILL) at step 3 by fault[0]",
        "rank 2 was stopped (SIGSTOP) at 1.2 s (wall clock) by fault[1]",
    ]
    assert due_signals(faults, states, frozenset({1, 2}), 1.2, frozenset(), {}) == []
    cont = due_signals(faults, states, frozenset(), 1.8, frozenset({0, 1}), {1: 1.2})
    assert [a.kind for a in cont] == ["cont"]


def test_no_signal_is_sent_before_every_rank_of_the_launch_has_begun_a_task(tmp_path: Path) -> None:
    # A rank killed while a peer still met it in the engine failed that peer's set-up (gloo's
    # connectFullMesh: "Connection closed by peer"), a death no survivor comes back from (seen in CI).
    from distlab.runtime.supervisor.process_faults import FaultState, apply_due_faults

    faults = FaultState(plan({"kind": "kill", "rank": 1, "at_step": 1}))
    pids = {0: 10**9, 1: 10**9, 2: 10**9}  # no such processes: a signal sent would raise
    joining = [st(0, state="running", step=1), st(1, state="running", step=1), st(2, state="starting")]
    assert apply_due_faults(faults, tmp_path, 3, joining, {}, pids, 1.0, founders=3) is False
    assert faults.killed == {} and faults.fired == set()
    # With one rank's slot not even there yet, the same.
    assert apply_due_faults(faults, tmp_path, 3, joining[:2], {}, pids, 1.0, founders=3) is False
    assert faults.killed == {}


def test_only_a_crash_is_restarted_and_only_within_budget_and_time() -> None:
    assert should_restart("crashed", 0, 1, 10.0)
    assert not should_restart("crashed", 1, 1, 10.0)
    assert not should_restart("crashed", 0, 1, 0.0)
    assert not should_restart("error", 0, 3, 10.0)
    assert not should_restart("timeout", 0, 3, 10.0)


# -- real processes ------------------------------------------------------------------------------


def test_a_kill_at_a_step_crashes_the_run_naming_the_rank_the_step_and_the_fault() -> None:
    result = run(token_job(plan({"kind": "kill", "rank": 1, "at_step": 3}), steps=8), deadline_s=30)
    assert result.status == "crashed"
    killed = "rank 1 was killed (SIGKILL) at step 3 by fault[0]"
    assert result.message.startswith(killed), result.message
    assert "ended without reporting" in result.message  # mpiexec ended ranks 0 and 2
    assert result.failing_rank == 1
    assert result.fault_events == [killed]
    assert result.attempts == 1


def test_a_stop_with_a_continue_delays_the_run_without_a_deadlock_verdict() -> None:
    stop = plan({"kind": "stop", "rank": 1, "at_step": 2, "cont_after_s": 1.0})
    # Every rank sits blocked in Recv and nothing moves for 1 s: a deadlock by the stall rule
    # (0.3 s), were rank 1 not held by the fault.
    result = run(token_job(stop, steps=5), deadline_s=30, stall_s=0.3)
    assert result.ok, result.message
    assert [o.value for o in result.task_outcomes(0)] == [0, 0, 0]
    assert result.fault_events[0] == "rank 1 was stopped (SIGSTOP) at step 2 by fault[0]"
    assert re.fullmatch(r"rank 1 was continued \(SIGCONT\) at [\d.]+ s \(wall clock\), "
                        r"1 s after its stop, by fault\[0\]", result.fault_events[1])
    # The other four steps' pauses, plus the second it was frozen: step 2's own pause may pass
    # while rank 1 is stopped (it is stopped as it waits for that step's token). 5 pauses + 1 s held
    # only while each launch started a zygote: 2.23 s were seen once it was kept.
    assert result.wall_s >= 4 * PAUSE_S + 1.0


def test_a_stop_never_continued_ends_at_the_deadline_naming_the_fault() -> None:
    stop = plan({"kind": "stop", "rank": 1, "at_step": 2})
    started = time.monotonic()
    result = run(token_job(stop, steps=50), deadline_s=4, stall_s=0.3)
    assert result.status == "timeout"
    assert "rank 1 was stopped (SIGSTOP) at step 2 by fault[0] and was not continued" in result.message
    assert "still computing" not in result.message  # a frozen rank computes nothing
    assert "rank 1 is stopped (SIGSTOP) by fault[0]" in result.details
    assert "rank 1 is running" not in result.details
    assert "process faults applied" in result.details
    assert time.monotonic() - started < 10


def test_a_restart_runs_the_job_again_and_the_kill_fires_once() -> None:
    faults = plan({"kind": "kill", "rank": 1, "at_step": 3}, {"kind": "restart", "max_restarts": 1})
    result = run(token_job(faults, steps=5), deadline_s=40)
    assert result.ok, result.message
    assert result.attempts == 2
    assert [o.value for o in result.task_outcomes(0)] == [1, 1, 1]  # DISTLAB_ATTEMPT=1
    assert result.fault_events == ["rank 1 was killed (SIGKILL) at step 3 by fault[0]"]
    assert len(result.restarted_after) == 1
    assert result.restarted_after[0].startswith("attempt 0 crashed: rank 1 was killed")


def test_a_kill_on_the_wall_clock() -> None:
    result = run(token_job(plan({"kind": "kill", "rank": 2, "at_s": 1.0}), steps=40), deadline_s=30)
    assert result.status == "crashed"
    found = re.match(r"rank 2 was killed \(SIGKILL\) at ([\d.]+) s \(wall clock\) by fault\[0\]",
                     result.message)
    assert found, result.message
    assert float(found.group(1)) >= 1.0


def test_a_kill_on_gloo_leads_the_survivors_failure() -> None:
    job = token_job(plan({"kind": "kill", "rank": 1, "at_step": 2}), ranks=2, steps=6, backend="gloo")
    result = run(job, deadline_s=40)
    assert result.status == "crashed"
    assert result.message.startswith("rank 1 was killed (SIGKILL) at step 2 by fault[0]; then rank 0")


# -- at a mark: comm.mark("NAME") in the rank's code ------------------------------------------------

def _around_a_mark(case: str, fault: dict[str, Any], backend: str = "mpi",
                   survivors: bool = False) -> Any:
    tests = Path(__file__).resolve().parent
    done = run_program(Program(tests / "programs.py", "call_solution", tests / "timeout_programs.py"),
                       [GradingTask(ranks=2, case=case, store=True, survivors=survivors).for_ranks()],
                       run_options(backend, seal=True, faults=plan(fault)), deadline_s=30)
    assert_nothing_left()
    return done


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_a_kill_at_a_mark_lands_exactly_there(backend: str) -> None:
    """Rank 1 writes "before" to the store, marks "checkpoint", writes "after": killed at the mark,
    it never writes "after" (the rank waits at the mark until the supervisor has acted). Rank 0
    lives on: on MPI, in a task whose ranks survive their peers (else Open MPI ends the job)."""
    done = _around_a_mark("killed_at_a_mark", {"kind": "kill", "rank": 1, "at_mark": "checkpoint"},
                          backend, survivors=backend == "mpi")
    assert done.ok, done.result.message
    assert done.result.fault_events == [
        "rank 1 was killed (SIGKILL) at its comm.mark('checkpoint') by fault[0]"]
    assert done.tasks[0].values[0] == {"after": False}


def test_a_stop_at_a_mark_holds_the_rank_there_until_it_is_continued() -> None:
    done = _around_a_mark("stopped_at_a_mark", {"kind": "stop", "rank": 1, "at_mark": "checkpoint",
                                                "cont_after_s": 1.0})
    assert done.ok, done.result.message
    assert done.result.fault_events[0] == (
        "rank 1 was stopped (SIGSTOP) at its comm.mark('checkpoint') by fault[0]")
    assert done.tasks[0].values[0] == {"missed": True, "last": 2.0}


def test_a_mark_that_is_never_called_fails_the_run_naming_the_fault() -> None:
    done = _around_a_mark("stopped_at_a_mark", {"kind": "kill", "rank": 1, "at_mark": "save"})
    assert not done.ok
    assert done.result.message == (
        "fault[0] (kill at_mark = 'save') never fired: rank 1 never called comm.mark('save')")


def test_a_step_the_rank_never_starts_fails_the_run_naming_the_fault() -> None:
    """The case marks no steps: a kill at step 2 would test nothing, and the run says so."""
    done = _around_a_mark("stopped_at_a_mark", {"kind": "kill", "rank": 1, "at_step": 2})
    assert not done.ok
    assert done.result.message == (
        "fault[0] (kill at_step = 2) never fired: rank 1 never started step 2 (steps are "
        "numbered by its comm.mark('step') calls)")


def test_a_reclaimed_rank_gets_its_notice_works_through_the_grace_and_is_killed() -> None:
    """A reclaim (a spot instance taken away): SIGTERM at step 3, which the learner's code
    catches (sealed: its agent hands it on), then SIGKILL a second later; the other rank, which
    never touches it again, finishes and the run passes."""
    fault = {"kind": "reclaim", "rank": 1, "at_step": 3, "grace_s": 1.0}
    done = _around_a_mark("noticed_reclaim", fault, backend="gloo")
    assert done.ok, done.result.message
    notice, kill = done.result.fault_events
    assert notice == ("rank 1 was told to leave (SIGTERM: its instance is reclaimed) at step 3 by "
                      "fault[0]")
    assert re.fullmatch(r"rank 1 was killed \(SIGKILL\) at [\d.]+ s \(wall clock\), 1 s after its "
                        r"reclaim notice, by fault\[0\]", kill), kill
    assert done.tasks[0].values[0] in (3, 4)  # seen at the next step boundary at the latest
