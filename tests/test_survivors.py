"""Survivors (runtime/comm/survivors.py, engines/surviving.py, engines/surviving_gloo.py): with
Task(survivors=True) a SIGKILLed rank no longer ends the task; the others get distlab.PeerFailed
from the call that touched it, and revoke, agree and shrink their communicator (through Open
MPI's ULFM, or on gloo over the launch's store), then finish with the right sums. The death is
recorded, not a crash; no process is left."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from test_launcher import assert_nothing_left

from distlab.errors import UsageError
from distlab.grading import Task, faults
from distlab.runs import Program, run, run_options
from distlab.runtime.clock.network import ReplayError
from distlab.runtime.comm.errors import PeerFailed, peer_failed_from
from distlab.runtime.faults.model import FaultPlanError

PROGRAMS = Path(__file__).resolve().parent / "programs.py"
SOLUTION = Path(__file__).resolve().parent / "survivor_programs.py"
KILL_2_AT_3 = faults.plan(faults.kill(rank=2, at_step=3), seed=1)
# What the survivors' sums may be, the same at every survivor: four ranks until rank 2 dies as step
# 3 starts, then three. Step 2 is redone over three when one survivor's Allreduce of it failed
# (rank 2 left it with its result while a message of it to that survivor died with it).
SUMS_THROUGH_A_DEATH = ([4.0] * 3 + [3.0] * 3, [4.0] * 2 + [3.0] * 4)


def launch(task: Task, seal: bool, backend: str = "mpi", plan: object = KILL_2_AT_3) -> object:
    done = run(Program(PROGRAMS, "call_solution", SOLUTION), [task.for_ranks()],
               run_options(backend, seal=seal, faults=plan), deadline_s=60)
    assert_nothing_left()
    return done


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("backend", "seal"), [("mpi", True), ("mpi", False), ("gloo", True),
                                               ("gloo", False)])
def test_kill_one_of_four_mid_allreduce_the_three_survivors_shrink_and_finish(
        backend: str, seal: bool) -> None:
    done = launch(Task(ranks=4, case="allreduce_through_a_death", survivors=True), seal, backend)
    assert done.ok, done.result.message
    assert done.result.fault_events == ["rank 2 was killed (SIGKILL) at step 3 by fault[0]"]
    task = done.tasks[0]
    assert len(task.values) == 3  # the survivors' (world ranks 0, 1, 3)
    for got, new_rank in zip(task.values, (0, 1, 2)):
        assert got["sums"] == task.values[0]["sums"] and got["sums"] in SUMS_THROUGH_A_DEATH, got
        failure = got["failure"]
        # A survivor that learns of the death from another's revocation may not know yet who died.
        assert failure["call"] == "Allreduce"
        assert failure["ranks"] == [2] or "was revoked" in failure["message"], failure
        assert (failure["failed"], failure["agreed"], failure["size"]) == (1, 1, 3)
        assert failure["rank"] == new_rank
        assert failure["waited"] < 2.0  # the kill lands 0.15 s into the step; ULFM sees it at once
        assert failure["message"].endswith("rank 2 of the communicator failed; carry on over "
                                           "comm.Shrink()") or "was revoked" in failure["message"]
    with pytest.raises(ReplayError, match="1 of the task's 4 ranks died in it"):
        task.replay()


def test_survivors_are_asked_for_and_have_a_launch_of_their_own() -> None:
    done = launch(Task(ranks=2, case="calls_without_survivors"), seal=True, plan=None)
    assert done.ok and done.tasks[0].values[0] == (
        "Shrink: this task's ranks do not survive their peers; a problem asks for it with "
        "Task(survivors=True)")
    with pytest.raises(UsageError, match="runs in a launch of its own"):
        run(Program(PROGRAMS, "call_solution", SOLUTION),
            [Task(ranks=2, case="calls_without_survivors", survivors=True).for_ranks()] * 2,
            run_options("mpi"))


def test_a_peer_failure_crosses_the_seal_as_itself() -> None:
    for error in (PeerFailed("Allreduce", (2,)), PeerFailed("Recv", (1, 3), revoked=True),
                  PeerFailed("Barrier", ())):
        again = peer_failed_from(str(error))
        assert (again.call, again.ranks, again.revoked, str(again)) == (
            error.call, error.ranks, error.revoked, str(error))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_a_rank_that_ends_by_itself_is_a_death_the_others_live_through(backend: str) -> None:
    done = launch(Task(ranks=4, case="a_rank_leaves_by_itself", survivors=True), False, backend,
                  plan=None)
    assert done.ok, done.result.message
    assert done.result.fault_events == [
        "rank 2 died: its process ended without reporting, and the others went on (a task with "
        "survivors)"]
    first = done.tasks[0].values[0]["sums"]
    assert first in SUMS_THROUGH_A_DEATH
    assert [got["sums"] for got in done.tasks[0].values] == [first] * 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_a_revocation_reaches_a_rank_that_waits_on_a_live_peer(backend: str) -> None:
    """Rank 0 waits for rank 1, rank 1 for rank 2, which is killed: only rank 1 can see the
    death, and its Revoke is how rank 0 learns of it (gloo cannot interrupt a call: its calls
    poll the revocation notices)."""
    done = launch(Task(ranks=4, case="a_revocation_reaches_every_waiter", survivors=True), True,
                  backend, plan=faults.plan(faults.kill(rank=2, at_step=1), seed=1))
    assert done.ok, done.result.message
    first, second, third = done.tasks[0].values
    assert first == {"call": "Recv", "revoked": True, "survivors": 3}, first
    assert second == {"call": "Recv", "revoked": False, "survivors": 3}, second
    assert third["survivors"] == 3 and third["call"] == "Barrier", third


def test_a_plan_that_kills_or_reclaims_a_rank_the_task_cannot_lose_is_refused_before_any_start() -> None:
    coordinated = Task(ranks=4, case="allreduce_through_a_death", survivors=True, needed_ranks=(0,),
                       label="the coordinated loop")
    reclaim_0 = faults.plan(faults.reclaim(rank=0, at_step=3), seed=1, where="plan.toml")
    with pytest.raises(FaultPlanError, match=re.escape(
            "plan.toml: fault[0] (reclaim) would take away rank 0, which task 'the coordinated "
            "loop' cannot lose (its ranks survive the others' deaths, not rank 0's); give the "
            "fault another rank")):
        launch(coordinated, False, plan=reclaim_0)
    anyone = faults.plan(faults.kill(probability=0.1, until_step=6), seed=1, where="plan.toml")
    with pytest.raises(FaultPlanError, match=r"fault\[0\] \(kill\) draws among all ranks, would "
                                             r"take away rank 0"):
        launch(coordinated, False, plan=anyone)
    with pytest.raises(UsageError, match=r"needed_ranks names rank 4, outside its 4 ranks"):
        launch(dataclasses.replace(coordinated, needed_ranks=(4,)), False, plan=None)
    with pytest.raises(UsageError, match="without survivors=True every rank is needed"):
        launch(dataclasses.replace(coordinated, survivors=False), False, plan=None)
