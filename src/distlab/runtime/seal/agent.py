"""The agent's end of the seal: serve one request at a time, validated, and answer it.

Call order (the agent is the parent; the learner process its child)::

    agent = AgentEnd.create(data_size)            # the arena and the two pipes
    child = subprocess.Popen([..., agent.handle()], pass_fds=agent.child_fds)
    agent.watch(child.pid)                        # a pidfd, and the child's fds closed here
    while True:
        request = agent.serve(timeout=...)        # Request, Rejected, or None on a timeout
        ...make the real call with request.inputs...
        agent.reply(request, ints=..., outputs=[...])   # or agent.fail(request, error)
    agent.close()

``serve`` raises ``LearnerGone`` when the learner process died or closed its end, with where it
was ("in Sendrecv": a request taken but not answered, or sent and never taken; "after Send":
between calls); ``reply`` raises it when the answer finds nobody, and ``LearnerFlooding`` when
the learner does not read its answers. A malformed request gets a rejection as its reply and
comes back as ``Rejected``: the agent decides what it means (for a verdict: tampering, since the
learner's own client never sends one).

Every input buffer is copied out of the arena before ``serve`` returns; output places are taken
from the validated request, so nothing the learner writes afterwards reaches a call in flight.
"""

from __future__ import annotations

import os
import select
import signal
import threading
from typing import NamedTuple, Sequence

import numpy as np

from .arena import Arena
from .calls import CALLS
from .doorbell import Doorbell, Woke
from .errors import BadRequest, LearnerFlooding, LearnerGone
from .wire import (
    FAILED,
    OK,
    REJECTED,
    Buffer,
    Reply,
    Signature,
    call_id_of,
    decode_request,
    encode_reply,
    framed,
)


class Request(NamedTuple):
    """A validated request, its inputs already the agent's own arrays."""

    call_id: int
    op: int
    name: str
    ints: tuple[int, ...]
    floats: tuple[float, ...]
    text: str
    inputs: tuple[np.ndarray, ...]
    outputs: tuple[Buffer, ...]  # where the reply's arrays go, as validated
    input_places: tuple[Buffer, ...] = ()  # where the inputs were: an output at one is in place
    comm: int = 0  # the learner's handle of the communicator it calls on (service.py)


class Rejected(NamedTuple):
    """A request that failed validation; the learner has been told ``reason``."""

    call_id: int
    reason: str


class AgentEnd:
    def __init__(self, arena: Arena, bell: Doorbell, child_bell: tuple[int, int],
                 table: dict[int, Signature]) -> None:
        self.arena = arena
        self._bell = bell
        self._child_bell: tuple[int, int] | None = child_bell  # (read, write), until watch()
        self._table = table
        self._last_seen = 0  # the highest call id looked at, valid or not
        self._pid: int | None = None
        self.in_call: str | None = None  # the op taken and not answered yet
        self.last_call: str | None = None  # the last op answered
        # Held while the data region is read or written for a call, so that clear_data never
        # falls between a request's arrival and its inputs' copy, or on a reply being written.
        self._guard = threading.Lock()

    @classmethod
    def create(cls, data_size: int, table: dict[int, Signature] | None = None,
               spin_s: float = 0.0) -> AgentEnd:
        arena = Arena.create(data_size)
        mine, theirs = Doorbell.pair()
        return cls(arena, Doorbell(*mine, spin_s=spin_s), theirs, CALLS if table is None else table)

    @property
    def child_fds(self) -> tuple[int, int, int]:
        """The descriptors the learner process must inherit (``pass_fds``): the arena, and the
        pipes its end reads and rings on."""
        assert self._child_bell is not None, "the child's end was closed by watch()"
        return (self.arena.fd, *self._child_bell)

    @property
    def spin_s(self) -> float:
        return self._bell.spin_s

    def handle(self) -> str:
        """What the learner process needs to open its end: ``LearnerEnd.open(handle)``."""
        arena_fd, read_fd, write_fd = self.child_fds
        return (f"arena={arena_fd},size={self.arena.data_size},bell={read_fd}:{write_fd},"
                f"spin={self._bell.spin_s}")

    def watch(self, pid: int) -> None:
        """Follows the learner process ``pid`` and closes this process's copy of its end (else
        its death would leave its pipe open here, and no EOF)."""
        self._pid = pid
        self._bell.watch(os.pidfd_open(pid))
        self._close_child_bell()

    def _close_child_bell(self) -> None:
        if self._child_bell is not None:
            for fd in self._child_bell:
                os.close(fd)
            self._child_bell = None

    # -- serving -----------------------------------------------------------------------------

    def serve(self, timeout: float | None = None) -> Request | Rejected | None:
        """Waits for the next request: a validated ``Request``, a ``Rejected`` one (already
        answered), or None when ``timeout`` seconds pass without one."""
        woke = self._bell.wait(self._new_request, timeout)
        if woke is Woke.TIMEOUT:
            return None
        if woke is not Woke.READY:
            raise self._gone(closed=woke is Woke.CLOSED)
        with self._guard:
            return self._take_request()

    def _take_request(self) -> Request | Rejected:
        block = self.arena.read_block("request")  # the only read of the block: a copy
        call_id = call_id_of(block)
        try:
            decoded = decode_request(block, self._table, self.arena.data_size, self._last_seen)
        except BadRequest as e:
            self._last_seen = max(self._last_seen, call_id)
            self._answer(call_id, Reply(REJECTED, text=str(e)))
            return Rejected(call_id, str(e))
        self._last_seen = call_id
        take = self.arena.take
        inputs = tuple([take(b.offset, b.dtype, b.shape) for b in decoded.inputs])
        self.in_call = decoded.name
        return Request(call_id, decoded.op, decoded.name, decoded.ints, decoded.floats,
                       decoded.text, inputs, decoded.outputs, decoded.inputs, decoded.comm)

    def reply(self, request: Request, ints: Sequence[int] = (), floats: Sequence[float] = (),
              outputs: Sequence[np.ndarray | None] = ()) -> None:
        """Answers ``request``: its results, and an array (or None) per output place, copied
        into the arena; an array may be shorter than its place (a short receive)."""
        if len(outputs) > len(request.outputs):
            raise ValueError(f"{request.name}: {len(outputs)} outputs for "
                             f"{len(request.outputs)} places")
        for array, place in zip(outputs, request.outputs):
            if array is not None and (array.dtype != place.dtype or array.nbytes > place.nbytes):
                raise ValueError(f"{request.name}: an output of {array.nbytes} bytes of "
                                 f"{array.dtype} for a place of {place.nbytes} of {place.dtype}")
        with self._guard:
            written = []
            for array, place in zip(outputs, request.outputs):
                if array is None:
                    written.append(0)
                    continue
                if not array.flags.c_contiguous:
                    array = np.ascontiguousarray(array)
                self.arena.put(place.offset, array)
                written.append(array.nbytes)
            self._answer(request.call_id, Reply(OK, tuple(ints), tuple(floats), tuple(written)))

    def reject(self, request: Request, reason: str) -> Rejected:
        """Refuses a request that decoded well but asks for what the learner's own client never
        would (a communicator it does not hold): answered as a failed validation is."""
        self._answer(request.call_id, Reply(REJECTED, text=reason))
        return Rejected(request.call_id, reason)

    def fail(self, request: Request, error: BaseException) -> None:
        """Answers ``request`` with the exception its call raised, for the learner to raise."""
        self._answer(request.call_id, Reply(FAILED, text=f"{type(error).__name__}\n{error}"))

    def _answer(self, call_id: int, reply: Reply) -> None:
        self.arena.write_block("reply", call_id, framed(encode_reply(reply)))
        try:
            delivered = self._bell.ring()
        except ConnectionError:
            raise self._gone(closed=True) from None
        if not delivered:
            raise LearnerFlooding(
                f"the learner process does not read its replies (the channel is full after "
                f"call {call_id})"
            )
        if self.in_call is not None:
            self.last_call, self.in_call = self.in_call, None

    def _new_request(self) -> bool:
        return self.arena.block_id("request") != self._last_seen

    def clear_data(self) -> bool:
        """Gives the data region's pages back where it holds nothing a call needs (arena.py's
        clear_data): no request waits to be taken, whose inputs lie there, and the learner took
        the last reply's outputs (its end then sets the reply's id back to 0). The learner is
        stopped meanwhile (rank/pause.py). Returns whether it was cleared; what was not still
        counts (``arena.data_held``)."""
        with self._guard:
            if self._new_request() or self.arena.block_id("reply") != 0:
                return False
            self.arena.clear_data()
            return True

    def shut(self) -> None:
        """Ends the line without unmapping it: a thread waiting in ``serve`` wakes to EOF."""
        self._bell.shut()

    # -- the learner's end, as far as the agent knows it -------------------------------------

    def where(self) -> str:
        """Where the learner process is: in a call, between two, or before the first."""
        if self.in_call is not None:
            return f"in {self.in_call}"
        pending = self._pending_call()
        if pending is not None:  # it had asked for a call that was never taken
            return f"in {pending}"
        if self.last_call is not None:
            return f"after {self.last_call}"
        return "before its first call"

    def _pending_call(self) -> str | None:
        block = self.arena.read_block("request")
        try:
            return decode_request(block, self._table, self.arena.data_size, self._last_seen).name
        except BadRequest:
            return None

    def learner_status(self) -> str | None:
        """How the learner process ended ("killed by SIGKILL", "exit status 1"), or None while it
        runs or when it is not this process's child. It is left for its parent to reap."""
        if self._pid is None:
            return None
        try:
            info = os.waitid(os.P_PID, self._pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return None
        if info is None:
            return None
        if info.si_code == os.CLD_EXITED:
            return f"exit status {info.si_status}"
        try:
            return f"killed by {signal.Signals(info.si_status).name}"
        except ValueError:
            return f"killed by signal {info.si_status}"

    def _gone(self, closed: bool) -> LearnerGone:
        # EOF comes as the dying process closes its files, a moment before its pidfd fires (the
        # waiter outside the namespace ends after the learner and its reaper: a chain of three,
        # which takes longer than 0.2 s on a loaded machine): on EOF, wait that moment, so that a
        # death is not reported as a closed channel. Only a learner that closes its end and
        # lives on pays the wait.
        if self._learner_ended(2.0 if closed else 0.0):
            return LearnerGone(self.where(), self.learner_status() or "")
        return LearnerGone(self.where(), closed=True)

    def _learner_ended(self, wait_s: float) -> bool:
        pidfd = self._bell.pidfd
        if pidfd is None:
            return False
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(round(wait_s * 1000)))

    def close(self) -> None:
        self._bell.close()
        self._close_child_bell()
        self.arena.close()
