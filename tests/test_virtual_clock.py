"""The virtual clock end to end: real ranks, recorded events, the replay, and the online clock.

The story: problem 03's reference ring allreduce runs on an alpha-beta platform and must take
exactly 2(p-1)alpha + 2(p-1)/p n beta; runs repeated on both engines give bit-identical virtual
times; sends follow MPI's eager and rendezvous protocols on both engines; flows into one port share
it; declared FLOPs become time through the device profile.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from distlab.platforms import resolve, uniform
from distlab.runtime.clock.collectives_cost import ring_allreduce_time
from distlab.runtime.clock.online import EAGER_LIMIT
from distlab.runtime.clock.replay import replay
from distlab.runtime.jobspec import Job, Task, program_module_name
from distlab.runtime.supervisor import LaunchResult, launch

PROGRAMS = Path(__file__).resolve().parent / "clock_programs.py"
ALPHA, BETA = 20e-6, 1 / 5e9  # 20 us, 5 GB/s


def run_tasks(program: str, tasks: list[Task], platform, backend: str = "mpi") -> LaunchResult:
    job = Job(
        program_file=str(PROGRAMS), program_module=program_module_name(PROGRAMS), program=program,
        solution_file=None, tasks_blob=pickle.dumps(tuple(tasks)),
        task_labels=tuple(t.label for t in tasks), backend=backend,
        world_size=max(t.ranks for t in tasks), supervisor_pid=os.getpid(), platform=platform, online_clock=True,
        device_flops=tuple(platform.device_of(r).flops for r in range(max(t.ranks for t in tasks))),
    )
    result = launch(job, deadline_s=90)
    assert result.ok, result.message + "\n" + result.details
    return result


def virtual_times(result: LaunchResult, index: int, platform) -> tuple[float, list[float]]:
    """(replayed makespan, each rank's online clock at the end) of task ``index``."""
    outcomes = result.task_outcomes(index)
    played = replay({r: o.trace for r, o in enumerate(outcomes)}, platform)
    return played.makespan, [o.value for o in outcomes]


@pytest.mark.parametrize("p, n", [(2, 4096), (3, 30000), (4, 1 << 18), (8, 1 << 17)])
def test_the_ring_takes_exactly_the_alpha_beta_formula(p: int, n: int) -> None:
    platform = uniform(8, ALPHA, BETA)
    result = run_tasks("ring_allreduce", [Task(ranks=p, args=(n,))], platform)
    makespan, online = virtual_times(result, 0, platform)
    bound = ring_allreduce_time(p, n * 8, ALPHA, BETA)
    # n divisible by p: exact; otherwise ceil-sized chunks cost a few bytes more.
    assert makespan == pytest.approx(bound, rel=0.01)
    # Nothing shares a link in a ring on this platform: the online clock agrees with the replay.
    assert max(online) == pytest.approx(makespan, rel=1e-9)


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_the_same_run_gives_identical_virtual_times(backend: str) -> None:
    platform = resolve("three-dc")
    # Three runs of the same program: two in one launch, one in a second launch (on gloo, whose
    # ranks each import torch, on 4 ranks).
    ranks = 6 if backend == "mpi" else 4
    seen = []
    for repeats in (2, 1):
        tasks = [Task(ranks=ranks, args=(10007,))] * repeats
        result = run_tasks("ring_allreduce", tasks, platform, backend)
        seen += [virtual_times(result, i, platform) for i in range(len(tasks))]
    assert len(seen) == 3
    assert all(s == seen[0] for s in seen), seen  # bit-identical, replay and online clock alike


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_a_lone_send_is_free_below_the_eager_limit_and_a_ping_pong_is_two_messages(backend: str) -> None:
    """Real MPI: a Send below the eager limit returns once the message is copied out; a larger one
    (rendezvous) once its bytes have moved. Timing a lone Send then says nothing of the link below
    the limit, and a ping-pong still takes 2(alpha + n beta), online and in the replay."""
    platform = uniform(2, ALPHA, BETA)
    late = 1e-3  # rank 1 posts its Recv 1 ms late
    small, large = 1000, 4 * EAGER_LIMIT
    tasks = [Task(ranks=2, args=(n, late), label=f"{n} B") for n in (small, large)]
    result = run_tasks("lone_send_then_ping_pong", tasks, platform, backend)
    for index, n in enumerate((small, large)):
        outcomes = result.task_outcomes(index)
        (lone, ping_pong), arrived = outcomes[0].value, outcomes[1].value
        wire = ALPHA + n * BETA
        assert ping_pong == pytest.approx(2 * wire, rel=1e-12), n
        played = replay({r: o.trace for r, o in enumerate(outcomes)}, platform)
        send_done = played.spans[0][1][1]  # rank 0's events: the Send's "send", then its "wait"
        assert arrived == pytest.approx(late)  # the message was in long before rank 1 looked
        if n == small:  # eager: done once copied out, on both clocks
            assert lone == 0.0 and send_done == 0.0
        else:  # rendezvous: done once the bytes are in (a late receive is not modelled)
            assert lone == pytest.approx(wire, rel=1e-12) and send_done == pytest.approx(wire, rel=1e-12)


def test_a_burst_to_one_peer_arrives_message_after_message_on_both_clocks() -> None:
    """One channel per pair, first in, first out: three Isends posted at once arrive one after
    another, the k-th once the bytes of the ones before it are in, online and in the replay."""
    platform = uniform(2, ALPHA, BETA)
    sizes = (4 * EAGER_LIMIT, 1000, 30_000)  # a rendezvous first: the small ones wait behind it
    result = run_tasks("burst_to_one_peer", [Task(ranks=2, args=(sizes,))], platform)
    outcomes = result.task_outcomes(0)
    expected = [ALPHA + sum(sizes[: k + 1]) * BETA for k in range(len(sizes))]
    assert outcomes[1].value == pytest.approx(expected, rel=1e-12)
    played = replay({r: o.trace for r, o in enumerate(outcomes)}, platform)
    flows = sorted(played.flows, key=lambda f: f.end)
    assert [f.nbytes for f in flows] == list(sizes)
    assert [f.end for f in flows] == pytest.approx(expected, rel=1e-12)


def test_two_flows_through_one_port_take_twice_as_long_as_one() -> None:
    platform = uniform(3, ALPHA, BETA)
    nbytes = 1 << 20
    result = run_tasks("fan_in", [Task(ranks=3, args=(1, nbytes)), Task(ranks=3, args=(2, nbytes))], platform)
    one, _ = virtual_times(result, 0, platform)
    two, _ = virtual_times(result, 1, platform)
    assert one == pytest.approx(ALPHA + nbytes * BETA, rel=1e-9)
    # Both flows enter rank 2 through its one downlink and share it.
    assert two == pytest.approx(ALPHA + 2 * nbytes * BETA, rel=1e-9)


def test_declared_flops_become_time_through_the_device_profile() -> None:
    platform = resolve("seed-lab")  # ranks 0-7 A100 (19.5 TFLOP/s), 8-11 V100 (14 TFLOP/s)
    flops = 19.5e12 * 0.010  # 10 ms on an A100
    result = run_tasks("compute_then_barrier", [Task(ranks=2, args=(flops,))], platform)
    makespan, online = virtual_times(result, 0, platform)
    assert makespan > 0.010 and makespan == pytest.approx(max(online), rel=1e-9)
    assert makespan < 0.011  # the barrier adds microseconds, not milliseconds


def test_a_task_can_model_its_own_platform_within_one_launch() -> None:
    # One launch, two tasks: the first on the job's platform, the second on a platform of its
    # own with ten times the latency and half the bandwidth. Each online clock and each replay
    # follows its task's platform, and each matches the ring formula for it.
    job_platform = uniform(4, ALPHA, BETA)
    own = uniform(4, 10 * ALPHA, 2 * BETA)
    n, p = 1 << 16, 4
    tasks = [Task(ranks=p, args=(n,)), Task(ranks=p, args=(n,), platform=own)]
    result = run_tasks("ring_allreduce", tasks, job_platform)
    for index, (platform, alpha, beta) in enumerate(
        [(job_platform, ALPHA, BETA), (own, 10 * ALPHA, 2 * BETA)]
    ):
        makespan, online = virtual_times(result, index, platform)
        assert makespan == pytest.approx(ring_allreduce_time(p, n * 8, alpha, beta), rel=1e-6)
        assert max(online) == pytest.approx(makespan, rel=1e-9), index


def test_a_check_reads_each_task_on_its_own_platform() -> None:
    # The same through the API of check.py: TaskRun.replay() uses the task's platform. The
    # programs file is loaded as a problem package's programs.py would be.
    import importlib

    import numpy as np

    from distlab.grading import Task as CaseTask
    from distlab.grading.api import CheckContext, Session
    from distlab.runs import run_options
    from distlab.runtime.jobspec import problem_package

    programs = importlib.import_module(f"{problem_package(PROGRAMS.parent)}.{PROGRAMS.stem}")
    session = Session(
        solution_file=PROGRAMS, seed=1,
        narrator=type("Quiet", (), {"say": lambda self, text: None})(),
        options=run_options("mpi", uniform(4, ALPHA, BETA), deadline_s=60),
    )
    own = uniform(4, 10 * ALPHA, 2 * BETA)
    n, p = 1 << 16, 4
    run = CheckContext(session, 1).launch(
        programs.ring_allreduce, [CaseTask(ranks=p, case=n), CaseTask(ranks=p, case=n, platform=own)]
    )
    times = [task_run.replay().makespan for task_run in run.tasks]
    want = [ring_allreduce_time(p, n * 8, ALPHA, BETA), ring_allreduce_time(p, n * 8, 10 * ALPHA, 2 * BETA)]
    assert np.allclose(times, want, rtol=1e-6), (times, want)
