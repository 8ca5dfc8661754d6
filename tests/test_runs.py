"""The front door for runs (distlab/runs.py): options checked once with one set of messages, before
any process starts; a run on real ranks with its values, counters and replay; a run that ends
badly comes back as a result, not an exception; and nothing outside the runtime but the front door
starts a job."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import job_processes
from distlab.errors import UsageError
from distlab.platforms import PlatformError, uniform
from distlab.runs import Program, run, run_options
from distlab.runtime.clock.collectives_cost import p2p_time
from distlab.runtime.faults.plans import FaultPlanError, parse_fault_plan
from distlab.runtime.jobspec import Task

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src" / "distlab"
PROGRAMS = TESTS / "programs.py"
ALPHA, BETA = 5e-6, 1e-9


@pytest.mark.parametrize("kwargs, error, text", [
    ({"backend": "nccl"}, UsageError, "unknown backend 'nccl': use mpi or gloo"),
    ({"backend": "gloo", "allowed_backends": ("mpi",), "problem": "03"}, UsageError,
     "problem 03 runs on mpi, not gloo"),
    ({"clock": "sundial"}, UsageError, "unknown clock 'sundial': use virtual or wall"),
    ({"deadline_s": float("nan")}, UsageError, "--time-limit must be a positive number"),
    ({"deadline_s": -1.0}, UsageError, "--time-limit must be a positive number"),
    ({"platform": "no-such-cluster"}, PlatformError, "no-such-cluster"),
    ({"platform": "laptop", "world": 4096}, PlatformError, "4096"),
])
def test_bad_options_are_refused_with_one_sentence(kwargs: dict, error: type, text: str) -> None:
    with pytest.raises(error) as caught:
        run_options(**kwargs)
    assert text in str(caught.value)


def test_a_fault_plan_is_checked_against_the_world_it_will_run_on() -> None:
    plan = parse_fault_plan({"format_version": 1, "seed": 1, "fault": [
        {"kind": "kill", "rank": 7, "at_step": 1},
    ]}, where="test plan")
    assert run_options(faults=plan).faults is plan  # no world known yet: nothing to hold it to
    with pytest.raises(FaultPlanError, match="rank 7"):
        run_options(faults=plan, world=4)


def test_monitoring_is_asked_of_mpi_only() -> None:
    assert run_options("mpi", mpi_monitoring=True).mpi_monitoring
    assert not run_options("gloo", mpi_monitoring=True).mpi_monitoring


def test_a_run_returns_every_ranks_value_its_counters_and_its_replay() -> None:
    options = run_options("mpi", uniform(4, ALPHA, BETA), deadline_s=60)
    n = 1 << 12
    done = run(Program(PROGRAMS, "ring_sum"), [Task(ranks=3, args=(n,)), Task(ranks=2, args=(n,))],
               options)
    assert done.ok and len(done.tasks) == 2
    three, two = done.tasks
    assert [got[0] for got in three.values] == [2.0, 0.0, 1.0]  # each rank holds its left neighbour's
    assert [s.bytes_sent for s in three.stats] == [n * 8] * 3
    # One Sendrecv per rank, all at once on disjoint links: one message's time.
    assert three.replay().makespan == pytest.approx(p2p_time(n * 8, ALPHA, BETA), rel=1e-9)
    assert two.metrics().messages == 2
    assert job_processes() == []


def test_a_run_that_ends_badly_is_a_result_with_no_tasks() -> None:
    options = run_options("mpi", uniform(2, ALPHA, BETA), deadline_s=30)
    done = run(Program(PROGRAMS, "send_send_deadlock"), [Task(ranks=2, args=(1 << 20,))], options,
               stall_s=1.0)
    assert not done.ok and done.tasks == []
    assert done.result.status == "deadlock"
    assert "rank 0 waits" in done.result.message or "rank 1 waits" in done.result.message
    assert job_processes() == []


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_only_the_front_door_starts_jobs() -> None:
    """Outside the runtime, launch() and make_job() are called by runs.py alone (the bench measures
    mpiexec and the proxy themselves, below the door, and starts no job)."""
    starters = {"supervisor.launch", "jobspec.make_job", "supervisor.launch.launch"}
    callers = sorted(
        str(path.relative_to(SRC)) for path in SRC.rglob("*.py")
        if "runtime" not in path.relative_to(SRC).parts
        and any(name.endswith(tuple(starters)) for name in _imports(path))
    )
    assert callers == ["runs.py"]


def test_the_memory_limit_is_a_share_of_the_machine_not_4_gib_per_rank() -> None:
    from distlab.runtime.jobspec import Limits
    from distlab.runtime.supervisor.memory import FLOOR_MB, budget

    gib = 1 << 30
    assert budget(Limits(), 2, 24 * gib).address_space_mb == 4096  # room for 4 GiB each
    assert budget(Limits(), 8, 24 * gib).address_space_mb == int(24 * gib * 0.9 / 8) >> 20  # 2764
    assert budget(Limits(), 64, 24 * gib).address_space_mb == FLOOR_MB
    assert budget(Limits(address_space_mb=900), 2, 24 * gib).address_space_mb == 900  # a lower one stays
    done = run(Program(PROGRAMS, "address_space_limit"), [Task(ranks=2)], run_options())
    assert done.ok, done.result.message
    assert done.tasks[0].values == [budget(Limits(), 2).address_space_mb] * 2
