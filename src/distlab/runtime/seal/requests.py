"""The learner process's requests: a pending Isend, Irecv or nonblocking collective of the
sealed ``comm`` (client.py), as mpi4py's ``MPI.Request``, with Wait, Test and the many-request
forms (Waitall, Waitany, Testall). The agent holds the real request under ``handle``; a receive's
or collective's buffer stays here and is filled from the reply of the call that completes it.
Wait, Waitall and Waitany take a ``timeout=`` as the proxy's do (a Waitall in rounds shares one
deadline; one that gives up has completed the rounds before it).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..comm.errors import timeout_seconds
from ..comm.requests import _fill_status
from ..engines.base import UNDEFINED
from .calls import Call
from .wire import MAX_BUFFERS, MAX_INTS

if TYPE_CHECKING:
    from .client import SealedComm


class SealedRequest:
    """A pending Isend, Irecv or Iallreduce, as mpi4py's ``MPI.Request``; the agent holds the
    real one under ``handle``."""

    def __init__(self, comm: SealedComm, handle: int, buffer: np.ndarray | None) -> None:
        self._comm = comm
        self._handle = handle
        self._buffer = buffer  # filled when the request completes
        self._status: tuple[int, int, int] | None = None

    def Wait(self, status: Any = None, timeout: Any = None) -> None:  # noqa: N802
        if self._status is None:
            reply = self._comm._call(Call.WAIT, (self._handle,), outputs=self._outputs(),
                                     timeout=timeout)
            self._status = (reply.ints[0], reply.ints[1], reply.ints[2])
        _fill_status(status, *self._status)

    def Test(self, status: Any = None) -> bool:  # noqa: N802
        if self._status is None:
            reply = self._comm._call(Call.TEST, (self._handle,), outputs=self._outputs())
            if reply.ints[0]:
                self._status = (reply.ints[1], reply.ints[2], reply.ints[3])
        if self._status is not None:
            _fill_status(status, *self._status)
        return self._status is not None

    def wait(self, status: Any = None) -> None:
        self.Wait(status)

    def test(self, status: Any = None) -> tuple[bool, None]:
        return self.Test(status), None

    def _outputs(self) -> tuple[np.ndarray, ...]:
        return (self._buffer,) if self._buffer is not None else ()

    @staticmethod
    def Waitall(requests: Sequence[SealedRequest], statuses: Any = None,  # noqa: N802
                timeout: Any = None) -> None:
        pending = [r for r in requests if r._status is None]
        seconds = None if timeout is None else timeout_seconds(timeout, "Waitall")
        deadline = None if seconds is None else time.monotonic() + seconds
        # wire.py carries at most MAX_BUFFERS buffers and MAX_INTS ints a call: more requests
        # wait in rounds.
        while pending:
            batch: list[SealedRequest] = []
            outputs: list[np.ndarray] = []
            while (pending and len(batch) < MAX_INTS
                   and len(outputs) + len(pending[0]._outputs()) <= MAX_BUFFERS):
                request = pending.pop(0)
                batch.append(request)
                outputs.extend(request._outputs())
            comm = batch[0]._comm
            comm._call(Call.WAITALL, tuple(r._handle for r in batch), outputs=outputs,
                       timeout=seconds)
            if deadline is not None:
                # A later round waits what is left of the deadline (a moment, once it has passed).
                seconds = max(deadline - time.monotonic(), 1e-3)
            for request in batch:
                request._status = (-1, -1, 0)


    @staticmethod
    def Waitany(requests: Sequence[SealedRequest], status: Any = None,  # noqa: N802
                timeout: Any = None) -> int:
        pending = [(i, r) for i, r in enumerate(requests) if r._status is None]
        if not pending:
            return UNDEFINED
        if len(pending) > MAX_INTS or sum(len(r._outputs()) for _, r in pending) > MAX_BUFFERS:
            raise ValueError(f"Waitany takes at most {MAX_INTS} requests and {MAX_BUFFERS} "
                             "receive buffers at once under the seal")
        outputs = [buf for _, r in pending for buf in r._outputs()]
        reply = pending[0][1]._comm._call(Call.WAITANY, tuple(r._handle for _, r in pending),
                                          outputs=outputs, timeout=timeout)
        if reply.ints[0] < 0:  # the agent found none of them pending
            return UNDEFINED
        index, request = pending[reply.ints[0]]
        request._status = (reply.ints[1], reply.ints[2], reply.ints[3])
        _fill_status(status, *request._status)
        return index

    @staticmethod
    def Testall(requests: Sequence[SealedRequest], statuses: Any = None) -> bool:  # noqa: N802
        pending = [r for r in requests if r._status is None]
        if not pending:
            return True
        if len(pending) > MAX_INTS or sum(len(r._outputs()) for r in pending) > MAX_BUFFERS:
            raise ValueError(f"Testall takes at most {MAX_INTS} requests and {MAX_BUFFERS} "
                             "receive buffers at once under the seal")
        outputs = [buf for r in pending for buf in r._outputs()]
        reply = pending[0]._comm._call(Call.TESTALL, tuple(r._handle for r in pending),
                                       outputs=outputs)
        if reply.ints[0]:
            for request in pending:
                request._status = (-1, -1, 0)
        return bool(reply.ints[0])
