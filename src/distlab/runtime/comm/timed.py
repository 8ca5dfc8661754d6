"""Timeouts on the learner's ``comm``: ``comm.set_timeout(seconds)`` for every blocking call of a
communicator, or ``timeout=`` on one call, after which the call raises ``distlab.CommTimeout``
naming the call, the peer and the time waited, instead of blocking until the check's deadline.

A call with a timeout runs the nonblocking form of its operation and polls it to the deadline
(engines/base.py's ``finished_by``); one without runs exactly as before. When the deadline passes:

* a receive is withdrawn (MPI_Cancel; on gloo an orphan that the next matching receive adopts,
  engines/gloo_orphans.py), so the message, when it comes, goes to a later receive;
* a send, which cannot be withdrawn, stays under way on a private copy of the buffer (the
  learner may reuse it at once): the message may still be received later, as with MPI;
* a collective stays under way too (its members may still finish it, and its clock exchange is
  posted for them), and its communicator is broken: every later call on it raises
  ``distlab.CommBroken``, since its ranks may be anywhere in that collective. The other
  communicators of the rank and the store still work.

Each timeout is charged on the virtual clock (the call waited its whole timeout: the online
clock moves by it, and the trace's "timeout" event makes the replay do the same), counted as a
call of its name, and shown in the rank's slot (``gives_up_at``), so the supervisor does not
take a rank waiting with a timeout for a deadlocked one.
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from ..clock.online import ExchangeTimedOut, Timekeeper
from ..engines.base import Engine, EngineRequest, abandon, arrived_bytes, finished_by
from ..trace.events import TIMEOUT, TraceRecorder
from .errors import CommBroken, CommTimeout, timeout_seconds
from .rankstate import NullSlot, RankSlot
from .stats import CommStats


class TimedCalls:
    """Mixed into ``Comm`` (proxy.py), whose constructor sets these attributes."""

    _engine: Engine
    _slot: RankSlot | NullSlot
    stats: CommStats
    _clock: Timekeeper | None
    _trace: TraceRecorder | None
    _world_ranks: list[int]
    _size: int
    _ctx: int
    # What collectives.py keeps of the collective under way and the nonblocking ones not
    # placed on the online clock yet.
    _coll_started: tuple[str, int, int, float, tuple[int, ...] | None]
    _unsettled: deque[Any]
    _timeout_s: float | None  # the communicator's timeout (set_timeout), None: none
    _broken: str | None  # why the communicator is unusable (a collective timed out), or None

    # -- the learner's calls ----------------------------------------------------------------

    def set_timeout(self, seconds: Any) -> None:
        """Every later blocking call on this communicator without a ``timeout=`` of its own gives
        up after ``seconds`` (None: waits as long as it takes, the default). Communicators made
        from this one later start with its timeout."""
        self._timeout_s = None if seconds is None else timeout_seconds(seconds, "set_timeout")

    def get_timeout(self) -> float | None:
        return self._timeout_s

    @contextmanager
    def call_timeout(self, seconds: float) -> Iterator[None]:
        """The harness's: one call's own timeout (a sealed call's ``timeout=``, which reaches the
        agent with the request, not as an argument)."""
        kept, self._timeout_s = self._timeout_s, timeout_seconds(seconds, "timeout")
        try:
            yield
        finally:
            self._timeout_s = kept

    # -- what every timed call shares -------------------------------------------------------

    def _world(self, rank: int) -> int:
        raise NotImplementedError

    if TYPE_CHECKING:  # collectives.py's, later in Comm's bases: declared, not overridden
        def _settle(self, request: Any, deadline: float | None = None) -> None: ...

        def _collective_done(self, deadline: float | None = None) -> None: ...

    def _limit(self, timeout: Any, call: str) -> float | None:
        """The seconds a call may wait: its own ``timeout=``, else the communicator's."""
        return self._timeout_s if timeout is None else timeout_seconds(timeout, call)

    def _check_broken(self) -> None:
        if self._broken is not None:
            raise CommBroken(f"this communicator ({self._size} ranks) is unusable: {self._broken}; "
                             "its ranks may be anywhere in that collective. Carry on over "
                             "another communicator, or end the task")

    def _deadline(self, limit: float, wall0: float) -> float:
        """The call's deadline on ``time.perf_counter()``, also noted in the rank's slot."""
        self._slot.gives_up_at(time.monotonic() + limit - (time.perf_counter() - wall0))
        return wall0 + limit

    def _timed_out(self, call: str, peer: Any, seconds: float, wall0: float,
                   why: str) -> CommTimeout:
        """Ends a call that gave up: charged, counted, traced; returns the error to raise.
        ``peer``: the rank (of this communicator) it waited on, -1 for any, a tuple of ranks, or
        a store key."""
        self._slot.running()
        if self._clock is not None:
            self._clock.compute(seconds)
        self.stats.count_call(call, 0)
        if self._trace is not None:
            world = (peer if isinstance(peer, str) else tuple(self._world(r) for r in peer)
                     if isinstance(peer, tuple) else self._world(peer))
            self._trace.add((TIMEOUT, call, world, seconds, wall0, time.perf_counter()))
        return CommTimeout(call, peer, seconds, why)

    # -- point to point ---------------------------------------------------------------------

    def _timed_recv(self, array: np.ndarray, source: int, tag: int, limit: float,
                    wall0: float, call: str = "Recv") -> tuple[int, int, int]:
        """A receive that gives up at its deadline: (source, tag, bytes) of the message it took."""
        receiving = self._engine.irecv(array, source, tag, cancellable=True)
        if finished_by(receiving, self._deadline(limit, wall0)) or not receiving.cancel():
            got_source, got_tag = receiving.wait()
            return got_source, got_tag, arrived_bytes(receiving, array.nbytes)
        raise self._timed_out(call, source, limit, wall0, "no message came")

    def _timed_send(self, array: np.ndarray, dest: int, tag: int, limit: float,
                    wall0: float) -> bool:
        """A rendezvous send of a copy of ``array``, given up (and left under way) at the
        deadline: True if it completed, False if its timeout passed."""
        sending = self._engine.isend(array.copy(), dest, tag, synchronous=True)
        if finished_by(sending, self._deadline(limit, wall0)):
            sending.wait()
            return True
        abandon(sending)
        return False

    def _timed_exchange(self, send: np.ndarray | None, dest: int, sendtag: int, rendezvous: bool,
                        recv: np.ndarray, source: int, recvtag: int, limit: float,
                        wall0: float) -> tuple[tuple[int, int, int] | None, bool]:
        """A Sendrecv that gives up at its deadline (``send`` None: a fault dropped the send):
        what the receive matched (source, tag, bytes; None if withdrawn), and whether the send
        completed."""
        sending: EngineRequest | None = None
        if send is not None:
            sending = self._engine.isend(send.copy(), dest, sendtag, synchronous=rendezvous)
        receiving = self._engine.irecv(recv, source, recvtag, cancellable=True)

        def both() -> bool:
            return receiving.test() and (sending is None or sending.test())

        done = _Poll(both)
        if finished_by(done, self._deadline(limit, wall0)):
            if sending is not None:
                sending.wait()
            return (*receiving.wait(), arrived_bytes(receiving, recv.nbytes)), True
        sent = sending is None or sending.test()
        if sending is not None and not sent:
            abandon(sending)
        if receiving.cancel():
            return None, sent
        return (*receiving.wait(), arrived_bytes(receiving, recv.nbytes)), sent

    # -- collectives ------------------------------------------------------------------------

    def _clock_by(self, deadline: float, op: str, largest: int) -> None:
        """The clock's exchanges after a collective with a timeout, each to the deadline; when
        one gives up, the rest are posted for the other ranks (``_abandon_exchanges``)."""
        assert self._clock is not None
        try:
            while self._unsettled:
                self._settle(self._unsettled[0], deadline)
        except ExchangeTimedOut:
            self._abandon_exchanges(largest)
            raise
        self._clock.collective(op, largest, deadline)

    def _abandon_exchanges(self, largest: int) -> None:
        """Posts this rank's part of every clock exchange still due (the nonblocking collectives
        not placed yet, then the collective that gave up) without waiting for any: the members
        that finish those collectives get their exchanges; this rank places them at now."""
        clock = self._clock
        assert clock is not None
        while self._unsettled:
            request = self._unsettled.popleft()
            clock.abandon_exchange(request._nbytes)
            request.arrival, request._settled = clock.now, True
        clock.abandon_exchange(largest)

    def _timed_collective(self, limit: float, start: Callable[[], EngineRequest],
                          buffers: Any) -> None:
        """The collective ``_collective`` started (collectives.py), run by ``start()``, its
        nonblocking form on ``buffers``, to the deadline; given up as the module says."""
        op, nbytes, root, wall0, per_peer = self._coll_started
        deadline = self._deadline(limit, wall0)
        request = start()
        if finished_by(request, deadline):
            request.wait()
            try:
                self._collective_done(deadline)
                return
            except ExchangeTimedOut:
                why = "it ended, but some ranks gave up before agreeing on its time"
        else:
            why = "not every rank of the communicator reached it in time"
            abandon(request, buffers)
            if self._clock is not None:
                self._abandon_exchanges(max(per_peer, default=0) if per_peer is not None else nbytes)
        if self._trace is not None:  # posted and never waited on: its members may finish it
            recorded = per_peer if per_peer is not None else nbytes
            self._trace.icollective(op, tuple(self._world_ranks), recorded, root, wall0,  # type: ignore[arg-type]
                                    time.perf_counter())
        self._broken = f"its {op} timed out after {limit:g} s"
        raise self._timed_out(op, tuple(range(self._size)), limit, wall0, why)

    def _trace_parts(self, dst: int, sendtag: int, send_nbytes: int, fault: Any,
                     src: int, recvtag: int, recv_nbytes: int, matched: tuple[int, int] | None,
                     wall0: float) -> None:
        """A Sendrecv that gave up, as the parts that happened: its send, posted (it may still be
        received), and its receive if it took a message."""
        if self._trace is None:
            return
        self._trace.send(self._ctx, dst, sendtag, send_nbytes, fault, wall0)
        if matched is not None:
            req = self._trace.recv(self._ctx, src, recvtag, recv_nbytes, wall0)
            got = (req, self._world_ranks[matched[0]], matched[1])
            self._trace.wait(self._ctx, (req,), [got], wall0, time.perf_counter())


class _Poll:
    """A condition as something ``finished_by`` polls."""

    def __init__(self, condition: Callable[[], bool]) -> None:
        self.test = condition
