"""The agent's side of a sealed task: each request of the learner process made on the real proxy.

``Service.run_task`` hands the learner process one task (its index and pickled arguments), then
serves its calls on the rank's proxy ``Comm`` (runtime/comm/proxy.py), which counts, clocks,
faults, traces and watches them exactly as when learner code called it directly, until the
learner hands back its result. The agent's arrays are its own: inputs are copies out of the
arena, outputs are allocated here (or are the input itself when the learner laid both in one
place, which is how an in-place call crosses) and copied back with the reply.

Each request names the communicator it is made on: 0 is the task's, and each Split, Dup or
Create_group the learner makes is numbered here (``_comms``), per task.

A request that fails validation, or names a communicator the learner does not hold, is answered
with a rejection by the seal and remembered here as ``tampered``: the learner's own client never
sends one. Requests the proxy raises on are answered
with the exception, for the learner's code to see as it would have. A blocking call that carries
its own timeout (one float more than its signature's: calls.py) runs within
``comm.call_timeout``, so it gives up exactly as the learner's ``timeout=`` would unsealed.
"""

from __future__ import annotations

import itertools
from typing import Callable

import numpy as np

from ... import ops
from ..comm.proxy import Comm
from ..comm.requests import Request as ProxyRequest
from ..comm.requests import Status
from ..engines.base import UNDEFINED
from .agent import AgentEnd, Rejected, Request
from .calls import CALLS, REDUCE_OPS, Call
from .errors import LearnerGone, SealError
from .lines import Switch
from .store_service import store_handlers

VALUE, FAILURE = 0, 1  # the kinds of a RESULT (calls.py)
# The harness's own calls, made on the first line only (lines.py).
TASK_PROTOCOL = frozenset((Call.NEXT_TASK, Call.TASK_ARGS, Call.RESULT, Call.BEFORE_SOLUTION))


class TaskResult:
    def __init__(self, kind: int, data: bytes) -> None:
        self.kind = kind
        self.data = data


class Service:
    def __init__(self, agent: AgentEnd) -> None:
        self._first = agent
        # Handlers answer on the line their request came on (lines.py): the first, or a further
        # one that a learner thread's call took. The tables below are shared by every line, as
        # the proxy's are by the threads that call it unsealed: numbers come from counters,
        # whose next() is one step under the GIL.
        self._agent = Switch(agent)
        self.tampered: list[str] = []  # why each rejected request was rejected
        self._comm: Comm | None = None
        self._comms: dict[int, Comm] = {}
        self._comm_numbers = itertools.count(1)
        self._handles: dict[int, tuple[ProxyRequest, np.ndarray | None]] = {}
        self._handle_numbers = itertools.count(1)
        self._parts: list[bytes] = []
        # Reads the learner's memory, where the job asks (Task.memory): set by the rank.
        self.read_before_solution: Callable[[], None] | None = None
        self._read_once = False
        self._dispatch: dict[int, Callable[[Comm, Request], None]] = {
            Call.SEND: self._send, Call.SSEND: self._send,
            Call.RECV: self._recv, Call.ISEND: self._isend, Call.IRECV: self._irecv,
            Call.SENDRECV: self._sendrecv, Call.WAIT: self._wait, Call.TEST: self._test,
            Call.WAITALL: self._waitall, Call.BARRIER: self._barrier, Call.BCAST: self._bcast,
            Call.REDUCE: self._reduce, Call.ALLREDUCE: self._allreduce,
            Call.IALLREDUCE: self._iallreduce, Call.REDUCE_SCATTER: self._reduce_scatter,
            Call.REDUCE_SCATTER_BLOCK: self._reduce_scatter_block,
            Call.ALLGATHER: self._allgather, Call.COMPUTE: self._compute, Call.MARK: self._mark,
            Call.NOW: self._now, Call.SPLIT: self._split, Call.CREATE_GROUP: self._create_group,
            Call.FREE: self._free, Call.GATHER: self._gather, Call.SCATTER: self._scatter,
            Call.ALLGATHERV: self._allgatherv, Call.ALLTOALL: self._alltoall,
            Call.WAITANY: self._waitany, Call.TESTALL: self._testall, Call.IBCAST: self._ibcast,
            Call.IALLGATHER: self._iallgather, Call.IREDUCE_SCATTER_BLOCK: self._ireduce_scatter_block,
            Call.ALLTOALLV: self._alltoallv, Call.PROBE: self._probe, Call.IPROBE: self._iprobe,
            Call.TIMEOUT: self._timeout, Call.REVOKE: self._revoke,
            Call.IS_REVOKED: self._is_revoked, Call.AGREE: self._agree,
            Call.GET_FAILED: self._get_failed, Call.ACK_FAILED: self._ack_failed,
            Call.SHRINK: self._shrink, Call.ADMIT: self._admit,
            **store_handlers(self._agent),
        }

    def run_task(self, comm: Comm | None, index: int, args: bytes) -> TaskResult | None:
        """Serves the learner process until it hands back the result of task ``index`` (or of
        its start-up, when it failed before asking for a task). With ``index`` -1 it tells the
        learner that the batch is done, and returns None."""
        self._comm, self._handles, self._parts = comm, {}, []
        self._comms, self._comm_numbers = ({0: comm} if comm is not None else {}), itertools.count(1)
        self._handle_numbers = itertools.count(1)
        agent = self._first
        while True:
            request = agent.serve()
            if isinstance(request, Rejected):
                self.tampered.append(request.reason)
                continue
            assert request is not None  # serve() without a timeout
            if request.op == Call.NEXT_TASK:
                rank, size = (comm.rank, comm.size) if comm is not None else (0, 0)
                agent.reply(request, ints=(index, len(args), rank, size))
                if index < 0:
                    return None
            elif request.op == Call.TASK_ARGS:
                part = request.outputs[0]
                start = request.ints[0]
                chunk = np.frombuffer(args[start:start + part.nbytes], dtype=np.uint8)
                agent.reply(request, ints=(chunk.size,), outputs=(chunk,))
            elif request.op == Call.BEFORE_SOLUTION:
                self._before_solution(request)
            elif request.op == Call.RESULT:
                self._parts.append(request.inputs[0].tobytes())
                agent.reply(request)
                if request.ints[1]:
                    return TaskResult(request.ints[0], b"".join(self._parts))
            else:
                self._serve_call_of(agent, request)

    def serve_line(self, end: AgentEnd) -> None:
        """Serves a further line (lines.py) until the learner closes it or dies (the first
        line's watcher says how it ended): calls of the task's communicators only."""
        self._agent.serving(end)
        try:
            while True:
                request = end.serve()
                if isinstance(request, Rejected):
                    self.tampered.append(request.reason)
                elif request is None:
                    continue
                elif request.op in TASK_PROTOCOL:
                    self.tampered.append(end.reject(request, f"{request.name} on a thread's line").reason)
                else:
                    self._serve_call_of(end, request)
        except SealError as exc:  # gone (told by the first line), or flooding this one
            if not isinstance(exc, LearnerGone):
                self.tampered.append(str(exc))

    def _serve_call_of(self, end: AgentEnd, request: Request) -> None:
        """A call of the learner's code, on ``end``'s line: made on the communicator it names,
        while a task runs; one on a communicator it does not hold is tampering."""
        if self._comm is None:
            end.fail(request, RuntimeError(f"{request.name} outside a task"))
        elif request.comm not in self._comms:
            reason = f"{request.name} on communicator {request.comm}, which it does not hold"
            self.tampered.append(end.reject(request, reason).reason)
        else:
            self._serve_call(self._comms[request.comm], request)

    def _before_solution(self, request: Request) -> None:
        """Has the learner's memory read while it waits (its harness code sent this before it
        imports the learner's file, so nothing of the learner's has run): once; again, or where
        the job reads no memory, is tampering."""
        if self.read_before_solution is None or self._read_once:
            self.tampered.append(self._agent.reject(request, "a memory reading its harness never asks for").reason)
            return
        self._read_once = True
        self.read_before_solution()
        self._agent.reply(request)

    def _serve_call(self, comm: Comm, request: Request) -> None:
        try:
            if len(request.floats) > CALLS[request.op].floats:  # its own timeout (wire.py checked)
                with comm.call_timeout(request.floats[-1]):
                    self._dispatch[request.op](comm, request)
            else:
                self._dispatch[request.op](comm, request)
        except Exception as exc:  # the call's own error: the learner's code sees it raised
            self._agent.fail(request, exc)

    def _revoke(self, comm: Comm, request: Request) -> None:
        comm.Revoke()
        self._agent.reply(request)

    def _is_revoked(self, comm: Comm, request: Request) -> None:
        self._agent.reply(request, ints=(int(comm.Is_revoked()),))

    def _agree(self, comm: Comm, request: Request) -> None:
        self._agent.reply(request, ints=(comm.Agree(request.ints[0]),))

    def _get_failed(self, comm: Comm, request: Request) -> None:
        # As ranks of the communicator: the learner's groups number those (client.py).
        here = {w: r for r, w in enumerate(comm._world_ranks)}
        self._agent.reply(request, ints=tuple(here[w] for w in comm.Get_failed().world))

    def _ack_failed(self, comm: Comm, request: Request) -> None:
        self._agent.reply(request, ints=(comm.Ack_failed(),))

    def _shrink(self, comm: Comm, request: Request) -> None:
        self._agent.reply(request, ints=self._hold(comm.Shrink()))

    def _admit(self, comm: Comm, request: Request) -> None:
        grown = comm.Admit()
        self._agent.reply(request, ints=(-1, -1, 0) if grown is comm else self._hold(grown))

    def _timeout(self, comm: Comm, request: Request) -> None:
        action = request.ints[0]
        if action:
            comm.set_timeout(request.floats[0] if action == 1 else None)
        now = comm.get_timeout()
        self._agent.reply(request, ints=(int(now is not None),), floats=(now or 0.0,))

    # -- one handler per op: the proxy's call with the agent's arrays --------------------------

    def _outputs(self, request: Request) -> list[np.ndarray]:
        """An array per output place: the input laid at the same place (an in-place call), or a
        new one of the place's dtype and shape."""
        if not request.inputs:  # most calls: nothing to share
            return [np.empty(p.shape, p.dtype) for p in request.outputs]
        same = {p: a for p, a in zip(request.input_places, request.inputs) if p.nbytes}
        return [same[p] if p in same else np.empty(p.shape, p.dtype) for p in request.outputs]

    def _send(self, comm: Comm, request: Request) -> None:
        dest, tag = request.ints
        (comm.Ssend if request.op == Call.SSEND else comm.Send)(request.inputs[0], dest, tag)
        self._agent.reply(request)

    def _recv(self, comm: Comm, request: Request) -> None:
        (buf,), status = self._outputs(request), Status()
        comm.Recv(buf, request.ints[0], request.ints[1], status)
        self._agent.reply(request, ints=(status.source, status.tag, status.nbytes), outputs=(buf,))

    def _sendrecv(self, comm: Comm, request: Request) -> None:
        dest, sendtag, source, recvtag = request.ints
        (buf,), status = self._outputs(request), Status()
        comm.Sendrecv(request.inputs[0], dest, sendtag, buf, source, recvtag, status)
        self._agent.reply(request, ints=(status.source, status.tag, status.nbytes), outputs=(buf,))

    def _probe(self, comm: Comm, request: Request) -> None:
        status = Status()
        comm.Probe(request.ints[0], request.ints[1], status)
        self._agent.reply(request, ints=(status.source, status.tag, status.nbytes))

    def _iprobe(self, comm: Comm, request: Request) -> None:
        status = Status()
        found = comm.Iprobe(request.ints[0], request.ints[1], status)
        self._agent.reply(request, ints=(int(found), status.source, status.tag,
                                         status.nbytes if found else 0))

    def _keep(self, handle: ProxyRequest, buffer: np.ndarray | None) -> int:
        number = next(self._handle_numbers)
        self._handles[number] = (handle, buffer)
        return number

    def _isend(self, comm: Comm, request: Request) -> None:
        handle = comm.Isend(request.inputs[0], request.ints[0], request.ints[1])
        self._agent.reply(request, ints=(self._keep(handle, None),))

    def _irecv(self, comm: Comm, request: Request) -> None:
        (buf,) = self._outputs(request)
        handle = comm.Irecv(buf, request.ints[0], request.ints[1])
        self._agent.reply(request, ints=(self._keep(handle, buf),))

    def _iallreduce(self, comm: Comm, request: Request) -> None:
        send, (recv,) = request.inputs[0], self._outputs(request)
        handle = comm.Iallreduce(send, recv, _op(request))
        self._agent.reply(request, ints=(self._keep(handle, recv),))

    def _ibcast(self, comm: Comm, request: Request) -> None:
        (buf,) = self._outputs(request)
        handle = comm.Ibcast(buf, request.ints[0])
        self._agent.reply(request, ints=(self._keep(handle, buf),))

    def _iallgather(self, comm: Comm, request: Request) -> None:
        (recv,) = self._outputs(request)
        handle = comm.Iallgather(request.inputs[0], recv)
        self._agent.reply(request, ints=(self._keep(handle, recv),))

    def _ireduce_scatter_block(self, comm: Comm, request: Request) -> None:
        (recv,) = self._outputs(request)
        handle = comm.Ireduce_scatter_block(request.inputs[0], recv, _op(request))
        self._agent.reply(request, ints=(self._keep(handle, recv),))

    def _request(self, number: int) -> tuple[ProxyRequest, np.ndarray | None]:
        if number not in self._handles:
            raise ValueError(f"request {number} is not pending (already completed, or never made)")
        return self._handles[number]

    def _wait(self, comm: Comm, request: Request) -> None:
        handle, buf = self._request(request.ints[0])
        status = Status()
        handle.Wait(status)
        del self._handles[request.ints[0]]
        self._agent.reply(request, ints=(status.source, status.tag, status.nbytes),
                          outputs=(buf,) if buf is not None and request.outputs else ())

    def _test(self, comm: Comm, request: Request) -> None:
        handle, buf = self._request(request.ints[0])
        status = Status()
        done = handle.Test(status)
        if done:
            del self._handles[request.ints[0]]
        out = (buf,) if done and buf is not None and request.outputs else ()
        self._agent.reply(request, ints=(int(done), status.source, status.tag, status.nbytes),
                          outputs=out)

    def _waitall(self, comm: Comm, request: Request) -> None:
        pairs = [self._request(number) for number in request.ints]
        ProxyRequest.Waitall([handle for handle, _ in pairs])
        for number in request.ints:
            self._handles.pop(number, None)
        self._agent.reply(request, outputs=[buf for _, buf in pairs if buf is not None])

    def _waitany(self, comm: Comm, request: Request) -> None:
        pairs = [self._request(number) for number in request.ints]
        status = Status()
        index = ProxyRequest.Waitany([handle for handle, _ in pairs], status)
        if index == UNDEFINED:  # every one had completed already: nothing to wait for
            self._agent.reply(request, ints=(-1, -1, -1, 0))
            return
        done = pairs[index][1]
        del self._handles[request.ints[index]]
        # Only the completed request's buffer is written: the others' places stay untouched.
        outputs = [buf if buf is done else None for _, buf in pairs if buf is not None]
        self._agent.reply(request, ints=(index, status.source, status.tag, status.nbytes),
                          outputs=outputs)

    def _testall(self, comm: Comm, request: Request) -> None:
        pairs = [self._request(number) for number in request.ints]
        done = ProxyRequest.Testall([handle for handle, _ in pairs])
        if done:
            for number in request.ints:
                self._handles.pop(number, None)
        outputs = [buf for _, buf in pairs if buf is not None] if done else []
        self._agent.reply(request, ints=(int(done),), outputs=outputs)

    def _barrier(self, comm: Comm, request: Request) -> None:
        comm.Barrier()
        self._agent.reply(request)

    def _bcast(self, comm: Comm, request: Request) -> None:
        (buf,) = self._outputs(request)
        comm.Bcast(buf, request.ints[0])
        self._agent.reply(request, outputs=(buf,))

    def _reduce(self, comm: Comm, request: Request) -> None:
        outputs = self._outputs(request)
        recv = outputs[0] if outputs else None
        comm.Reduce(request.inputs[0], recv, _op(request), request.ints[1])
        self._agent.reply(request, outputs=outputs)

    def _allreduce(self, comm: Comm, request: Request) -> None:
        (recv,) = self._outputs(request)
        comm.Allreduce(request.inputs[0], recv, _op(request))
        self._agent.reply(request, outputs=(recv,))

    def _reduce_scatter(self, comm: Comm, request: Request) -> None:
        (recv,) = self._outputs(request)
        counts = list(request.ints[1:]) or None
        comm.Reduce_scatter(request.inputs[0], recv, counts, _op(request))
        self._agent.reply(request, outputs=(recv,))

    def _reduce_scatter_block(self, comm: Comm, request: Request) -> None:
        (recv,) = self._outputs(request)
        comm.Reduce_scatter_block(request.inputs[0], recv, _op(request))
        self._agent.reply(request, outputs=(recv,))

    def _allgather(self, comm: Comm, request: Request) -> None:
        (recv,) = self._outputs(request)
        comm.Allgather(request.inputs[0], recv)
        self._agent.reply(request, outputs=(recv,))

    def _gather(self, comm: Comm, request: Request) -> None:
        outputs = self._outputs(request)
        comm.Gather(request.inputs[0], outputs[0] if outputs else None, request.ints[0])
        self._agent.reply(request, outputs=outputs)

    def _scatter(self, comm: Comm, request: Request) -> None:
        (recv,) = self._outputs(request)
        comm.Scatter(request.inputs[0] if request.inputs else None, recv, request.ints[0])
        self._agent.reply(request, outputs=(recv,))

    def _allgatherv(self, comm: Comm, request: Request) -> None:
        (recv,) = self._outputs(request)
        counts, displs = _layout(request, comm.size, 2)
        comm.Allgatherv(request.inputs[0], [recv.reshape(-1), (counts, displs)])
        self._agent.reply(request, outputs=(recv,))

    def _alltoallv(self, comm: Comm, request: Request) -> None:
        (recv,) = self._outputs(request)
        send_counts, send_at, recv_counts, recv_at = _layout(request, comm.size, 4)
        comm.Alltoallv([request.inputs[0].reshape(-1), (send_counts, send_at)],
                       [recv.reshape(-1), (recv_counts, recv_at)])
        self._agent.reply(request, outputs=(recv,))

    def _alltoall(self, comm: Comm, request: Request) -> None:
        (recv,) = self._outputs(request)
        comm.Alltoall(request.inputs[0], recv)
        self._agent.reply(request, outputs=(recv,))

    def _compute(self, comm: Comm, request: Request) -> None:
        amount = request.floats[0]
        if request.ints[0] == 0:
            comm.compute(seconds=amount, label=request.text)
        else:
            comm.compute(flops=amount, label=request.text)
        self._agent.reply(request)

    def _mark(self, comm: Comm, request: Request) -> None:
        comm.mark(request.text)
        self._agent.reply(request)

    def _now(self, comm: Comm, request: Request) -> None:
        self._agent.reply(request, floats=(comm.now(),))

    # -- communicators ----------------------------------------------------------------------

    def _hold(self, sub: Comm | None) -> tuple[int, int, int]:
        """(handle, rank, size) of a new communicator, numbered for the learner; -1 for none."""
        if sub is None:
            return (-1, -1, 0)
        number = next(self._comm_numbers)
        self._comms[number] = sub
        return (number, sub.rank, sub.size)

    def _split(self, comm: Comm, request: Request) -> None:
        color, key = request.ints
        self._agent.reply(request, ints=self._hold(comm.Split(color, key)))

    def _create_group(self, comm: Comm, request: Request) -> None:
        ranks = request.inputs[0]
        if ranks.dtype != np.int64 or ranks.ndim != 1:
            raise TypeError(f"Create_group: the group's ranks come as one row of int64, not "
                            f"{ranks.dtype} of shape {ranks.shape}")
        group = comm.Get_group().Incl([int(r) for r in ranks])
        self._agent.reply(request, ints=self._hold(comm.Create_group(group, request.ints[0])))

    def _free(self, comm: Comm, request: Request) -> None:
        comm.Free()
        for number in [n for n, c in list(self._comms.items()) if c is comm]:
            self._comms.pop(number, None)  # in place: another line may be adding one
        self._agent.reply(request)


def _op(request: Request) -> ops.Op:
    return ops.BY_NAME[REDUCE_OPS[request.ints[0]]]


def _layout(request: Request, p: int, rows: int) -> list[list[int]]:
    """The ``rows`` lists of p ints (counts, displacements) a v-call sends as its second input."""
    layout = request.inputs[1]
    if layout.dtype != np.int64 or layout.shape != (rows * p,):
        raise TypeError(f"{request.name}: the layout comes as {rows * p} int64, not "
                        f"{layout.dtype} of shape {layout.shape}")
    return [layout[k * p : (k + 1) * p].tolist() for k in range(rows)]
