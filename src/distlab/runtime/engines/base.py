"""The interface every engine implements, on contiguous NumPy buffers only.

Call order for a rank: an engine is made once per process (``mpi.world()`` or ``gloo.world()``),
sub-groups come from ``split`` (a collective call over every rank of the parent), and ``close`` runs
once at the end. Ranks given to and returned by the methods are ranks in *this* engine's group;
``world_ranks`` maps them to ranks of the whole job (for reports and the wait-for graph).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ...ops import Op

ANY_SOURCE = -1
ANY_TAG = -1


class EngineRequest(Protocol):
    """A pending nonblocking operation."""

    def wait(self) -> tuple[int, int]:
        """Blocks until done; returns (source, tag) for a receive, (-1, -1) for a send."""
        ...

    def test(self) -> bool:
        """True once the operation has completed (then ``wait`` returns at once)."""
        ...


class Engine(Protocol):
    name: str
    rank: int
    size: int
    world_ranks: list[int]

    def send(self, buf: np.ndarray, dest: int, tag: int, synchronous: bool) -> None:
        """Blocking send; ``synchronous`` waits until the receiver has matched it (rendezvous)."""
        ...

    def recv(self, buf: np.ndarray, source: int, tag: int) -> tuple[int, int]:
        """Blocking receive into ``buf``; returns the actual (source, tag)."""
        ...

    def isend(
        self, buf: np.ndarray, dest: int, tag: int, synchronous: bool = True
    ) -> EngineRequest:
        """Nonblocking send; ``synchronous=False`` (below the eager limit) may complete at once."""
        ...

    def irecv(self, buf: np.ndarray, source: int, tag: int) -> EngineRequest: ...

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

    def reduce_scatter(
        self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int], op: Op
    ) -> None:
        """Element-wise reduction of ``sendbuf``; rank r receives the r-th block of ``counts``."""
        ...

    def allgather(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
        """``recvbuf`` holds ``size`` blocks of ``sendbuf.size`` elements, in rank order."""
        ...

    def split(self, ranks: list[int]) -> "Engine | None":
        """A sub-group of the given ranks (collective over this group); None on ranks left out."""
        ...

    def abort(self, code: int) -> None:
        """Ends every rank of the job at once."""
        ...

    def close(self) -> None: ...
