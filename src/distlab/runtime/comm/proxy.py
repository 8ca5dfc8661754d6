"""The learner's ``comm``: mpi4py's buffer API over any engine, counted and watched.

Learner code calls ``comm.Send(buf, dest)``, ``comm.Sendrecv(...)``, ``comm.Allreduce(...)`` exactly
as with mpi4py. Buffers are NumPy arrays or CPU torch tensors (contiguous). Each call goes through
this proxy, which

* counts messages and bytes per operation and per peer (``CommStats``);
* records in the rank's slot what the call is blocked on, for the supervisor's wait-for graph;
* keeps the rank's online virtual clock (runtime/clock/online.py) and applies the message-level faults of
  the fault plan (delay, spike, bandwidth, drop, partition, dead, hung: runtime/faults/decide.py);
* records every call as an event for the replay and the trace (runtime/trace);
* runs ``Iallreduce`` (a nonblocking collective) as a request: its Wait is where the rank waits
  for the whole group, and where the online clock settles it (see ``Comm._settle``);
* offers the built-in collectives (``collectives.py``, ``gathers.py``), nonblocking requests (``requests.py``),
  mpi4py's lowercase calls on Python objects (``objects.py``) and sub-communicators
  (``groups.py``: Split, Dup, Create_group, Free; ``survivors.py``: Shrink after a peer's
  death, with Revoke, Agree, Get_failed and Ack_failed), which share the rank's slot, trace, clock,
  fault plan and marks (``RankBook``) and count their own calls into the rank's totals;
* gives up a blocking call at its timeout (``comm.set_timeout``, a call's ``timeout=``:
  ``timed.py``) with ``distlab.CommTimeout``;
* sends above the eager limit synchronously, as real MPI transports do, so that two ranks doing a
  blocking ``Send`` to each other deadlock the same way on every engine and every transport; and
  times them so on the online clock: an eager send is done once copied out (its sender does not
  wait for the arrival), a rendezvous once its bytes have arrived (see runtime/clock/online.py).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ..clock.online import EAGER_LIMIT, Timekeeper
from ..engines.base import ANY_SOURCE, ANY_TAG, Engine, EngineRequest, arrived_bytes
from ..trace.events import TraceRecorder
from .collectives import Collectives
from .declared import Declarations
from .faulted import MessageFaultsApplied
from .gathers import Gathers
from .groups import Communicators, RankBook
from .objects import ObjectCalls
from .probes import Probes
from .rankstate import NullSlot, RankSlot
from .requests import IN_PLACE, Request, _buffer, _Completed, _fill_status, peer_rank
from .sent import SentLog
from .stats import CommStats
from .store import StoreAccess
from .survivors import Survivors
from .timed import TimedCalls

if TYPE_CHECKING:  # a fault plan's modules load only in a rank that has one (rank/worker.py)
    from ..faults.decide import MessageFaults

DEFAULT_EAGER_LIMIT = EAGER_LIMIT

class Comm(Declarations, MessageFaultsApplied, TimedCalls, Collectives, Gathers, Communicators,
           Survivors, Probes, StoreAccess, ObjectCalls):
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
        book: RankBook | None = None,
        trigger_marks: tuple[str, ...] = (),
        record_sent: bool = False,
        memory_probe: Callable[[str], tuple[int, int]] | None = None,
    ) -> None:
        self._engine = engine
        self._slot = slot if slot is not None else NullSlot()
        self.stats = stats if stats is not None else CommStats()
        self._clock = clock
        self._faults = faults
        self._trigger_steps = trigger_steps  # steps at which the supervisor kills or stops us
        self._book = book if book is not None else RankBook()
        if trigger_marks:  # mark names at which the supervisor kills or stops us (every comm's)
            self._book.trigger_marks = trigger_marks
        self._book.comms.append(self)
        self._slot.marked = self._book.marked
        if record_sent:
            self._book.sent = SentLog()
        if memory_probe is not None:
            self._book.memory_probe = memory_probe
        self._attempts = self._book.attempts  # sends per world destination, lost ones included
        self._eager_limit = eager_limit
        self._trace = trace
        self._ctx = ctx
        self._compute_multiplier = compute_multiplier
        self._device_flops = device_flops
        # Nonblocking collectives the online clock has not placed yet, in the order they were
        # posted, and when the last one placed ends (they queue on the group's links).
        self._unsettled: deque[Request] = deque()
        # Every request not completed yet, by Wait/Test or their -all forms: one the learner's
        # function returns without completing is a bug MPI punishes later (unwaited()).
        self._outstanding: set[Request] = set()
        self._icoll_free_at = 0.0
        self._timeout_s: float | None = None  # set_timeout's (timed.py)
        self._broken: str | None = None  # why a timed-out collective left this unusable
        self._coll_limit: float | None = None
        # Read on every call: kept as plain attributes rather than looked up through the engine.
        self._size = engine.size
        self._world_ranks = list(engine.world_ranks)
        # A message to itself is a copy in the rank, never on a link: it counts among the calls and
        # their bytes, not as a message sent or received (padding counts with free messages to
        # itself once met a check's byte bound without the traffic).
        self._me = self._world_ranks[engine.rank]

    # -- identity ---------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._engine.rank

    @property
    def size(self) -> int:
        return self._engine.size

    def unwaited(self) -> dict[str, int]:
        """Sends and nonblocking collectives never completed on any communicator of the rank, by
        kind ("Isend", "Iallreduce").
        A receive left behind is not counted: code that waits for a message with a timeout
        abandons the receive of one that was lost, and MPI lets it (MPI_Cancel aside)."""
        counts: dict[str, int] = {}
        for request in (r for comm in self._book.comms for r in comm._outstanding):
            kind = request.kind()
            if kind == "Irecv":
                continue
            counts[kind] = counts.get(kind, 0) + 1
        return dict(sorted(counts.items()))

    def Get_rank(self) -> int:  # noqa: N802
        return self._engine.rank

    def Get_size(self) -> int:  # noqa: N802
        return self._engine.size

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def marked(self) -> list[tuple[str, CommStats]]:
        """Every mark of the rank, on any of its communicators, with the rank's totals then."""
        return self._book.marked

    @property
    def sent(self) -> SentLog | None:
        """What the rank sent on any of its communicators, if its task logs it (sent.py)."""
        return self._book.sent

    @property
    def memory_marks(self) -> list[tuple[str, int, int]]:
        """What the learner's processes held at each mark, and their peak since the reading before,
        where the task asked (Task.memory)."""
        return self._book.memory

    def total_stats(self) -> CommStats:
        """The rank's counters over all its communicators (see groups.py)."""
        return self._book.totals() if len(self._book.comms) > 1 else self.stats

    def stats_by_communicator(self) -> dict[str, CommStats]:
        return self._book.by_communicator()

    def _log_sent(self, op: str, peer: int, array: np.ndarray) -> None:
        """``peer``: a world rank; a send to this rank itself reaches no other and is not logged."""
        book = self._book
        assert book.sent is not None
        if peer != self._world_ranks[self._engine.rank]:
            book.sent.add(op, peer, array, len(book.marked), tuple(self._world_ranks))

    def _count_sent(self, op: str, dst: int, nbytes: int) -> None:
        """A call that sent ``nbytes`` to world rank ``dst``: traffic unless ``dst`` is this rank."""
        self.stats.count_call(op, nbytes)
        if dst != self._me:
            self.stats.count_send(dst, nbytes)

    def _count_arrived(self, src: int, arrived: int) -> None:
        """A message from world rank ``src`` taken: traffic, or one sent to itself no longer parked."""
        if src != self._me:
            self.stats.count_recv(src, arrived)
        else:
            self._book.parked -= arrived

    def _world(self, rank: int) -> int:
        return self._world_ranks[rank] if 0 <= rank < self._size else rank

    def _peer(self, peer: Any, what: str, wildcard: bool = False) -> int:
        """``peer`` as an int, once it is known to be a rank of this communicator (or ANY_SOURCE
        where ``wildcard``)."""
        if type(peer) is int and 0 <= peer < self._size:
            return peer  # the common case, answered first: this runs on every call
        return peer_rank(peer, what, self._size, wildcard)

    def _advance(self, requests: Sequence[Request]) -> None:
        if self._clock is not None:
            self._clock.advance_to(max(r.arrival for r in requests))

    # -- recording ---------------------------------------------------------------------------

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

    def Send(self, buf: Any, dest: int, tag: int = 0, timeout: Any = None) -> None:  # noqa: N802
        self._send(buf, dest, tag, None, timeout, "Send")

    def Ssend(self, buf: Any, dest: int, tag: int = 0, timeout: Any = None) -> None:  # noqa: N802
        self._send(buf, dest, tag, True, timeout, "Ssend")

    def _send(self, buf: Any, dest: int, tag: int, synchronous: bool | None, timeout: Any,
              call: str) -> None:
        array = _buffer(buf, "Send buffer")
        dest, tag = self._peer(dest, "dest"), _tag(tag)
        if self._broken is not None:
            self._check_broken()
        limit = self._timeout_s if timeout is None else self._limit(timeout, call)
        nbytes = array.nbytes
        if synchronous is None:
            synchronous = nbytes > self._eager_limit
        action, arrival = None, 0.0
        if self._faults is not None or self._clock is not None:
            self._check_hung()
            action, arrival = self._outgoing(dest, tag, nbytes)
        dst = self._world_ranks[dest]
        if dst == self._me:
            self._book.park(nbytes)
        # Read before the send moves the clock: a held message waits from now.
        fault = self._send_fault(dest, action) if action is not None else None
        wall0 = time.perf_counter()
        sent = True
        if action is None or not action.drop:
            if self._clock is not None:
                # The stamp goes first: the receiver must never wait for it once the message is in.
                self._clock.send_stamp(dest, tag, arrival)
            self._slot.blocked_on("Send", dst, -1, nbytes, self._ctx)
            if limit is None or not synchronous:  # an eager send never waits for its receiver
                self._engine.send(array, dest, tag, synchronous)
            else:
                sent = self._timed_send(array, dest, tag, limit, wall0)
            self._slot.running()
            if self._clock is not None and sent:
                # Eager: done once copied out; a rendezvous, once the bytes have moved.
                self._clock.advance_to(self._clock.send_done(arrival, synchronous))
        if self._book.sent is not None and (action is None or not action.drop):
            self._log_sent(call, dst, array)
        self._count_sent("Send", dst, nbytes)
        if not sent:  # the message stays under way, posted: it may still be received
            if self._trace is not None:
                self._trace.send(self._ctx, dst, tag, nbytes, fault, wall0)
            assert limit is not None
            raise self._timed_out(call, dest, limit, wall0, "no rank took the message")
        if self._trace is not None:
            self._trace.blocking_send(self._ctx, dst, tag, nbytes, fault, wall0, time.perf_counter())

    def Recv(  # noqa: N802
        self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Any = None,
        timeout: Any = None,
    ) -> None:
        array = _buffer(buf, "Recv buffer")
        source, tag = self._peer(source, "source", wildcard=True), _tag(tag)
        if self._broken is not None:
            self._check_broken()
        limit = self._timeout_s if timeout is None else self._limit(timeout, "Recv")
        if self._faults is not None:
            self._check_hung()
        nbytes = array.nbytes
        world = self._world_ranks
        src = world[source] if source >= 0 else -1
        wall0 = time.perf_counter()
        self._slot.blocked_on("Recv", src, -1, nbytes, self._ctx)
        if limit is None:
            got_source, got_tag = self._engine.recv(array, source, tag)
            arrived = arrived_bytes(self._engine, nbytes)
        else:
            got_source, got_tag, arrived = self._timed_recv(array, source, tag, limit, wall0)
        self._slot.running()
        got_src = world[got_source]
        self.stats.count_call("Recv", nbytes)
        self._count_arrived(got_src, arrived)
        if self._clock is not None:
            self._clock.advance_to(self._clock.receive_stamp(got_source, got_tag))
        if self._trace is not None:
            self._trace.blocking_recv(
                self._ctx, src, tag, nbytes, got_src, got_tag, wall0, time.perf_counter()
            )
        if status is not None:
            _fill_status(status, got_source, got_tag, arrived)

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> Request:  # noqa: N802
        array = _buffer(buf, "Isend buffer")
        dest, tag = self._peer(dest, "dest"), _tag(tag)
        if self._broken is not None:
            self._check_broken()
        self._check_hung()
        nbytes = array.nbytes
        action, arrival = self._outgoing(dest, tag, nbytes)
        dst = self._world_ranks[dest]
        if dst == self._me:
            self._book.park(nbytes)
        self._count_sent("Isend", dst, nbytes)
        if self._book.sent is not None and (action is None or not action.drop):
            self._log_sent("Isend", dst, array)
        req = 0
        if self._trace is not None:
            fault = self._send_fault(dest, action)
            req = self._trace.send(self._ctx, dst, tag, nbytes, fault, time.perf_counter())
        rendezvous = nbytes > self._eager_limit
        if action is not None and action.drop:
            request: EngineRequest = _Completed()
        else:
            if self._clock is not None:
                self._clock.send_stamp(dest, tag, arrival)
            request = self._engine.isend(array, dest, tag, synchronous=rendezvous)
        handle = Request(self, request, dest, tag, nbytes, False, req, buffers=array)
        if self._clock is not None:  # when its Wait returns on the online clock
            dropped = action is not None and action.drop
            handle.arrival = self._clock.now if dropped else self._clock.send_done(arrival, rendezvous)
        return handle

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:  # noqa: N802
        array = _buffer(buf, "Irecv buffer")
        source, tag = self._peer(source, "source", wildcard=True), _tag(tag)
        if self._broken is not None:
            self._check_broken()
        self._check_hung()
        self.stats.count_call("Irecv", array.nbytes)
        req = 0
        if self._trace is not None:
            src = self._world_ranks[source] if source >= 0 else -1
            req = self._trace.recv(self._ctx, src, tag, array.nbytes, time.perf_counter())
        request = self._engine.irecv(array, source, tag)
        return Request(self, request, source, tag, array.nbytes, True, req, buffers=array)

    def Sendrecv(  # noqa: N802
        self,
        sendbuf: Any,
        dest: int,
        sendtag: int = 0,
        recvbuf: Any = None,
        source: int = ANY_SOURCE,
        recvtag: int = ANY_TAG,
        status: Any = None,
        timeout: Any = None,
    ) -> None:
        if recvbuf is None:
            raise TypeError("Sendrecv needs a recvbuf (the buffer API has no pickled variant here)")
        send_array = _buffer(sendbuf, "Sendrecv sendbuf")
        recv_array = _buffer(recvbuf, "Sendrecv recvbuf")
        dest, sendtag = self._peer(dest, "dest"), _tag(sendtag)
        source, recvtag = self._peer(source, "source", wildcard=True), _tag(recvtag)
        if self._broken is not None:
            self._check_broken()
        limit = self._timeout_s if timeout is None else self._limit(timeout, "Sendrecv")
        send_nbytes, recv_nbytes = send_array.nbytes, recv_array.nbytes
        action, arrival = None, 0.0
        if self._faults is not None or self._clock is not None:
            self._check_hung()
            action, arrival = self._outgoing(dest, sendtag, send_nbytes)
        dropped = action is not None and action.drop
        world = self._world_ranks
        dst = world[dest]
        if dst == self._me:
            self._book.park(send_nbytes)
        src = world[source] if source >= 0 else -1
        # Read before the exchange moves the clock: a held message waits from now.
        fault = self._send_fault(dest, action) if action is not None else None
        wall0 = time.perf_counter()
        rendezvous = send_nbytes > self._eager_limit
        if self._clock is not None and not dropped:
            self._clock.send_stamp(dest, sendtag, arrival)
        # The receive side first: a Sendrecv waits for its source to send (see waitfor.py).
        self._slot.blocked_on("Sendrecv", src, dst, send_nbytes, self._ctx)
        if limit is None:
            if dropped:
                got = self._engine.recv(recv_array, source, recvtag)
            else:
                got = self._engine.sendrecv(send_array, dest, sendtag, recv_array, source, recvtag)
            matched: tuple[int, int] | None = got
            arrived, delivered = arrived_bytes(self._engine, recv_nbytes), True
        else:
            taken, delivered = self._timed_exchange(
                None if dropped else send_array, dest, sendtag, rendezvous, recv_array, source,
                recvtag, limit, wall0)
            matched, arrived = (taken[:2], taken[2]) if taken is not None else (None, 0)
        self._slot.running()
        if self._book.sent is not None and not dropped:
            self._log_sent("Sendrecv", dst, send_array)
        self._count_sent("Sendrecv", dst, send_nbytes)
        if matched is not None:
            self._count_arrived(world[matched[0]], arrived)
        if self._clock is not None:
            # A message taken has its stamp taken too, even by a call that then gives up.
            received = self._clock.receive_stamp(*matched) if matched is not None else 0.0
            sent = 0.0 if dropped or not delivered else self._clock.send_done(arrival, rendezvous)
            if matched is not None and delivered:
                self._clock.advance_to(max(received, sent))
        if matched is None or not delivered:
            assert limit is not None
            self._trace_parts(dst, sendtag, send_nbytes, fault, src, recvtag,
                              recv_nbytes, matched, wall0)
            why = "no message came" if matched is None else "no rank took its message"
            raise self._timed_out("Sendrecv", source if matched is None else dest, limit, wall0,
                                  why)
        if self._trace is not None:
            self._trace.sendrecv(
                self._ctx, dst, sendtag, send_nbytes, fault, src, recvtag, recv_nbytes,
                world[matched[0]], matched[1], wall0, time.perf_counter(),
            )
        if status is not None:
            _fill_status(status, matched[0], matched[1], arrived)


def _tag(tag: Any) -> int:
    return tag if type(tag) is int else int(tag)

