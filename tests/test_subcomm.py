"""Sub-communicators (runtime/comm/groups.py): Split, Dup, Get_group/Incl, Create_group and
Free, on both engines and through the seal. Each is a full communicator: its collectives sum
its own ranks, its calls count in its own counters and in the rank's totals, its messages carry
world ranks and its own context in the trace, a message costs on the virtual clock what the
same message costs on the task's communicator, and a partition cuts it as it cuts the task's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import test_launcher
from test_seal_attacks import attack

from distlab.grading import Task, faults
from distlab.runs import Program, Run, run, run_options
from distlab.runtime.trace.events import SEND

PROGRAMS = Path(__file__).resolve().parent / "programs.py"
SOLUTION = Path(__file__).resolve().parent / "subcomm_programs.py"
PARTITION = faults.plan(faults.partition(groups=[[0, 1], [2, 3]], from_step=2, until_step=5), seed=7)


def launch(tasks: list[Task], backend: str = "mpi", seal: bool = True, platform: str = "laptop",
           **options: Any) -> Run:
    done = run(Program(PROGRAMS, "call_solution", SOLUTION), [t.for_ranks() for t in tasks],
               run_options(backend, seal=seal, platform=platform), **options)
    assert done.ok, done.result.message
    return done


_LAUNCHES: dict[tuple[str, bool], Run] = {}


def twelve(backend: str, seal: bool) -> Run:
    """One launch per engine and seal: the 12-rank split (sealed), then (on MPI) the misuses and
    the partitioned tokens, each its own task."""
    if (backend, seal) not in _LAUNCHES:
        # Unsealed, the split runs on the same proxy as in a sealed rank's agent: the rings below
        # split unsealed, so that launch keeps to the small tasks.
        tasks = [Task(ranks=12, case="three_groups_of_four")] if seal else []
        if backend == "mpi":
            tasks += [Task(ranks=2, case="bad_calls"),
                      Task(ranks=4, case="partitioned_tokens", faults=PARTITION)]
        _LAUNCHES[backend, seal] = launch(tasks, backend, seal)
    return _LAUNCHES[backend, seal]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_split_into_three_groups_of_four_on_twelve_ranks(backend: str) -> None:
    task = twelve(backend, True).tasks[0]
    x = {r: np.arange(5, dtype=np.float64) * (r + 1) for r in range(12)}
    for r, got in enumerate(task.values):
        members = [q for q in range(12) if q // 4 == r // 4]
        want = sum(x[q] for q in members)
        assert got["total"] == want.tolist() and got["dup_total"] == want.tolist()
        # Keys -r: the group's highest world rank is its rank 0.
        order = sorted(members, reverse=True)
        assert (got["rank"], got["size"]) == (order.index(r), 4)
        assert got["left"] == float(order[(order.index(r) - 1) % 4])
        assert got["trio"] == ([[0, 5, 11].index(r), 3, 16] if r in (0, 5, 11) else None)
        assert got["left_out"] == (r % 2 == 0) and got["odd_size"] == (6 if r % 2 else 0)
    # Counted where they were made, and in the rank's totals.
    rank0 = task.outcomes[0]
    assert rank0.stats.calls["Allreduce"] == 3 and rank0.stats.calls["Sendrecv"] == 1
    per = [dict(stats.calls) for stats in rank0.by_communicator.values()]  # in the order made
    assert per == [{"Allreduce": 1, "Sendrecv": 1}, {"Allreduce": 1}, {"Allreduce": 1}]
    assert [dict(s.calls) for s in task.outcomes[1].by_communicator.values()] == [
        {"Allreduce": 1, "Sendrecv": 1}, {"Allreduce": 1}, {}]  # rank 1: no trio, but the odd ranks


@pytest.mark.parametrize("seal", [True, False])
def test_each_misuse_is_named(seal: bool) -> None:
    said = twelve("mpi", seal).tasks[-2].values
    for answers in said:
        assert answers["negative color"].startswith("ValueError: Split: color -3 is invalid")
        assert answers["color not an int"].startswith("TypeError: Split: the color must be an int")
        assert answers["rank out of range"] == ("ValueError: Incl: rank 2 is out of range: the "
                                                "group has ranks 0..1")
        assert answers["rank twice"] == "ValueError: Incl: rank 1 is listed twice"
        assert answers["not a group"].startswith("TypeError: Create_group takes a Group")
        assert answers["free the task's"].startswith("ValueError: Free: the task's communicator")
        assert answers["use after free"].startswith("ValueError: this communicator (2 ranks) was freed")
    # Worded alike sealed (the agent checks membership, and knows the world rank; its client said "(1)").
    assert ("this rank (world rank 1) is not in the group; only the group's members call Create_group"
            in said[1]["not a member"]), said[1]["not a member"]


@pytest.mark.parametrize("seal", [True, False])
def test_a_partition_cuts_a_sub_communicator_too(seal: bool) -> None:
    # World ranks 0 and 2 are on either side; on the evens' communicator they are its ranks 0, 1.
    assert twelve("mpi", seal).tasks[-1].values[2] == [0, 1, 5, 6]


@pytest.fixture(scope="module")
def rings() -> Run:
    # rack: links of three speeds, so a ring among the even ranks crosses PCIe and QPI links.
    names = ["ring_on_sub", "ring_on_task", "big_ring_on_sub", "big_ring_on_task"]
    return launch([Task(ranks=8, case=name) for name in names], seal=False, platform="rack",
                  online_clock=True)


def test_a_sub_communicator_s_events_name_world_ranks_and_its_own_context(rings: Run) -> None:
    task = rings.tasks[0]
    for rank, events in task.traces.items():
        sends = [e for e in events if e[0] == SEND]
        assert {e[3] for e in sends} == {(rank + 2) % 8}  # the next world rank of its parity
        assert len({e[2] for e in sends}) == 1 and sends[0][2] != 0  # one context, not the task's
    mates = {e[2] for r in (0, 2, 4, 6) for e in task.traces[r] if e[0] == SEND}
    assert len(mates) == 1 and mates != {e[2] for e in task.traces[1] if e[0] == SEND}


def test_a_sub_communicator_s_messages_cost_what_the_task_s_own_cost(rings: Run) -> None:
    for on_sub, on_task in (rings.tasks[0:2], rings.tasks[2:4]):  # eager, then rendezvous
        assert [v[1] for v in on_sub.values] == [v[1] for v in on_task.values]
        assert [v[0] for v in on_sub.values] == [v[0] for v in on_task.values]  # comm.now()
        assert on_sub.replay().finish == on_task.replay().finish  # the graded replay
        assert min(v[0] for v in on_sub.values) > 0


@pytest.mark.timeout(120)
def test_a_deadlock_across_sub_communicators_names_each_one_and_the_cycle() -> None:
    done = run(Program(PROGRAMS, "call_solution", SOLUTION),
               [Task(ranks=4, case="deadlock_across_groups").for_ranks()],
               run_options("mpi", seal=True, platform="laptop"), deadline_s=60)
    assert done.result.status == "deadlock", done.result.message
    assert "rank 0 waits on 2, 2 on 1, 1 on 3, 3 on 0" in done.result.message
    assert ("rank 0 is blocked in Allreduce on communicator 0/0.0 (world ranks 0, 2) (waits for "
            "every rank of its communicator)") in done.result.details
    assert "rank 2 waits to receive from 1 in Recv" in done.result.details


def test_a_call_on_a_communicator_the_learner_does_not_hold_is_tampering(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(test_launcher, "SEAL", True)
    result = attack("call_on_a_forged_communicator")
    assert result.status == "error", result.message
    assert "tampered with the channel to its rank's agent" in result.message


def test_a_freed_gloo_group_lets_go_of_its_threads_and_connections() -> None:
    """60 Split/Free rounds on gloo leave no group behind: before, every gloo group lived until
    the process ended (two threads and a socket per peer each), and code that splits on every
    call ran out of address space in the rank ("Resource temporarily unavailable")."""
    done = launch([Task(ranks=4, case="split_and_free_often")], "gloo", seal=False,
                  platform="laptop", online_clock=True)
    for held, threads in done.tasks[0].values:
        # One group stays: the side channel of the task's own online clock (closed as it ends).
        assert held == 1 and threads < 40, (held, threads)
