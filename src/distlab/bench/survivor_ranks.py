"""The rank programs of the survivors and store benchmarks (survivor_cost.py).

``python -m distlab.bench.survivor_ranks --out F``, started by ``mpiexec --with-ft ulfm -n 4``
over the TCP transport, as a ``Task(survivors=True)`` job runs: the ranks time a 4-rank Allreduce
through distlab's ``Comm`` over the survivors' engine (the baseline); then, once every rank has
left a Barrier, rank 2 writes the wall time to a file beside F and SIGKILLs itself, while the
others sit in an Allreduce; they time from that time to their ``distlab.PeerFailed``, then
through Revoke, Shrink and one Allreduce of the survivors; rank 0 writes the medians to F. (A kill of the harness's fault plan lands at the supervisor's next
50 ms poll, which would hide the engine's own detection time.)

``through_a_death_on_gloo``: the same in a gloo job with survivors started through the front
door, where detection is the supervisor's notice of the death (engines/notices.py).

``admit_a_joiner``: the membership barrier of an elastic job, empty and with a newcomer.

``store_round_trip``: a harness program; rank 0 times a set and a get of 8 bytes on the task's
store against an 8-byte Send/Recv round trip with rank 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np

import distlab

ROUNDS = 20
VICTIM = 2


def through_a_death(comm: Any, kill_file: Path) -> dict[str, float] | None:
    ones, out = np.ones(1024), np.zeros(1024)
    times = []
    for _ in range(ROUNDS + 3):
        comm.Barrier()
        start = time.perf_counter()
        comm.Allreduce(ones, out)
        times.append(time.perf_counter() - start)
    comm.Barrier()
    if comm.rank == VICTIM:
        time.sleep(0.05)  # every other rank is out of the Barrier, inside the Allreduce
        kill_file.write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.Allreduce(ones, out)
        return None  # the death went unseen: survivor_cost.py says so
    except distlab.PeerFailed:
        detect_s = time.time() - float(kill_file.read_text())
    start = time.perf_counter()
    comm.Revoke()
    survivors = comm.Shrink()
    survivors.Allreduce(ones, out)
    finish_s = time.perf_counter() - start
    mine = np.array([float(np.median(times[3:])), detect_s, finish_s])
    medians = np.zeros((survivors.size, 3))
    survivors.Allgather(mine, medians)
    return dict(zip(("allreduce_s", "detect_s", "shrink_and_finish_s"),
                    (float(v) for v in np.median(medians, axis=0))))


def through_a_death_on_gloo(comm: Any, solution: Any, kill_file: str) -> dict[str, float] | None:
    """A harness program: ``through_a_death`` in a gloo job with survivors, where the supervisor
    notices the death and posts it on the launch's store; rank 0 returns the medians."""
    got = through_a_death(comm, Path(kill_file))
    if got is None:
        raise RuntimeError("rank 2's death went unseen: the Allreduce after it completed")
    return got if comm.rank == 0 else None


def admit_a_joiner(comm: Any, solution: Any) -> dict[str, float] | None:
    """A harness program for a 4-rank job with survivors whose plan has one rank join at step 1: rank 0 times an Admit with no one waiting (the membership barrier every elastic step
    pays), then the Admit that takes the newcomer in and the grown group's first Allreduce (which
    includes the newcomer's start: the Admit waits for it to reach the lobby)."""
    ones, out = np.ones(1024), np.zeros(1024)
    if os.environ.get("DISTLAB_JOINED") == "1":
        comm.Allreduce(ones, out)
        return None
    empty = []
    comm.mark("step")  # step 0
    for _ in range(ROUNDS + 3):
        comm.Barrier()
        start = time.perf_counter()
        same = comm.Admit()
        empty.append(time.perf_counter() - start)
        assert same is comm, "a rank joined before its step"
    comm.mark("step")  # step 1, the join's: the supervisor starts the newcomer here
    start = time.perf_counter()
    grown = comm.Admit()
    grown.Allreduce(ones, out)
    reform_s = time.perf_counter() - start
    if comm.rank != 0:
        return None
    return {"admit_s": float(np.median(empty[3:])), "reform_s": reform_s}


def store_round_trip(comm: Any, solution: Any, rounds: int) -> dict[str, float] | None:
    store = comm.store()
    buf = np.zeros(1)
    trips, pings = [], []
    for _ in range(rounds + 5):
        comm.Barrier()
        if comm.rank == 0:
            start = time.perf_counter()
            store.set("k", b"12345678")
            store.get("k")
            trips.append(time.perf_counter() - start)
            start = time.perf_counter()
            comm.Send(buf, dest=1)
            comm.Recv(buf, source=1)
            pings.append(time.perf_counter() - start)
        elif comm.rank == 1:
            comm.Recv(buf, source=0)
            comm.Send(buf, dest=0)
    if comm.rank != 0:
        return None
    return {"store_s": float(np.median(trips[5:])), "pingpong_s": float(np.median(pings[5:]))}


def main(argv: list[str] | None = None) -> int:
    from ..runtime.comm.proxy import Comm
    from ..runtime.engines import mpi
    from ..runtime.engines.surviving import SurvivingEngine

    parser = argparse.ArgumentParser(prog="python -m distlab.bench.survivor_ranks")
    parser.add_argument("--out", type=Path, required=True, help="JSON file that rank 0 writes")
    out = parser.parse_args(argv).out
    comm = Comm(SurvivingEngine(mpi.world(), lambda: None))  # type: ignore[arg-type]
    got = through_a_death(comm, out.with_suffix(".killed"))
    if comm.rank == 0 and got is not None:
        out.write_text(json.dumps(got))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
