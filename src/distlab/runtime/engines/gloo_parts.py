"""The pieces of the gloo engine (gloo.py) below the engine itself: torch imported lazily, arrays
as tensors, the requests of nonblocking calls (a helper thread stands in for ``Work.test``), the
background queue that makes small sends eager, and the mailbox for messages to self.
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ...ops import Op
from .base import ANY_SOURCE, ANY_TAG

_TORCH: Any = None
_DIST: Any = None

# The tag a receive uses when asked for ANY_TAG (see the module docstring).
WILDCARD_TAG = 0

_REDUCE_OPS = {"SUM": "SUM", "PROD": "PRODUCT", "MAX": "MAX", "MIN": "MIN"}


def _torch() -> tuple[Any, Any]:
    global _TORCH, _DIST
    if _TORCH is None:
        import torch
        import torch.distributed as dist

        _TORCH, _DIST = torch, dist
    return _TORCH, _DIST


def _reduce_op(op: Op) -> Any:
    _, dist = _torch()
    try:
        return getattr(dist.ReduceOp, _REDUCE_OPS[op.name])
    except KeyError:
        raise TypeError(f"the gloo engine has no reduction {op.name!r}") from None


def _bytes(arr: np.ndarray, into: bool = False) -> Any:
    """A uint8 tensor over the array's memory, for transfers that need no element type.

    ``into``: the transfer writes the array (a receive), so it must be writable.
    """
    torch, _ = _torch()
    flat = arr.reshape(-1).view(np.uint8)
    if not flat.flags.writeable:
        if into:
            raise ValueError("the receive buffer is read-only")
        # torch.from_numpy warns on read-only arrays; a send buffer may be one, so send a copy.
        flat = flat.copy()
    return torch.from_numpy(flat)


def _typed(arr: np.ndarray) -> Any:
    """A tensor of the array's dtype over its memory (writes land in ``arr``)."""
    torch, _ = _torch()
    return torch.from_numpy(arr.reshape(-1))


class _Done:
    """A request that completed when it was made (a message to or from the own rank)."""

    def __init__(self, source: int, tag: int) -> None:
        self._result = (source, tag)

    def wait(self) -> tuple[int, int]:
        return self._result

    def test(self) -> bool:
        return True

    def cancel(self) -> bool:
        return False  # done already


class _Request:
    """A pending isend/irecv: torch's ``Work`` plus what MPI's status would report.

    A cancellable receive (``into``: the caller's array) lands in ``keep``, a scratch tensor of
    its own, and is copied into ``into`` when it completes: gloo cannot withdraw a posted
    receive, so ``cancel`` leaves it posted, as an orphan (``orphaned``) that writes nothing of
    the caller's, until a later receive adopts it (engines/gloo_orphans.py)."""

    def __init__(self, work: Any, keep: Any, is_recv: bool, source: int, tag: int,
                 into: np.ndarray | None = None, on_orphan: Any = None) -> None:
        self._work = work
        self._keep = keep  # the tensor under the transfer, alive until it completes
        self._is_recv = is_recv
        self._source = source  # group rank, or ANY_SOURCE until the receive has matched
        self._tag = tag
        self._into = into
        self._on_orphan = on_orphan  # hands an orphan to its engine's Orphans
        self.orphaned = False
        self.adopted = False  # a later receive took it over (an orphan again goes first)
        self._done = False
        self._waiter: threading.Thread | None = None
        self._finished = threading.Event()
        self._error: BaseException | None = None

    def _complete(self) -> None:
        if self._is_recv and self._source == ANY_SOURCE:
            # The group rank of the sender (``dist.recv`` does the same; the public
            # ``source_rank`` spelling prints a deprecation warning).
            self._source = int(self._work._source_rank())
        if not self.orphaned:  # an orphan keeps its bytes for the receive that adopts it
            if self._into is not None:
                target = self._into.reshape(-1).view(np.uint8)
                landed = self._keep.numpy()
                target[: landed.size] = landed[: target.size]
            self._keep = None
        self._done = True

    def cancel(self) -> bool:
        """Orphans a cancellable receive not completed yet (see the class docstring); a send,
        or a receive that completed, stays as it is (False)."""
        if self._into is None or self.test():
            return False
        self.orphaned = True
        if self._on_orphan is not None:
            self._on_orphan(self)
        return True

    def adopt(self, into: np.ndarray) -> _Request:
        """This orphan as the request of a new receive into ``into`` (from the same source,
        with the same tag): what it brings, or has brought, is that receive's message."""
        self._into, self.orphaned, self.adopted = into, False, True
        if self._done:  # it completed while orphaned: its bytes wait in ``keep``
            self._done = False
            self._complete()
        return self

    def wait(self) -> tuple[int, int]:
        if not self._done:
            if self._waiter is None:
                self._work.wait()
            else:
                self._finished.wait()
                if self._error is not None:
                    raise self._error
            self._complete()
        return (self._source, self._tag) if self._is_recv else (ANY_SOURCE, ANY_TAG)

    def test(self) -> bool:
        if self._done:
            return True
        if self._waiter is None:
            # Gloo's Work never reports completion before wait() (see the module docstring), so a
            # helper thread waits and the caller polls its flag. Started on the first test only:
            # plain Isend/Irecv + Wait costs no thread.
            self._waiter = threading.Thread(target=self._wait_in_thread, daemon=True)
            self._waiter.start()
        if self._finished.is_set():
            self.wait()
            return True
        return False

    def _wait_in_thread(self) -> None:
        try:
            self._work.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's wait()
            self._error = exc
        self._finished.set()


class _CollRequest:
    """A pending nonblocking collective: torch's ``Work``, whose completion gloo does report."""

    def __init__(self, work: Any, keep: Any, then: Any = None) -> None:
        self._work = work
        self._keep = keep  # the tensors under the collective, alive until it completes
        self._then = then  # what to do once it has (copy a block out), or None
        self._done = False

    def wait(self) -> tuple[int, int]:
        if not self._done:
            self._work.wait()
            self._done = True
            if self._then is not None:
                self._then()
            self._keep = self._then = None
        return ANY_SOURCE, ANY_TAG

    def test(self) -> bool:
        if not self._done and self._work.is_completed():
            self.wait()  # returns at once; raises if the collective failed
        return self._done

    def cancel(self) -> bool:
        return False  # a collective cannot be withdrawn


class _EagerSends:
    """Standard-mode sends below the eager limit: a copy goes out in the background.

    One daemon thread waits on the pending works in order and drops them (and their copies) once
    each receiver has taken its message. A failed transfer (its peer died) is kept and raised by
    the next call into any engine of this process: the send itself has long returned, as an eager
    MPI send has when its failure shows. A send that fails once its group is closing is no
    failure: nobody received it while the group lived (a task's message left unreceived), and
    the group's members closing their ends is what failed it.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def add(self, work: Any, keep: Any, closing: Callable[[], bool]) -> None:
        """``closing``: whether the group it was sent on is being closed (or is)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._reap, daemon=True)
            self._thread.start()
        self._queue.put((work, keep, closing))

    def _reap(self) -> None:
        while True:
            work, keep, closing = self._queue.get()
            try:
                work.wait()
            except BaseException as exc:  # noqa: BLE001 - reported by the engine later
                if self.error is None and not closing():
                    self.error = exc
            del work, keep, closing
            self._queue.task_done()

    def drain(self, timeout_s: float) -> bool:
        """Waits until every pending send was received; False if some still wait after timeout.
        Waits on the queue's own condition (what Queue.join waits on, with a timeout): asked
        between every two tasks, a helper thread per call would stay blocked for good behind a
        message nobody receives."""
        finished = self._queue.all_tasks_done
        with finished:
            return finished.wait_for(lambda: self._queue.unfinished_tasks == 0, timeout_s)


# Process-wide: a sub-group engine may be dropped right after its task while its last eager
# sends are still on their way, and their works and copies must outlive it.
_EAGER = _EagerSends()


class _SelfMailbox:
    """Messages a rank sends to itself (gloo has no pair to the own rank).

    A send to self is always buffered (never blocks); a receive from self takes the oldest queued
    message with a matching tag (here ANY_TAG is a true wildcard: gloo is not involved), or is
    completed later by the send if it was posted first with ``irecv``.
    """

    def __init__(self) -> None:
        self._queued: collections.deque[tuple[int, np.ndarray]] = collections.deque()
        self._posted: list[tuple[np.ndarray, int, _SelfRecv]] = []

    def deliver(self, data: np.ndarray, tag: int) -> None:
        for i, (buf, want, request) in enumerate(self._posted):
            if want in (ANY_TAG, tag):
                del self._posted[i]
                _copy_bytes(data, buf)
                request.complete(tag)
                return
        self._queued.append((tag, data.copy()))

    @property
    def queued(self) -> int:
        """How many messages wait for a receive."""
        return len(self._queued)

    def take(self, buf: np.ndarray, tag: int) -> int | None:
        for i, (got_tag, data) in enumerate(self._queued):
            if tag in (ANY_TAG, got_tag):
                del self._queued[i]
                _copy_bytes(data, buf)
                return got_tag
        return None

    def post(self, buf: np.ndarray, tag: int, rank: int) -> "_SelfRecv":
        request = _SelfRecv(rank, self)
        got_tag = self.take(buf, tag)
        if got_tag is not None:
            request.complete(got_tag)
        else:
            self._posted.append((buf, tag, request))
        return request

    def withdraw(self, request: "_SelfRecv") -> bool:
        """Takes a posted receive back (its timeout passed); False if a send completed it."""
        for i, (_, _, posted) in enumerate(self._posted):
            if posted is request:
                del self._posted[i]
                return True
        return False


class _SelfRecv:
    """An irecv from the own rank; completed by a later send to self (or never: a deadlock)."""

    def __init__(self, rank: int, mailbox: _SelfMailbox | None = None) -> None:
        self._rank = rank
        self._mailbox = mailbox
        self._tag = ANY_TAG
        self._finished = threading.Event()

    def cancel(self) -> bool:
        return self._mailbox is not None and self._mailbox.withdraw(self)

    def complete(self, tag: int) -> None:
        self._tag = tag
        self._finished.set()

    def wait(self) -> tuple[int, int]:
        # Only this rank's own thread could have sent the message, so if it is missing now it never
        # comes: waiting forever is what MPI does too, and the supervisor reports the rank as
        # blocked on itself.
        self._finished.wait()
        return self._rank, self._tag

    def test(self) -> bool:
        return self._finished.is_set()


def _copy_bytes(data: np.ndarray, buf: np.ndarray) -> None:
    src = data.reshape(-1).view(np.uint8)
    dst = buf.reshape(-1).view(np.uint8)
    if src.size > dst.size:
        raise ValueError(
            f"message truncated: {src.size} bytes sent to self, the receive buffer holds {dst.size}"
        )
    dst[: src.size] = src
