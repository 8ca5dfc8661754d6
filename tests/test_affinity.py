"""The CPUs a rank's solution process may run on, read by the harness from the kernel at the
task's end (runtime/rank/sealed.py's cpus; TaskRun.cpus in grading): what the learner's code
applied, not what it says, sealed (the learner's process in its own PID namespace) or not."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_launcher import assert_nothing_left

from distlab.grading import Task
from distlab.runs import Program, run, run_options

PROGRAMS = Path(__file__).resolve().parent / "programs.py"
SOLUTION = Path(__file__).resolve().parent / "affinity_programs.py"


@pytest.mark.parametrize("seal", [True, False])
def test_the_harness_reads_the_affinity_the_code_applied_from_the_kernel(seal: bool) -> None:
    done = run(Program(PROGRAMS, "call_solution", SOLUTION), [Task(ranks=2, case="pin_and_lie").for_ranks()],
               run_options("mpi", seal=seal), deadline_s=60)
    assert_nothing_left()
    assert done.ok, done.result.message
    task = done.tasks[0]
    for rank, value in enumerate(task.values):
        assert task.outcomes[rank].cpus == (value["pinned"],) != tuple(value["claims"])
