"""The built-in collectives of the learner's ``comm`` (the baselines problems compare with):
Barrier, Bcast, Reduce, Allreduce, Reduce_scatter(_block), Allgather, the nonblocking Iallreduce,
Ibcast, Iallgather and Ireduce_scatter_block, and Abort. Each
is counted, marked in the slot as a wait on every peer, moved on the online clock and traced as
one "coll" event, which the replay expands into its standard algorithm. A blocking collective
with a timeout (``timeout=``, ``comm.set_timeout``: timed.py) runs its nonblocking form to the
deadline, and one that gives up stays under way, traced as an "icoll" never waited on.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

import numpy as np

from ... import ops
from ..clock.online import ExchangeTimedOut, Timekeeper
from ..engines.base import Engine, EngineRequest
from ..trace.events import TraceRecorder
from .rankstate import ALL_PEERS, NullSlot, RankSlot
from .requests import IN_PLACE, LearnerAbort, Request, _buffer
from .sent import COLLECTIVE
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
    _coll_started: tuple[str, int, int, float, tuple[int, ...] | None]
    _coll_limit: float | None  # the timeout of the collective under way, None: none
    _size: int
    _broken: str | None
    _book: Any  # groups.py's RankBook

    @property
    def size(self) -> int:
        return self._engine.size

    def _peer(self, peer: Any, what: str, wildcard: bool = False) -> int:
        raise NotImplementedError

    def _check_hung(self) -> None:
        raise NotImplementedError

    def _check_broken(self) -> None:
        raise NotImplementedError

    def _clock_by(self, deadline: float, op: str, largest: int) -> None:
        raise NotImplementedError

    def _limit(self, timeout: Any, call: str) -> float | None:
        raise NotImplementedError

    def _timed_collective(self, limit: float, start: Callable[[], EngineRequest],
                          buffers: Any) -> None:
        raise NotImplementedError

    def _collective(self, op: str, nbytes: int, root: int = -1,
                    per_peer: tuple[int, ...] | None = None, timeout: Any = None,
                    sent: np.ndarray | None = None) -> None:
        """Counts and watches a collective about to start. ``per_peer`` (Alltoallv): the bytes
        sent to each group rank, which its trace event carries instead of the total, and whose
        largest the online clock charges; ``timeout``: the call's own (timed.py); ``sent``: what
        this rank contributes, for a task that logs it (sent.py), read before the engine runs."""
        self._check_broken()
        self._coll_limit = self._limit(timeout, op)
        self._check_hung()
        self.stats.count_call(op, nbytes)
        if sent is not None and self._book.sent is not None:
            self._log_contribution(op, root, sent)
        self._slot.blocked(op, (ALL_PEERS,), nbytes, self._ctx)
        self._coll_started = (op, nbytes, root, time.perf_counter(), per_peer)

    def _log_contribution(self, op: str, root: int, sent: np.ndarray) -> None:
        """What this rank hands the others (sent.py): nothing on a communicator of one rank, nor
        the root's own share of a rooted reduction or gather, which stays where it is."""
        if self._size == 1 or (op in ("Gather", "Reduce") and root == self._engine.rank):
            return
        self._book.sent.add(op, COLLECTIVE, sent, len(self._book.marked), tuple(self._world_ranks))

    def _complete(self, run: Callable[[], None], start: Callable[[], EngineRequest],
                  buffers: Any) -> None:
        """Runs the collective ``_collective`` started: ``run()``, the engine's blocking call,
        or, with a timeout, ``start()``, its nonblocking form on ``buffers``, to the deadline."""
        if self._coll_limit is None:
            run()
            self._collective_done()
        else:
            self._timed_collective(self._coll_limit, start, buffers)

    def _collective_done(self, deadline: float | None = None) -> None:
        self._slot.running()
        op, nbytes, root, wall0, per_peer = self._coll_started
        if self._clock is not None:
            largest = max(per_peer, default=0) if per_peer is not None else nbytes
            if deadline is None:
                # Earlier nonblocking collectives first: every rank settles them in the same order.
                while self._unsettled:
                    self._settle(self._unsettled[0])
                self._clock.collective(op, largest)
            else:
                self._clock_by(deadline, op, largest)  # timed.py
        if self._trace is not None:
            group = tuple(self._world_ranks)
            recorded = per_peer if per_peer is not None else nbytes
            self._trace.collective(op, group, recorded, root, wall0, time.perf_counter())

    def Barrier(self, timeout: Any = None) -> None:  # noqa: N802
        self._collective("Barrier", 0, timeout=timeout)
        self._complete(self._engine.barrier, self._engine.ibarrier, None)

    def Bcast(self, buf: Any, root: int = 0, timeout: Any = None) -> None:  # noqa: N802
        array = _buffer(buf, "Bcast buffer")
        root = self._peer(root, "root")
        self._collective("Bcast", array.nbytes, root, timeout=timeout,
                         sent=array if self._engine.rank == root else None)
        self._complete(lambda: self._engine.bcast(array, root),
                       lambda: self._engine.ibcast(array, root), array)

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM, root: int = 0,  # noqa: N802
               timeout: Any = None) -> None:
        root = self._peer(root, "root")
        if sendbuf is IN_PLACE or _is_mpi_in_place(sendbuf):
            sendbuf = recvbuf
        send_array = _buffer(sendbuf, "Reduce sendbuf")
        recv_array = (
            _buffer(recvbuf, "Reduce recvbuf") if recvbuf is not None else np.empty_like(send_array)
        )
        self._collective("Reduce", send_array.nbytes, root, timeout=timeout, sent=send_array)
        send, reduction = _distinct_or_same(send_array, recv_array), ops.resolve(op)
        self._complete(lambda: self._engine.reduce(send, recv_array, reduction, root),
                       lambda: self._engine.ireduce(send, recv_array, reduction, root),
                       (send, recv_array))

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM,  # noqa: N802
                  timeout: Any = None) -> None:
        if sendbuf is IN_PLACE or _is_mpi_in_place(sendbuf):
            sendbuf = recvbuf
        send_array = _buffer(sendbuf, "Allreduce sendbuf")
        recv_array = _buffer(recvbuf, "Allreduce recvbuf")
        _same_size(send_array, recv_array, "Allreduce")
        self._collective("Allreduce", send_array.nbytes, timeout=timeout, sent=send_array)
        send, reduction = _distinct_or_same(send_array, recv_array), ops.resolve(op)
        self._complete(lambda: self._engine.allreduce(send, recv_array, reduction),
                       lambda: self._engine.iallreduce(send, recv_array, reduction),
                       (send, recv_array))

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM) -> Request:  # noqa: N802
        """Nonblocking Allreduce: starts it and returns a Request; recvbuf holds the result once
        the request has completed (Wait, Test, Waitall). Counted as an "Allreduce" in stats."""
        if sendbuf is IN_PLACE or _is_mpi_in_place(sendbuf):
            sendbuf = recvbuf
        send_array = _buffer(sendbuf, "Iallreduce sendbuf")
        recv_array = _buffer(recvbuf, "Iallreduce recvbuf")
        _same_size(send_array, recv_array, "Iallreduce")
        work = send_array.copy()  # reduced in place by the engine, then delivered (_nonblocking)
        return self._nonblocking("Allreduce", send_array.nbytes, -1, work,
                                 lambda: self._engine.iallreduce(work, work, ops.resolve(op)),
                                 sent=send_array, deliver=((work, recv_array),))

    def Ibcast(self, buf: Any, root: int = 0) -> Request:  # noqa: N802
        """Nonblocking Bcast; buf holds the root's data once the request has completed."""
        array = _buffer(buf, "Ibcast buffer")
        root = self._peer(root, "root")
        work = array.copy()
        return self._nonblocking("Bcast", array.nbytes, root, work,
                                 lambda: self._engine.ibcast(work, root),
                                 sent=array if self._engine.rank == root else None, deliver=((work, array),))

    def Iallgather(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        """Nonblocking Allgather."""
        send_array = _buffer(sendbuf, "Iallgather sendbuf")
        recv_array = _buffer(recvbuf, "Iallgather recvbuf")
        _gathers_into(send_array, recv_array, self.size, "Iallgather")
        block, gathered = send_array.copy(), np.empty_like(recv_array)
        return self._nonblocking("Allgather", send_array.nbytes, -1, (block, gathered),
                                 lambda: self._engine.iallgather(block, gathered),
                                 sent=send_array, deliver=((gathered, recv_array),))

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM) -> Request:  # noqa: N802
        """Nonblocking Reduce_scatter_block: rank r's recvbuf gets block r of the reduction."""
        send_array = _buffer(sendbuf, "Ireduce_scatter_block sendbuf")
        recv_array = _buffer(recvbuf, "Ireduce_scatter_block recvbuf")
        _gathers_into(recv_array, send_array, self.size, "Ireduce_scatter_block", "sendbuf")
        whole, block = send_array.copy(), np.empty_like(recv_array)
        return self._nonblocking(
            "Reduce_scatter", send_array.nbytes, -1, (whole, block),
            lambda: self._engine.ireduce_scatter_block(whole, block, ops.resolve(op)),
            sent=send_array, deliver=((block, recv_array),))

    def _nonblocking(self, op: str, nbytes: int, root: int, buffers: Any, start: Any,
                     sent: np.ndarray | None = None,
                     deliver: tuple[tuple[np.ndarray, np.ndarray], ...] = ()) -> Request:
        """Starts a nonblocking collective (``start()`` hands it to the engine, which works on
        ``buffers`` until it completes) as a Request; on completion each (result, into) pair of
        ``deliver`` is copied into the caller's array.
        Counted under the collective's own name, so stats.collectives_used() and per-op counts
        see it; blocking or not shows in the trace ("coll" versus "icoll").

        The engine works on copies, never on the caller's arrays: the inputs as they were when the
        call was posted, the result delivered when it completes. That is what a sealed rank does
        (its learner's buffers cross the seal at the post and the result at the Wait), so a program
        that writes a buffer while its collective is pending, which MPI leaves undefined, gets the
        same result sealed or not: MPI read such a buffer at the Wait (problem 06's bucket state
        never reset: its early allreduce summed the gradients written after the post unsealed,
        its stale ones sealed, and the two verdicts differed)."""
        self._check_broken()
        self._check_hung()
        self.stats.count_call(op, nbytes)
        if sent is not None and self._book.sent is not None:
            self._log_contribution(op, root, sent)
        wall0 = time.perf_counter()
        inner = start()
        req = 0
        if self._trace is not None:
            group = tuple(self._world_ranks)
            req = self._trace.icollective(op, group, nbytes, root, wall0, time.perf_counter())
        handle = Request(cast("Comm", self), inner, -1, -1, nbytes, False, req, collective=op,
                         buffers=buffers, deliver=deliver)
        if self._clock is not None:
            handle._posted_at = self._clock.now
            self._unsettled.append(handle)
        return handle

    def _settle(self, request: Request, deadline: float | None = None) -> None:
        """Places nonblocking collectives on the online clock, in the order they were posted, up
        to ``request``; sets each one's ``arrival`` (its end).

        A collective starts when its last member has posted it, and not before the previous one
        has ended (they share the group's links), then takes what the blocking one takes. The
        start is agreed on with the blocking collective's clock exchange (``Timekeeper.collective``
        from a clock set to the post time), so every rank must settle the same collectives in the
        same order: they do, in post order, at a Wait or Test that completes one, or before the
        next blocking collective. ``deadline``: that blocking collective's, if it has a timeout."""
        clock = self._clock
        assert clock is not None
        while not request._settled and self._unsettled:
            first = self._unsettled.popleft()
            now = clock.now
            clock.now = max(first._posted_at, self._icoll_free_at)
            try:
                clock.collective(first._collective or "Allreduce", first._nbytes, deadline)
            except ExchangeTimedOut:
                first.arrival, first._settled, clock.now = now, True, now
                raise
            first.arrival = self._icoll_free_at = clock.now
            clock.now = now
            first._settled = True

    def Reduce_scatter(  # noqa: N802
        self, sendbuf: Any, recvbuf: Any, recvcounts: Sequence[int] | None = None,
        op: Any = ops.SUM, timeout: Any = None,
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
        self._collective("Reduce_scatter", send_array.nbytes, timeout=timeout, sent=send_array)
        reduction = ops.resolve(op)
        self._complete(
            lambda: self._engine.reduce_scatter(send_array, recv_array, counts, reduction),
            lambda: self._engine.ireduce_scatter(send_array, recv_array, counts, reduction),
            (send_array, recv_array))

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM,  # noqa: N802
                             timeout: Any = None) -> None:
        recv_array = _buffer(recvbuf, "Reduce_scatter_block recvbuf")
        self.Reduce_scatter(sendbuf, recvbuf, [recv_array.size] * self.size, op, timeout)

    def Allgather(self, sendbuf: Any, recvbuf: Any, timeout: Any = None) -> None:  # noqa: N802
        send_array = _buffer(sendbuf, "Allgather sendbuf")
        recv_array = _buffer(recvbuf, "Allgather recvbuf")
        _gathers_into(send_array, recv_array, self.size, "Allgather")
        self._collective("Allgather", send_array.nbytes, timeout=timeout, sent=send_array)
        self._complete(lambda: self._engine.allgather(send_array, recv_array),
                       lambda: self._engine.iallgather(send_array, recv_array),
                       (send_array, recv_array))

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


def _gathers_into(block: np.ndarray, whole: np.ndarray, p: int, what: str,
                  whole_name: str = "recvbuf") -> None:
    """``whole`` (recvbuf of a gather, sendbuf of a scatter) must hold p blocks."""
    if whole.size != block.size * p:
        raise ValueError(f"{what}: {whole_name} has {whole.size} elements, needs {p} x {block.size}")
