"""The learner's ``comm``: mpi4py's buffer API over any engine, counted and watched.

Learner code calls ``comm.Send(buf, dest)``, ``comm.Sendrecv(...)``, ``comm.Allreduce(...)`` exactly
as with mpi4py. Buffers are NumPy arrays or CPU torch tensors (contiguous). Each call goes through
this proxy, which

* counts messages and bytes per operation and per peer (``CommStats``);
* records in the rank's slot what the call is blocked on, for the supervisor's wait-for graph;
* keeps the rank's online virtual clock (``clock.py``) and applies the message-level faults of
  the fault plan (delay, spike, bandwidth, drop, partition, dead, hung: ``faults_decide.py``);
* records every call as an event for the replay and the trace (``trace.py``);
* runs ``Iallreduce`` (a nonblocking collective) as a request: its Wait is where the rank waits
  for the whole group, and where the online clock settles it (see ``Comm._settle``);
* sends above the eager limit synchronously, as real MPI transports do, so that two ranks doing a
  blocking ``Send`` to each other deadlock the same way on every engine and every transport.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Sequence

import numpy as np

from .. import ops
from ..ops import as_numpy
from .engines.base import ANY_SOURCE, ANY_TAG, Engine, EngineRequest
from .rankstate import ALL_PEERS, NullSlot, RankSlot
from .stats import CommStats
from .clock import Timekeeper
from .faults_decide import MessageAction, MessageFaults
from .trace import COMPUTE, MARK, TraceRecorder

DEFAULT_EAGER_LIMIT = 64 * 1024


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
        self.count = 0

    def Get_source(self) -> int:  # noqa: N802
        return self.source

    def Get_tag(self) -> int:  # noqa: N802
        return self.tag

    def Get_count(self, datatype: Any = None) -> int:  # noqa: N802
        return self.count


def _fill_status(status: Any, source: int, tag: int, count: int) -> None:
    if status is None:
        return
    if isinstance(status, Status):
        status.source, status.tag, status.count = source, tag, count
        return
    # An mpi4py MPI.Status passed by learner code.
    status.Set_source(source)
    status.Set_tag(tag)


def _buffer(buf: Any, what: str) -> np.ndarray:
    if type(buf) is np.ndarray and buf.flags.c_contiguous:
        return buf  # the common case, answered first: this runs on every call
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


class _Completed:
    """The engine request of a send that a fault dropped: done at once, nothing on the wire."""

    def wait(self) -> tuple[int, int]:
        return -1, -1

    def test(self) -> bool:
        return True


class Request:
    """A pending Isend, Irecv or Iallreduce, as mpi4py's ``MPI.Request``."""

    def __init__(
        self,
        comm: "Comm",
        inner: EngineRequest,
        peer: int,
        tag: int,
        nbytes: int,
        is_recv: bool,
        trace_id: int,
        collective: str | None = None,
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
        # For a nonblocking collective: its op ("Allreduce"), and the virtual time it was posted.
        self._collective = collective
        self._posted_at = 0.0
        self._settled = False  # the online clock has placed it (see Comm._settle)
        self.arrival = 0.0  # virtual time at which it completes (set on completion for a receive)

    def _peers(self) -> tuple[int, ...]:
        """What the slot shows a rank blocked on this request as waiting for."""
        if self._collective is not None:
            return (ALL_PEERS,)  # a collective waits for every rank of its group
        return (self._comm._world(self._peer),)

    def Wait(self, status: Any = None) -> None:  # noqa: N802
        if not self._completed:
            comm = self._comm
            comm._slot.blocked("Wait", self._peers(), self._nbytes)
            wall0 = time.perf_counter()
            source, tag = self._inner.wait()
            comm._slot.running()
            self._finish(source, tag)
            comm._record_wait((self,), wall0)
            comm._advance((self,))
        _fill_status(status, *self._matched, self._nbytes)

    def Test(self, status: Any = None) -> bool:  # noqa: N802
        if not self._completed and self._inner.test():
            wall0 = time.perf_counter()
            source, tag = self._inner.wait()
            self._finish(source, tag)
            self._comm._record_wait((self,), wall0)
            self._comm._advance((self,))
        if self._completed:
            _fill_status(status, *self._matched, self._nbytes)
        return self._completed

    def _finish(self, source: int, tag: int) -> None:
        self._completed = True
        if self._collective is not None:
            if self._comm._clock is not None:
                self._comm._settle(self)
            return
        if self._is_recv:
            self._matched = (source, tag)
            self._comm.stats.count_recv(self._comm._world(source), self._nbytes)
            if self._comm._clock is not None:
                self.arrival = self._comm._clock.receive_stamp(source, tag)

    @staticmethod
    def Waitall(requests: Sequence["Request"], statuses: Any = None) -> None:  # noqa: N802
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
        comm._slot.blocked(op, peers, sum(r._nbytes for r in pending))
        wall0 = time.perf_counter()
        for request in pending:
            source, tag = request._inner.wait()
            request._finish(source, tag)
        comm._slot.running()
        comm._record_wait(tuple(pending), wall0)
        comm._advance(pending)


class Comm:
    """The communicator handed to learner code. Ranks are ranks of this communicator."""

    ANY_SOURCE = ANY_SOURCE
    ANY_TAG = ANY_TAG
    IN_PLACE = IN_PLACE

    def __init__(
        self,
        engine: Engine,
        slot: RankSlot | NullSlot | None = None,
        stats: CommStats | None = None,
        eager_limit: int = DEFAULT_EAGER_LIMIT,
        trace: TraceRecorder | None = None,
        ctx: int = 0,
        compute_multiplier: float = 1.0,
        device_flops: float | None = None,
        clock: Timekeeper | None = None,
        faults: MessageFaults | None = None,
        trigger_steps: frozenset[int] = frozenset(),
    ) -> None:
        self._engine = engine
        self._slot = slot if slot is not None else NullSlot()
        self.stats = stats if stats is not None else CommStats()
        self._clock = clock
        self._faults = faults
        self._trigger_steps = trigger_steps  # steps at which the supervisor kills or stops us
        self._attempts: dict[int, int] = {}  # sends per destination, lost ones included (faults)
        self._eager_limit = eager_limit
        self._trace = trace
        self._ctx = ctx
        self._compute_multiplier = compute_multiplier
        self._device_flops = device_flops
        self._steps_started = 0
        # Nonblocking collectives the online clock has not placed yet, in the order they were
        # posted, and when the last one placed ends (they queue on the group's links).
        self._unsettled: deque[Request] = deque()
        self._icoll_free_at = 0.0
        # Read on every call: kept as plain attributes rather than looked up through the engine.
        self._size = engine.size
        self._world_ranks = list(engine.world_ranks)

    # -- identity ---------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._engine.rank

    @property
    def size(self) -> int:
        return self._engine.size

    def Get_rank(self) -> int:  # noqa: N802
        return self._engine.rank

    def Get_size(self) -> int:  # noqa: N802
        return self._engine.size

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def step(self) -> int:
        """The current training step (0 before and during the first marked step)."""
        return max(self._steps_started - 1, 0)

    def _world(self, rank: int) -> int:
        return self._world_ranks[rank] if 0 <= rank < self._size else rank

    def _peer(self, peer: Any, what: str, wildcard: bool = False) -> int:
        """``peer`` as an int, once it is known to be a rank of this communicator (or ANY_SOURCE
        where ``wildcard``)."""
        if type(peer) is int and 0 <= peer < self._size:
            return peer  # the common case, answered first: this runs on every call
        if wildcard and peer == ANY_SOURCE:
            return ANY_SOURCE
        if not isinstance(peer, (int, np.integer)) or not 0 <= peer < self._size:
            raise ValueError(
                f"{what}={peer!r} is not a rank of this communicator (ranks 0..{self._size - 1})"
            )
        return int(peer)

    def _outgoing(self, dest: int, tag: int, nbytes: int) -> tuple[MessageAction | None, float]:
        """Applies the fault plan to one outgoing message; returns (action, virtual arrival)."""
        action = None
        if self._faults is not None:
            dst = self._world(dest)
            k = self._attempts.get(dst, 0)
            self._attempts[dst] = k + 1
            action = self._faults.decide(dst, nbytes, tag, k, self.step, self.now())
            if action.untouched:
                action = None
            elif action.hang:
                self._hang()
            elif action.wall_sleep_s > 0:
                self._slot.set(1, "delay")
                time.sleep(action.wall_sleep_s)
        arrival = self._clock.arrival(dest, nbytes, action) if self._clock is not None else 0.0
        return action, arrival

    def _hang(self) -> None:
        """A `hung` fault: this call never returns (the supervisor or a watchdog must act)."""
        self._slot.blocked("hung", ())
        while True:
            time.sleep(3600)

    def _check_hung(self) -> None:
        if self._faults is not None and self._faults.on_call(self.step, self.now()):
            self._hang()

    def _advance(self, requests: Sequence[Request]) -> None:
        if self._clock is not None:
            self._clock.advance_to(max(r.arrival for r in requests))

    # -- what problem code declares (not part of mpi4py's API) -------------------------------

    def compute(self, seconds: float | None = None, flops: float | None = None, label: str = "") -> None:
        """Declares work for the virtual clock: seconds, or FLOPs over this rank's device."""
        if (seconds is None) == (flops is None):
            raise TypeError("compute() takes seconds= or flops=, exactly one")
        if flops is not None:
            if not self._device_flops:
                raise ValueError("compute(flops=...) needs a platform with a device profile")
            seconds = flops / self._device_flops
        assert seconds is not None
        seconds *= self._compute_multiplier
        if self._clock is not None:
            self._clock.compute(seconds)
        if self._trace is not None:
            now = time.perf_counter()
            self._trace.add((COMPUTE, seconds, label, now, now))

    def now(self) -> float:
        """This rank's virtual time, in seconds (0 when no virtual clock runs)."""
        return self._clock.now if self._clock is not None else 0.0

    def mark(self, name: str) -> None:
        """A point in the trace, such as the start of a training step.

        ``mark("step")`` at the start of each training step also numbers the steps from 0, which
        fault plans trigger on (``at_step = 30``: when step 30 starts)."""
        if name == "step":
            self._steps_started += 1
            self._slot.set_step(self._steps_started - 1)
            if self.step in self._trigger_steps:
                # Give the supervisor's 50 ms poll time to act at exactly this step.
                time.sleep(0.15)
        if self._trace is not None:
            now = time.perf_counter()
            self._trace.add((MARK, name, now, now))

    # -- recording ---------------------------------------------------------------------------

    def _send_fault(self, dest: int, action: MessageAction | None) -> tuple[float, float, bool] | None:
        """How the replay must treat a faulted send: (extra latency, bandwidth factor, dropped)."""
        if action is None:
            return None
        if action.drop:
            return (0.0, 1.0, True)
        held = max((action.hold_until_s or 0.0) - self.now(), 0.0)
        return (action.extra_latency_s + held, self._clock_beta_factor(dest, action), False)

    def _clock_beta_factor(self, dest: int, action: MessageAction) -> float:
        """How much of the route's bandwidth a faulted message gets (1.0: all of it)."""
        if action.bandwidth_factor == 1.0 and action.bandwidth_cap_gbps is None:
            return 1.0
        if self._clock is None:
            return action.bandwidth_factor
        route_beta = self._clock.route_beta(dest)
        slowed = action.effective_beta(route_beta)
        return route_beta / slowed if slowed > 0 else 1.0

    def _record_wait(self, requests: Sequence[Request], wall0: float) -> None:
        if self._trace is None:
            return
        world = self._world_ranks
        received = [
            (r._trace_id, world[r._matched[0]], r._matched[1]) for r in requests if r._is_recv
        ]
        ids = tuple(r._trace_id for r in requests)
        self._trace.wait(self._ctx, ids, received, wall0, time.perf_counter())

    # -- point to point ---------------------------------------------------------------------
    #
    # Send, Recv and Sendrecv are the calls a learner's loop makes thousands of times, so they
    # are written for speed: every microsecond spent here, outside the transport, is a
    # microsecond the peer waits in a rendezvous. Each does its checks, marks the slot, calls the
    # engine, and then counts and records with plain attribute and dict operations. The fault
    # plan and the online clock cost nothing when they are off.

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:  # noqa: N802
        self._send(buf, dest, tag, synchronous=None)

    def Ssend(self, buf: Any, dest: int, tag: int = 0) -> None:  # noqa: N802
        self._send(buf, dest, tag, synchronous=True)

    def _send(self, buf: Any, dest: int, tag: int, synchronous: bool | None) -> None:
        array = _buffer(buf, "Send buffer")
        dest, tag = self._peer(dest, "dest"), _tag(tag)
        nbytes = array.nbytes
        if synchronous is None:
            synchronous = nbytes > self._eager_limit
        action, arrival = None, 0.0
        if self._faults is not None or self._clock is not None:
            self._check_hung()
            action, arrival = self._outgoing(dest, tag, nbytes)
        dst = self._world_ranks[dest]
        # Read before the send moves the clock: a held message waits from now.
        fault = self._send_fault(dest, action) if action is not None else None
        wall0 = time.perf_counter()
        if action is None or not action.drop:
            if self._clock is not None:
                # The stamp goes first: the receiver must never wait for it once the message is in.
                self._clock.send_stamp(dest, tag, arrival)
            self._slot.blocked_on("Send", dst, -1, nbytes)
            self._engine.send(array, dest, tag, synchronous)
            self._slot.running()
            if self._clock is not None:
                self._clock.advance_to(arrival)
        stats = self.stats
        stats.calls["Send"] += 1
        stats.op_bytes["Send"] += nbytes
        stats.sent_msgs[dst] += 1
        stats.sent_bytes[dst] += nbytes
        if self._trace is not None:
            self._trace.blocking_send(self._ctx, dst, tag, nbytes, fault, wall0, time.perf_counter())

    def Recv(  # noqa: N802
        self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Any = None
    ) -> None:
        array = _buffer(buf, "Recv buffer")
        source, tag = self._peer(source, "source", wildcard=True), _tag(tag)
        if self._faults is not None:
            self._check_hung()
        nbytes = array.nbytes
        world = self._world_ranks
        src = world[source] if source >= 0 else -1
        wall0 = time.perf_counter()
        self._slot.blocked_on("Recv", src, -1, nbytes)
        got_source, got_tag = self._engine.recv(array, source, tag)
        self._slot.running()
        got_src = world[got_source]
        stats = self.stats
        stats.calls["Recv"] += 1
        stats.op_bytes["Recv"] += nbytes
        stats.recv_msgs[got_src] += 1
        stats.recv_bytes[got_src] += nbytes
        if self._clock is not None:
            self._clock.advance_to(self._clock.receive_stamp(got_source, got_tag))
        if self._trace is not None:
            self._trace.blocking_recv(
                self._ctx, src, tag, nbytes, got_src, got_tag, wall0, time.perf_counter()
            )
        if status is not None:
            _fill_status(status, got_source, got_tag, array.size)

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> Request:  # noqa: N802
        array = _buffer(buf, "Isend buffer")
        dest, tag = self._peer(dest, "dest"), _tag(tag)
        self._check_hung()
        nbytes = array.nbytes
        action, arrival = self._outgoing(dest, tag, nbytes)
        dst = self._world_ranks[dest]
        self.stats.count_call("Isend", nbytes)
        self.stats.count_send(dst, nbytes)
        req = 0
        if self._trace is not None:
            fault = self._send_fault(dest, action)
            req = self._trace.send(self._ctx, dst, tag, nbytes, fault, time.perf_counter())
        if action is not None and action.drop:
            request: EngineRequest = _Completed()
        else:
            if self._clock is not None:
                self._clock.send_stamp(dest, tag, arrival)
            request = self._engine.isend(array, dest, tag, synchronous=nbytes > self._eager_limit)
        handle = Request(self, request, dest, tag, nbytes, False, req)
        handle.arrival = arrival
        return handle

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:  # noqa: N802
        array = _buffer(buf, "Irecv buffer")
        source, tag = self._peer(source, "source", wildcard=True), _tag(tag)
        self._check_hung()
        self.stats.count_call("Irecv", array.nbytes)
        req = 0
        if self._trace is not None:
            src = self._world_ranks[source] if source >= 0 else -1
            req = self._trace.recv(self._ctx, src, tag, array.nbytes, time.perf_counter())
        request = self._engine.irecv(array, source, tag)
        return Request(self, request, source, tag, array.nbytes, True, req)

    def Sendrecv(  # noqa: N802
        self,
        sendbuf: Any,
        dest: int,
        sendtag: int = 0,
        recvbuf: Any = None,
        source: int = ANY_SOURCE,
        recvtag: int = ANY_TAG,
        status: Any = None,
    ) -> None:
        if recvbuf is None:
            raise TypeError("Sendrecv needs a recvbuf (the buffer API has no pickled variant here)")
        send_array = _buffer(sendbuf, "Sendrecv sendbuf")
        recv_array = _buffer(recvbuf, "Sendrecv recvbuf")
        dest, sendtag = self._peer(dest, "dest"), _tag(sendtag)
        source, recvtag = self._peer(source, "source", wildcard=True), _tag(recvtag)
        send_nbytes, recv_nbytes = send_array.nbytes, recv_array.nbytes
        action, arrival = None, 0.0
        if self._faults is not None or self._clock is not None:
            self._check_hung()
            action, arrival = self._outgoing(dest, sendtag, send_nbytes)
        dropped = action is not None and action.drop
        world = self._world_ranks
        dst = world[dest]
        src = world[source] if source >= 0 else -1
        # Read before the exchange moves the clock: a held message waits from now.
        fault = self._send_fault(dest, action) if action is not None else None
        wall0 = time.perf_counter()
        if self._clock is not None and not dropped:
            self._clock.send_stamp(dest, sendtag, arrival)
        # The receive side first: a Sendrecv waits for its source to send (see waitfor.py).
        self._slot.blocked_on("Sendrecv", src, dst, send_nbytes)
        if dropped:
            got_source, got_tag = self._engine.recv(recv_array, source, recvtag)
        else:
            got_source, got_tag = self._engine.sendrecv(
                send_array, dest, sendtag, recv_array, source, recvtag
            )
        self._slot.running()
        got_src = world[got_source]
        stats = self.stats
        stats.calls["Sendrecv"] += 1
        stats.op_bytes["Sendrecv"] += send_nbytes
        stats.sent_msgs[dst] += 1
        stats.sent_bytes[dst] += send_nbytes
        stats.recv_msgs[got_src] += 1
        stats.recv_bytes[got_src] += recv_nbytes
        if self._clock is not None:
            received = self._clock.receive_stamp(got_source, got_tag)
            self._clock.advance_to(max(received, 0.0 if dropped else arrival))
        if self._trace is not None:
            self._trace.sendrecv(
                self._ctx, dst, sendtag, send_nbytes, fault, src, recvtag, recv_nbytes,
                got_src, got_tag, wall0, time.perf_counter(),
            )
        if status is not None:
            _fill_status(status, got_source, got_tag, recv_array.size)

    # -- collectives (the built-in baselines) -----------------------------------------------

    def _collective(self, op: str, nbytes: int, root: int = -1) -> None:
        self._check_hung()
        self.stats.count_call(op, nbytes)
        self._slot.blocked(op, (ALL_PEERS,), nbytes)
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
        handle = Request(self, inner, -1, -1, nbytes, False, req, collective="Allreduce")
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


def _tag(tag: Any) -> int:
    return tag if type(tag) is int else int(tag)


def _same_size(a: np.ndarray, b: np.ndarray, what: str) -> None:
    if a.size != b.size or a.dtype != b.dtype:
        raise ValueError(
            f"{what}: sendbuf ({a.size} x {a.dtype}) and recvbuf ({b.size} x {b.dtype}) differ"
        )
