"""The learner process's ``comm``: mpi4py's buffer API, each call made by the rank's agent.

``SealedComm`` has the methods of the proxy (runtime/comm/proxy.py, collectives.py), the
lowercase object calls (the same ``ObjectCalls``, built on these buffer calls) and ``now``,
``compute`` and ``mark``; it holds no engine, no counters, no clock and no fault plan. A call
turns its buffers into NumPy arrays here, with the proxy's own buffer checks (so a strided view or
a wrong datatype gets the same message), sends the request through the seal, and fills the
output buffers in place from the reply. Ranks and roots are checked here too, against the size
the agent announced, because the wire's bounds would otherwise turn a learner's wrong rank into
a rejected request. Everything else (sizes, dtypes, the engine's own errors) is the proxy's work
in the agent, and comes back as the same exception type and message.

Sub-communicators (Split, Dup, Create_group) are clients too, each naming its handle in every
request; the agent holds the real ones. A ``Group`` here numbers the ranks of the communicator
it came from (the client knows no world ranks), so ``Create_group`` takes groups made from its
own communicator's ``Get_group()``; the proxy also takes a group of any communicator.

A blocking call's ``timeout=`` travels with its request (one float more: calls.py); the
communicator's own (``set_timeout``) is kept by the agent, where the calls wait, and a timed-out
call's ``distlab.CommTimeout`` or ``CommBroken`` comes back as itself.

Nonblocking calls leave their buffer with the request: an Irecv or Iallreduce is answered into the
learner's array when the Wait, Test or Waitall that completes it replies, which MPI allows (a
receive buffer is undefined until then).
"""

from __future__ import annotations

import builtins
from typing import Any, Sequence

import numpy as np

from ... import ops
from ..comm.declared import declared_amount
from ..comm.errors import (
    CommBroken,
    comm_timeout_from,
    peer_failed_from,
    timeout_seconds,
)
from ..comm.gathers import block_buffer, vector_layout
from ..comm.groups import Group, split_color
from ..comm.objects import ObjectCalls
from ..comm.requests import (
    IN_PLACE,
    LearnerAbort,
    _buffer,
    _fill_status,
    peer_rank,
)
from ..engines.base import ANY_SOURCE, ANY_TAG
from .calls import CALLS, MAX_TAG, REDUCE_OPS, Call
from .errors import CallFailed, CallRejected, SealError
from .lines import LearnerLines
from .requests import SealedRequest
from .store_client import SealedStore
from .wire import Reply

_OP_CODE = {name: code for code, name in enumerate(REDUCE_OPS)}


class TamperSuspected(SealError):
    """The agent refused a request this client built: something rewrote the client or the arena."""


class SealedComm(ObjectCalls):
    ANY_SOURCE = ANY_SOURCE
    ANY_TAG = ANY_TAG
    IN_PLACE = IN_PLACE

    def __init__(self, end: LearnerLines, rank: int, size: int, handle: int = 0) -> None:
        self._end = end
        self._rank = rank
        self._size = size
        self._handle = handle  # the agent's number for this communicator (0: the task's)
        self._freed = False

    # -- identity ---------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def Get_rank(self) -> int:  # noqa: N802
        return self._rank

    def Get_size(self) -> int:  # noqa: N802
        return self._size

    @property
    def stats(self) -> Any:
        raise AttributeError("comm.stats: under the seal the counters are kept by the rank's agent, "
                             "out of the learner process's reach (distlab run --seal off shows them)")

    # -- what problem code declares -----------------------------------------------------------

    def compute(self, seconds: float | None = None, flops: float | None = None, label: str = "") -> None:
        if (seconds is None) == (flops is None):
            raise TypeError("compute() takes seconds= or flops=, exactly one")
        per = 0 if seconds is not None else 1
        self._call(Call.COMPUTE, (per, declared_amount(seconds, flops), str(label)))

    def now(self) -> float:
        return self._call(Call.NOW).floats[0]

    def mark(self, name: str) -> None:
        self._call(Call.MARK, (str(name),))

    # -- point to point ---------------------------------------------------------------------

    def Send(self, buf: Any, dest: int, tag: int = 0, timeout: Any = None) -> None:  # noqa: N802
        self._call(Call.SEND, (self._peer(dest, "dest"), _tag(tag)), (_buffer(buf, "Send buffer"),),
                   timeout=timeout)

    def Ssend(self, buf: Any, dest: int, tag: int = 0, timeout: Any = None) -> None:  # noqa: N802
        self._call(Call.SSEND, (self._peer(dest, "dest"), _tag(tag)), (_buffer(buf, "Send buffer"),),
                   timeout=timeout)

    def Recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,  # noqa: N802
             status: Any = None, timeout: Any = None) -> None:
        array = _buffer(buf, "Recv buffer")
        reply = self._call(Call.RECV, (self._peer(source, "source", True), _tag(tag, True)),
                           outputs=(array,), timeout=timeout)
        _fill_status(status, reply.ints[0], reply.ints[1], reply.ints[2])

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> SealedRequest:  # noqa: N802
        array = _buffer(buf, "Isend buffer")
        reply = self._call(Call.ISEND, (self._peer(dest, "dest"), _tag(tag)), (array,))
        return SealedRequest(self, reply.ints[0], None)

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> SealedRequest:  # noqa: N802
        array = _buffer(buf, "Irecv buffer")
        reply = self._call(Call.IRECV, (self._peer(source, "source", True), _tag(tag, True)),
                           outputs=(array,))
        return SealedRequest(self, reply.ints[0], array)

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,  # noqa: N802
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status: Any = None,
                 timeout: Any = None) -> None:
        if recvbuf is None:
            raise TypeError("Sendrecv needs a recvbuf (the buffer API has no pickled variant here)")
        send, recv = _buffer(sendbuf, "Sendrecv sendbuf"), _buffer(recvbuf, "Sendrecv recvbuf")
        args = (self._peer(dest, "dest"), _tag(sendtag), self._peer(source, "source", True),
                _tag(recvtag, True))
        reply = self._call(Call.SENDRECV, args, (send,), (recv,), timeout=timeout)
        _fill_status(status, reply.ints[0], reply.ints[1], reply.ints[2])

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Any = None,  # noqa: N802
              timeout: Any = None) -> None:
        reply = self._call(Call.PROBE, (self._peer(source, "source", True), _tag(tag, True)),
                           timeout=timeout)
        _fill_status(status, reply.ints[0], reply.ints[1], reply.ints[2])

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Any = None) -> bool:  # noqa: N802
        reply = self._call(Call.IPROBE, (self._peer(source, "source", True), _tag(tag, True)))
        if reply.ints[0]:
            _fill_status(status, reply.ints[1], reply.ints[2], reply.ints[3])
        return bool(reply.ints[0])

    # -- collectives ------------------------------------------------------------------------

    def Barrier(self, timeout: Any = None) -> None:  # noqa: N802
        self._call(Call.BARRIER, timeout=timeout)

    def Bcast(self, buf: Any, root: int = 0, timeout: Any = None) -> None:  # noqa: N802
        array, root = self._bcast_buffer(buf, root, "Bcast buffer"), self._peer(root, "root")
        self._call(Call.BCAST, (root,), (array,) if self._rank == root else (), (array,),
                   timeout=timeout)

    def _bcast_buffer(self, buf: Any, root: int, what: str) -> np.ndarray:
        """The root only sends from its buffer, which may be read-only (MPI's is; the lowercase
        bcast's pickle is): it crosses as a writable copy, one place in and out."""
        array = _buffer(buf, what)
        if root == self._rank and not array.flags.writeable:
            return array.copy()
        return array

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM, root: int = 0,  # noqa: N802
               timeout: Any = None) -> None:
        root = self._peer(root, "root")
        send = _buffer(recvbuf if _in_place(sendbuf) else sendbuf, "Reduce sendbuf")
        outputs = (_buffer(recvbuf, "Reduce recvbuf"),) if recvbuf is not None else ()
        self._call(Call.REDUCE, (_op(op), root), (send,), outputs, timeout=timeout)

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM,  # noqa: N802
                  timeout: Any = None) -> None:
        send, recv = self._pair(sendbuf, recvbuf, "Allreduce")
        self._call(Call.ALLREDUCE, (_op(op),), (send,), (recv,), timeout=timeout)

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM) -> SealedRequest:  # noqa: N802
        send, recv = self._pair(sendbuf, recvbuf, "Iallreduce")
        reply = self._call(Call.IALLREDUCE, (_op(op),), (send,), (recv,))
        return SealedRequest(self, reply.ints[0], recv)

    def Ibcast(self, buf: Any, root: int = 0) -> SealedRequest:  # noqa: N802
        array, root = self._bcast_buffer(buf, root, "Ibcast buffer"), self._peer(root, "root")
        reply = self._call(Call.IBCAST, (root,), (array,) if self._rank == root else (), (array,))
        return SealedRequest(self, reply.ints[0], array)

    def Iallgather(self, sendbuf: Any, recvbuf: Any) -> SealedRequest:  # noqa: N802
        send, recv = _buffer(sendbuf, "Iallgather sendbuf"), _buffer(recvbuf, "Iallgather recvbuf")
        reply = self._call(Call.IALLGATHER, (), (send,), (recv,))
        return SealedRequest(self, reply.ints[0], recv)

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM) -> SealedRequest:  # noqa: N802
        send = _buffer(sendbuf, "Ireduce_scatter_block sendbuf")
        recv = _buffer(recvbuf, "Ireduce_scatter_block recvbuf")
        reply = self._call(Call.IREDUCE_SCATTER_BLOCK, (_op(op),), (send,), (recv,))
        return SealedRequest(self, reply.ints[0], recv)

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any,  # noqa: N802
                       recvcounts: Sequence[int] | None = None, op: Any = ops.SUM,
                       timeout: Any = None) -> None:
        send = _buffer(sendbuf, "Reduce_scatter sendbuf")
        recv = _buffer(recvbuf, "Reduce_scatter recvbuf")
        counts = tuple(int(c) for c in recvcounts) if recvcounts is not None else ()
        self._call(Call.REDUCE_SCATTER, (_op(op), *counts), (send,), (recv,), timeout=timeout)

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = ops.SUM,  # noqa: N802
                             timeout: Any = None) -> None:
        send = _buffer(sendbuf, "Reduce_scatter sendbuf")
        recv = _buffer(recvbuf, "Reduce_scatter_block recvbuf")
        self._call(Call.REDUCE_SCATTER_BLOCK, (_op(op),), (send,), (recv,), timeout=timeout)

    def Allgather(self, sendbuf: Any, recvbuf: Any, timeout: Any = None) -> None:  # noqa: N802
        send = _buffer(sendbuf, "Allgather sendbuf")
        self._call(Call.ALLGATHER, (), (send,), (_buffer(recvbuf, "Allgather recvbuf"),),
                   timeout=timeout)

    def Gather(self, sendbuf: Any, recvbuf: Any = None, root: int = 0,  # noqa: N802
               timeout: Any = None) -> None:
        root, send = self._peer(root, "root"), block_buffer(sendbuf, "Gather sendbuf")
        outputs = (_buffer(recvbuf, "Gather recvbuf"),) if self._rank == root else ()
        self._call(Call.GATHER, (root,), (send,), outputs, timeout=timeout)

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0,  # noqa: N802
                timeout: Any = None) -> None:
        root, recv = self._peer(root, "root"), block_buffer(recvbuf, "Scatter recvbuf")
        inputs = (_buffer(sendbuf, "Scatter sendbuf"),) if self._rank == root else ()
        self._call(Call.SCATTER, (root,), inputs, (recv,), timeout=timeout)

    def Allgatherv(self, sendbuf: Any, recvbuf: Any, timeout: Any = None) -> None:  # noqa: N802
        recv, counts, displs = vector_layout(recvbuf, "Allgatherv recvbuf", self._size)
        layout = np.array(counts + displs, dtype=np.int64)
        send = block_buffer(sendbuf, "Allgatherv sendbuf")
        self._call(Call.ALLGATHERV, (), (send, layout, recv), (recv,), timeout=timeout)

    def Alltoall(self, sendbuf: Any, recvbuf: Any, timeout: Any = None) -> None:  # noqa: N802
        send = block_buffer(sendbuf, "Alltoall sendbuf")
        self._call(Call.ALLTOALL, (), (send,), (_buffer(recvbuf, "Alltoall recvbuf"),),
                   timeout=timeout)

    def Alltoallv(self, sendbuf: Any, recvbuf: Any, timeout: Any = None) -> None:  # noqa: N802
        send, send_counts, send_at = vector_layout(sendbuf, "Alltoallv sendbuf", self._size)
        recv, recv_counts, recv_at = vector_layout(recvbuf, "Alltoallv recvbuf", self._size)
        layout = np.array(send_counts + send_at + recv_counts + recv_at, dtype=np.int64)
        self._call(Call.ALLTOALLV, (), (send, layout, recv), (recv,), timeout=timeout)

    def Abort(self, errorcode: int = 1) -> None:  # noqa: N802
        raise LearnerAbort(int(errorcode))

    # -- timeouts (runtime/comm/timed.py; the agent keeps the communicator's) ----------------

    def set_timeout(self, seconds: Any) -> None:
        if seconds is None:
            self._call(Call.TIMEOUT, (2, 0.0))
        else:
            self._call(Call.TIMEOUT, (1, timeout_seconds(seconds, "set_timeout")))

    def get_timeout(self) -> float | None:
        reply = self._call(Call.TIMEOUT, (0, 0.0))
        return reply.floats[0] if reply.ints[0] else None

    def store(self) -> SealedStore:
        """The task's key-value store, through the agent (runtime/seal/store_client.py)."""
        return SealedStore(self)

    # -- communicators (runtime/comm/groups.py) ---------------------------------------------

    def Split(self, color: Any = 0, key: Any = 0) -> SealedComm | None:  # noqa: N802
        color, key = split_color(color), int(key)
        if not -(2**31) <= key < 2**31:
            raise ValueError(f"Split: key {key} is outside the int32 range MPI takes")
        return self._made(self._call(Call.SPLIT, (color, key)))

    def Dup(self) -> SealedComm:  # noqa: N802
        dup = self.Split(0, self._rank)
        assert dup is not None
        return dup

    def Get_group(self) -> Group:  # noqa: N802
        return Group(range(self._size), self._rank, origin=self._handle)

    def Create_group(self, group: Group, tag: int = 0) -> SealedComm:  # noqa: N802
        if not isinstance(group, Group):
            raise TypeError(f"Create_group takes a Group (comm.Get_group().Incl(...)), not {group!r}")
        if group.origin != self._handle:
            raise ValueError("Create_group: the group was made from another communicator's "
                             "Get_group(); make it from this communicator's")
        # Membership is the agent's to check: it words it as the proxy does (with the world rank).
        made = self._made(self._call(Call.CREATE_GROUP, (_tag(tag),),
                                     (np.array(group.world, dtype=np.int64),)))
        assert made is not None
        return made

    def Free(self) -> None:  # noqa: N802
        self._call(Call.FREE)
        self._freed = True

    # -- survivors (runtime/comm/survivors.py) ----------------------------------------------

    def Revoke(self) -> None:  # noqa: N802
        self._call(Call.REVOKE)

    def Is_revoked(self) -> bool:  # noqa: N802
        return bool(self._call(Call.IS_REVOKED).ints[0])

    def Agree(self, flag: int) -> int:  # noqa: N802
        return int(self._call(Call.AGREE, (int(flag),)).ints[0])

    def Get_failed(self) -> Group:  # noqa: N802
        """The failed ranks, as a group of this communicator's ranks (as ``Get_group``'s)."""
        return Group(self._call(Call.GET_FAILED).ints, self._rank, origin=self._handle)

    def Ack_failed(self) -> int:  # noqa: N802
        return int(self._call(Call.ACK_FAILED).ints[0])

    def Shrink(self) -> SealedComm:  # noqa: N802
        made = self._made(self._call(Call.SHRINK))
        assert made is not None
        return made

    def Admit(self) -> SealedComm:  # noqa: N802
        """This communicator's ranks and the ranks waiting to join (comm/survivors.py); itself
        when no one waits."""
        return self._made(self._call(Call.ADMIT)) or self

    def _made(self, reply: Reply) -> SealedComm | None:
        handle, rank, size = reply.ints
        return SealedComm(self._end, rank, size, handle) if handle >= 0 else None

    # -- the crossing -----------------------------------------------------------------------

    def _pair(self, sendbuf: Any, recvbuf: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
        """The send and receive arrays; IN_PLACE is the receive array twice (one arena place)."""
        recv = _buffer(recvbuf, f"{what} recvbuf")
        return (recv if _in_place(sendbuf) else _buffer(sendbuf, f"{what} sendbuf")), recv

    def _peer(self, peer: Any, what: str, wildcard: bool = False) -> int:
        return peer_rank(peer, what, self._size, wildcard)

    def _call(self, op: int, args: Sequence[Any] = (), inputs: Sequence[np.ndarray] = (),
              outputs: Sequence[np.ndarray] = (), timeout: Any = None) -> Reply:
        if self._freed:
            raise ValueError(f"this communicator ({self._size} ranks) was freed with Free(); "
                             "make a new one to go on")
        if timeout is not None:  # the call's own timeout: one float after its arguments
            args = (*args, timeout_seconds(timeout, _TIMEOUT_NAMES.get(op, CALLS[op].name)))
        try:
            return self._end.call(op, args, inputs, outputs, comm=self._handle)
        except CallFailed as failed:
            raise _as_raised(failed) from None
        except CallRejected as rejected:
            raise TamperSuspected(f"the rank's agent refused a request: {rejected}") from None


def _in_place(buf: Any) -> bool:
    if buf is IN_PLACE:
        return True
    if type(buf).__module__.startswith("mpi4py"):
        from mpi4py import MPI

        return buf is MPI.IN_PLACE
    return False


def _op(op: Any) -> int:
    return _OP_CODE[ops.resolve(op).name]


def _tag(tag: Any, wildcard: bool = False) -> int:
    value = int(tag)
    if wildcard and value == ANY_TAG:
        return value
    if not 0 <= value <= MAX_TAG:
        raise ValueError(f"tag {value} is outside 0..{MAX_TAG}")
    return value


_NAMED_ERRORS: dict[str, type[BaseException]] = {}


# Where the proxy names a timeout by another call than the wire's (Reduce_scatter_block is a
# Reduce_scatter there), the client says what the proxy would.
_TIMEOUT_NAMES: dict[int, str] = {Call.REDUCE_SCATTER_BLOCK: "Reduce_scatter"}


def _as_raised(failed: CallFailed) -> BaseException:
    # distlab's own, for learner code that catches them by name
    if failed.kind == "CommTimeout":
        return comm_timeout_from(failed.message)
    if failed.kind == "CommBroken":
        return CommBroken(failed.message)
    if failed.kind == "PeerFailed":
        return peer_failed_from(failed.message)
    return _named(failed)


def _named(failed: CallFailed) -> BaseException:
    """The exception the call raised in the agent, as the learner's code would have seen it: the
    built-in type of that name, or a RuntimeError subclass of that name (an engine's own error),
    so that "RuntimeError: Connection reset by peer" reads the same sealed or not."""
    kind = getattr(builtins, failed.kind, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        return kind(failed.message)
    named = _NAMED_ERRORS.get(failed.kind)
    if named is None:
        named = _NAMED_ERRORS[failed.kind] = type(failed.kind, (RuntimeError,), {})
    return named(failed.message)
