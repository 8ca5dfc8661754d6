"""The built-in collectives of the learner's ``comm`` (the baselines problems compare with):
Barrier, Bcast, Reduce, Allreduce, Iallreduce, Reduce_scatter(_block), Allgather, and Abort. Each
is counted, marked in the slot as a wait on every peer, moved on the online clock and traced as
one "coll" event, which the replay expands into its standard algorithm.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, Sequence, cast

import numpy as np

from ... import ops
from ..clock.online import Timekeeper
from ..engines.base import Engine
from ..trace.events import TraceRecorder
from .rankstate import ALL_PEERS, NullSlot, RankSlot
from .requests import IN_PLACE, LearnerAbort, Request, _buffer
from .stats import CommStats

if TYPE_CHECKING:
    from .proxy import Comm


class Collectives:
    """Mixed into ``Comm`` (proxy.py), whose constructor sets these attributes."""

    _engine: Engine
    _slot: RankSlot | NullSlot
    stats: CommStats
    _clock: Timekeeper | None
    _trace: TraceRecorder | None
    _world_ranks: list[int]
    _ctx: int
    _unsettled: deque[Request]
    _icoll_free_at: float
    _coll_started: tuple[str, int, int, float]

    @property
    def size(self) -> int:
        return self._engine.size

    def _peer(self, peer: Any, what: str, wildcard: bool = False) -> int:
        raise NotImplementedError

    def _check_hung(self) -> None:
        raise NotImplementedError

    def _collective(self, op: str, nbytes: int, root: int = -1) -> None:
        self._check_hung()
        self.stats.count_call(op, nbytes)
        self._slot.blocked(op, (ALL_PEERS,), nbytes, self._ctx)
        self._coll_started = (op, nbytes, root, time.perf_counter())

    def _collective_done(self) -> None:
        self._slot.running()
        op, nbytes, root, wall0 = self._coll_started
        if self._clock is not None:
            # Earlier nonblocking collectives first: every rank settles them in the same order.
            while self._unsettled:
                self._settle(self._unsettled[0])
            self._clock.collective(op, nbytes)
        if self._trace is not None:
            group = tuple(self._world_ranks)
            self._trace.collective(op, group, nbytes, root, wall0, time.perf_counter())

    def Barrier(self) -> None:  # noqa: N802
        self._collective("Barrier", 0)
        self._engine.barrier()
        self._collective_done()

    def Bcast(self, buf: Any, root: int = 0) -> None:  # noqa: N802
        array = _buffer(buf, "Bcast buffer")
        root = self._peer(root, "root")
        self._collective("Bcast", array.nbytes, root)
        self._engine.bcast(array, root)
        self._collective_done()

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM, root: int = 0) -> None:  # noqa: N802
        root = self._peer(root, "root")
        if sendbuf is IN_PLACE or _is_mpi_in_place(sendbuf):
            sendbuf = recvbuf
        send_array = _buffer(sendbuf, "Reduce sendbuf")
        recv_array = (
            _buffer(recvbuf, "Reduce recvbuf") if recvbuf is not None else np.empty_like(send_array)
        )
        self._collective("Reduce", send_array.nbytes, root)
        self._engine.reduce(_distinct_or_same(send_array, recv_array), recv_array, ops.resolve(op), root)
        self._collective_done()

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM) -> None:  # noqa: N802
        if sendbuf is IN_PLACE or _is_mpi_in_place(sendbuf):
            sendbuf = recvbuf
        send_array = _buffer(sendbuf, "Allreduce sendbuf")
        recv_array = _buffer(recvbuf, "Allreduce recvbuf")
        _same_size(send_array, recv_array, "Allreduce")
        self._collective("Allreduce", send_array.nbytes)
        self._engine.allreduce(_distinct_or_same(send_array, recv_array), recv_array, ops.resolve(op))
        self._collective_done()

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM) -> Request:  # noqa: N802
        """Nonblocking Allreduce: starts it and returns a Request; recvbuf holds the result once
        the request has completed (Wait, Test, Waitall). Counted as an "Allreduce" in stats."""
        if sendbuf is IN_PLACE or _is_mpi_in_place(sendbuf):
            sendbuf = recvbuf
        send_array = _buffer(sendbuf, "Iallreduce sendbuf")
        recv_array = _buffer(recvbuf, "Iallreduce recvbuf")
        _same_size(send_array, recv_array, "Iallreduce")
        self._check_hung()
        nbytes = send_array.nbytes
        # Counted under the collective's own name, so stats.collectives_used() and per-op counts
        # see it; blocking or not shows in the trace ("coll" versus "icoll").
        self.stats.count_call("Allreduce", nbytes)
        wall0 = time.perf_counter()
        inner = self._engine.iallreduce(
            _distinct_or_same(send_array, recv_array), recv_array, ops.resolve(op)
        )
        req = 0
        if self._trace is not None:
            group = tuple(self._world_ranks)
            req = self._trace.icollective("Allreduce", group, nbytes, -1, wall0, time.perf_counter())
        handle = Request(cast("Comm", self), inner, -1, -1, nbytes, False, req, collective="Allreduce")
        if self._clock is not None:
            handle._posted_at = self._clock.now
            self._unsettled.append(handle)
        return handle

    def _settle(self, request: Request) -> None:
        """Places nonblocking collectives on the online clock, in the order they were posted, up
        to ``request``; sets each one's ``arrival`` (its end).

        A collective starts when its last member has posted it, and not before the previous one
        has ended (they share the group's links), then takes what the blocking one takes. The
        start is agreed on with the blocking collective's clock exchange (``Timekeeper.collective``
        from a clock set to the post time), so every rank must settle the same collectives in the
        same order: they do, in post order, at a Wait or Test that completes one, or before the
        next blocking collective."""
        clock = self._clock
        assert clock is not None
        while not request._settled and self._unsettled:
            first = self._unsettled.popleft()
            now = clock.now
            clock.now = max(first._posted_at, self._icoll_free_at)
            clock.collective(first._collective or "Allreduce", first._nbytes)
            first.arrival = self._icoll_free_at = clock.now
            clock.now = now
            first._settled = True

    def Reduce_scatter(  # noqa: N802
        self, sendbuf: Any, recvbuf: Any, recvcounts: Sequence[int] | None = None, op: Any = ops.SUM
    ) -> None:
        send_array = _buffer(sendbuf, "Reduce_scatter sendbuf")
        recv_array = _buffer(recvbuf, "Reduce_scatter recvbuf")
        if recvcounts is None:
            recvcounts = [recv_array.size] * self.size
        counts = [int(c) for c in recvcounts]
        if len(counts) != self.size or sum(counts) != send_array.size:
            raise ValueError(
                f"Reduce_scatter: recvcounts {counts} must have {self.size} entries summing to "
                f"the send size {send_array.size}"
            )
        self._collective("Reduce_scatter", send_array.nbytes)
        self._engine.reduce_scatter(send_array, recv_array, counts, ops.resolve(op))
        self._collective_done()

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM) -> None:  # noqa: N802
        recv_array = _buffer(recvbuf, "Reduce_scatter_block recvbuf")
        self.Reduce_scatter(sendbuf, recvbuf, [recv_array.size] * self.size, op)

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        send_array = _buffer(sendbuf, "Allgather sendbuf")
        recv_array = _buffer(recvbuf, "Allgather recvbuf")
        if recv_array.size != send_array.size * self.size:
            raise ValueError(
                f"Allgather: recvbuf has {recv_array.size} elements, needs "
                f"{self.size} x {send_array.size}"
            )
        self._collective("Allgather", send_array.nbytes)
        self._engine.allgather(send_array, recv_array)
        self._collective_done()

    def Abort(self, errorcode: int = 1) -> None:  # noqa: N802
        raise LearnerAbort(int(errorcode))


def _is_mpi_in_place(buf: Any) -> bool:
    if type(buf).__module__.startswith("mpi4py"):
        from mpi4py import MPI

        return buf is MPI.IN_PLACE
    return False


def _distinct_or_same(send_array: np.ndarray, recv_array: np.ndarray) -> np.ndarray:
    """The send array to hand the engine: ``recv_array`` itself for an in-place call (the
    engine then reduces in place), a copy when the two merely overlap, else the array."""
    if send_array is recv_array:
        return recv_array
    if np.may_share_memory(send_array, recv_array):
        if (send_array.__array_interface__["data"][0] == recv_array.__array_interface__["data"][0]
                and send_array.nbytes == recv_array.nbytes):
            return recv_array
        return send_array.copy()
    return send_array


def _same_size(a: np.ndarray, b: np.ndarray, what: str) -> None:
    if a.size != b.size or a.dtype != b.dtype:
        raise ValueError(
            f"{what}: sendbuf ({a.size} x {a.dtype}) and recvbuf ({b.size} x {b.dtype}) differ"
        )
