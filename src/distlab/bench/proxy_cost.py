"""The proxy's own time per Sendrecv, without a transport: what the MPI figures are made of.

The MPI half times a 1 MiB Sendrecv through the proxy against raw mpi4py; what the proxy adds
there is its Python, run between two transfers. This measures that Python alone, in one process:
the learner's ``Comm`` (with a rank slot, stats and the trace, as a check builds it) over a stub
engine that returns at once, against a plain function making the same call. Twice:

* hot: call after call, everything the proxy touches stays in the CPU caches;
* cache cleared: a 4 MiB copy before each call, as the 1 MiB transfers of a real exchange do
  (they push the interpreter's objects out of the caches, and each one the proxy touches is then
  a trip to memory). This is the cost a real exchange pays.

Medians over rounds; read by ``distlab bench`` as report-only rows.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..runtime.comm.proxy import Comm
from ..runtime.comm.rankstate import RankSlot
from ..runtime.comm.stats import CommStats
from ..runtime.trace.events import TraceRecorder

SENDRECV_BYTES = 1 << 20
CLEARING_BYTES = 4 << 20  # larger than a core's L2: what a 1 MiB exchange also pushes through


class _StubEngine:
    """Answers like an engine whose transfers take no time."""

    name, rank, size, world_ranks = "stub", 0, 4, [0, 1, 2, 3]

    def sendrecv(self, *args: Any) -> tuple[int, int]:
        return 3, 0


@dataclass(frozen=True)
class ProxyCost:
    plain_hot_s: float  # a Python call of the stub alone, per call
    proxy_hot_s: float  # Comm.Sendrecv over the stub, per call
    plain_cold_s: float  # the same two, each after a cache-clearing copy
    proxy_cold_s: float


def _per_call(call: Callable[[], Any], calls: int, clear: Callable[[], None] | None) -> float:
    total = 0.0
    for _ in range(calls):
        if clear is not None:
            clear()
        start = time.perf_counter()
        call()
        total += time.perf_counter() - start
    return total / calls


def measure(rounds: int = 5, calls: int = 2000) -> ProxyCost:
    sendbuf = np.ones(SENDRECV_BYTES // 4, dtype=np.float32)
    recvbuf = np.empty_like(sendbuf)
    source = np.ones(CLEARING_BYTES // 8)
    target = np.empty_like(source)
    stub = _StubEngine()
    with tempfile.TemporaryDirectory(prefix="distlab-bench-") as tmp:
        slot = RankSlot(Path(tmp) / "state-0.bin")
        comm = Comm(stub, slot, CommStats(), trace=TraceRecorder(0))  # type: ignore[arg-type]

        def plain() -> None:
            stub.sendrecv(sendbuf, 1, 0, recvbuf, 3, 0)

        def proxy() -> None:
            comm.Sendrecv(sendbuf, 1, 0, recvbuf, 3, 0)

        def clear() -> None:
            np.copyto(target, source)

        samples: dict[str, list[float]] = {"ph": [], "xh": [], "pc": [], "xc": []}
        for _ in range(rounds):
            samples["ph"].append(_per_call(plain, calls, None))
            samples["xh"].append(_per_call(proxy, calls, None))
            samples["pc"].append(_per_call(plain, calls // 4, clear))
            samples["xc"].append(_per_call(proxy, calls // 4, clear))
        slot.close()
    median = {key: statistics.median(values) for key, values in samples.items()}
    return ProxyCost(median["ph"], median["xh"], median["pc"], median["xc"])
