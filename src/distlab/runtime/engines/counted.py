"""The engine a rank runs its harness on while Open MPI's monitoring counts what MPI carried
(exam grading): a duplicate of a duplicate of MPI_COMM_WORLD, counting every point-to-point
message it hands to MPI, and naming the communicators it splits off. Why, and how the counts are
compared: runtime/supervisor/mpi_monitoring.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ops import Op
from .base import Engine, EngineRequest

WORLD_NAME = "MPI_COMM_WORLD"
PROBE_NAME = "distlab.probe"
HARNESS_NAME = "distlab.harness"
TASK_NAME = "distlab.task"


class HandedCounts:
    """Point-to-point messages and bytes one rank handed to MPI, per destination world rank."""

    def __init__(self) -> None:
        self.by_peer: dict[int, list[int]] = {}

    def count(self, peer: int, nbytes: int) -> None:
        tally = self.by_peer.setdefault(peer, [0, 0])
        tally[0] += 1
        tally[1] += nbytes

    def as_dict(self) -> dict[int, tuple[int, int]]:
        return {peer: (m, b) for peer, (m, b) in self.by_peer.items()}


class CountedEngine:
    """An MPI engine that counts the point-to-point messages it hands to MPI, and names the
    communicators it splits off (``distlab.task``), so monitoring can tell them from others."""

    def __init__(self, inner: Any, handed: HandedCounts) -> None:
        self._inner = inner
        self._handed = handed
        self.name: str = inner.name
        self.rank: int = inner.rank
        self.size: int = inner.size
        self.world_ranks: list[int] = inner.world_ranks
        self.path: str = inner.path

    @property
    def received_bytes(self) -> int | None:
        return getattr(self._inner, "received_bytes", None)

    def _count(self, dest: int, buf: np.ndarray) -> None:
        self._handed.count(self.world_ranks[dest], buf.nbytes)

    def send(self, buf: np.ndarray, dest: int, tag: int, synchronous: bool) -> None:
        self._count(dest, buf)
        self._inner.send(buf, dest, tag, synchronous)

    def recv(self, buf: np.ndarray, source: int, tag: int) -> tuple[int, int]:
        return self._inner.recv(buf, source, tag)

    def isend(self, buf: np.ndarray, dest: int, tag: int, synchronous: bool = True) -> EngineRequest:
        self._count(dest, buf)
        return self._inner.isend(buf, dest, tag, synchronous)

    def irecv(self, buf: np.ndarray, source: int, tag: int, cancellable: bool = False) -> EngineRequest:
        return self._inner.irecv(buf, source, tag, cancellable)

    def probe(self, source: int, tag: int, block: bool) -> tuple[int, int, int] | None:
        return self._inner.probe(source, tag, block)

    def sendrecv(
        self, sendbuf: np.ndarray, dest: int, sendtag: int, recvbuf: np.ndarray, source: int,
        recvtag: int,
    ) -> tuple[int, int]:
        self._count(dest, sendbuf)
        return self._inner.sendrecv(
            sendbuf, dest, sendtag, recvbuf, source, recvtag
        )

    def barrier(self) -> None:
        self._inner.barrier()

    def bcast(self, buf: np.ndarray, root: int) -> None:
        self._inner.bcast(buf, root)

    def reduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op, root: int) -> None:
        self._inner.reduce(sendbuf, recvbuf, op, root)

    def allreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op) -> None:
        self._inner.allreduce(sendbuf, recvbuf, op)

    def iallreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op) -> EngineRequest:
        return self._inner.iallreduce(sendbuf, recvbuf, op)

    def ibcast(self, buf: np.ndarray, root: int) -> EngineRequest:
        return self._inner.ibcast(buf, root)

    def iallgather(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> EngineRequest:
        return self._inner.iallgather(sendbuf, recvbuf)

    def ireduce_scatter_block(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op) -> EngineRequest:
        return self._inner.ireduce_scatter_block(sendbuf, recvbuf, op)

    def reduce_scatter(
        self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int], op: Op
    ) -> None:
        self._inner.reduce_scatter(sendbuf, recvbuf, counts, op)

    def allgather(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
        self._inner.allgather(sendbuf, recvbuf)

    def ibarrier(self) -> EngineRequest:
        return self._inner.ibarrier()

    def ireduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op, root: int) -> EngineRequest:
        return self._inner.ireduce(sendbuf, recvbuf, op, root)

    def ireduce_scatter(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int],
                        op: Op) -> EngineRequest:
        return self._inner.ireduce_scatter(sendbuf, recvbuf, counts, op)

    def igather(self, sendbuf: np.ndarray, recvbuf: np.ndarray | None, root: int) -> EngineRequest:
        return self._inner.igather(sendbuf, recvbuf, root)

    def iscatter(self, sendbuf: np.ndarray | None, recvbuf: np.ndarray, root: int) -> EngineRequest:
        return self._inner.iscatter(sendbuf, recvbuf, root)

    def iallgatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int],
                    displs: list[int]) -> EngineRequest:
        return self._inner.iallgatherv(sendbuf, recvbuf, counts, displs)

    def ialltoall(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> EngineRequest:
        return self._inner.ialltoall(sendbuf, recvbuf)

    def ialltoallv(self, sendbuf: np.ndarray, send_layout: tuple[list[int], list[int]],
                   recvbuf: np.ndarray, recv_layout: tuple[list[int], list[int]]) -> EngineRequest:
        return self._inner.ialltoallv(sendbuf, send_layout, recvbuf, recv_layout)

    def gather(self, sendbuf: np.ndarray, recvbuf: np.ndarray | None, root: int) -> None:
        self._inner.gather(sendbuf, recvbuf, root)

    def scatter(self, sendbuf: np.ndarray | None, recvbuf: np.ndarray, root: int) -> None:
        self._inner.scatter(sendbuf, recvbuf, root)

    def allgatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int],
                   displs: list[int]) -> None:
        self._inner.allgatherv(sendbuf, recvbuf, counts, displs)

    def alltoall(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
        self._inner.alltoall(sendbuf, recvbuf)

    def alltoallv(self, sendbuf: np.ndarray, send_layout: tuple[list[int], list[int]],
                  recvbuf: np.ndarray, recv_layout: tuple[list[int], list[int]]) -> None:
        self._inner.alltoallv(sendbuf, send_layout, recvbuf, recv_layout)

    def split(self, color: int, key: int) -> CountedEngine | None:
        sub = self._inner.split(color, key)
        if sub is None:
            return None
        sub.raw.Set_name(TASK_NAME)
        return CountedEngine(sub, self._handed)

    def create_group(self, ranks: list[int], tag: int) -> CountedEngine:
        sub = self._inner.create_group(ranks, tag)
        sub.raw.Set_name(TASK_NAME)
        return CountedEngine(sub, self._handed)

    def abort(self, code: int) -> None:
        self._inner.abort(code)

    def unreceived_anywhere(self) -> bool:
        return self._inner.unreceived_anywhere()

    def drop_unreceived(self) -> int:
        return self._inner.drop_unreceived()

    def close(self) -> None:
        self._inner.close()


def harness_engine(world: Any) -> tuple[Engine, HandedCounts]:
    """The engine the harness runs on while monitoring (see the module docstring): a duplicate of a
    duplicate of ``world`` (an MpiEngine on MPI_COMM_WORLD), counting what it hands to MPI."""
    from .mpi import MpiEngine

    probe = world.raw.Dup()
    probe.Set_name(PROBE_NAME)
    harness = probe.Dup()
    harness.Set_name(HARNESS_NAME)
    handed = HandedCounts()
    engine: Engine = CountedEngine(MpiEngine(harness, list(world.world_ranks)), handed)
    return engine, handed
