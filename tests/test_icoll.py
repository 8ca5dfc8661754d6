"""The nonblocking allreduce (``comm.Iallreduce``): replayed with overlap, and real on both engines.

The story. A rank posts an Iallreduce, computes for C seconds, then waits: on the virtual clock
that must take max(C, T) (T the allreduce alone), not C + T, because the collective's flows run
while the rank computes. First on hand-written traces over a tiny network with known answers (the
collective starts when its last member posts it; a wait after it ended costs nothing; two at
once share the links; a missing member is named), then on real ranks of both engines: the
results equal the blocking Allreduce (in place or not, several dtypes and ops, torch tensors,
Wait, Test and Waitall), the counters count it as an Allreduce, and the replay and the online
clock both show the overlap.
"""

from __future__ import annotations

import math
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_netsim import Tracer, UniformNet, close, traces_of

from distlab.platforms import uniform
from distlab.runtime.clock import collectives_cost as cc
from distlab.runtime.clock.replay import ReplayError, replay
from distlab.runtime.jobspec import Job, Task, program_module_name
from distlab.runtime.supervisor import LaunchResult, launch
from distlab.runtime.trace.events import Event

ALPHA, BETA = 20e-6, 1 / 5e9  # 20 us, 5 GB/s

# -- replay: hand-written traces --------------------------------------------------------------


class ITracer(Tracer):
    """Tracer plus the nonblocking collective, with the comm proxy's numbering."""

    def iallreduce(self, group: tuple[int, ...], nbytes: int) -> int:
        index = self._colls.get(group, 0)
        self._colls[group] = index + 1
        req = self._next()
        self.events.append(("icoll", req, "Allreduce", group, index, nbytes, -1, 0.0, 0.0))
        return req


def overlap_traces(p: int, nbytes: int, compute_s: float, blocking: bool = False) -> dict[int, list[Event]]:
    """Every rank: post an allreduce of nbytes, compute, wait (or: compute, then a blocking one)."""
    group = tuple(range(p))
    tracers = [ITracer(r) for r in range(p)]
    for t in tracers:
        if blocking:
            t.compute(compute_s)
            t.coll("Allreduce", group, nbytes)
        else:
            req = t.iallreduce(group, nbytes)
            t.compute(compute_s)
            t.wait(req)
    return traces_of(tracers)


@pytest.mark.parametrize("p", [2, 4, 5])
@pytest.mark.parametrize("ratio", [0.0, 0.3, 1.0, 1.7])
def test_compute_overlaps_a_posted_allreduce(p: int, ratio: float) -> None:
    n = 20 << 16  # divisible by every p here: the ring's chunks are equal
    net = UniformNet(ALPHA, BETA)
    alone = cc.ring_allreduce_time(p, n, ALPHA, BETA)
    c = ratio * alone
    overlapped = replay(overlap_traces(p, n, c), net)
    assert close(overlapped.makespan, max(c, alone), rel=1e-6), (overlapped.makespan, c, alone)
    serial = replay(overlap_traces(p, n, c, blocking=True), net)
    assert close(serial.makespan, c + alone, rel=1e-6)
    for r in range(p):
        # Blocked only for what the compute did not hide; no sync wait (nobody waited to start).
        assert close(overlapped.comm_s[r], max(alone - c, 0.0), rel=1e-6)
        assert overlapped.sync_wait_s[r] == 0.0
        assert close(overlapped.compute_s[r] + overlapped.comm_s[r] + overlapped.idle_s[r],
                     overlapped.makespan)
    # The same flows as the blocking collective: same bytes per pair.
    assert overlapped.pair_bytes == serial.pair_bytes
    assert {f.op for f in overlapped.flows} == {"Allreduce"}


def test_the_collective_starts_when_the_last_member_posts_it() -> None:
    p, n, late = 3, 300_000, 0.002  # n divisible by p
    group = tuple(range(p))
    tracers = [ITracer(r) for r in range(p)]
    for t in tracers:
        if t.rank == 2:
            t.compute(late)  # rank 2 posts late: the flows cannot start before
        req = t.iallreduce(group, n)
        t.compute(0.0005)
        t.wait(req)
    result = replay(traces_of(tracers), UniformNet(ALPHA, BETA))
    alone = cc.ring_allreduce_time(p, n, ALPHA, BETA)
    assert close(result.finish[0], late + alone, rel=1e-6)
    assert close(result.makespan, late + max(0.0005, alone), rel=1e-6)  # rank 2 computes after
    assert min(f.start for f in result.flows) >= late
    # Ranks 0 and 1 went on computing after posting; they block at their wait, not at the post.
    assert close(result.spans[0][2][0], 0.0005) and close(result.spans[0][2][1], late + alone)


def test_a_wait_after_the_collective_ended_costs_nothing_and_mixes_with_messages() -> None:
    p, n = 2, 100_000
    group = (0, 1)
    alone = cc.ring_allreduce_time(p, n, ALPHA, BETA)
    tracers = [ITracer(r) for r in range(p)]
    for t in tracers:
        req = t.iallreduce(group, n)
        t.compute(10 * alone)
        other = 1 - t.rank
        # One wait on the collective and a point-to-point exchange together.
        t.wait(req, t.isend(other, 8), t.irecv(other, 8))
    result = replay(traces_of(tracers), UniformNet(ALPHA, BETA))
    assert close(result.makespan, 10 * alone + ALPHA + 8 * BETA, rel=1e-9)
    assert all(close(result.comm_s[r], ALPHA + 8 * BETA) for r in range(p))


def test_two_allreduces_in_flight_share_the_links() -> None:
    p, n = 4, 1 << 20
    group = tuple(range(p))
    tracers = [ITracer(r) for r in range(p)]
    for t in tracers:
        first, second = t.iallreduce(group, n), t.iallreduce(group, n)
        t.wait(first, second)
    result = replay(traces_of(tracers), UniformNet(0.0, BETA))
    alone = cc.ring_allreduce_time(p, n, 0.0, BETA)
    assert close(result.makespan, 2 * alone, rel=1e-6)


def test_blocking_and_nonblocking_collectives_share_one_numbering() -> None:
    """An Iallreduce, a Barrier, then a second Iallreduce waited on in reverse order."""
    p, n = 3, 60_000
    group = tuple(range(p))
    tracers = [ITracer(r) for r in range(p)]
    for t in tracers:
        a = t.iallreduce(group, n)
        t.coll("Barrier", group, 0)
        b = t.iallreduce(group, n)
        t.wait(b)
        t.wait(a)
    result = replay(traces_of(tracers), UniformNet(ALPHA, BETA))
    assert len(result.flows) == 2 * 2 * (p - 1) * p + cc.rounds(p) * p
    assert result.makespan > cc.ring_allreduce_time(p, n, ALPHA, BETA)


def test_a_member_that_never_posts_it_is_named() -> None:
    group = (0, 1, 2)
    tracers = [ITracer(r) for r in range(3)]
    for t in tracers[:2]:
        t.wait(t.iallreduce(group, 64))
    with pytest.raises(ReplayError, match=r"rank\(s\) \[2\] never make that call"):
        replay(traces_of(tracers), UniformNet(ALPHA, BETA))


def test_a_wait_stuck_behind_a_peer_is_described() -> None:
    """Rank 0 waits on its Iallreduce; rank 1 first waits for a message rank 0 never sends."""
    group = (0, 1)
    tracers = [ITracer(r) for r in range(2)]
    tracers[0].wait(tracers[0].iallreduce(group, 64))
    tracers[0].send(1, 8)
    tracers[1].recv(0, 8)
    tracers[1].wait(tracers[1].iallreduce(group, 64))
    with pytest.raises(ReplayError, match=r"deadlock") as err:
        replay(traces_of(tracers), UniformNet(ALPHA, BETA))
    assert "Allreduce #0 over ranks [0, 1] (posted without blocking), which rank(s) [1]" in str(err.value)


def test_same_traces_same_times() -> None:
    traces = overlap_traces(5, 12345, 1e-4)
    a, b = replay(traces, UniformNet(ALPHA, BETA)), replay(traces, UniformNet(ALPHA, BETA))
    assert a == b


# -- the proxy: slot, counters, trace, without processes --------------------------------------


def test_a_rank_blocked_on_an_iallreduce_waits_for_its_whole_group(tmp_path: Path) -> None:
    from distlab import IN_PLACE
    from distlab.runtime.comm.proxy import Comm
    from distlab.runtime.comm.rankstate import ALL_PEERS, RankSlot, read_state
    from distlab.runtime.comm.requests import Request
    from distlab.runtime.supervisor.judge import is_stuck
    from distlab.runtime.trace.events import TraceRecorder

    seen = []

    class Pending:
        def wait(self) -> tuple[int, int]:
            seen.append(read_state(tmp_path, 0))  # the slot while the engine blocks
            return -1, -1

        def test(self) -> bool:
            return False

    class Engine:
        name, rank, size, world_ranks = "fake", 0, 3, [0, 1, 2]

        def iallreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Any) -> Pending:
            return Pending()

        def irecv(self, buf: np.ndarray, source: int, tag: int) -> Pending:
            return Pending()

    trace = TraceRecorder(0)
    comm = Comm(Engine(), slot=RankSlot(tmp_path / "state-0.bin"), trace=trace)  # type: ignore[arg-type]
    buf = np.ones(4)
    first = comm.Iallreduce(IN_PLACE, buf)
    assert not first.Test()
    first.Wait()
    second = comm.Iallreduce(np.zeros(4), buf)
    Request.Waitall([comm.Irecv(np.empty(1), source=2), second])
    for state in seen:
        assert state.state == "blocked" and state.op == "Wait" and state.peers == (ALL_PEERS,)
        assert "waits for every rank of its group" in state.describe()
    # Every rank blocked on it together is progress, not a deadlock.
    everyone = [state.__class__(**{**state.__dict__, "rank": r}) for r in range(3) for state in seen[:1]]
    assert not is_stuck(everyone, 3)
    assert dict(comm.stats.calls) == {"Allreduce": 2, "Irecv": 1}
    assert comm.stats.collectives_used() == ["Allreduce"]
    kinds = [e[0] for e in trace.events]
    assert kinds == ["icoll", "wait", "icoll", "recv", "wait"]
    assert trace.events[0][1:7] == (1, "Allreduce", (0, 1, 2), 0, 32, -1)
    assert trace.events[2][4] == 1  # the group's second collective


# -- real ranks on both engines -----------------------------------------------------------------

PROGRAM = '''
import numpy as np
import torch

from distlab import MAX, SUM
from distlab.runtime.comm.requests import Request


def make(rank, dtype, n, salt):
    rng = np.random.default_rng([rank, salt, n])
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(n) * 10).astype(dtype)
    return rng.integers(-1000, 1000, size=n).astype(dtype)


def values(comm, n):
    """Iallreduce against Allreduce: dtypes, ops, in place, Test, Waitall, torch tensors."""
    rank = comm.Get_rank()
    out = {}
    before = comm.stats.snapshot()
    for dtype in ("float32", "float64", "int64"):
        for name, op in (("SUM", SUM), ("MAX", MAX)):
            x = make(rank, dtype, n, 1)
            keep = x.copy()
            blocking = np.empty_like(x)
            comm.Allreduce(x, blocking, op)
            got = np.empty_like(x)
            req = comm.Iallreduce(x, got, op)
            req.Wait()
            in_place = x.copy()
            comm.Iallreduce(comm.IN_PLACE, in_place, op).Wait()
            assert np.array_equal(x, keep), "Iallreduce wrote into its send buffer"
            out[dtype, name] = (blocking, got, in_place)
    # Several in flight at once, a blocking collective among them, completed by Waitall and Test.
    bufs = [make(rank, "float64", n + k, 2) for k in range(3)]
    reqs = [comm.Iallreduce(comm.IN_PLACE, b) for b in bufs[:2]]
    comm.Barrier()
    reqs.append(comm.Iallreduce(comm.IN_PLACE, bufs[2]))
    while not reqs[2].Test():
        pass
    Request.Waitall(reqs)
    out["many"] = bufs
    # Torch tensors, as a data-parallel wrapper hands them over (a flat gradient bucket).
    t = torch.arange(n, dtype=torch.float32) * (rank + 1)
    comm.Iallreduce(comm.IN_PLACE, t).Wait()
    out["torch"] = t.numpy().copy()
    stats = comm.stats.since(before)
    return out, dict(stats.calls), stats.collectives_used()


def overlap(comm, nbytes, compute_s, blocking):
    """Post, compute, wait (or compute, then the blocking call); returns the online clock."""
    buf = np.ones(nbytes // 8)
    if blocking:
        comm.compute(seconds=compute_s)
        comm.Allreduce(comm.IN_PLACE, buf)
    else:
        req = comm.Iallreduce(comm.IN_PLACE, buf)
        comm.compute(seconds=compute_s)
        req.Wait()
    assert buf[0] == comm.Get_size()
    return comm.now()
'''

P = 4
N = 37
NBYTES = 1 << 20
T_ALONE = cc.ring_allreduce_time(P, NBYTES, ALPHA, BETA)
COMPUTES = (0.4 * T_ALONE, 1.0 * T_ALONE, 2.5 * T_ALONE)
TASKS = [Task(ranks=P, args=("values", N), label="values on 4"),
         Task(ranks=3, args=("values", N), label="values on 3"),
         Task(ranks=1, args=("values", N), label="values on 1")]
TASKS += [Task(ranks=P, args=("overlap", NBYTES, c, False), label=f"overlap {i}")
          for i, c in enumerate(COMPUTES)]
TASKS += [Task(ranks=P, args=("overlap", NBYTES, COMPUTES[1], True), label="blocking")]


@pytest.fixture(scope="module")
def program_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("icoll") / "icoll_programs.py"
    path.write_text(PROGRAM + "\n\ndef run(comm, solution, section, *args):\n"
                    "    return globals()[section](comm, *args)\n")
    return path


_RUNS: dict[str, LaunchResult] = {}
PLATFORM = uniform(P, ALPHA, BETA)


@pytest.fixture
def batch(program_file: Path) -> Any:
    def get(backend: str) -> LaunchResult:
        if backend not in _RUNS:
            job = Job(
                program_file=str(program_file), program_module=program_module_name(program_file),
                program="run", solution_file=None, tasks_blob=pickle.dumps(tuple(TASKS)),
                task_labels=tuple(t.label for t in TASKS), backend=backend, world_size=P,
                supervisor_pid=os.getpid(), platform=PLATFORM, online_clock=True,
                device_flops=tuple(PLATFORM.device_of(r).flops for r in range(P)),
            )
            _RUNS[backend] = launch(job, deadline_s=120)
        result = _RUNS[backend]
        assert result.ok, f"{backend}: {result.status}: {result.message}\n{result.details}\n{result.logs}"
        return result
    return get


def _task(result: LaunchResult, label: str) -> Any:
    index = [t.label for t in TASKS].index(label)
    return result.task_outcomes(index)


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    if got.dtype.kind == "f":
        tol = 1e-4 if got.dtype == np.float32 else 1e-10
        return got.shape == want.shape and bool(np.allclose(got, want, rtol=tol, atol=tol * 100))
    return bool(np.array_equal(got, want))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
@pytest.mark.parametrize("p", [4, 3, 1])
def test_iallreduce_equals_the_blocking_allreduce(batch: Any, backend: str, p: int) -> None:
    outcomes = _task(batch(backend), f"values on {p}")
    results = [o.value[0] for o in outcomes]
    for rank, (out, calls, used) in enumerate(o.value for o in outcomes):
        for key, (blocking, got, in_place) in ((k, v) for k, v in out.items() if isinstance(k, tuple)):
            assert _same(got, blocking), (backend, p, rank, key)
            assert _same(in_place, blocking), (backend, p, rank, key, "IN_PLACE")
        for k, buf in enumerate(out["many"]):
            want = sum(np.random.default_rng([r, 2, N + k]).standard_normal(N + k) * 10 for r in range(p))
            assert _same(buf, want), (backend, p, rank, "many", k)
        assert np.allclose(out["torch"], np.arange(N) * sum(range(1, p + 1)))
        # Counted as Allreduce: 6 blocking + 12 nonblocking + 3 + 1 torch; and one Barrier.
        assert calls == {"Allreduce": 22, "Barrier": 1}, calls
        assert used == ["Allreduce", "Barrier"]
    # Every rank holds the same result.
    for key in results[0]:
        if isinstance(key, tuple):
            assert all(_same(r[key][1], results[0][key][1]) for r in results)
    traces = {r: o.trace for r, o in enumerate(outcomes)}
    kinds = [e[0] for e in traces[0]]
    assert kinds.count("icoll") == 16 and kinds.count("coll") == 7
    replay(traces, PLATFORM)  # the recorded events replay without complaint


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_overlap_on_real_ranks_replay_and_online_clock(batch: Any, backend: str) -> None:
    result = batch(backend)
    for i, c in enumerate(COMPUTES):
        outcomes = _task(result, f"overlap {i}")
        played = replay({r: o.trace for r, o in enumerate(outcomes)}, PLATFORM)
        # max(C, T): the flows run while the ranks compute.
        assert played.makespan == pytest.approx(max(c, T_ALONE), rel=1e-6), (backend, i)
        # The online clock starts the collective at the post and ends the wait at max(C, T) too.
        assert max(o.value for o in outcomes) == pytest.approx(max(c, T_ALONE), rel=1e-6)
    outcomes = _task(result, "blocking")
    played = replay({r: o.trace for r, o in enumerate(outcomes)}, PLATFORM)
    assert played.makespan == pytest.approx(COMPUTES[1] + T_ALONE, rel=1e-6)
    assert max(o.value for o in outcomes) == pytest.approx(COMPUTES[1] + T_ALONE, rel=1e-6)
    assert math.isclose(COMPUTES[1], T_ALONE)
