"""The MPI half of ``distlab bench``: runs on every rank and writes raw timings as JSON.

Started by ``suite.py`` (and by tests/test_bench.py) as::

    mpiexec -n 4 --oversubscribe --bind-to none python -m distlab.bench.mpi_ranks --out F

What it measures, each as the median over repetitions of the slowest rank's wall time (a Barrier
before every repetition, so that each one starts together):

* problem 03's reference ring allreduce, called through distlab's ``Comm`` proxy built the way a
  check builds it (a real ``RankSlot`` in a temp dir and a ``TraceRecorder``, so the slot writes
  and the event records are paid), against mpi4py's built-in ``Allreduce`` on float32 buffers of
  4 KiB, 1 MiB and 16 MiB: in place (``MPI.IN_PLACE``, what the ring does, the baseline) and out
  of place (kept for reference: Open MPI is far slower that way at 16 MiB);
* a ping-pong of 8-byte Send/Recv between ranks 0 and 1, raw mpi4py against the proxy, while the
  other ranks sleep;
* a 1 MiB Sendrecv ring exchange on every rank, raw mpi4py against the proxy.

The two sides of each comparison alternate repetition by repetition and swap order every time, so
the noise of a shared machine falls on both alike instead of on whichever happened to run later.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..bank import Bank, resolve_solution
from ..ops import SUM
from ..platforms import resolve
from ..runtime.clock.online import Timekeeper
from ..runtime.comm.proxy import Comm
from ..runtime.comm.rankstate import RankSlot
from ..runtime.comm.stats import CommStats
from ..runtime.engines.mpi import MpiEngine
from ..runtime.rank.learner import load_module
from ..runtime.trace.events import TraceRecorder
from .timings import (
    ALLREDUCE_BYTES,
    PINGPONG_BYTES,
    SENDRECV_BYTES,
    AllreduceTiming,
    MpiTimings,
    write_json_atomically,
)

Step = Callable[[], None]


@dataclass(frozen=True)
class Plan:
    """How many repetitions of what. Sized for 4 ranks on a noisy 2-core machine."""

    warmup: int
    allreduce_reps: dict[int, int]  # by buffer size in bytes
    pingpong_batches: int
    round_trips_per_batch: int  # one batch is timed as a whole: a round trip is a few us
    sendrecv_reps: int
    exchanges_per_rep: int

    def counts(self) -> dict[str, int]:
        counts = {f"allreduce_{n}": reps for n, reps in self.allreduce_reps.items()}
        counts.update(
            warmup=self.warmup,
            pingpong_batches=self.pingpong_batches,
            round_trips_per_batch=self.round_trips_per_batch,
            sendrecv_reps=self.sendrecv_reps,
            exchanges_per_rep=self.exchanges_per_rep,
        )
        return counts


FULL = Plan(
    warmup=3,
    allreduce_reps={4 * 1024: 500, 1024 * 1024: 200, 16 * 1024 * 1024: 60},
    pingpong_batches=100,
    round_trips_per_batch=300,
    sendrecv_reps=400,
    exchanges_per_rep=4,
)
QUICK = Plan(
    warmup=2,
    allreduce_reps={4 * 1024: 100, 1024 * 1024: 40, 16 * 1024 * 1024: 10},
    pingpong_batches=20,
    round_trips_per_batch=200,
    sendrecv_reps=60,
    exchanges_per_rep=2,
)


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class Contender:
    run: Step
    reset: Step = _nothing  # restores the input; runs before the Barrier, outside the timing


def time_contenders(sync: Any, contenders: list[Contender], reps: int, warmup: int) -> list[float]:
    """Median over ``reps`` of the slowest rank's wall time of each contender, on ``sync``'s ranks.

    The contenders take turns within each repetition, in forward then backward order."""
    count = len(contenders)
    local = np.zeros((count, reps))
    for i in range(warmup + reps):
        for k in range(count) if i % 2 == 0 else reversed(range(count)):
            contenders[k].reset()
            sync.Barrier()
            start = time.perf_counter()
            contenders[k].run()
            elapsed = time.perf_counter() - start
            if i >= warmup:
                local[k, i - warmup] = elapsed
    slowest = np.empty_like(local)
    sync.Allreduce(local, slowest, op=MPI.MAX)
    return [float(np.median(row)) for row in slowest]


def wait_for_all(world: Any) -> None:
    """A Barrier that sleeps between polls: a blocking one spins and would take a core from the
    ranks being measured (4 ranks share 2 cores)."""
    request = world.Ibarrier()
    while not request.Test():
        time.sleep(0.001)


# -- 1. ring allreduce vs the built-in ----------------------------------------------------------


def load_reference_ring() -> ModuleType:
    path = resolve_solution(Bank.default().problem("03"), "reference")
    return load_module(path, "solution")


def allreduce_timing(
    world: Any, comm: Comm, ring: ModuleType, nbytes: int, plan: Plan
) -> AllreduceTiming:
    source = np.random.default_rng(world.Get_rank()).standard_normal(nbytes // 4).astype(np.float32)
    # The ring and the in-place built-in overwrite their buffer: both restart from ``source``.
    ring_buf, in_place_buf, out = source.copy(), source.copy(), np.empty_like(source)
    contenders = [
        Contender(lambda: ring.allreduce(comm, ring_buf, SUM), lambda: np.copyto(ring_buf, source)),
        Contender(
            lambda: world.Allreduce(MPI.IN_PLACE, in_place_buf, op=MPI.SUM),
            lambda: np.copyto(in_place_buf, source),
        ),
        Contender(lambda: world.Allreduce(source, out, op=MPI.SUM)),
    ]
    _check_same_results(contenders, [ring_buf, in_place_buf, out], nbytes)
    reps = plan.allreduce_reps[nbytes]
    ring_s, in_place_s, out_of_place_s = time_contenders(world, contenders, reps, plan.warmup)
    return AllreduceTiming(nbytes, ring_s, in_place_s, out_of_place_s)


def _check_same_results(
    contenders: list[Contender], results: list[np.ndarray], nbytes: int
) -> None:
    # The timing of an allreduce that computes the wrong thing would mean nothing.
    for contender in contenders:
        contender.reset()
        contender.run()
    if not all(np.allclose(r, results[-1], rtol=1e-5, atol=1e-5) for r in results):
        raise RuntimeError(f"the allreduces disagree at {nbytes} bytes: nothing was timed")


# -- 2a. small-message ping-pong, raw vs proxy --------------------------------------------------


def _round_trips(send: Any, recv: Any, buf: np.ndarray, peer: int, leads: bool, count: int) -> None:
    # ``send``/``recv`` are mpi4py's or the proxy's bound methods: same positional signature.
    if leads:
        for _ in range(count):
            send(buf, peer, 0)
            recv(buf, peer, 0)
    else:
        for _ in range(count):
            recv(buf, peer, 0)
            send(buf, peer, 0)


def pingpong_timing(world: Any, comm: Comm, plan: Plan) -> tuple[float, float]:
    """(raw, proxy) seconds per round trip between ranks 0 and 1; other ranks get (0, 0)."""
    rank = world.Get_rank()
    pair = world.Split(0 if rank < 2 else MPI.UNDEFINED, rank)
    result = (0.0, 0.0)
    if pair != MPI.COMM_NULL:
        buf = np.zeros(PINGPONG_BYTES // 8, dtype=np.float64)
        peer, leads, count = 1 - rank, rank == 0, plan.round_trips_per_batch
        raw = Contender(lambda: _round_trips(world.Send, world.Recv, buf, peer, leads, count))
        proxy = Contender(lambda: _round_trips(comm.Send, comm.Recv, buf, peer, leads, count))
        raw_s, proxy_s = time_contenders(pair, [raw, proxy], plan.pingpong_batches, plan.warmup)
        result = (raw_s / count, proxy_s / count)
        pair.Free()
    wait_for_all(world)
    return result


# -- 2b. 1 MiB ring exchange, raw vs proxy ------------------------------------------------------


def _exchanges(
    sendrecv: Any, sendbuf: np.ndarray, recvbuf: np.ndarray, right: int, left: int, count: int
) -> None:
    for _ in range(count):
        sendrecv(sendbuf, right, 0, recvbuf, left, 0)


def sendrecv_timing(world: Any, comm: Comm, plan: Plan) -> tuple[float, float]:
    """(raw, proxy) seconds per 1 MiB Sendrecv, every rank sending right and receiving from left.

    ``comm`` is the proxy as a check builds it, with or without the online clock."""
    rank, size = world.Get_rank(), world.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    sendbuf = np.ones(SENDRECV_BYTES // 4, dtype=np.float32)
    recvbuf = np.empty_like(sendbuf)
    count = plan.exchanges_per_rep
    raw = Contender(lambda: _exchanges(world.Sendrecv, sendbuf, recvbuf, right, left, count))
    proxy = Contender(lambda: _exchanges(comm.Sendrecv, sendbuf, recvbuf, right, left, count))
    raw_s, proxy_s = time_contenders(world, [raw, proxy], plan.sendrecv_reps, plan.warmup)
    return raw_s / count, proxy_s / count


# -- the run ------------------------------------------------------------------------------------


def measure(world: Any, comm: Comm, clocked: Comm, plan: Plan, quick: bool) -> MpiTimings:
    ring = load_reference_ring()
    allreduce = [allreduce_timing(world, comm, ring, n, plan) for n in ALLREDUCE_BYTES]
    pingpong_raw, pingpong_proxy = pingpong_timing(world, comm, plan)
    sendrecv_raw, sendrecv_proxy = sendrecv_timing(world, comm, plan)
    clocked_raw, clocked_proxy = sendrecv_timing(world, clocked, plan)
    return MpiTimings(
        ranks=world.Get_size(),
        quick=quick,
        repetitions=plan.counts(),
        allreduce=allreduce,
        pingpong_raw_s=pingpong_raw,
        pingpong_proxy_s=pingpong_proxy,
        sendrecv_raw_s=sendrecv_raw,
        sendrecv_proxy_s=sendrecv_proxy,
        clocked_raw_s=clocked_raw,
        clocked_proxy_s=clocked_proxy,
    )


def learner_comm(world: Any, slot_dir: Path, clocked: bool = False) -> Comm:
    """The proxy as runtime/rank/worker.py hands it to learner code in a check (tracing is on there;
    with ``clocked``, the online virtual clock too, with its time stamps on a side communicator)."""
    rank = world.Get_rank()
    ranks = list(range(world.Get_size()))
    engine = MpiEngine(world, ranks)
    slot = RankSlot(slot_dir / f"state-{rank}{'-clocked' if clocked else ''}.bin")
    clock = Timekeeper(resolve("laptop"), MpiEngine(world.Dup(), ranks)) if clocked else None
    return Comm(engine, slot, CommStats(), trace=TraceRecorder(rank), clock=clock)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distlab.bench.mpi_ranks")
    parser.add_argument("--out", type=Path, required=True, help="JSON file that rank 0 writes")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    if world.Get_size() < 2:
        parser.error("needs at least 2 ranks (the ping-pong runs between ranks 0 and 1)")
    with tempfile.TemporaryDirectory(prefix="distlab-bench-") as tmp:
        comm = learner_comm(world, Path(tmp))
        clocked = learner_comm(world, Path(tmp), clocked=True)
        timings = measure(world, comm, clocked, QUICK if args.quick else FULL, args.quick)
    # Only ranks 0 and 1 hold the ping-pong figures; rank 0 has everything else too.
    if world.Get_rank() == 0:
        write_json_atomically(args.out, timings.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
