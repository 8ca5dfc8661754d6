"""Request.Waitany and Request.Testall (runtime/comm/requests.py), as mpi4py's: the first request
to complete is the one returned, its status filled, its buffer written and the other's not; a
Testall completes all or none. On both engines and through the seal. Probe and Iprobe
(runtime/comm/probes.py) give a message's source, tag and size before its receive, on MPI; on
gloo they say that they need MPI."""

from __future__ import annotations

from pathlib import Path

import pytest

from distlab.runs import Program, Run, run, run_options
from distlab.runtime.jobspec import Task

PROGRAMS = Path(__file__).resolve().parent / "programs.py"
SOLUTION = Path(__file__).resolve().parent / "request_programs.py"


_LAUNCHES: dict[tuple[str, bool], Run] = {}


def tasks_on(backend: str, seal: bool) -> Run:
    """One launch per engine and seal: Waitany and Testall, then (MPI only) the probes."""
    if (backend, seal) not in _LAUNCHES:
        tasks = [Task(ranks=3, args=("first_come_first_served",))]
        if backend == "mpi":
            tasks.append(Task(ranks=2, args=("sized_by_probe",)))
        done = run(Program(PROGRAMS, "call_solution", SOLUTION), tasks, run_options(backend, seal=seal))
        assert done.ok, done.result.message
        _LAUNCHES[backend, seal] = done
    return _LAUNCHES[backend, seal]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_waitany_returns_the_first_request_done_and_testall_all_or_none(backend: str) -> None:
    # Sealed: the agent waits on the proxy's requests, as an unsealed rank does itself.
    done = tasks_on(backend, True)
    got = done.tasks[0].values[0]
    (first, *early), (second, *late) = got["seen"]
    assert first == 1 and early == [2, 6, [2.0, 2.0], [0.0, 0.0]]  # rank 1's is not in yet
    assert second == 0 and late == [1, 5, [2.0, 2.0], [1.0, 1.0]]
    assert got["testall_early"] is False and got["testall_late"] is True
    assert got["none_left"] is True
    counts = done.tasks[0].outcomes[0].stats
    assert counts.calls["Irecv"] == 2 and counts.recv_bytes == {1: 16, 2: 16}
    assert counts.sent_bytes == {1: 8}


@pytest.mark.timeout(120)
def test_a_probe_tells_the_size_before_the_receive() -> None:
    task = tasks_on("mpi", True).tasks[1]
    got = task.values[0]
    assert got == {"early": False, "source": 1, "tag": 3, "bytes": 40, "got": [0.0, 1.0, 2.0, 3.0, 4.0],
                   "late": 2}
    calls = task.outcomes[0].stats.calls
    assert calls["Probe"] == 1 and calls["Iprobe"] >= 2 and calls["Recv"] == 2


def test_a_probe_on_gloo_says_it_needs_mpi() -> None:
    done = run(Program(PROGRAMS, "call_solution", SOLUTION), [Task(ranks=2, args=("sized_by_probe",))],
               run_options("gloo", seal=True), deadline_s=30)
    assert not done.ok
    assert "Probe and Iprobe need MPI" in done.result.message
