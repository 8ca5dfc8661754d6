"""What the proxy's calls hand back and take: ``Request`` (as mpi4py's ``MPI.Request``, with Wait,
Test and Waitall), ``Status``, ``IN_PLACE``, and the check every buffer goes through. A request
reports its completion to its communicator (the counters, the slot, the online clock, the trace).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ...ops import as_numpy
from ..engines.base import (
    ANY_SOURCE,
    ANY_TAG,
    UNDEFINED,
    EngineRequest,
    arrived_bytes,
    finished_by,
)
from .mpi4py_objects import datatype_name, datatype_size, is_mpi_datatype
from .rankstate import ALL_PEERS

if TYPE_CHECKING:
    from .proxy import Comm


class _InPlace:
    def __repr__(self) -> str:
        return "IN_PLACE"


IN_PLACE: Any = _InPlace()


class LearnerAbort(BaseException):
    """Raised by ``comm.Abort``; the worker reports it and ends every rank."""

    def __init__(self, code: int) -> None:
        super().__init__(f"the solution called comm.Abort({code})")
        self.code = code


class Status:
    """What a receive matched, as mpi4py's ``MPI.Status``."""

    def __init__(self) -> None:
        self.source = ANY_SOURCE
        self.tag = ANY_TAG
        # The matched message's bytes: what arrived (MPI's count), or on gloo, which does not say,
        # the receive buffer's size; a probe's message.
        self.nbytes = 0

    def Get_source(self) -> int:  # noqa: N802
        return self.source

    def Get_tag(self) -> int:  # noqa: N802
        return self.tag

    def Get_count(self, datatype: Any = None) -> int:  # noqa: N802
        """The message's elements of ``datatype`` (an mpi4py datatype such as MPI.DOUBLE, or a
        NumPy dtype); its bytes without one, as mpi4py's default (MPI.BYTE)."""
        return self.nbytes if datatype is None else self.nbytes // datatype_size(datatype)

    @property
    def count(self) -> int:
        """mpi4py's property: ``Get_count()``, in bytes."""
        return self.nbytes

    Get_elements = Get_count  # noqa: N815 - mpi4py's name; the same for a predefined datatype


def _fill_status(status: Any, source: int, tag: int, nbytes: int) -> None:
    """Fills the learner's status (distlab's or mpi4py's) with the matched message: its source,
    tag and bytes (``Get_count(MPI.DOUBLE)`` divides them; mpi4py's default datatype is bytes)."""
    if status is None:
        return
    if isinstance(status, Status):
        status.source, status.tag, status.nbytes = source, tag, nbytes
        return
    # An mpi4py MPI.Status passed by learner code (unsealed: MPI is initialized in this process).
    from mpi4py import MPI

    status.Set_source(source)
    status.Set_tag(tag)
    # Its Get_count(datatype) reads the bytes over the datatype's size (it read 0 before).
    status.Set_elements(MPI.BYTE, nbytes)


def peer_rank(peer: Any, what: str, size: int, wildcard: bool = False) -> int:
    """``peer`` as an int, once it is known to be a rank of a communicator of ``size`` ranks (or
    ANY_SOURCE where ``wildcard``); the proxy's and the sealed client's one rule."""
    if wildcard and peer == ANY_SOURCE:
        return ANY_SOURCE
    if not isinstance(peer, (int, np.integer)) or not 0 <= peer < size:
        raise ValueError(f"{what}={peer!r} is not a rank of this communicator (ranks 0..{size - 1})")
    return int(peer)


def _buffer(buf: Any, what: str) -> np.ndarray:
    if type(buf) is np.ndarray and buf.flags.c_contiguous:
        return buf  # the common case, answered first: this runs on every call
    if isinstance(buf, (list, tuple)) and buf:
        return _buffer_spec(buf, what)
    try:
        array = as_numpy(buf)
    except TypeError as exc:
        raise TypeError(f"{what}: {exc}") from None
    if not array.flags.c_contiguous:
        raise TypeError(
            f"{what}: the buffer is a strided view; pass a contiguous array "
            "(slice along the first axis, or use np.ascontiguousarray)"
        )
    return array


def _buffer_spec(spec: list[Any] | tuple[Any, ...], what: str) -> np.ndarray:
    """mpi4py's buffer specifications: ``[buf, MPI.DOUBLE]`` and ``[buf, count, MPI.DOUBLE]``.
    The datatype must have the array's item size (MPI would reinterpret the bytes; a mismatch is
    a bug in learner code), and a count takes the first ``count`` elements."""
    if len(spec) not in (2, 3) or isinstance(spec[0], (list, tuple)):
        raise TypeError(f"{what}: a buffer specification is [buf, datatype] or [buf, count, datatype]")
    array = _buffer(spec[0], what)
    datatype = spec[-1]
    if is_mpi_datatype(datatype) and datatype_size(datatype) != array.itemsize:
        raise TypeError(f"{what}: the array holds {array.dtype} ({array.itemsize} bytes each) but the "
                        f"datatype is {datatype_name(datatype)} ({datatype_size(datatype)} bytes)")
    if len(spec) == 3:
        count = int(spec[1])
        if not 0 <= count <= array.size:
            raise ValueError(f"{what}: count {count} is outside the buffer's {array.size} elements")
        array = array.reshape(-1)[:count]
    return array


class _Completed:
    """The engine request of a send that a fault dropped: done at once, nothing on the wire."""

    def wait(self) -> tuple[int, int]:
        return -1, -1

    def test(self) -> bool:
        return True

    def cancel(self) -> bool:
        return False


class Request:
    """A pending Isend, Irecv or Iallreduce, as mpi4py's ``MPI.Request``."""

    def __init__(
        self,
        comm: Comm,
        inner: EngineRequest,
        peer: int,
        tag: int,
        nbytes: int,
        is_recv: bool,
        trace_id: int,
        collective: str | None = None,
        buffers: Any = None,
        deliver: tuple[tuple[np.ndarray, np.ndarray], ...] = (),
    ) -> None:
        self._comm = comm
        self._inner = inner
        self._peer = peer
        self._tag = tag
        self._nbytes = nbytes
        self._is_recv = is_recv
        self._trace_id = trace_id
        self._completed = False
        self._matched = (-1, -1)
        self._received = nbytes  # a receive's: what arrived, once it completed
        # For a nonblocking collective: its op ("Allreduce"), and the virtual time it was posted.
        self._collective = collective
        self._posted_at = 0.0
        self._settled = False  # the online clock has placed it (see Comm._settle)
        self.arrival = 0.0  # virtual time at which it completes (set on completion for a receive)
        # The arrays the engine works on until completion, held here: a learner's temporary
        # (comm.Ireduce_scatter_block(np.ones(n), out)) must not be freed under MPI's feet.
        self._buffers = buffers
        self._deliver = deliver  # (result, the caller's array): copied at completion (Comm._nonblocking)
        comm._outstanding.add(self)

    def kind(self) -> str:
        if self._collective is not None:
            return "I" + self._collective.lower()
        return "Irecv" if self._is_recv else "Isend"

    def _peers(self) -> tuple[int, ...]:
        """What the slot shows a rank blocked on this request as waiting for."""
        if self._collective is not None:
            return (ALL_PEERS,)  # a collective waits for every rank of its group
        return (self._comm._world(self._peer),)

    def _peer_named(self) -> Any:
        """Whom a timed-out wait on this request waited on, as CommTimeout names it."""
        return tuple(range(self._comm.size)) if self._collective is not None else self._peer

    def Wait(self, status: Any = None, timeout: Any = None) -> None:  # noqa: N802
        """Blocks until the request completes; with a ``timeout`` (or the communicator's:
        comm.set_timeout), raises distlab.CommTimeout after it, the request still pending."""
        if not self._completed:
            comm = self._comm
            limit = comm._timeout_s if timeout is None else comm._limit(timeout, "Wait")
            comm._slot.blocked("Wait", self._peers(), self._nbytes, comm._ctx)
            wall0 = time.perf_counter()
            if limit is not None and not finished_by(self._inner, comm._deadline(limit, wall0)):
                raise comm._timed_out("Wait", self._peer_named(), limit, wall0,
                                      "the request did not complete")
            source, tag = self._inner.wait()
            comm._slot.running()
            self._finish(source, tag)
            comm._record_wait((self,), wall0)
            comm._advance((self,))
        _fill_status(status, *self._matched, self._received)

    def Test(self, status: Any = None) -> bool:  # noqa: N802
        if not self._completed and self._inner.test():
            wall0 = time.perf_counter()
            source, tag = self._inner.wait()
            self._finish(source, tag)
            self._comm._record_wait((self,), wall0)
            self._comm._advance((self,))
        if self._completed:
            _fill_status(status, *self._matched, self._received)
        return self._completed

    # mpi4py's lowercase forms, which course code uses on buffer requests too: wait() returns
    # None (the data is in the buffer), test() the pair (completed, None).
    def wait(self, status: Any = None) -> None:
        self.Wait(status)

    def test(self, status: Any = None) -> tuple[bool, None]:
        return self.Test(status), None

    def _finish(self, source: int, tag: int) -> None:
        self._completed = True
        for result, into in self._deliver:
            into[...] = result
        self._deliver = ()
        self._buffers = None
        self._comm._outstanding.discard(self)
        if self._collective is not None:
            if self._comm._clock is not None:
                self._comm._settle(self)
            return
        if self._is_recv:
            self._matched = (source, tag)
            self._received = arrived_bytes(self._inner, self._nbytes)
            self._comm._count_arrived(self._comm._world(source), self._received)
            if self._comm._clock is not None:
                self.arrival = self._comm._clock.receive_stamp(source, tag)

    @staticmethod
    def Waitall(requests: Sequence["Request"], statuses: Any = None,  # noqa: N802
                timeout: Any = None) -> None:
        """Completes every request; with a ``timeout``, raises distlab.CommTimeout if they have
        not all completed by then, completing none of them."""
        if requests and not isinstance(requests[0], Request):
            # Learner code calls distlab.Request.Waitall; sealed, its requests are the client's
            # (runtime/seal/client.py), which wait through the agent.
            return type(requests[0]).Waitall(requests, statuses,  # type: ignore[no-any-return]
                                             timeout=timeout)
        pending = [r for r in requests if not r._completed]
        if not pending:
            return
        comm = pending[0]._comm
        peers: tuple[int, ...]
        if any(r._collective is not None for r in pending):
            # Blocked on a collective, it waits for every rank of the group (as a lone Wait does).
            op, peers = "Wait", (ALL_PEERS,)
        else:
            op, peers = "Waitall", tuple(comm._world(r._peer) for r in pending)
        limit = comm._timeout_s if timeout is None else comm._limit(timeout, "Waitall")
        comm._slot.blocked(op, peers, sum(r._nbytes for r in pending), comm._ctx)
        wall0 = time.perf_counter()
        if limit is not None:
            every = _Every([r._inner for r in pending])
            if not finished_by(every, comm._deadline(limit, wall0)):
                raise comm._timed_out("Waitall", _peers_of(pending), limit, wall0,
                                      f"{every.left} of its {len(pending)} requests did not complete")
        for request in pending:
            source, tag = request._inner.wait()
            request._finish(source, tag)
        comm._slot.running()
        comm._record_wait(tuple(pending), wall0)
        comm._advance(pending)

    @staticmethod
    def Waitany(requests: Sequence["Request"], status: Any = None,  # noqa: N802
                timeout: Any = None) -> int:
        """Waits until one of the requests completes and returns its index (mpi4py's
        ``MPI.UNDEFINED`` when none is pending); a completed one is never returned twice. With
        a ``timeout``, raises distlab.CommTimeout if none has completed by then."""
        if requests and not isinstance(requests[0], Request):
            return type(requests[0]).Waitany(requests, status,  # type: ignore[no-any-return]
                                             timeout=timeout)
        pending = [(i, r) for i, r in enumerate(requests) if not r._completed]
        if not pending:
            return UNDEFINED
        comm = pending[0][1]._comm
        peers = tuple(dict.fromkeys(p for _, r in pending for p in r._peers()))
        limit = comm._limit(timeout, "Waitany")
        comm._slot.blocked("Waitany", peers, sum(r._nbytes for _, r in pending), comm._ctx)
        wall0 = time.perf_counter()
        # Engines have no wait-for-any: poll (finished_by backs off to 1 ms).
        anyone = _Any([r._inner for _, r in pending])
        deadline = comm._deadline(limit, wall0) if limit is not None else float("inf")
        if not finished_by(anyone, deadline):
            assert limit is not None
            raise comm._timed_out("Waitany", _peers_of([r for _, r in pending]), limit, wall0,
                                  f"none of its {len(pending)} requests completed")
        index, request = pending[anyone.first]
        source, tag = request._inner.wait()
        request._finish(source, tag)
        comm._slot.running()
        comm._record_wait((request,), wall0)
        comm._advance((request,))
        _fill_status(status, *request._matched, request._received)
        return index

    @staticmethod
    def Testall(requests: Sequence["Request"], statuses: Any = None) -> bool:  # noqa: N802
        """True, with every request completed, once all of them have; else False, and none is
        completed by this call (as MPI_Testall)."""
        if requests and not isinstance(requests[0], Request):
            return type(requests[0]).Testall(requests, statuses)  # type: ignore[no-any-return]
        pending = [r for r in requests if not r._completed]
        if not all(r._inner.test() for r in pending):
            return False
        if pending:
            Request.Waitall(pending)  # each one is done: this returns at once
        return True


def _peers_of(requests: list[Request]) -> Any:
    """Whom requests that timed out waited on: a rank, or a tuple of ranks when several."""
    named = [r._peer_named() for r in requests]
    peers = tuple(dict.fromkeys(p for n in named for p in (n if isinstance(n, tuple) else (n,))))
    return peers[0] if len(peers) == 1 else peers


class _Every:
    """Several engine requests as one, done when all are (for a Waitall with a timeout)."""

    def __init__(self, requests: list[EngineRequest]) -> None:
        self._requests = requests
        self.left = len(requests)

    def test(self) -> bool:
        self.left = sum(1 for r in self._requests if not r.test())
        return self.left == 0


class _Any:
    """Several engine requests as one, done when one is: ``first`` is its index."""

    def __init__(self, requests: list[EngineRequest]) -> None:
        self._requests = requests
        self.first = -1

    def test(self) -> bool:
        self.first = next((i for i, r in enumerate(self._requests) if r.test()), -1)
        return self.first >= 0
