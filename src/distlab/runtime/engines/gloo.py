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
* Sub-groups (``split``) are gloo process groups of their members only, made the way
  ``new_group`` makes them (``ProcessGroupGloo`` over a prefix of the job's store) but named by
  the group's path (engines/base.py) instead of torch's per-process group count: ``new_group``
  needs every rank of the job to call it, and its members-only form
  (``use_local_synchronization``) hashes the ranks with the number of groups this process has
  made, which differs between ranks as soon as sibling groups split further. Every call
  therefore goes to the process group object itself (``group.send([t], dst, tag)``, ...), with
  ranks of the group, rather than through the functional API, which knows only groups it made.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any

import numpy as np

from ...ops import MAX, Op
from .base import ANY_SOURCE, ANY_TAG, UNDEFINED, GroupNames, child_path
from .gloo_blocks import BlockCollectives
from .gloo_orphans import Orphans
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

# How long a buffered send may take to report that its receiver took it, between tasks.
_SETTLE_S = 0.05

# Every sub-group made in this process and not closed yet (a close is collective: see close).
_SUB_GROUPS: list[Any] = []
_STORE: Any = None


class GlooEngine(BlockCollectives):
    name = "gloo"

    def __init__(
        self,
        group: Any,
        rank: int,
        size: int,
        world_ranks: list[int],
        timeout: timedelta,
        is_world: bool,
        path: str = "0",
    ) -> None:
        self._group = group
        self.rank = rank
        self.size = size
        self.world_ranks = world_ranks
        self.path = path
        self._timeout = timeout
        self._is_world = is_world
        self._splits = 0
        self._names = GroupNames()
        self._mailbox = _SelfMailbox()
        self._orphans = Orphans()
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
    # Ranks are ranks of this group, as the process group's own methods take them.

    def send(self, buf: np.ndarray, dest: int, tag: int, synchronous: bool) -> None:
        self._check_eager()
        if dest == self.rank:
            self._mailbox.deliver(buf, tag)
            return
        if synchronous:
            # A gloo send returns once the receiver has matched it: MPI's Ssend.
            self._group.send([_bytes(buf)], dest, tag).wait()
            return
        # Standard mode below the eager limit: return at once, as MPI does, by handing gloo a copy
        # (the caller may reuse buf as soon as we return).
        data = _bytes(buf).clone()
        _EAGER.add(self._group.send([data], dest, tag), data, lambda: self._closed)

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
        tensor = _bytes(buf)
        work = self._group.send([tensor], dest, tag)
        return _Request(work, tensor, is_recv=False, source=dest, tag=tag)

    def irecv(self, buf: np.ndarray, source: int, tag: int,
              cancellable: bool = False) -> _Request | _Done | _SelfRecv:
        self._check_eager()
        if source == self.rank:
            return self._mailbox.post(buf, tag, self.rank)
        if source == ANY_SOURCE:
            got_tag = self._mailbox.take(buf, tag)
            if got_tag is not None:
                return _Done(self.rank, got_tag)
        torch, _ = _torch()
        gloo_tag = WILDCARD_TAG if tag == ANY_TAG else tag
        writable = _bytes(buf, into=True)  # refuses a read-only buffer, cancellable or not
        orphan = self._orphans.adopt(source, gloo_tag, buf)
        if orphan is not None:
            return orphan  # it takes this receive's message (engines/gloo_orphans.py)
        tensor = torch.empty_like(writable) if cancellable else writable
        if source == ANY_SOURCE:
            if tensor.numel() == 0:
                # Gloo refuses an empty buffer for a receive from any source (an empty one from a
                # given source is fine); a receive may be larger than the message, so take the
                # zero-byte message into a one-byte scratch buffer instead.
                tensor = torch.empty(1, dtype=torch.uint8)
            work = self._group.recv_anysource([tensor], gloo_tag)
        else:
            work = self._group.recv([tensor], source, gloo_tag)
        if cancellable:
            return _Request(work, tensor, is_recv=True, source=source, tag=gloo_tag, into=buf,
                            on_orphan=lambda r: self._orphans.add(source, gloo_tag, r))
        return _Request(work, tensor, is_recv=True, source=source, tag=gloo_tag)

    def probe(self, source: int, tag: int, block: bool) -> tuple[int, int, int] | None:
        raise NotImplementedError(
            "Probe and Iprobe need MPI: torch.distributed (gloo) cannot look at a message before "
            "receiving it; run with --backend mpi, or send the size first")

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

    # Each blocking collective is its nonblocking form waited on: gloo runs every collective on
    # its own threads, and a call with a timeout polls the same request (runtime/comm/timed.py).

    def barrier(self) -> None:
        self.ibarrier().wait()

    def ibarrier(self) -> _CollRequest:
        self._check_eager()
        return _CollRequest(self._group.barrier(), None)

    def bcast(self, buf: np.ndarray, root: int) -> None:
        self.ibcast(buf, root).wait()

    def reduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op, root: int) -> None:
        self.ireduce(sendbuf, recvbuf, op, root).wait()

    def ireduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op, root: int) -> _CollRequest:
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
        options = dist.ReduceOptions()
        options.rootRank, options.reduceOp = root, _reduce_op(op)
        tensor = _typed(work)
        return _CollRequest(self._group.reduce([tensor], options), tensor)

    def allreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op) -> None:
        self.iallreduce(sendbuf, recvbuf, op).wait()

    def iallreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op) -> _CollRequest:
        self._check_eager()
        if sendbuf is not recvbuf:
            recvbuf.reshape(-1)[...] = sendbuf.reshape(-1)
        tensor = _typed(recvbuf)
        return _CollRequest(self._all_reduce(tensor, op), tensor)

    def _all_reduce(self, tensor: Any, op: Op) -> Any:
        _, dist = _torch()
        options = dist.AllreduceOptions()
        options.reduceOp = _reduce_op(op)
        return self._group.allreduce([tensor], options)

    def ibcast(self, buf: np.ndarray, root: int) -> _CollRequest:
        self._check_eager()
        _, dist = _torch()
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = root, 0
        tensor = _bytes(buf, into=self.rank != root)
        return _CollRequest(self._group.broadcast([tensor], options), tensor)

    def iallgather(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> _CollRequest:
        self._check_eager()
        blocks, send = self._blocks(recvbuf, sendbuf.nbytes), _bytes(sendbuf)
        return _CollRequest(self._group.allgather([blocks], [send]), (blocks, send))

    def ireduce_scatter_block(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op) -> _CollRequest:
        return self.ireduce_scatter(sendbuf, recvbuf, [recvbuf.size] * self.size, op)

    def reduce_scatter(
        self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int], op: Op
    ) -> None:
        self.ireduce_scatter(sendbuf, recvbuf, counts, op).wait()

    def ireduce_scatter(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int],
                        op: Op) -> _CollRequest:
        # Gloo has no reduce_scatter. An allreduce of a copy gives the same values, and this
        # rank's block is copied out once it is done (the proxy charges the traffic of a real
        # reduce-scatter in its counters, not this engine).
        self._check_eager()
        whole = sendbuf.reshape(-1).copy()
        start, mine = sum(counts[: self.rank]), counts[self.rank]

        def copy_out() -> None:
            recvbuf.reshape(-1)[:mine] = whole[start : start + mine]

        return _CollRequest(self._all_reduce(_typed(whole), op), whole, copy_out)

    def allgather(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
        # Views of recvbuf, one block per rank in rank order: gloo copies each rank's block
        # straight into place (zero-length blocks included).
        self.iallgather(sendbuf, recvbuf).wait()

    # -- groups and ending ------------------------------------------------------------------

    def split(self, color: int, key: int) -> GlooEngine | None:
        # Every rank learns every rank's (color, key), as MPI_Comm_split does inside.
        mine = np.array([color, key], dtype=np.int64)
        table = np.empty(2 * self.size, dtype=np.int64)
        self.allgather(mine, table)
        self._splits += 1
        if color == UNDEFINED:
            return None
        pairs = table.reshape(-1, 2)
        ranks = sorted((r for r in range(self.size) if pairs[r, 0] == color),
                       key=lambda r: (int(pairs[r, 1]), r))
        return self._group_of(ranks, child_path(self.path, self._splits - 1, color))

    def create_group(self, ranks: list[int], tag: int) -> GlooEngine:
        world = [self.world_ranks[r] for r in ranks]
        return self._group_of(ranks, self._names.next(self.path, world, tag))

    def _group_of(self, ranks: list[int], path: str) -> GlooEngine:
        """The process group of these ranks of this group (this rank among them), named by path."""
        group = meet_group(path, ranks.index(self.rank), len(ranks), self._timeout)
        return self._made(group, ranks.index(self.rank), [self.world_ranks[r] for r in ranks], path)

    def _made(self, group: Any, rank: int, world_ranks: list[int], path: str) -> GlooEngine:
        """The engine of a group this one made (engines/surviving_gloo.py makes its own kind)."""
        return GlooEngine(group, rank, len(world_ranks), world_ranks, self._timeout, False, path)

    def abort(self, code: int) -> None:
        # Gloo has no job-wide abort: this rank leaves, its peers fail on their next transfer with
        # it (connection closed by peer) or the supervisor finds them stuck, and ends them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def unreceived_anywhere(self) -> bool:
        # A gloo sender knows: a buffered send is pending until its receiver takes it (a send
        # just taken gets a moment to say so); a message to itself waits in the mailbox; an
        # abandoned receive would take a later message (gloo_orphans.py).
        here = bool(self._mailbox.queued) or len(self._orphans) > 0 or not _EAGER.drain(_SETTLE_S)
        flags = np.array([int(here)], dtype=np.int64)
        self.allreduce(flags.copy(), flags, MAX)
        return bool(flags[0])

    def drop_unreceived(self) -> int:
        # Closing a sub-group drops them (its sends fail, and are no failure: gloo_parts.py).
        return 0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._is_world:
            # A sub-group goes as MPI_Comm_free does, collectively: once every member is here no
            # peer is still finishing a transfer with this rank over it, and its threads and
            # connections can go (code that splits on every call would otherwise gather hundreds
            # of them: threads past the address-space limit, sockets past the descriptors).
            self.ibarrier().wait()
            if self._group in _SUB_GROUPS:
                _SUB_GROUPS.remove(self._group)
            self._group = None
            return
        _, dist = _torch()
        # Leave together: a rank that tears its sockets down while peers still talk to each other
        # over the same mesh makes their pairs fail.
        dist.barrier(group=self._group)
        if _EAGER.drain(_DRAIN_S):
            dist.destroy_process_group()
        # Otherwise a buffered send was never received (an MPI program would drop it at
        # MPI_Finalize); destroying the group under it could hang, so the process just exits.


def world(timeout_s: float = 1800.0, store: Any = None) -> GlooEngine:
    """Joins the job's process group from torchrun's variables (RANK, WORLD_SIZE, MASTER_*), or,
    given ``store`` (a client of a store outside the ranks: a job whose ranks survive their peers
    meets at the supervisor's, since rank 0's would die with it), over that store."""
    _, dist = _torch()
    try:
        rank = int(os.environ["RANK"])
        size = int(os.environ["WORLD_SIZE"])
    except KeyError as missing:
        raise RuntimeError(
            f"the gloo engine needs torchrun's environment variables ({missing.args[0]} is unset)"
        ) from None
    timeout = timedelta(seconds=timeout_s)
    if store is not None:
        use_store(store)
    if not dist.is_initialized():
        if store is None:
            dist.init_process_group(
                "gloo", init_method="env://", rank=rank, world_size=size, timeout=timeout
            )
        else:
            dist.init_process_group("gloo", store=dist.PrefixStore("distlab/world", store),
                                    rank=rank, world_size=size, timeout=timeout)
    return GlooEngine(dist.group.WORLD, rank, size, list(range(size)), timeout, True)


def meet_group(path: str, rank: int, size: int, timeout: timedelta) -> Any:
    """A ProcessGroupGloo of ``size`` members, this process its ``rank``: the members meet under
    the group's path in the job's store, as new_group's do under its name; it returns once all of
    them are connected."""
    _, dist = _torch()
    store = dist.PrefixStore(f"distlab/{path}/", _job_store(timeout))
    group = dist.ProcessGroupGloo(store, rank, size, timeout)
    _SUB_GROUPS.append(group)
    return group


def use_store(store: Any) -> None:
    """Groups of this process meet at ``store`` (a rank that joins a running job has no world
    to meet at first: engines/surviving_gloo.py)."""
    global _STORE
    _STORE = store


def _job_store(timeout: timedelta) -> Any:
    """A client of the store the world met at (rank 0 hosts it, from MASTER_ADDR and
    MASTER_PORT, unless ``world`` was given one): where sub-groups meet. One per process, made
    at the first split."""
    global _STORE
    if _STORE is None:
        _, dist = _torch()
        _STORE = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                               is_master=False, timeout=timeout)
    return _STORE
