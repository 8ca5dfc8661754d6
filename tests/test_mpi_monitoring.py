"""Open MPI's own counters below the proxy: the files a real mpiexec writes, their parser, the rule
that compares them with what the harness handed to MPI, and the launch path that turns them on."""

from __future__ import annotations

import sys
from pathlib import Path

from distlab.exam import bypasses
from distlab.platforms import resolve
from distlab.runtime.jobspec import Task, make_job
from distlab.runtime.supervisor import LaunchResult, launch, mpi_env, mpiexec_path, run_mpiexec
from distlab.runtime.supervisor.mpi_monitoring import (
    PROBE_NAME,
    WORLD_NAME,
    RankMonitoring,
    Traffic,
    Unexplained,
    monitoring_env,
    monitoring_path,
    parse_monitoring,
    read_job,
    unexplained,
)

TESTS = Path(__file__).resolve().parent
PROGRAMS = TESTS / "programs.py"
SOLUTIONS = TESTS / "monitoring_solutions.py"

# Rank 0 sends 10 float64 to rank 1 on MPI_COMM_WORLD, then both sum 4 float64 there.
TINY = """
import numpy as np
from mpi4py import MPI
world = MPI.COMM_WORLD
data = np.ones(10)
if world.Get_rank() == 0:
    world.Send(data, dest=1, tag=7)
else:
    world.Recv(data, source=0, tag=7)
world.Allreduce(np.ones(4), np.empty(4))
"""


def test_a_real_mpiexec_writes_files_the_parser_reads(tmp_path: Path) -> None:
    env = mpi_env() | monitoring_env(tmp_path)
    command = [mpiexec_path(), "-n", "2", "--oversubscribe", "--bind-to", "none",
               sys.executable, "-c", TINY]
    done = run_mpiexec(command, env, timeout_s=60)
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = read_job(tmp_path, 2)
    assert sorted(ranks) == [0, 1] and monitoring_path(tmp_path, 0).exists()
    # The Send is one external message of 80 bytes from rank 0 to rank 1, and nothing else is.
    assert ranks[0].external == {1: Traffic(1, 80)}
    assert ranks[1].external == {}
    # The Allreduce is one operation on the world of 32 bytes per peer, and its messages are
    # internal ones, apart from the program's point-to-point traffic.
    assert ranks[0].collectives[WORLD_NAME] == Traffic(1, 32)
    assert ranks[1].internal and ranks[0].one_sided == {}


def test_the_parser_sums_communicators_of_one_name_and_ignores_histograms() -> None:
    text = (
        "# POINT TO POINT\n"
        "E\t0\t1\t80 bytes\t1 msgs sent\t0,0,1,0\n"
        "E\t0\t0\t8 bytes\t1 msgs sent\n"
        "I\t0\t1\t92 bytes\t5 msgs sent\n"
        "# OSC\n"
        "S\t0\t1\t32 bytes\t1 msgs sent\n"
        "# COLLECTIVES\n"
        "C\t0\t1\t92 bytes\t5 msgs sent\n"
        "D\tdistlab.task\tprocs: 0,1\n"
        "O2A\t0\t8 bytes\t1 msgs sent\nA2O\t0\t0 bytes\t0 msgs sent\nA2A\t0\t16 bytes\t2 msgs sent\n"
        "D\tdistlab.task\tprocs: 0,1\n"
        "O2A\t0\t0 bytes\t0 msgs sent\nA2O\t0\t0 bytes\t0 msgs sent\nA2A\t0\t0 bytes\t1 msgs sent\n"
    )
    found = parse_monitoring(text, 0)
    assert found.external == {1: Traffic(1, 80), 0: Traffic(1, 8)}
    assert found.internal == {1: Traffic(5, 92)} and found.one_sided == {1: Traffic(1, 32)}
    assert found.collectives == {"distlab.task": Traffic(4, 24)}


def test_the_rule_counts_only_what_the_harness_did_not_hand_to_mpi() -> None:
    dup = Traffic(3, 12)
    honest = RankMonitoring(0, external={1: Traffic(4, 320)},
                            collectives={WORLD_NAME: dup, PROBE_NAME: dup})
    assert not unexplained({0: honest}, {0: {1: (4, 320)}}, 1).flagged
    cheat = RankMonitoring(0, external={1: Traffic(5, 400), 2: Traffic(1, 8)},
                           collectives={WORLD_NAME: dup + Traffic(2, 160), PROBE_NAME: dup})
    found = unexplained({0: cheat}, {0: {1: (4, 320)}}, 2)
    assert found.flagged and found.ranks_unmeasured == 1
    assert found.point_to_point == Traffic(2, 88) and found.world_collectives == Traffic(2, 160)
    assert found.sentence() == (
        "MPI carried 2 point-to-point message(s) (88 B) and 2 collective operation(s) on "
        "MPI_COMM_WORLD (160 B) that the proxy did not"
    )


def monitored(name: str, tasks: list[Task], **options: object) -> LaunchResult:
    job = make_job(PROGRAMS, "call_solution", tasks, "mpi", SOLUTIONS, mpi_monitoring=True,
                   **options)
    result = launch(job, deadline_s=60)
    assert result.ok, result.message + result.details
    assert result.mpi_traffic is not None and sorted(result.mpi_traffic) == list(range(job.world_size))
    return result


def verdict(result: LaunchResult) -> Unexplained:
    assert result.mpi_traffic is not None
    handed = {rank: o.handed for rank, o in result.outcomes.items()}
    return unexplained(result.mpi_traffic, handed, result.world_size)


def test_honest_code_through_the_proxy_is_not_flagged_with_the_clock_and_sub_communicators() -> None:
    # The online clock adds its time stamps and allreduces; the 2-rank task runs on a split while
    # rank 2 waits at the harness's barrier: all of it is the harness's, none of it is flagged.
    tasks = [Task(ranks=3, args=("honest", 16)), Task(ranks=2, args=("honest", 16))]
    result = monitored("honest", tasks, platform=resolve("laptop"), online_clock=True)
    found = verdict(result)
    assert not found.flagged, found.sentence()
    # What MPI carried point to point is exactly what the harness handed it, peer by peer.
    assert result.mpi_traffic is not None
    for rank, outcome in result.outcomes.items():
        carried = {peer: (t.messages, t.bytes) for peer, t in result.mpi_traffic[rank].external.items()}
        assert carried == outcome.handed and carried


def test_a_disguised_allreduce_on_the_world_is_caught_by_the_counters_alone() -> None:
    assert bypasses(SOLUTIONS) == []  # the import scan sees no mpi4py import
    found = verdict(monitored("world_allreduce", [Task(ranks=3, args=("world_allreduce", 10))]))
    # One Allreduce of 80 bytes on each of 3 ranks, counted as 80 bytes per peer.
    assert found.world_collectives == Traffic(3, 3 * 2 * 80) and not found.point_to_point
    assert "3 collective operation(s) on MPI_COMM_WORLD" in found.sentence()


def test_a_disguised_sendrecv_on_the_world_is_caught_by_the_counters_alone() -> None:
    found = verdict(monitored("world_sendrecv", [Task(ranks=2, args=("world_sendrecv", 10))]))
    assert found.point_to_point == Traffic(2, 160) and not found.world_collectives


def test_a_launch_not_asked_to_monitor_counts_nothing(tmp_path: Path) -> None:
    job = make_job(PROGRAMS, "call_solution", [Task(ranks=2, args=("honest", 4))], "mpi", SOLUTIONS)
    result = launch(job, deadline_s=60, keep_dir=tmp_path / "job")
    assert result.ok and result.mpi_traffic is None
    assert all(o.handed == {} for o in result.outcomes.values())
    assert not list((tmp_path / "job").glob("mpi-monitoring*"))
