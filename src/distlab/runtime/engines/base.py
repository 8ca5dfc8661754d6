"""The interface every engine implements, on contiguous NumPy buffers only.

Call order for a rank: an engine is made once per process (``mpi.world()`` or ``gloo.world()``),
sub-groups come from ``split`` (a collective call over every rank of the parent, as MPI_Comm_split),
and ``close`` runs once at the end. Ranks given to and returned by the methods are ranks in *this*
engine's group; ``world_ranks`` maps them to ranks of the whole job (for reports and the wait-for
graph). ``path`` names the group the same way on each of its members and differently from every
other group of the job: "0" is the world, and the n-th split of a group whose path is P gives the
members of color c the path "P/n.c" (every member of P splits in the same order, so n agrees);
``create_group``, which only the new group's members call, names it by its members and tag and
how many groups of the same members and tag they made from P before ("P/g<tag>.<hash>.<n>").
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Protocol

import numpy as np

from ...ops import Op

ANY_SOURCE = -1
ANY_TAG = -1
UNDEFINED = -32766  # a split's color for a rank that joins no group (MPI.UNDEFINED's value in Open MPI)


class EngineRequest(Protocol):
    """A pending nonblocking operation."""

    def wait(self) -> tuple[int, int]:
        """Blocks until done; returns (source, tag) for a receive, (-1, -1) for a send."""
        ...

    def test(self) -> bool:
        """True once the operation has completed (then ``wait`` returns at once)."""
        ...

    def cancel(self) -> bool:
        """Withdraws a receive that has not matched yet (made with ``cancellable``); True when it
        is withdrawn, False when it had completed (or is a send or a collective, which cannot
        be withdrawn: they stay under way)."""
        ...


class Engine(Protocol):
    name: str
    rank: int
    size: int
    world_ranks: list[int]
    path: str

    def send(self, buf: np.ndarray, dest: int, tag: int, synchronous: bool) -> None:
        """Blocking send; ``synchronous`` waits until the receiver has matched it (rendezvous)."""
        ...

    def recv(self, buf: np.ndarray, source: int, tag: int) -> tuple[int, int]:
        """Blocking receive into ``buf``; returns the actual (source, tag). An engine that can tell
        how many bytes arrived (MPI) sets ``received_bytes`` after each blocking receive and on each
        completed receive request; one that cannot (gloo) has none (see ``arrived_bytes``)."""
        ...

    def isend(
        self, buf: np.ndarray, dest: int, tag: int, synchronous: bool = True
    ) -> EngineRequest:
        """Nonblocking send; ``synchronous=False`` (below the eager limit) may complete at once."""
        ...

    def irecv(self, buf: np.ndarray, source: int, tag: int, cancellable: bool = False) -> EngineRequest:
        """Nonblocking receive; ``cancellable``: its request's ``cancel`` may withdraw it (a
        receive with a timeout), which costs gloo a copy (engines/gloo_orphans.py)."""
        ...

    def probe(self, source: int, tag: int, block: bool) -> tuple[int, int, int] | None:
        """(source, tag, bytes) of a message that a receive from (source, tag) would match,
        without receiving it; waits for one when ``block``, else None if none is there yet."""
        ...

    def sendrecv(
        self,
        sendbuf: np.ndarray,
        dest: int,
        sendtag: int,
        recvbuf: np.ndarray,
        source: int,
        recvtag: int,
    ) -> tuple[int, int]: ...

    def barrier(self) -> None: ...

    def bcast(self, buf: np.ndarray, root: int) -> None: ...

    def reduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op, root: int) -> None:
        """``recvbuf`` matters on the root only (other ranks may pass a scratch array).

        Reductions are in place when ``sendbuf is recvbuf`` (the same array object)."""
        ...

    def allreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op) -> None: ...

    def iallreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op) -> EngineRequest:
        """Nonblocking allreduce; in place when ``sendbuf is recvbuf``. ``recvbuf`` holds the
        result once the request has completed; neither buffer may be touched before that."""
        ...

    def ibcast(self, buf: np.ndarray, root: int) -> EngineRequest:
        """Nonblocking bcast: ``buf`` holds the root's data once the request has completed."""
        ...

    def iallgather(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> EngineRequest: ...

    def ireduce_scatter_block(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op) -> EngineRequest:
        """Nonblocking reduce-scatter of ``size`` equal blocks: block r of the reduction lands in
        rank r's ``recvbuf`` once the request has completed."""
        ...

    def reduce_scatter(
        self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int], op: Op
    ) -> None:
        """Element-wise reduction of ``sendbuf``; rank r receives the r-th block of ``counts``."""
        ...

    # The nonblocking form of each blocking collective, with the blocking one's arguments: what a
    # call with a timeout polls until its deadline (runtime/comm/timed.py).

    def ibarrier(self) -> EngineRequest: ...

    def ireduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Op, root: int) -> EngineRequest: ...

    def ireduce_scatter(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int],
                        op: Op) -> EngineRequest: ...

    def igather(self, sendbuf: np.ndarray, recvbuf: np.ndarray | None, root: int) -> EngineRequest: ...

    def iscatter(self, sendbuf: np.ndarray | None, recvbuf: np.ndarray, root: int) -> EngineRequest: ...

    def iallgatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int],
                    displs: list[int]) -> EngineRequest: ...

    def ialltoall(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> EngineRequest: ...

    def ialltoallv(self, sendbuf: np.ndarray, send_layout: tuple[list[int], list[int]],
                   recvbuf: np.ndarray, recv_layout: tuple[list[int], list[int]]) -> EngineRequest: ...

    def allgather(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
        """``recvbuf`` holds ``size`` blocks of ``sendbuf.size`` elements, in rank order."""
        ...

    def gather(self, sendbuf: np.ndarray, recvbuf: np.ndarray | None, root: int) -> None:
        """The root's ``recvbuf`` holds ``size`` blocks of ``sendbuf``'s size, in rank order;
        ``recvbuf`` is None on the other ranks."""
        ...

    def scatter(self, sendbuf: np.ndarray | None, recvbuf: np.ndarray, root: int) -> None:
        """Rank r receives the r-th of the root's ``size`` equal blocks of ``sendbuf`` (None on
        the other ranks)."""
        ...

    def allgatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int],
                   displs: list[int]) -> None:
        """Rank r's ``counts[r]`` elements land in ``recvbuf`` from element ``displs[r]`` on."""
        ...

    def alltoall(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
        """Block j of ``sendbuf`` (``size`` equal blocks) goes to rank j, landing as block r of its
        ``recvbuf`` where r is this rank."""
        ...

    def alltoallv(self, sendbuf: np.ndarray, send_layout: tuple[list[int], list[int]],
                  recvbuf: np.ndarray, recv_layout: tuple[list[int], list[int]]) -> None:
        """Rank j gets ``counts[j]`` elements of ``sendbuf`` from ``displs[j]`` on (the send
        layout); what rank j sends lands in ``recvbuf`` at the receive layout's j-th place."""
        ...

    def split(self, color: int, key: int) -> "Engine | None":
        """MPI_Comm_split, collective over this group: the ranks of each color >= 0 form a group,
        ordered by (key, rank here); None on a rank whose color is UNDEFINED."""
        ...

    def create_group(self, ranks: list[int], tag: int) -> "Engine":
        """MPI_Comm_create_group: a group of these ranks, in this order, made by them alone (the
        other ranks of this group do not call it)."""
        ...

    def abort(self, code: int) -> None:
        """Ends every rank of the job at once."""
        ...

    def drop_unreceived(self) -> int:
        """Once every member is here (collective), receives and drops the messages sent to this
        rank on this group that no receive took; how many. The harness calls it at the end of a
        task, before freeing the task's group: Open MPI gives a freed communicator's context to
        the next one made, where such a message would match a receive of the next task."""
        ...

    def unreceived_anywhere(self) -> bool:
        """Collective over this group: whether a message that any member sent, on any group of
        its process, may still wait for a receive. True where a sender cannot tell (MPI's eager
        sends complete before they are received). The harness asks it between tasks: a task
        after one that left none can run on the world without a new context."""
        ...

    def close(self) -> None: ...


# Requests a call gave up on (its timeout passed) with the arrays under them, kept until the
# process ends: the engine may still write them, and freeing an array under a live request
# corrupts MPI's heap.
_ABANDONED: list[tuple[EngineRequest, object]] = []


def abandon(request: EngineRequest, buffers: object = None) -> None:
    """Lets go of ``request`` without completing it (see ``_ABANDONED``)."""
    _ABANDONED.append((request, buffers))


class Testable(Protocol):
    def test(self) -> bool: ...


def arrived_bytes(receiver: Any, buffer_bytes: int) -> int:
    """The bytes a completed receive took: what ``receiver`` (an engine after a blocking receive,
    or a receive's request) says arrived where its engine can tell (MPI's status count), else the
    receive buffer's size (gloo does not say). The counters count this, not the buffer: a learner
    who received 8-byte messages into buffers of the size a check expects was counted as moving
    them all."""
    got = getattr(receiver, "received_bytes", None)
    return buffer_bytes if got is None else int(got)


def finished_by(request: Testable, deadline: float) -> bool:
    """Polls ``request`` until it completes (True) or ``time.perf_counter()`` passes ``deadline``
    (False): neither engine can wait on a request with a time limit. The pause grows from 20 us
    to 1 ms, so a quick completion is seen at once and a long wait costs little CPU."""
    pause = 20e-6
    while not request.test():
        left = deadline - time.perf_counter()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, 1e-3)
    return True


def split_off(engine: Engine, ranks: list[int]) -> Engine | None:
    """A group of the given ranks of ``engine``, in that order (collective over ``engine``);
    None on the ranks left out."""
    inside = engine.rank in ranks
    return engine.split(0 if inside else UNDEFINED, ranks.index(engine.rank) if inside else 0)


def child_path(parent: str, splits_before: int, color: int) -> str:
    """The path of a group split off ``parent`` (see the module's docstring)."""
    return f"{parent}/{splits_before}.{color}"


class GroupNames:
    """The paths of the groups one engine makes with ``create_group`` (see the module's
    docstring): counted per (members, tag), which every member counts alike."""

    def __init__(self) -> None:
        self._made: dict[tuple[tuple[int, ...], int], int] = {}

    def next(self, parent: str, world_ranks: list[int], tag: int) -> str:
        key = (tuple(world_ranks), tag)
        n = self._made.get(key, 0)
        self._made[key] = n + 1
        members = hashlib.blake2b(repr(key[0]).encode(), digest_size=6).hexdigest()
        return f"{parent}/g{tag}.{members}.{n}"
