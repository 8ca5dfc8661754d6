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

import os
import sys
from datetime import timedelta
from typing import Any

import numpy as np

from ...ops import Op
from .base import ANY_SOURCE, ANY_TAG
from .gloo_parts import (
    _EAGER,
    WILDCARD_TAG,
    _bytes,
    _CollRequest,
    _Done,
    _reduce_op,
    _Request,
    _SelfMailbox,
    _SelfRecv,
    _torch,
    _typed,
)

# How long the world's ``close`` waits for background (eager) sends to be taken by their receivers
# before it tears the process group down anyway.
_DRAIN_S = 2.0


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
    # The arrays come from the proxy (runtime/comm): contiguous, and sendbuf never shares memory with recvbuf.

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
        # Gloo has no reduce_scatter. An allreduce gives the same values (the proxy charges the
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
