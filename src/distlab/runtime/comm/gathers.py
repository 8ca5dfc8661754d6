"""The collectives of the learner's ``comm`` that move blocks rather than reduce them: Gather,
Scatter, Allgatherv, Alltoall and Alltoallv, with mpi4py's signatures. Like the others (collectives.py) each
is counted, watched in the slot, moved on the online clock and traced as one "coll" event, which
the replay expands into the algorithm runtime/clock/collectives_cost.py documents with its cost;
each takes a ``timeout=`` as they do.

``vector_layout`` reads mpi4py's vector buffer specifications (``[buf, counts]``,
``[buf, (counts, displs)]``, ``[buf, counts, displs, MPI.DOUBLE]``, ...) for the v-forms; the
learner's sealed client (runtime/seal/client.py) uses it too, so both say the same of a bad one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ..engines.base import Engine, EngineRequest
from .collectives import _is_mpi_in_place
from .requests import IN_PLACE, _buffer

if TYPE_CHECKING:
    from .stats import CommStats


class Gathers:
    """Mixed into ``Comm`` (proxy.py) after ``Collectives``, whose helpers these calls use."""

    _engine: Engine
    stats: CommStats

    def _peer(self, peer: Any, what: str, wildcard: bool = False) -> int:
        raise NotImplementedError

    def _collective(self, op: str, nbytes: int, root: int = -1,
                    per_peer: tuple[int, ...] | None = None, timeout: Any = None,
                    sent: np.ndarray | None = None) -> None:
        raise NotImplementedError

    def _complete(self, run: Callable[[], None], start: Callable[[], EngineRequest],
                  buffers: Any) -> None:
        raise NotImplementedError

    def Gather(self, sendbuf: Any, recvbuf: Any = None, root: int = 0,  # noqa: N802
               timeout: Any = None) -> None:
        """The root's recvbuf holds every rank's sendbuf, in rank order (recvbuf matters on the
        root only)."""
        root = self._peer(root, "root")
        send = block_buffer(sendbuf, "Gather sendbuf")
        recv = None
        if self._engine.rank == root:
            recv = _buffer(recvbuf, "Gather recvbuf")
            _blocks_fit(recv, send, self._engine.size, "Gather", "recvbuf", "sendbuf")
        self._collective("Gather", send.nbytes, root, timeout=timeout, sent=send)
        self._complete(lambda: self._engine.gather(send, recv, root),
                       lambda: self._engine.igather(send, recv, root), (send, recv))

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0,  # noqa: N802
                timeout: Any = None) -> None:
        """Rank r's recvbuf receives the r-th of the root's ``size`` equal blocks of sendbuf."""
        root = self._peer(root, "root")
        recv = block_buffer(recvbuf, "Scatter recvbuf")
        send = None
        if self._engine.rank == root:
            send = _buffer(sendbuf, "Scatter sendbuf")
            _blocks_fit(send, recv, self._engine.size, "Scatter", "sendbuf", "recvbuf")
        self._collective("Scatter", recv.nbytes, root, timeout=timeout, sent=send)
        self._complete(lambda: self._engine.scatter(send, recv, root),
                       lambda: self._engine.iscatter(send, recv, root), (send, recv))

    def Allgatherv(self, sendbuf: Any, recvbuf: Any, timeout: Any = None) -> None:  # noqa: N802
        """Every rank's sendbuf, each at its displacement of recvbuf: ``recvbuf`` is
        ``[buf, counts]``, ``[buf, (counts, displs)]`` or either with a datatype."""
        send = block_buffer(sendbuf, "Allgatherv sendbuf")
        recv, counts, displs = vector_layout(recvbuf, "Allgatherv recvbuf", self._engine.size)
        me = self._engine.rank
        if send.dtype != recv.dtype or send.size != counts[me]:
            raise ValueError(f"Allgatherv: rank {me} sends {send.size} x {send.dtype}, but recvbuf "
                             f"holds {counts[me]} x {recv.dtype} for it")
        self._collective("Allgatherv", send.nbytes, timeout=timeout, sent=send)
        self._complete(lambda: self._engine.allgatherv(send, recv, counts, displs),
                       lambda: self._engine.iallgatherv(send, recv, counts, displs), (send, recv))

    def Alltoall(self, sendbuf: Any, recvbuf: Any, timeout: Any = None) -> None:  # noqa: N802
        """Block j of sendbuf (``size`` equal blocks) goes to rank j, as block r of its recvbuf
        (r: this rank)."""
        send = block_buffer(sendbuf, "Alltoall sendbuf")
        recv = _buffer(recvbuf, "Alltoall recvbuf")
        p = self._engine.size
        if send.size != recv.size or send.dtype != recv.dtype or send.size % p:
            raise ValueError(f"Alltoall: sendbuf ({send.size} x {send.dtype}) and recvbuf "
                             f"({recv.size} x {recv.dtype}) must be alike and hold {p} equal blocks")
        self._collective("Alltoall", send.nbytes, timeout=timeout, sent=send)
        self._complete(lambda: self._engine.alltoall(send, recv),
                       lambda: self._engine.ialltoall(send, recv), (send, recv))

    def Alltoallv(self, sendbuf: Any, recvbuf: Any, timeout: Any = None) -> None:  # noqa: N802
        """Alltoall with a block of its own size for each pair: ``sendbuf`` and ``recvbuf`` are
        vector buffers (``[buf, counts]``, ``[buf, (counts, displs)]``, ...); rank j gets the
        send layout's j-th block, and rank i's block for this rank lands at the receive
        layout's i-th place."""
        p = self._engine.size
        send, send_counts, send_at = vector_layout(sendbuf, "Alltoallv sendbuf", p)
        recv, recv_counts, recv_at = vector_layout(recvbuf, "Alltoallv recvbuf", p)
        if send.dtype != recv.dtype:
            raise ValueError(f"Alltoallv: sendbuf holds {send.dtype}, recvbuf {recv.dtype}")
        per_peer = tuple(c * send.itemsize for c in send_counts)
        self._collective("Alltoallv", sum(per_peer), per_peer=per_peer, timeout=timeout, sent=send)
        layouts = (send_counts, send_at), (recv_counts, recv_at)
        self._complete(lambda: self._engine.alltoallv(send, layouts[0], recv, layouts[1]),
                       lambda: self._engine.ialltoallv(send, layouts[0], recv, layouts[1]),
                       (send, recv))


def block_buffer(buf: Any, what: str) -> np.ndarray:
    """The buffer of a rank's own block (IN_PLACE is refused: these calls take a block)."""
    if buf is IN_PLACE or _is_mpi_in_place(buf):
        raise TypeError(f"{what}: IN_PLACE is not taken here; pass the rank's own block")
    return _buffer(buf, what)


def _blocks_fit(whole: np.ndarray, block: np.ndarray, p: int, op: str, big: str, small: str) -> None:
    if whole.dtype != block.dtype or whole.size != p * block.size:
        raise ValueError(f"{op}: {big} holds {whole.size} x {whole.dtype}; it needs {p} blocks of "
                         f"{small}'s {block.size} x {block.dtype}")


def vector_layout(spec: Any, what: str, p: int) -> tuple[np.ndarray, list[int], list[int]]:
    """(array, counts, displacements) of a vector buffer specification (in elements; without
    displacements the blocks follow one another)."""
    if not isinstance(spec, (list, tuple)) or len(spec) not in (2, 3, 4):
        raise TypeError(f"{what}: a vector buffer is [buf, counts], [buf, (counts, displs)], or "
                        "either with a datatype last")
    parts = list(spec)
    datatype = parts.pop() if len(parts) > 2 and not _is_sequence(parts[-1]) else None
    array = _buffer([parts[0], datatype] if datatype is not None else parts[0], what)
    if len(parts) == 3:
        counts, displs = parts[1], parts[2]
    elif len(parts[1]) == 2 and all(_is_sequence(x) for x in parts[1]):
        counts, displs = parts[1]
    else:
        counts, displs = parts[1], None
    counts = _ints(counts, what, "counts", p)
    if displs is None:
        displs = [sum(counts[:r]) for r in range(p)]
    displs = _ints(displs, what, "displacements", p)
    for r, (count, start) in enumerate(zip(counts, displs)):
        if start + count > array.size:
            raise ValueError(f"{what}: rank {r}'s block ({count} elements from {start}) runs past "
                             f"the buffer's {array.size} elements")
    return array.reshape(-1), counts, displs


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def _ints(values: Sequence[Any], what: str, name: str, p: int) -> list[int]:
    got = [int(v) for v in values]
    if len(got) != p or min(got, default=0) < 0:
        raise ValueError(f"{what}: {name} {got} must be {p} numbers >= 0, one per rank")
    return got
