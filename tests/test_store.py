"""The task's key-value store (runtime/comm/store.py): a real TCPStore the supervisor hosts,
reached from every rank's agent, sealed or not, on both engines. Its calls are counted and
traced; a get past its timeout raises distlab.CommTimeout; a partition cuts the far side off it;
a stopped rank's heartbeat stops; and a bad key, value or timeout is named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from distlab.grading import Task, faults
from distlab.runs import Program, Run, run, run_options

PROGRAMS = Path(__file__).resolve().parent / "programs.py"
SOLUTION = Path(__file__).resolve().parent / "store_programs.py"
CUT = faults.plan(faults.partition(groups=[[0], [1, 2]], from_step=1, until_step=3), seed=3)


def launch(tasks: list[Task], backend: str = "mpi", seal: bool = True, **options: Any) -> Run:
    return run(Program(PROGRAMS, "call_solution", SOLUTION), [t.for_ranks() for t in tasks],
               run_options(backend, seal=seal, **options), deadline_s=60)


_LAUNCHES: dict[tuple[str, bool], Run] = {}


def stored(backend: str, seal: bool) -> Run:
    """One launch per engine and seal: the misuses, membership on 4 ranks (sealed: the agent's
    store behind the learner's client), the partitioned steps (MPI)."""
    if (backend, seal) not in _LAUNCHES:
        tasks = [Task(ranks=1, case="bad_store_calls", store=True)]
        if seal:
            tasks.append(Task(ranks=4, case="membership", store=True))
        if backend == "mpi":
            tasks.append(Task(ranks=3, case="cut_off", store=True, faults=CUT))
        done = launch(tasks, backend, seal)
        assert done.ok, done.result.message
        _LAUNCHES[backend, seal] = done
    return _LAUNCHES[backend, seal]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_ranks_register_elect_and_time_out_through_the_store(backend: str) -> None:
    task = stored(backend, True).tasks[1]
    leaders = {got["leader"] for got in task.values}
    assert len(leaders) == 1 and leaders.pop() in {"0", "1", "2", "3"}  # one winner, seen by all
    for got in task.values:
        assert got["seen"] == [f"rank {q}" for q in range(4)]
        assert 1 <= got["joined"] <= 4 and got["final"] == 4
        message, call, waited, took = got["timed_out"]
        assert message == "store.get on 'never-set' timed out after 0.4 s: no rank set it in time"
        assert call == "store.get" and waited == 0.4 and 0.35 <= took <= 0.4 + 0.5
    assert task.values[0]["deleted"] is True
    calls = task.outcomes[2].stats.calls
    assert calls["store.set"] == 1 and calls["store.get"] == 5 and calls["store.wait"] == 1
    assert calls["store.add"] == 2 and calls["store.compare_set"] == 1
    assert [e[1] for e in task.traces[2] if e[0] == "store"][:3] == ["set", "add", "wait"]


@pytest.mark.parametrize("seal", [True, False])
def test_each_bad_store_call_is_named(seal: bool) -> None:
    said = stored("mpi", seal).tasks[0].values[0]
    assert said["key not a str"] == "TypeError: a store key is a non-empty str without NUL characters, not 5"
    assert said["value not bytes"] == "TypeError: a store value is bytes or str, not float"
    assert said["timeout not > 0"] == "ValueError: store: a timeout is a number of seconds > 0, not 0"


@pytest.mark.parametrize("seal", [True, False])
def test_a_partition_cuts_the_far_side_off_the_store(seal: bool) -> None:
    got = stored("mpi", seal).tasks[-1].values
    assert got[0] == [0, 1, 2, 3]  # rank 0's side holds the store
    for far in (1, 2):
        assert got[far] == [0, "store.set", "store.set", 3]  # cut off in steps 1 and 2


def test_a_task_without_a_store_is_told_how_to_ask_for_one() -> None:
    done = launch([Task(ranks=1, case="no_store")])
    assert not done.ok
    assert "comm.store(): this task has no store; a problem asks for one with Task(store=True)" in \
        done.result.message


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_a_stopped_rank_s_heartbeat_stops_until_it_is_continued(backend: str) -> None:
    stop = faults.plan(faults.stop(rank=1, at_step=5, cont_after_s=0.8), seed=1)
    done = launch([Task(ranks=2, case="heartbeats", store=True)], backend, faults=stop)
    assert done.ok, done.result.message
    beats = done.tasks[0].values[0]
    gaps = [(b1, t2 - t1) for (b1, t1), (_, t2) in zip(beats, beats[1:])]
    frozen_at, longest = max(gaps, key=lambda gap: gap[1])
    assert longest >= 0.6 and frozen_at <= 5  # the beat froze at the stop, for about 0.8 s
    assert beats[-1][0] > frozen_at + 1  # and went on once continued
