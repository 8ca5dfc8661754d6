"""The MPI engine: mpi4py over the Open MPI wheel from PyPI."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ops import Op
from .base import UNDEFINED, GroupNames, child_path

_MPI: Any = None


def _mpi() -> Any:
    global _MPI
    if _MPI is None:
        from mpi4py import MPI

        _MPI = MPI
    return _MPI


def _mpi_op(op: Op) -> Any:
    return getattr(_mpi(), op.name)


class _Request:
    def __init__(self, request: Any, is_recv: bool) -> None:
        self._request = request
        self._is_recv = is_recv
        self._status = _mpi().Status()
        self._done = False
        self.received_bytes: int | None = None  # a receive's, once it has completed

    def wait(self) -> tuple[int, int]:
        if not self._done:
            self._request.Wait(self._status)
            self._done = True
        if self._is_recv:
            self.received_bytes = self._status.Get_count(_mpi().BYTE)
            return self._status.Get_source(), self._status.Get_tag()
        return -1, -1

    def test(self) -> bool:
        if not self._done:
            self._done = bool(self._request.Test(self._status))
        return self._done

    def cancel(self) -> bool:
        """Withdraws a receive that has not matched yet (MPI_Cancel); False when it had matched
        (then it has completed, and ``wait`` returns what it received)."""
        if self._done:
            return False
        self._request.Cancel()
        self._request.Wait(self._status)
        self._done = True
        return bool(self._status.Is_cancelled())


class MpiEngine:
    name = "mpi"

    def __init__(self, comm: Any, world_ranks: list[int], path: str = "0") -> None:
        self._comm = comm
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self.world_ranks = world_ranks
        self.path = path
        self._splits = 0
        self._names = GroupNames()
        # One Status for the blocking receives, reused: they run one at a time on a rank.
        self._status = _mpi().Status()
        # The bytes the last blocking receive (Recv, Sendrecv) took: a message may be shorter than
        # its buffer, and the counters count what arrived (the buffer is the learner's to size).
        self.received_bytes: int | None = None

    @property
    def raw(self) -> Any:
        """The mpi4py communicator underneath (for the harness, never for learner code)."""
        return self._comm

    def send(self, buf: np.ndarray, dest: int, tag: int, synchronous: bool) -> None:
        if synchronous:
            self._comm.Ssend(buf, dest, tag)
        else:
            self._comm.Send(buf, dest, tag)

    def recv(self, buf: np.ndarray, source: int, tag: int) -> tuple[int, int]:
        status = self._status
        self._comm.Recv(buf, source, tag, status)
        self.received_bytes = status.Get_count(_mpi().BYTE)
        return status.Get_source(), status.Get_tag()

    def isend(self, buf: np.ndarray, dest: int, tag: int, synchronous: bool = True) -> _Request:
        # MPI's Isend already completes early below the transport's eager limit.
        return _Request(self._comm.Isend(buf, dest=dest, tag=tag), is_recv=False)

    def irecv(self, buf: np.ndarray, source: int, tag: int, cancellable: bool = False) -> _Request:
        # Every MPI receive can be cancelled: ``cancellable`` matters to gloo only.
        return _Request(self._comm.Irecv(buf, source=source, tag=tag), is_recv=True)

    def probe(self, source: int, tag: int, block: bool) -> tuple[int, int, int] | None:
        status = _mpi().Status()
        if block:
            self._comm.Probe(source, tag, status)
        elif not self._comm.Iprobe(source, tag, status):
            return None
        return status.Get_source(), status.Get_tag(), status.Get_count(_mpi().BYTE)

    def sendrecv(
        self,
        sendbuf: np.ndarray,
        dest: int,
        sendtag: int,
        recvbuf: np.ndarray,
        source: int,
        recvtag: int,
    ) -> tuple[int, int]:
        status = self._status
        self._comm.Sendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag, status)
        self.received_bytes = status.Get_count(_mpi().BYTE)
        return status.Get_source(), status.Get_tag()

    def barrier(self) -> None:
        self._comm.Barrier()

    def bcast(self, buf: np.ndarray, root: int) -> None:
        self._comm.Bcast(buf, root=root)

    # The proxy passes the same array as sendbuf and recvbuf for an in-place call.

    def reduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op, root: int) -> None:
        if sendbuf is recvbuf:
            if self.rank == root:
                self._comm.Reduce(_mpi().IN_PLACE, recvbuf, op=_mpi_op(op), root=root)
            else:
                self._comm.Reduce(sendbuf, None, op=_mpi_op(op), root=root)
            return
        self._comm.Reduce(sendbuf, recvbuf, op=_mpi_op(op), root=root)

    def allreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op) -> None:
        send = _mpi().IN_PLACE if sendbuf is recvbuf else sendbuf
        self._comm.Allreduce(send, recvbuf, op=_mpi_op(op))

    def iallreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op) -> _Request:
        send = _mpi().IN_PLACE if sendbuf is recvbuf else sendbuf
        return _Request(self._comm.Iallreduce(send, recvbuf, op=_mpi_op(op)), is_recv=False)

    def ibcast(self, buf: np.ndarray, root: int) -> _Request:
        return _Request(self._comm.Ibcast(buf, root=root), is_recv=False)

    def iallgather(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> _Request:
        return _Request(self._comm.Iallgather(sendbuf, recvbuf), is_recv=False)

    def ireduce_scatter_block(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op) -> _Request:
        return _Request(self._comm.Ireduce_scatter_block(sendbuf, recvbuf, op=_mpi_op(op)),
                        is_recv=False)

    def reduce_scatter(
        self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int], op: Op
    ) -> None:
        self._comm.Reduce_scatter(sendbuf, recvbuf, recvcounts=counts, op=_mpi_op(op))

    # The nonblocking forms of the blocking collectives, which a call with a timeout polls
    # (runtime/comm/timed.py). mpi4py's request holds the buffers until it completes.

    def ibarrier(self) -> _Request:
        return _Request(self._comm.Ibarrier(), is_recv=False)

    def ireduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op, root: int) -> _Request:
        if sendbuf is recvbuf:
            if self.rank == root:
                started = self._comm.Ireduce(_mpi().IN_PLACE, recvbuf, op=_mpi_op(op), root=root)
            else:
                started = self._comm.Ireduce(sendbuf, None, op=_mpi_op(op), root=root)
        else:
            started = self._comm.Ireduce(sendbuf, recvbuf, op=_mpi_op(op), root=root)
        return _Request(started, is_recv=False)

    def ireduce_scatter(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int],
                        op: Op) -> _Request:
        return _Request(self._comm.Ireduce_scatter(sendbuf, recvbuf, recvcounts=counts,
                                                   op=_mpi_op(op)), is_recv=False)

    def igather(self, sendbuf: np.ndarray, recvbuf: np.ndarray | None, root: int) -> _Request:
        return _Request(self._comm.Igather(sendbuf, recvbuf, root=root), is_recv=False)

    def iscatter(self, sendbuf: np.ndarray | None, recvbuf: np.ndarray, root: int) -> _Request:
        return _Request(self._comm.Iscatter(sendbuf, recvbuf, root=root), is_recv=False)

    def iallgatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int],
                    displs: list[int]) -> _Request:
        return _Request(self._comm.Iallgatherv(sendbuf, [recvbuf, (counts, displs)]), is_recv=False)

    def ialltoall(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> _Request:
        return _Request(self._comm.Ialltoall(sendbuf, recvbuf), is_recv=False)

    def ialltoallv(self, sendbuf: np.ndarray, send_layout: tuple[list[int], list[int]],
                   recvbuf: np.ndarray, recv_layout: tuple[list[int], list[int]]) -> _Request:
        return _Request(self._comm.Ialltoallv([sendbuf, send_layout], [recvbuf, recv_layout]),
                        is_recv=False)

    def allgather(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
        self._comm.Allgather(sendbuf, recvbuf)

    def gather(self, sendbuf: np.ndarray, recvbuf: np.ndarray | None, root: int) -> None:
        self._comm.Gather(sendbuf, recvbuf, root=root)

    def scatter(self, sendbuf: np.ndarray | None, recvbuf: np.ndarray, root: int) -> None:
        self._comm.Scatter(sendbuf, recvbuf, root=root)

    def allgatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int],
                   displs: list[int]) -> None:
        self._comm.Allgatherv(sendbuf, [recvbuf, (counts, displs)])

    def alltoall(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
        self._comm.Alltoall(sendbuf, recvbuf)

    def alltoallv(self, sendbuf: np.ndarray, send_layout: tuple[list[int], list[int]],
                  recvbuf: np.ndarray, recv_layout: tuple[list[int], list[int]]) -> None:
        self._comm.Alltoallv([sendbuf, send_layout], [recvbuf, recv_layout])

    def split(self, color: int, key: int) -> MpiEngine | None:
        MPI = _mpi()
        sub = self._comm.Split(MPI.UNDEFINED if color == UNDEFINED else color, key)
        self._splits += 1
        if sub == MPI.COMM_NULL:
            return None
        # Its members' ranks here, by translating its group into ours: no message needed.
        theirs, ours = sub.Get_group(), self._comm.Get_group()
        here = MPI.Group.Translate_ranks(theirs, list(range(sub.Get_size())), ours)
        theirs.Free()
        ours.Free()
        return MpiEngine(sub, [self.world_ranks[r] for r in here],
                         child_path(self.path, self._splits - 1, color))

    def create_group(self, ranks: list[int], tag: int) -> MpiEngine:
        ours = self._comm.Get_group()
        theirs = ours.Incl(ranks)
        sub = self._comm.Create_group(theirs, tag)
        ours.Free()
        theirs.Free()
        world = [self.world_ranks[r] for r in ranks]
        return MpiEngine(sub, world, self._names.next(self.path, world, tag))

    # -- survivors: Open MPI's user-level failure mitigation (engines/surviving.py) ----------

    def revoke(self) -> None:
        self._comm.Revoke()

    def is_revoked(self) -> bool:
        return bool(self._comm.Is_revoked())

    def shrink(self) -> MpiEngine:
        """The survivors of this group, renumbered in their order here (collective over them)."""
        MPI = _mpi()
        sub = self._comm.Shrink()
        theirs, ours = sub.Get_group(), self._comm.Get_group()
        here = MPI.Group.Translate_ranks(theirs, list(range(sub.Get_size())), ours)
        theirs.Free()
        ours.Free()
        self._splits += 1
        return MpiEngine(sub, [self.world_ranks[r] for r in here],
                         f"{self.path}/s{self._splits - 1}")

    def agree(self, flag: int) -> int:
        """MPI_Comm_agree: the bitwise AND of every survivor's flag (fault tolerant)."""
        return int(self._comm.Agree(int(flag)))

    def failed(self) -> list[int]:
        """The ranks of this group this rank knows have failed (MPIX_Comm_get_failed)."""
        MPI = _mpi()
        failed, ours = self._comm.Get_failed(), self._comm.Get_group()
        ranks = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), ours)
        failed.Free()
        ours.Free()
        return sorted(int(r) for r in ranks)

    def ack_failed(self) -> int:
        """Acknowledges every failure known here (wildcard receives and Agree go on without the
        dead); the number acknowledged."""
        return int(self._comm.Ack_failed())

    def spawn(self, command: list[str], count: int, world_ranks: list[int], path: str) -> MpiEngine:
        """``count`` new processes running ``command`` (MPI_Comm_spawn, collective over this
        group, rank 0 its root), merged with this group into one (this group's ranks first, then
        the new ones in their order): the group of ``world_ranks`` named ``path``. The new
        processes merge with ``from_parent`` (engines/admission.py)."""
        inter = self._comm.Spawn(command[0], args=command[1:], maxprocs=count, root=0)
        merged = inter.Merge(high=False)
        _MERGED.append((merged, inter))
        return MpiEngine(merged, world_ranks, path)

    def abort(self, code: int) -> None:
        self._comm.Abort(code)

    def unreceived_anywhere(self) -> bool:
        return True

    def drop_unreceived(self) -> int:
        MPI = _mpi()
        # A message sent before the barrier is in this rank's queue once the barrier is done (the
        # sender sent it first, on the same connection); larger ones are sent only when received.
        self._comm.Barrier()
        status, dropped = MPI.Status(), 0
        while self._comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
            scratch = bytearray(status.Get_count(MPI.BYTE))
            self._comm.Recv([scratch, MPI.BYTE], status.Get_source(), status.Get_tag())
            dropped += 1
        return dropped

    def close(self) -> None:
        if self._comm is _mpi().COMM_WORLD or any(self._comm is m for m, _ in _MERGED):
            # The rank's last close: processes a spawn connected stay connected until every
            # group that joins them is disconnected, and MPI_Finalize would wait on all of them.
            while _MERGED:
                merged, inter = _MERGED.pop(0)
                merged.Free()
                inter.Disconnect()
        else:
            self._comm.Free()


def from_parent(world_ranks: list[int], path: str) -> MpiEngine:
    """In a process that ``spawn`` started: the merged group it belongs to."""
    MPI = _mpi()
    parent = MPI.Comm.Get_parent()
    merged = parent.Merge(high=True)
    _MERGED.append((merged, parent))
    return MpiEngine(merged, world_ranks, path)


# Every group this process's spawns merged (``spawn``, ``from_parent``), in the order they were
# made, the same on every member: disconnected together as the rank ends (``close``).
_MERGED: list[tuple[Any, Any]] = []  # (the merged group, the spawn's intercommunicator)


def world() -> MpiEngine:
    MPI = _mpi()
    return MpiEngine(MPI.COMM_WORLD, list(range(MPI.COMM_WORLD.Get_size())))
