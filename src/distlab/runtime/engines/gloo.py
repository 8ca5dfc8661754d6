"""The torch.distributed engine: the gloo backend over TCP, started the way torchrun starts ranks.

Everything goes through ``torch.distributed``'s functional API on CPU tensors made with
``torch.from_numpy``, which shares memory with the caller's array: a receive or a collective lands in
the learner's buffer with no copy back. Torch is imported lazily, on the first engine built, so that
importing this module (the worker does it before it knows the backend is used) stays cheap.

Where gloo differs from MPI, and what this engine does about it:

* A gloo send always waits for the receiver to post a matching receive (a rendezvous, at every
  size). MPI's standard-mode ``Send`` returns at once below the eager limit. ``send`` therefore
  honours ``synchronous=False`` by sending a private copy in the background (what an eager MPI
  transport does with its bounce buffers), so the same learner code deadlocks or not on both engines.
* Gloo matches tags exactly and has no tag wildcard: ``ANY_TAG`` on a receive becomes tag 0 (the
  default send tag of ``comm.Send``/``Sendrecv``), and the status reports tag 0.
* ``Work.is_completed()`` of a gloo send/receive stays False until someone calls ``wait()``, and
  ``Work.get_future()`` is not implemented for them; ``test`` therefore waits in a helper thread.
* Gloo has no pair to the own rank: messages to self go through a local mailbox instead.
* Gloo has no reduce-scatter: it is an allreduce on a copy, then this rank's block is copied out.
* A nonblocking allreduce is ``all_reduce(..., async_op=True)`` on a tensor over ``recvbuf`` (the
  send buffer copied in first): gloo runs it on its own threads while the caller goes on.
* Point-to-point transfers, broadcasts and allgathers move raw bytes (a ``uint8`` view), so any
  NumPy dtype works there; reductions use the array's own dtype, which torch must support.
"""

from __future__ import annotations

import collections
import os
import queue
import sys
import threading
from datetime import timedelta
from typing import Any

import numpy as np

from ...ops import Op
from .base import ANY_SOURCE, ANY_TAG

_TORCH: Any = None
_DIST: Any = None

# The tag a receive uses when asked for ANY_TAG (see the module docstring).
WILDCARD_TAG = 0

# How long the world's ``close`` waits for background (eager) sends to be taken by their receivers
# before it tears the process group down anyway.
_DRAIN_S = 2.0

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


class _Request:
    """A pending isend/irecv: torch's ``Work`` plus what MPI's status would report."""

    def __init__(self, work: Any, keep: Any, is_recv: bool, source: int, tag: int) -> None:
        self._work = work
        self._keep = keep  # the tensor under the transfer, alive until it completes
        self._is_recv = is_recv
        self._source = source  # group rank, or ANY_SOURCE until the receive has matched
        self._tag = tag
        self._done = False
        self._waiter: threading.Thread | None = None
        self._finished = threading.Event()
        self._error: BaseException | None = None

    def _complete(self) -> None:
        if self._is_recv and self._source == ANY_SOURCE:
            # The group rank of the sender (``dist.recv`` does the same; the public
            # ``source_rank`` spelling prints a deprecation warning).
            self._source = int(self._work._source_rank())
        self._keep = None
        self._done = True

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

    def __init__(self, work: Any, keep: Any) -> None:
        self._work = work
        self._keep = keep  # the tensor over recvbuf, alive until the collective completes
        self._done = False

    def wait(self) -> tuple[int, int]:
        if not self._done:
            self._work.wait()
            self._done = True
            self._keep = None
        return ANY_SOURCE, ANY_TAG

    def test(self) -> bool:
        if not self._done and self._work.is_completed():
            self.wait()  # returns at once; raises if the collective failed
        return self._done


class _EagerSends:
    """Standard-mode sends below the eager limit: a copy goes out in the background.

    One daemon thread waits on the pending works in order and drops them (and their copies) once
    each receiver has taken its message. A failed transfer (its peer died) is kept and raised by
    the next call into any engine of this process: the send itself has long returned, as an eager
    MPI send has when its failure shows.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def add(self, work: Any, keep: Any) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._reap, daemon=True)
            self._thread.start()
        self._queue.put((work, keep))

    def _reap(self) -> None:
        while True:
            work, keep = self._queue.get()
            try:
                work.wait()
            except BaseException as exc:  # noqa: BLE001 - reported by the engine later
                if self.error is None:
                    self.error = exc
            del work, keep
            self._queue.task_done()

    def drain(self, timeout_s: float) -> bool:
        """Waits until every pending send was received; False if some still wait after timeout."""
        done = threading.Event()

        def join() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=join, daemon=True).start()
        return done.wait(timeout_s)


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

    def take(self, buf: np.ndarray, tag: int) -> int | None:
        for i, (got_tag, data) in enumerate(self._queued):
            if tag in (ANY_TAG, got_tag):
                del self._queued[i]
                _copy_bytes(data, buf)
                return got_tag
        return None

    def post(self, buf: np.ndarray, tag: int, rank: int) -> "_SelfRecv":
        request = _SelfRecv(rank)
        got_tag = self.take(buf, tag)
        if got_tag is not None:
            request.complete(got_tag)
        else:
            self._posted.append((buf, tag, request))
        return request


class _SelfRecv:
    """An irecv from the own rank; completed by a later send to self (or never: a deadlock)."""

    def __init__(self, rank: int) -> None:
        self._rank = rank
        self._tag = ANY_TAG
        self._finished = threading.Event()

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


class GlooEngine:
    name = "gloo"

    def __init__(
        self,
        group: Any,
        rank: int,
        size: int,
        world_ranks: list[int],
        timeout: timedelta,
        is_world: bool,
    ) -> None:
        self._group = group
        self.rank = rank
        self.size = size
        self.world_ranks = world_ranks
        self._timeout = timeout
        self._is_world = is_world
        self._mailbox = _SelfMailbox()
        self._closed = False

    @property
    def raw(self) -> Any:
        """The torch ProcessGroup underneath (for the harness, never for learner code)."""
        return self._group

    def _check_eager(self) -> None:
        if _EAGER.error is not None:
            error, _EAGER.error = _EAGER.error, None
            raise RuntimeError(f"an earlier buffered send failed: {error}") from error

    # -- point to point ---------------------------------------------------------------------
    # Ranks are ranks of this group; torch translates them with group_dst/group_src.

    def send(self, buf: np.ndarray, dest: int, tag: int, synchronous: bool) -> None:
        self._check_eager()
        if dest == self.rank:
            self._mailbox.deliver(buf, tag)
            return
        _, dist = _torch()
        if synchronous:
            # A gloo send returns once the receiver has matched it: MPI's Ssend.
            dist.send(_bytes(buf), group=self._group, group_dst=dest, tag=tag)
            return
        # Standard mode below the eager limit: return at once, as MPI does, by handing gloo a copy
        # (the caller may reuse buf as soon as we return).
        data = _bytes(buf).clone()
        _EAGER.add(dist.isend(data, group=self._group, group_dst=dest, tag=tag), data)

    def recv(self, buf: np.ndarray, source: int, tag: int) -> tuple[int, int]:
        self._check_eager()
        if source == self.rank or source == ANY_SOURCE:
            # A message already sent to self matches first. (A wildcard receive that finds none
            # waits on the other ranks only: this process cannot send to itself while blocked.)
            got_tag = self._mailbox.take(buf, tag)
            if got_tag is not None:
                return self.rank, got_tag
            if source == self.rank:
                return _SelfRecv(self.rank).wait()  # never returns: MPI deadlocks here too
        return self.irecv(buf, source, tag).wait()

    def isend(
        self, buf: np.ndarray, dest: int, tag: int, synchronous: bool = True
    ) -> _Request | _Done:
        self._check_eager()
        if dest == self.rank:
            self._mailbox.deliver(buf, tag)
            return _Done(ANY_SOURCE, ANY_TAG)
        if not synchronous:
            # Below the eager limit an MPI Isend completes without the receiver: same here.
            self.send(buf, dest, tag, synchronous=False)
            return _Done(ANY_SOURCE, ANY_TAG)
        _, dist = _torch()
        tensor = _bytes(buf)
        work = dist.isend(tensor, group=self._group, group_dst=dest, tag=tag)
        return _Request(work, tensor, is_recv=False, source=dest, tag=tag)

    def irecv(self, buf: np.ndarray, source: int, tag: int) -> _Request | _Done | _SelfRecv:
        self._check_eager()
        if source == self.rank:
            return self._mailbox.post(buf, tag, self.rank)
        if source == ANY_SOURCE:
            got_tag = self._mailbox.take(buf, tag)
            if got_tag is not None:
                return _Done(self.rank, got_tag)
        torch, dist = _torch()
        gloo_tag = WILDCARD_TAG if tag == ANY_TAG else tag
        tensor = _bytes(buf, into=True)
        if source == ANY_SOURCE:
            if tensor.numel() == 0:
                # Gloo refuses an empty buffer for a receive from any source (an empty one from a
                # given source is fine); a receive may be larger than the message, so take the
                # zero-byte message into a one-byte scratch buffer instead.
                tensor = torch.empty(1, dtype=torch.uint8)
            work = dist.irecv(tensor, group=self._group, tag=gloo_tag)
        else:
            work = dist.irecv(tensor, group=self._group, group_src=source, tag=gloo_tag)
        return _Request(work, tensor, is_recv=True, source=source, tag=gloo_tag)

    def sendrecv(
        self,
        sendbuf: np.ndarray,
        dest: int,
        sendtag: int,
        recvbuf: np.ndarray,
        source: int,
        recvtag: int,
    ) -> tuple[int, int]:
        # The send is in flight while this rank receives, so ranks exchanging in a ring (or a pair)
        # never wait on each other's sends.
        sending = self.isend(sendbuf, dest, sendtag)
        matched = self.recv(recvbuf, source, recvtag)
        sending.wait()
        return matched

    # -- collectives ------------------------------------------------------------------------
    # The arrays come from comm.py: contiguous, and sendbuf never shares memory with recvbuf.

    def barrier(self) -> None:
        self._check_eager()
        _, dist = _torch()
        dist.barrier(group=self._group)

    def bcast(self, buf: np.ndarray, root: int) -> None:
        self._check_eager()
        _, dist = _torch()
        dist.broadcast(_bytes(buf, into=self.rank != root), group=self._group, group_src=root)

    def reduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op, root: int) -> None:
        self._check_eager()
        _, dist = _torch()
        # torch reduces in place, and gloo may use the tensor as scratch on the other ranks too:
        # the root reduces in recvbuf, the others in a copy (their sendbuf must stay intact, and
        # their recvbuf may be any scratch array, even of another size).
        if self.rank == root:
            recvbuf.reshape(-1)[...] = sendbuf.reshape(-1)
            work = recvbuf
        else:
            work = sendbuf.copy()
        dist.reduce(_typed(work), group=self._group, group_dst=root, op=_reduce_op(op))

    def allreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op) -> None:
        self._check_eager()
        _, dist = _torch()
        recvbuf.reshape(-1)[...] = sendbuf.reshape(-1)
        dist.all_reduce(_typed(recvbuf), group=self._group, op=_reduce_op(op))

    def iallreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op) -> _CollRequest:
        self._check_eager()
        _, dist = _torch()
        if sendbuf is not recvbuf:
            recvbuf.reshape(-1)[...] = sendbuf.reshape(-1)
        tensor = _typed(recvbuf)
        work = dist.all_reduce(tensor, group=self._group, op=_reduce_op(op), async_op=True)
        return _CollRequest(work, tensor)

    def reduce_scatter(
        self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int], op: Op
    ) -> None:
        # Gloo has no reduce_scatter. An allreduce gives the same values (comm.py charges the
        # traffic of a real reduce-scatter in its counters, not this engine).
        self._check_eager()
        _, dist = _torch()
        whole = sendbuf.reshape(-1).copy()
        dist.all_reduce(_typed(whole), group=self._group, op=_reduce_op(op))
        start = sum(counts[: self.rank])
        mine = counts[self.rank]
        recvbuf.reshape(-1)[:mine] = whole[start : start + mine]

    def allgather(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
        self._check_eager()
        _, dist = _torch()
        # Views of recvbuf, one block per rank in rank order: gloo copies each rank's block
        # straight into place (zero-length blocks included).
        out = _bytes(recvbuf, into=True)
        block = sendbuf.nbytes
        blocks = [out[i * block : (i + 1) * block] for i in range(self.size)]
        dist.all_gather(blocks, _bytes(sendbuf), group=self._group)

    # -- groups and ending ------------------------------------------------------------------

    def split(self, ranks: list[int]) -> GlooEngine | None:
        if not self._is_world:
            # new_group must be called by every rank of the whole job, and ranks outside this
            # engine's group are not calling; torch's member-only variant
            # (use_local_synchronization) names groups by a per-process count that differs
            # between ranks. The worker only ever splits the world.
            raise NotImplementedError("the gloo engine splits the world group only")
        _, dist = _torch()
        members = [self.world_ranks[r] for r in ranks]
        # Every rank calls new_group (it is collective over the default group), in the same order
        # on every rank because split is collective too. sort_ranks=False keeps MPI's order:
        # group rank i is ranks[i].
        group = dist.new_group(ranks=members, timeout=self._timeout, sort_ranks=False)
        if self.rank not in ranks:
            return None
        return GlooEngine(
            group, ranks.index(self.rank), len(ranks), members, self._timeout, is_world=False
        )

    def abort(self, code: int) -> None:
        # Gloo has no job-wide abort: this rank leaves, its peers fail on their next transfer with
        # it (connection closed by peer) or the supervisor finds them stuck, and ends them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def close(self) -> None:
        # Sub-groups: nothing. Their peers may still be finishing a transfer with this rank, and
        # the world's close below destroys every group at once.
        if not self._is_world or self._closed:
            return
        self._closed = True
        _, dist = _torch()
        # Leave together: a rank that tears its sockets down while peers still talk to each other
        # over the same mesh makes their pairs fail.
        dist.barrier(group=self._group)
        if _EAGER.drain(_DRAIN_S):
            dist.destroy_process_group()
        # Otherwise a buffered send was never received (an MPI program would drop it at
        # MPI_Finalize); destroying the group under it could hang, so the process just exits.


def world(timeout_s: float = 1800.0) -> GlooEngine:
    """Joins the job's process group from torchrun's variables (RANK, WORLD_SIZE, MASTER_*)."""
    _, dist = _torch()
    try:
        rank = int(os.environ["RANK"])
        size = int(os.environ["WORLD_SIZE"])
    except KeyError as missing:
        raise RuntimeError(
            f"the gloo engine needs torchrun's environment variables ({missing.args[0]} is unset)"
        ) from None
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        dist.init_process_group(
            "gloo", init_method="env://", rank=rank, world_size=size, timeout=timeout
        )
    return GlooEngine(dist.group.WORLD, rank, size, list(range(size)), timeout, is_world=True)
