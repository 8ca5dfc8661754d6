"""Message-level faults from fault plans, applied by the proxy on real ranks.

Each scenario runs a small program under one plan and checks what the learner's code would see:
later arrivals on the virtual clock, lost messages (and only those the plan's seed picks), a
partition that heals, a rank frozen by `hung`, a rank slowed by `slow`.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from conftest import job_processes

from distlab.platforms import uniform
from distlab.runtime.clock.replay import replay
from distlab.runtime.faults.plans import (
    FaultPlanError,
    MessageFaults,
    load_fault_plan,
    parse_fault_plan,
)
from distlab.runtime.jobspec import Job, Task, program_module_name
from distlab.runtime.supervisor import LaunchResult, launch

PROGRAMS = Path(__file__).resolve().parent / "clock_programs.py"
ALPHA, BETA = 10e-6, 1 / 1e9
PLATFORM = uniform(4, ALPHA, BETA)


def plan(*faults: dict[str, Any], seed: int = 7):
    return parse_fault_plan({"format_version": 1, "seed": seed, "fault": list(faults)}, where="test")


def run(program: str, tasks: list[Task], deadline_s: float = 60, stall_s: float = 3.0) -> LaunchResult:
    world = max(t.ranks for t in tasks)
    job = Job(
        program_file=str(PROGRAMS), program_module=program_module_name(PROGRAMS), program=program,
        solution_file=None, tasks_blob=pickle.dumps(tuple(tasks)),
        task_labels=tuple(t.label for t in tasks), backend="mpi", world_size=world,
        supervisor_pid=os.getpid(), platform=PLATFORM, online_clock=True,
        device_flops=tuple(PLATFORM.device_of(r).flops for r in range(world)),
    )
    result = launch(job, deadline_s=deadline_s, stall_s=stall_s)
    assert job_processes() == [] or _gone()
    return result


def _gone() -> bool:
    import time

    time.sleep(2)
    return job_processes() == []


def test_a_delay_adds_its_latency_on_both_clocks() -> None:
    nbytes = 100_000
    delayed = plan({"kind": "delay", "src": 0, "dst": 1, "latency_s": 0.005})
    result = run("one_message", [Task(ranks=2, args=(nbytes,)), Task(ranks=2, args=(nbytes,), faults=delayed)])
    assert result.ok, result.message
    plain, late = (result.task_outcomes(i) for i in (0, 1))
    assert plain[1].value == pytest.approx(ALPHA + nbytes * BETA, rel=1e-9)
    assert late[1].value == pytest.approx(ALPHA + nbytes * BETA + 0.005, rel=1e-9)
    played = replay({r: o.trace for r, o in enumerate(late)}, PLATFORM)
    assert played.makespan == pytest.approx(late[1].value, rel=1e-9)


def test_dropped_messages_are_exactly_those_the_seed_picks() -> None:
    lossy = plan({"kind": "drop", "src": 0, "dst": 1, "probability": 0.4}, seed=2024)
    steps = 12
    result = run("steps_with_timeout", [Task(ranks=2, args=(steps, 0.3), faults=lossy)])
    assert result.ok, result.message
    decide = MessageFaults(lossy.validate_for(2), 0)
    expected = [s for s in range(steps) if not decide.decide(1, 8, s, s, s, 0.0).drop]
    assert 0 < len(expected) < steps  # the seed drops some, not all
    assert result.task_outcomes(0)[1].value == expected


def test_a_partition_drops_only_inside_its_window() -> None:
    split = plan({"kind": "partition", "groups": [[0], [1]], "from_step": 2, "until_step": 5})
    result = run("steps_with_timeout", [Task(ranks=2, args=(7, 0.3), faults=split)])
    assert result.ok, result.message
    assert result.task_outcomes(0)[1].value == [0, 1, 5, 6]


def test_a_bandwidth_cap_slows_the_transfer_by_its_factor() -> None:
    nbytes = 1_000_000
    half = plan({"kind": "bandwidth", "src": 0, "dst": 1, "factor": 0.5})
    result = run("one_message", [Task(ranks=2, args=(nbytes,), faults=half)])
    assert result.ok, result.message
    outcomes = result.task_outcomes(0)
    assert outcomes[1].value == pytest.approx(ALPHA + 2 * nbytes * BETA, rel=1e-9)
    played = replay({r: o.trace for r, o in enumerate(outcomes)}, PLATFORM)
    assert played.makespan == pytest.approx(ALPHA + 2 * nbytes * BETA, rel=1e-9)


def test_nothing_arrives_from_a_dead_peer_after_its_trigger() -> None:
    dead = plan({"kind": "dead", "rank": 0, "at_step": 3})
    result = run("steps_with_timeout", [Task(ranks=2, args=(6, 0.3), faults=dead)])
    assert result.ok, result.message
    assert result.task_outcomes(0)[1].value == [0, 1, 2]


def test_a_spike_delays_the_messages_the_seed_picks() -> None:
    spiky = plan({"kind": "spike", "src": 0, "latency_s": 0.05, "probability": 1.0})
    result = run("one_message", [Task(ranks=2, args=(1000,), faults=spiky)])
    assert result.ok, result.message
    assert result.task_outcomes(0)[1].value == pytest.approx(ALPHA + 1000 * BETA + 0.05, rel=1e-9)


def test_a_hung_rank_freezes_and_the_supervisor_says_so() -> None:
    frozen = plan({"kind": "hung", "rank": 1, "at_step": 3})
    result = run("exchange_forever", [Task(ranks=3, faults=frozen)], deadline_s=20, stall_s=1.5)
    assert result.status == "deadlock"
    assert "rank(s) 1 hung by the fault plan" in result.message
    assert "rank 1 is hung (a fault plan froze it" in result.details


def test_a_slow_rank_takes_its_factor_longer_on_the_virtual_clock() -> None:
    slow = plan({"kind": "slow", "rank": 1, "factor": 3.0})
    flops = PLATFORM.device_of(0).flops * 0.01  # 10 ms of work
    result = run("compute_then_barrier", [Task(ranks=2, args=(flops,), faults=slow)])
    assert result.ok, result.message
    outcomes = result.task_outcomes(0)
    played = replay({r: o.trace for r, o in enumerate(outcomes)}, PLATFORM)
    assert played.compute_s[0] == pytest.approx(0.010, rel=1e-9)
    assert played.compute_s[1] == pytest.approx(0.030, rel=1e-9)
    assert played.makespan >= 0.030 and outcomes[0].value == pytest.approx(played.makespan, rel=1e-6)


def test_a_broken_plan_file_names_the_bad_entry(tmp_path: Path) -> None:
    bad = tmp_path / "faults.toml"
    bad.write_text('format_version = 1\n[[fault]]\nkind = "drop"\nprobability = 1.5\n')
    with pytest.raises(FaultPlanError, match=r"fault\[0\]\.probability must be between 0 and 1"):
        load_fault_plan(bad)
