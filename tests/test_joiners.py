"""Joiners (engines/admission.py, supervisor/newcomers.py): a fault plan's `join` adds ranks to a
running job, and `restart = "rank"` starts a dead rank again alone; the survivors' comm.Admit()
lets each newcomer in, renumbered after them (on gloo the supervisor starts it and it waits in
the store's lobby; on MPI the Admit spawns it). A newcomer no Admit takes in, a join that never
fires, and plans the job cannot take are named; no process is left."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from test_launcher import assert_nothing_left

from distlab.grading import Task
from distlab.runs import Program, run, run_options
from distlab.runtime.clock.network import ReplayError
from distlab.runtime.faults.model import FaultPlanError
from distlab.runtime.faults.plans import parse_fault_plan

PROGRAMS = Path(__file__).resolve().parent / "programs.py"
SOLUTION = Path(__file__).resolve().parent / "survivor_programs.py"
RECLAIM_THEN_JOIN = [{"kind": "reclaim", "rank": 2, "at_step": 2},
                     {"kind": "join", "count": 2, "at_step": 4}]


def launch(case: str, faults: list[dict[str, Any]], backend: str = "gloo", seal: bool = True,
           survivors: bool = True) -> Any:
    plan = parse_fault_plan({"format_version": 1, "seed": 1, "fault": faults}, "plan.toml")
    try:
        return run(Program(PROGRAMS, "call_solution", SOLUTION),
                   [Task(ranks=4, case=case, survivors=survivors).for_ranks()],
                   run_options(backend, seal=seal, faults=plan), deadline_s=60)
    finally:
        assert_nothing_left()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_a_reclaim_then_a_join_of_two_leaves_a_group_of_the_right_size_and_members(
        backend: str) -> None:
    done = launch("elastic", RECLAIM_THEN_JOIN, backend)
    assert done.ok, done.result.message
    assert done.result.fault_events[:2] == [
        "rank 2 was told to leave (SIGTERM: its instance is reclaimed) at step 2 by fault[0]",
        "rank(s) 4, 5 joined at step 4 by fault[1]"]
    # World ranks 0, 1, 3 survived and 4, 5 joined: the group renumbers them 0..4 in that order.
    values = done.tasks[0].values
    assert [(v["joined"], v["rank"], v["size"]) for v in values] == [
        (False, 0, 5), (False, 1, 5), (False, 2, 5), (True, 3, 5), (True, 4, 5)]
    survivor, newcomer = values[0], values[3]
    assert all(v["sizes"] == survivor["sizes"] for v in values[:3])
    assert values[4]["sizes"] == newcomer["sizes"] and values[4]["first"] == newcomer["first"]
    # Four ranks until rank 2 left (a reclaimed rank works on through its notice, until the
    # SIGTERM reaches it), three until the newcomers entered, five from then on, which the
    # newcomers saw too.
    entered = newcomer["first"]
    assert survivor["sizes"][entered:] == newcomer["sizes"] == [5] * (6 - entered)
    assert survivor["sizes"][:2] in ([4, 4], [4, 3]) and set(survivor["sizes"][2:entered]) <= {3, 4}
    with pytest.raises(ReplayError, match=re.escape("2 rank(s) joined the task's 4 while it ran")):
        done.tasks[0].replay()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_a_rank_restarted_alone_rejoins_the_survivors(backend: str) -> None:
    done = launch("elastic", [{"kind": "kill", "rank": 2, "at_step": 2},
                              {"kind": "restart", "max_restarts": 1, "restart": "rank"}],
                  backend, seal=False)
    assert done.ok, done.result.message
    assert done.result.fault_events == [
        "rank 2 was killed (SIGKILL) at step 2 by fault[0]",
        'rank 2 was started again alone, as rank 4 (restart = "rank")']
    values = done.tasks[0].values
    assert [(v["joined"], v["restarted"], v["rank"], v["size"]) for v in values] == [
        (False, None, 0, 4), (False, None, 1, 4), (False, None, 2, 4), (True, "2", 3, 4)]
    assert values[0]["sizes"][values[3]["first"]:] == values[3]["sizes"]


@pytest.mark.timeout(120)
def test_a_newcomer_that_no_admit_takes_in_fails_the_run_naming_it() -> None:
    done = launch("allreduce_through_a_death", [{"kind": "join", "at_step": 1}])
    assert done.result.status == "deadlock", done.result.message
    assert done.result.message.startswith(
        "rank(s) 4 joined the running job and waited to be admitted, but the others finished "
        "without a comm.Admit() after they arrived")
    assert "rank 4 joined the running job and waits to be admitted" in done.result.details
    # On MPI no process waits: the Admit that would spawn it never came.
    done = launch("allreduce_through_a_death", [{"kind": "join", "at_step": 1}], "mpi", seal=False)
    assert (done.result.status, done.result.message) == ("error", (
        "rank(s) 4 were due to join the running job, but the others finished without a "
        "comm.Admit() that would let them in"))


@pytest.mark.timeout(120)
def test_a_join_at_a_step_no_rank_reaches_fails_a_run_that_ended_well() -> None:
    done = launch("elastic", [{"kind": "join", "at_step": 40}], seal=False)
    assert done.result.status == "error"
    assert done.result.message == ("fault[0] (join at_step = 40) never fired: no rank started "
                                   "step 40 (steps are numbered by comm.mark('step'))")


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_a_join_the_job_cannot_take_is_refused_before_any_process_starts(backend: str) -> None:
    with pytest.raises(FaultPlanError, match=re.escape(
            "plan.toml: fault[1] (join) adds ranks to a running job, which only a task whose "
            "ranks survive their peers takes")):
        launch("elastic", RECLAIM_THEN_JOIN, backend, survivors=False)


def test_admit_with_no_one_waiting_is_the_same_communicator() -> None:
    done = launch("admit_alone", [], "mpi")
    assert done.ok and done.tasks[0].values == [True] * 4


def test_a_check_s_own_plan_kills_and_joins_in_a_launch_of_its_own() -> None:
    """What a problem's check writes (grading's Task and fault builders): the task's own plan
    drives the supervisor when the task runs alone; in a batch it is refused before any start."""
    from distlab.errors import UsageError
    from distlab.grading import faults

    plan = faults.plan(faults.kill(rank=1, at_step=1), faults.join(count=1, at_step=3),
                       faults.restart(max_restarts=1, rank_alone=True), seed=3, where="the check")
    task = Task(ranks=4, case="elastic", survivors=True, faults=plan)
    done = run(Program(PROGRAMS, "call_solution", SOLUTION), [task.for_ranks()],
               run_options("gloo", seal=False), deadline_s=60)
    assert_nothing_left()
    assert done.ok, done.result.message
    assert done.result.fault_events[0] == "rank 1 was killed (SIGKILL) at step 1 by fault[0]"
    assert [(v["rank"], v["size"]) for v in done.tasks[0].values] == [(r, 5) for r in range(5)]
    with pytest.raises(UsageError, match=re.escape(
            "the check: its kill acts on the launch's processes, so the task whose plan it is must "
            "run in a launch of its own (this one has 2 tasks)")):
        run(Program(PROGRAMS, "call_solution", SOLUTION),
            [task.for_ranks(), Task(ranks=2, case="elastic").for_ranks()], run_options("gloo"))
