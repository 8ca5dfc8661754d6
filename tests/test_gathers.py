"""The collectives of runtime II: Gather, Scatter, Allgatherv, Alltoall, Alltoallv
(runtime/comm/gathers.py) and the nonblocking Ibcast, Iallgather, Ireduce_scatter_block
(collectives.py): the values on both engines and through the seal, the time each takes on the
virtual clock against its documented formula (runtime/clock/collectives_cost.py), and a clear
error for each misuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from distlab.platforms import uniform
from distlab.runs import Program, run, run_options
from distlab.runtime.clock.collectives_cost import (
    collective_time,
    pairwise_alltoallv_time,
    rounds,
)
from distlab.runtime.jobspec import Task

PROGRAMS = Path(__file__).resolve().parent / "programs.py"
SOLUTION = Path(__file__).resolve().parent / "gather_programs.py"
ALPHA, BETA = 20e-6, 1 / 5e9


def launch(tasks: list[Task], backend: str = "mpi", seal: bool = True, **options: Any) -> Any:
    done = run(Program(PROGRAMS, "call_solution", SOLUTION), tasks,
               run_options(backend, seal=seal, platform=options.pop("platform", "laptop")), **options)
    assert done.ok, done.result.message
    return done


VALUES = [Task(ranks=5, args=("every_call",)), Task(ranks=3, args=("nonblocking_ones",)),
          Task(ranks=4, args=("uneven_exchange",)), Task(ranks=2, args=("misuse",))]
MISUSE = VALUES[-1]
_LAUNCHES: dict[tuple[str, bool], Any] = {}


def values_of(name: str, backend: str, seal: bool) -> Any:
    """The task ``name`` of VALUES, from one launch of them all per engine and seal."""
    if (backend, seal) not in _LAUNCHES:
        _LAUNCHES[backend, seal] = launch(VALUES, backend, seal)
    return _LAUNCHES[backend, seal].tasks[[t.args[0] for t in VALUES].index(name)]


# Sealed, each call runs on the proxy in the rank's agent, as it does unsealed: the timed tasks
# below run unsealed, and the misuses both ways.
ENGINES = [("mpi", True), ("gloo", True)]
N = 4096  # float64 per block in the timed tasks: 32 KiB, so the beta term weighs
BLOCKING = ["Gather", "Scatter", "Allgatherv equal", "Alltoall", "Allgatherv"]
NONBLOCKING = ["Bcast", "Allgather", "Reduce_scatter"]
_TIMED: dict[int, Any] = {}


def timed(p: int) -> dict[Any, Any]:
    """The timed tasks on a uniform platform of p ranks, one launch per p, by what they time:
    each blocking op; ("I", op) for the nonblocking ones and ("v", circulant) for Alltoallv
    (p = 4 only), and the misuses, unsealed."""
    if p not in _TIMED:
        keys: list[Any] = list(BLOCKING)
        tasks = [Task(ranks=p, args=("one_collective", op, N)) for op in BLOCKING]
        if p == 4:
            keys += [("I", op) for op in NONBLOCKING] + [("v", True), ("v", False), "misuse"]
            tasks += [Task(ranks=p, args=("one_nonblocking", op, N)) for op in NONBLOCKING]
            tasks += [Task(ranks=p, args=("timed_alltoallv", N // 2, c)) for c in (True, False)]
            tasks.append(MISUSE)  # unsealed, beside the timed ones
        done = launch(tasks, seal=False, platform=uniform(p, ALPHA, BETA), online_clock=True)
        _TIMED[p] = dict(zip(keys, done.tasks))
    return _TIMED[p]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend,seal", ENGINES)
def test_each_call_delivers_what_numpy_says(backend: str, seal: bool) -> None:
    p = 5
    task = values_of("every_call", backend, seal)
    blocks = [np.arange(3) + 100.0 * r for r in range(p)]
    counts = [k + 1 for k in range(p)]
    layout = np.full(sum(counts) + p, -1)
    for k in range(p):
        start = sum(counts[:k]) + k
        layout[start : start + counts[k]] = np.arange(counts[k]) + 100 * k
    for r, got in enumerate(task.values):
        assert got["gather"] == (np.concatenate(blocks).tolist() if r == 2 else None)
        assert got["scatter"] == [20 * r, 20 * r + 10]
        assert got["allgatherv"] == layout.tolist()
        assert got["alltoall"] == np.repeat(np.arange(p) * 10.0 + r, 2).tolist()
    assert task.outcomes[0].stats.calls == {"Gather": 1, "Scatter": 1, "Allgatherv": 1, "Alltoall": 1}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("p", [4, 5])
def test_the_replay_and_the_online_clock_take_each_formula(p: int) -> None:
    block = 8 * N
    tasks = timed(p)
    want = {
        "Gather": collective_time("Gather", p, block, ALPHA, BETA),
        "Scatter": collective_time("Scatter", p, block, ALPHA, BETA),
        "Allgatherv equal": collective_time("Allgatherv", p, block, ALPHA, BETA),
        "Alltoall": collective_time("Alltoall", p, block * p, ALPHA, BETA),
    }
    # The formulas themselves, spelled out: L alpha + (p-1) n beta; (p-1)(alpha + n beta).
    assert want["Gather"] == pytest.approx(rounds(p) * ALPHA + (p - 1) * block * BETA)
    assert want["Alltoall"] == pytest.approx((p - 1) * (ALPHA + block * BETA))
    for op in BLOCKING:
        task = tasks[op]
        played = task.replay().makespan
        if op in ("Gather", "Scatter") and p & (p - 1):
            # No power of two: the shallow subtree's ranks send while the first rounds run, so
            # the formula bounds the tree from above; the root's link still carries p - 1 blocks.
            assert ALPHA + (p - 1) * block * BETA < played <= want[op] * 1.01, op
            assert max(task.values) == pytest.approx(want[op], rel=0.01), op
        elif op in want:
            assert played == pytest.approx(want[op], rel=0.01), op
            assert max(task.values) == pytest.approx(want[op], rel=0.01), op  # comm.now()
        else:  # blocks of n, 2n, ... pn: no more than the ring with every block the largest
            bound = collective_time("Allgatherv", p, block * p, ALPHA, BETA)
            assert (p - 1) * ALPHA < played <= bound * 1.01
            assert max(task.values) == pytest.approx(bound, rel=0.01)  # the online clock: the bound


@pytest.mark.parametrize("seal", [True, False])
def test_each_misuse_is_named(seal: bool) -> None:
    task = values_of("misuse", "mpi", True) if seal else timed(4)["misuse"]
    first, second = task.values
    assert first["gather recvbuf"] == ("ValueError: Gather: recvbuf holds 3 x float64; it needs 2 "
                                       "blocks of sendbuf's 2 x float64")
    for said in (first, second):
        assert said["alltoall blocks"].startswith("ValueError: Alltoall: sendbuf (5 x float64) and "
                                                  "recvbuf (5 x float64) must be alike and hold 2 equal")
        assert said["allgatherv counts"] == ("ValueError: Allgatherv recvbuf: counts [1] must be 2 "
                                             "numbers >= 0, one per rank")
        assert said["allgatherv past"] == ("ValueError: Allgatherv recvbuf: rank 1's block (1 "
                                           "elements from 5) runs past the buffer's 2 elements")
        assert said["gather in place"] == ("TypeError: Gather sendbuf: IN_PLACE is not taken here; "
                                           "pass the rank's own block")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend,seal", ENGINES)
def test_the_nonblocking_collectives_deliver_at_their_wait(backend: str, seal: bool) -> None:
    p = 3
    task = values_of("nonblocking_ones", backend, seal)
    total = sum(np.arange(3.0 * p) * (r + 1) for r in range(p))
    for r, (told, everyone, mine) in enumerate(task.values):
        assert told == [0.0, 1.0, 2.0, 3.0]
        assert everyone == [x for q in range(p) for x in (q, -q)]
        assert mine == total[3 * r : 3 * r + 3].tolist()
    assert task.outcomes[0].stats.calls == {"Bcast": 1, "Allgather": 1, "Reduce_scatter": 1}


@pytest.mark.timeout(240)
def test_a_nonblocking_collective_waited_at_once_takes_its_blocking_formula() -> None:
    p = 4
    ops = {"Bcast": 8 * N, "Allgather": 8 * N, "Reduce_scatter": 8 * N * p}  # the event's bytes
    for op, nbytes in ops.items():
        task = timed(p)["I", op]
        want = collective_time(op, p, nbytes, ALPHA, BETA)
        assert task.replay().makespan == pytest.approx(want, rel=0.01), op
        assert max(task.values) == pytest.approx(want, rel=0.01), op


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend,seal", ENGINES)
def test_alltoallv_puts_each_pair_s_block_at_its_place(backend: str, seal: bool) -> None:
    p = 4
    task = values_of("uneven_exchange", backend, seal)
    for r, got in enumerate(task.values):
        want: list[float] = []
        for i in reversed(range(p)):  # reverse rank order, a gap after each block
            want += [100.0 * i + r] * (i + r + 1) + [-1.0]
        assert got == want
    assert task.outcomes[1].stats.op_bytes["Alltoallv"] == 8 * sum(1 + j + 1 for j in range(p))


@pytest.mark.timeout(240)
def test_alltoallv_takes_its_formula_exactly_when_each_step_is_even() -> None:
    p, n = 4, N // 2
    for circulant in (True, False):
        task = timed(p)["v", circulant]
        blocks = [[8 * n * (1 + (j - i) % p) if circulant else 8 * n * (1 + i + 2 * j)
                   for j in range(p)] for i in range(p)]
        bound = pairwise_alltoallv_time(blocks, ALPHA, BETA)
        played = task.replay().makespan
        if circulant:
            assert played == pytest.approx(bound, rel=0.01)
        else:
            assert (p - 1) * ALPHA < played <= bound * 1.01
        largest = max(max(row) for row in blocks)  # the online clock: every block the largest
        assert max(task.values) == pytest.approx((p - 1) * (ALPHA + largest * BETA), rel=0.01)
        spans = task.traces[0]
        assert [e[4] for e in spans if e[0] == "coll"] == [tuple(blocks[0])]
