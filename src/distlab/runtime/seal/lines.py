"""More lines than one: a learner thread's call made while another thread is in one.

Unsealed, a learner's threads call the proxy at once, as mpi4py's threads call MPI: one thread
blocks in a Recv while another sends what its peer waits for first. One channel (an arena, a
doorbell) carries one call at a time, so two threads on it would overwrite each other's request,
and a thread blocked in a call would hold up the others (a deadlock that exists only sealed). So
the learner process has a line per call in flight:

* the *first* line (the channel it was born with) carries its main thread's calls and the task
  protocol (next task, arguments, result), as before; a single-threaded learner never opens
  another;
* any other thread takes an idle *further* line for each call, and gives it back after. Where
  none is idle it asks its agent for a new one, up to ``MAX_FURTHER``; past that a thread waits
  for a line to come back.

Asking takes one byte on the *opener*, a socket the learner is born with; the agent answers with
the new channel's arena and socket (SCM_RIGHTS) and serves it in a thread of its own, on the same
proxy, through the same handlers (service.py), each answering on the line its request came on
(``Switch``). A learner that asks for more lines than its client ever opens gets none: that is
tampering, and is named so.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from typing import Callable, Sequence

import numpy as np

from .agent import AgentEnd, Rejected, Request
from .errors import SealError
from .learner import Arg, LearnerEnd
from .wire import Reply

# Further lines at most: 8 calls of one learner in flight at once. Each costs the agent an arena's
# address space (64 MiB, touched as used) and a thread's stack, under the rank's limits.
MAX_FURTHER = 7
# A further line's data region (the first's is sized by the rank's memory: rank/sealed.py). A
# thread's call whose buffers need more fails naming both sizes (ArenaTooSmall).
FURTHER_ARENA_BYTES = 64 << 20
_ASK, _GIVEN, _REFUSED = b"+", b"+", b"-"


class NoMoreLines(SealError):
    """The agent gave no further line."""


# -- the learner's side ------------------------------------------------------------------------


class LearnerLines:
    """The learner process's lines to its agent; ``call`` is ``LearnerEnd.call`` on a free one.
    The thread that made this object (the process's main one) always uses the first."""

    def __init__(self, first: LearnerEnd, opener: socket.socket | None = None) -> None:
        self.first = first
        self._opener = opener
        self._owner = threading.get_ident()
        self._idle: list[LearnerEnd] = []
        self._opened = 0
        self._changed = threading.Condition()
        # Without an opener (a channel made by hand) every thread shares the first line in turn.
        self._first_in_turn = threading.Lock()
        # A child forked by the learner's code inherits the lines, and its main thread the first
        # one: its calls would cross its parent's on them (and read to the agent as tampering).
        self._forked = False
        os.register_at_fork(after_in_child=self._in_a_forked_child)

    def _in_a_forked_child(self) -> None:
        self._forked = True

    def call(self, op: int, args: Sequence[Arg] = (), inputs: Sequence[np.ndarray] = (),
             outputs: Sequence[np.ndarray] = (), timeout: float | None = None, comm: int = 0) -> Reply:
        if self._forked:
            raise RuntimeError("comm is its rank's: a process the solution forked cannot call it "
                               "(MPI's are not either); hand the child's results back to the rank")
        if self._opener is None:
            with self._first_in_turn:
                return self.first.call(op, args, inputs, outputs, timeout, comm)
        if threading.get_ident() == self._owner:
            return self.first.call(op, args, inputs, outputs, timeout, comm)
        line = self._take()
        try:
            return line.call(op, args, inputs, outputs, timeout, comm)
        finally:
            with self._changed:
                self._idle.append(line)
                self._changed.notify()

    def _take(self) -> LearnerEnd:
        with self._changed:
            while not self._idle and self._opened >= MAX_FURTHER:
                self._changed.wait()
            if self._idle:
                return self._idle.pop()
            self._opened += 1
            try:  # under the condition's lock: one request on the opener at a time
                return self._open()
            except BaseException:
                self._opened -= 1
                raise

    def _open(self) -> LearnerEnd:
        assert self._opener is not None
        try:
            self._opener.sendall(_ASK)
            answer, fds, _, _ = socket.recv_fds(self._opener, 256, 3)
        except OSError as exc:
            raise NoMoreLines(f"the agent opened no line for this thread's call ({exc})") from None
        if answer != _GIVEN or len(fds) != 3:
            for fd in fds:
                socket.close(fd)
            why = answer[1:].decode(errors="replace") or "it closed the opener"
            raise NoMoreLines(f"the agent opened no line for this thread's call: {why}")
        arena_fd, read_fd, write_fd = fds
        return LearnerEnd.attach(arena_fd, FURTHER_ARENA_BYTES, (read_fd, write_fd), self.first.spin_s)


# -- the agent's side --------------------------------------------------------------------------


class _Serving(threading.local):
    # A class attribute: a thread that set none reads it without the AttributeError that
    # getattr's default costs on every reply.
    end: AgentEnd | None = None


class Switch:
    """The end a handler answers on: the line its request came on. A further line's thread says
    which (``serving``); every other thread answers on the first."""

    def __init__(self, first: AgentEnd) -> None:
        self._first = first
        self._local = _Serving()

    @property
    def end(self) -> AgentEnd:
        return self._local.end or self._first

    def serving(self, end: AgentEnd) -> None:
        self._local.end = end

    def reply(self, request: Request, ints: Sequence[int] = (), floats: Sequence[float] = (),
              outputs: Sequence[np.ndarray | None] = ()) -> None:
        self.end.reply(request, ints, floats, outputs)

    def fail(self, request: Request, error: BaseException) -> None:
        self.end.fail(request, error)

    def reject(self, request: Request, reason: str) -> Rejected:
        return self.end.reject(request, reason)


class AgentLines:
    """Opens the learner's further lines as it asks, each served by ``serve`` in a thread."""

    def __init__(self, opener: socket.socket, child_opener: socket.socket, first: AgentEnd) -> None:
        self._opener = opener
        self._child_opener: socket.socket | None = child_opener
        self._first = first
        self.further: list[AgentEnd] = []
        self._pid = 0
        self._serve: Callable[[AgentEnd], None] = lambda end: None
        self._refused: Callable[[str], None] = lambda reason: None

    @classmethod
    def create(cls, first: AgentEnd) -> AgentLines:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        return cls(mine, theirs, first)

    @property
    def child_fd(self) -> int:
        """The opener's descriptor that the learner process must inherit."""
        assert self._child_opener is not None, "the child's end was closed by start()"
        return self._child_opener.fileno()

    def start(self, pid: int, serve: Callable[[AgentEnd], None], refused: Callable[[str], None]) -> None:
        """Answers the learner process ``pid`` from now on: each line it opens is served by
        ``serve`` in a thread of its own, and ``refused`` hears why an ask was refused. Closes
        this process's copy of the learner's end. No thread waits for the asks: the agent's
        watcher of its learner does (rank/sealed.py), a single-threaded learner never asks, and
        each thread's stack would count against the rank's address-space limit."""
        self._pid, self._serve, self._refused = pid, serve, refused
        if self._child_opener is not None:
            self._child_opener.close()
            self._child_opener = None

    def fileno(self) -> int:
        """The opener, for select(): readable when the learner asked (or closed it)."""
        return self._opener.fileno()

    def answer(self) -> bool:
        """Answers the asks waiting on the opener; False once the learner closed it or died."""
        try:
            asked = self._opener.recv(64, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return bool(asked) and all(self._open_one() for _ in asked)

    def _open_one(self) -> bool:
        """Opens a line and hands it over; False when the opener is gone, or closed here."""
        if len(self.further) >= MAX_FURTHER:
            return self._close_on(f"it asked for more than {MAX_FURTHER} further lines, which its "
                                  f"own client never opens")
        # Made and started before it is handed over: a rank near its memory limit may have no
        # room for another arena or thread stack, and the learner's thread hears so.
        go = threading.Event()
        try:
            end = AgentEnd.create(FURTHER_ARENA_BYTES, spin_s=self._first.spin_s)
        except (OSError, MemoryError) as exc:
            return self._send(_REFUSED + f"no room for another arena ({exc})".encode()[:200], [])
        try:
            threading.Thread(target=self._serve_when, args=(end, go), name="seal-line", daemon=True).start()
        except RuntimeError as exc:
            end.close()
            return self._send(_REFUSED + f"no room for another thread ({exc})".encode()[:200], [])
        if not self._send(_GIVEN, list(end.child_fds)):
            end.shut()
            go.set()  # its thread reads EOF and leaves
            return False
        end.watch(self._pid)
        self.further.append(end)
        go.set()
        return True

    def _serve_when(self, end: AgentEnd, go: threading.Event) -> None:
        go.wait()
        self._serve(end)

    def _send(self, answer: bytes, fds: list[int]) -> bool:
        try:
            # Never blocks: a learner that asks without reading its answers fills only its own
            # socket, and is refused from then on.
            socket.send_fds(self._opener, [answer], fds, socket.MSG_DONTWAIT)
            return True
        except BlockingIOError:
            return self._close_on("it asked for lines without reading the answers")
        except OSError:
            return False

    def _close_on(self, tampering: str) -> bool:
        """Names the tampering once and answers no more asks: a learner that kept asking would
        otherwise keep its agent's watcher answering, and the reasons piling up."""
        self._refused(tampering)
        with contextlib.suppress(OSError):
            self._opener.shutdown(socket.SHUT_RDWR)
        return False

    def where(self) -> str:
        """Where the learner process is: in a call on its first line, else in one on a further
        line (a thread's, while the main thread waits between calls), else where the first is."""
        for end in self.every():
            where = end.where()
            if where.startswith("in "):
                return where
        return self._first.where()

    def every(self) -> list[AgentEnd]:
        """The first line and every further one."""
        return [self._first, *self.further]

    def close(self) -> None:
        """Closes the opener and wakes every further line's thread (it reads EOF). Their arenas
        stay mapped: a thread may still be in a call on one, and the process is about to end."""
        for end in [*self.further]:
            end.shut()
        self._opener.close()
        if self._child_opener is not None:
            self._child_opener.close()
