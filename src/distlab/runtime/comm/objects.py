"""mpi4py's lowercase calls on Python objects, as course code writes them: ``send``/``recv``,
``isend``/``irecv``, ``sendrecv``, ``barrier``, ``bcast``, ``gather``, ``allgather``, ``scatter``,
``reduce`` and ``allreduce``.

Each is made of the buffer calls of the proxy, so it is counted, watched, clocked, faulted and
traced as they are, and the object itself travels as its pickle (protocol 5), unpickled only by
the rank that receives it. How each is carried, and what that costs against mpi4py's own:

* ``send(obj)`` is two messages on the same channel: the pickle's length (8 bytes), then the
  pickle. mpi4py sends one message and the receiver probes for its size; gloo has no probe, so
  the length goes first. The counters therefore show two messages per object, and the virtual
  clock charges one latency more than mpi4py pays.
* The collectives exchange the lengths first (an ``Allgather`` or a ``Bcast`` of int64), then
  the pickles: ``bcast`` as a ``Bcast``; ``gather``, ``allgather`` and ``allreduce`` as an
  ``Allgather`` of the pickles padded to the longest; ``scatter`` as a ``Bcast`` of every piece
  (each rank keeps its own); ``reduce`` and ``allreduce`` combine the gathered objects in rank
  order, as ``op(a, b)`` on Python objects does in mpi4py (``+``, ``*``, the larger, the smaller;
  arrays element-wise).
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any, Callable, cast

import numpy as np

from ... import ops
from ..engines.base import ANY_SOURCE, ANY_TAG
from .requests import Request, Status

if TYPE_CHECKING:
    from .proxy import Comm


def _pickled(obj: Any) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=5), dtype=np.uint8)


def _combine(op: Any) -> Callable[[Any, Any], Any]:
    """``op`` applied to two Python objects (or arrays), as mpi4py's ``MPI.SUM(a, b)`` does."""
    ours = ops.resolve(op)

    def combine(a: Any, b: Any) -> Any:
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return ours.ufunc(a, b)
        if ours is ops.SUM:
            return a + b
        if ours is ops.PROD:
            return a * b
        if ours is ops.MAX:
            return b if b > a else a
        return b if b < a else a

    return combine


class ObjectRequest:
    """What ``isend`` and ``irecv`` return: ``wait()`` gives the received object (None for a
    send), ``test()`` gives (done, object); ``Wait``/``Test`` as mpi4py's capitalised aliases."""

    def __init__(self, comm: Comm, first: Request, then: Request | None = None,
                 length: np.ndarray | None = None) -> None:
        # A send: ``first`` sends the length, ``then`` the pickle. A receive: ``first`` receives
        # the length into ``length``; the pickle is received once it has arrived.
        self._comm, self._first, self._then, self._length = comm, first, then, length
        self._done, self._value = False, None

    def _finish_receive(self, length: np.ndarray) -> Any:
        # Once the length has arrived, its pickle is the next message of the same source and tag.
        status = Status()
        self._first.Wait(status)
        payload = np.empty(int(length[0]), dtype=np.uint8)
        self._comm.Recv(payload, source=status.source, tag=status.tag)
        return pickle.loads(payload.tobytes())

    def wait(self, status: Any = None) -> Any:
        if not self._done:
            if self._length is not None:
                self._value = self._finish_receive(self._length)
            else:
                self._first.Wait()
                assert self._then is not None
                self._then.Wait()
            self._done = True
        return self._value

    def test(self, status: Any = None) -> tuple[bool, Any]:
        if not self._done and self._first.Test() and (self._then is None or self._then.Test()):
            self.wait()
        return self._done, self._value

    Wait = wait
    Test = test


class ObjectCalls:
    """Mixed into ``Comm`` (proxy.py): the lowercase calls, built on its buffer calls."""

    @property
    def _comm(self) -> Comm:
        return cast("Comm", self)

    def barrier(self) -> None:
        self._comm.Barrier()

    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        payload = _pickled(obj)
        self._comm.Send(np.array([payload.size], dtype=np.int64), dest, tag)
        self._comm.Send(payload, dest, tag)

    def isend(self, obj: Any, dest: int, tag: int = 0) -> ObjectRequest:
        payload = _pickled(obj)
        first = self._comm.Isend(np.array([payload.size], dtype=np.int64), dest, tag)
        return ObjectRequest(self._comm, first, self._comm.Isend(payload, dest, tag))

    def recv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Any = None) -> Any:
        length, matched = np.zeros(1, dtype=np.int64), Status()
        self._comm.Recv(length, source, tag, matched)
        payload = np.empty(int(length[0]), dtype=np.uint8)
        self._comm.Recv(payload, matched.source, matched.tag, status)
        return pickle.loads(payload.tobytes())

    def irecv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> ObjectRequest:
        length = np.zeros(1, dtype=np.int64)
        return ObjectRequest(self._comm, self._comm.Irecv(length, source, tag), length=length)

    def sendrecv(self, sendobj: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status: Any = None) -> Any:
        outgoing = self.isend(sendobj, dest, sendtag)  # posted first: both sides may send first
        received = self.recv(None, source, recvtag, status)
        outgoing.wait()
        return received

    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        payload = _pickled(obj) if self._comm.Get_rank() == root else np.empty(0, dtype=np.uint8)
        length = np.array([payload.size], dtype=np.int64)
        self._comm.Bcast(length, root)
        if self._comm.Get_rank() != root:
            payload = np.empty(int(length[0]), dtype=np.uint8)
        self._comm.Bcast(payload, root)
        return pickle.loads(payload.tobytes())

    def allgather(self, sendobj: Any) -> list[Any]:
        payload, p = _pickled(sendobj), self._comm.Get_size()
        lengths = np.empty(p, dtype=np.int64)
        self._comm.Allgather(np.array([payload.size], dtype=np.int64), lengths)
        longest = int(lengths.max())
        padded = np.zeros(longest, dtype=np.uint8)
        padded[: payload.size] = payload
        table = np.empty(p * longest, dtype=np.uint8)
        self._comm.Allgather(padded, table)
        return [pickle.loads(table[r * longest: r * longest + int(n)].tobytes())
                for r, n in enumerate(lengths)]

    def gather(self, sendobj: Any, root: int = 0) -> list[Any] | None:
        gathered = self.allgather(sendobj)
        return gathered if self._comm.Get_rank() == root else None

    def scatter(self, sendobj: Any = None, root: int = 0) -> Any:
        if self._comm.Get_rank() == root:
            if sendobj is None or len(sendobj) != self._comm.Get_size():
                raise ValueError(f"scatter on the root needs a sequence of {self._comm.Get_size()} objects, "
                                 f"one per rank; got {type(sendobj).__name__}")
            pieces = list(sendobj)
        return self.bcast(pieces if self._comm.Get_rank() == root else None, root)[self._comm.Get_rank()]

    def allreduce(self, sendobj: Any, op: Any = ops.SUM) -> Any:
        combine, gathered = _combine(op), self.allgather(sendobj)
        result = gathered[0]
        for other in gathered[1:]:
            result = combine(result, other)
        return result

    def reduce(self, sendobj: Any, op: Any = ops.SUM, root: int = 0) -> Any:
        result = self.allreduce(sendobj, op)
        return result if self._comm.Get_rank() == root else None
