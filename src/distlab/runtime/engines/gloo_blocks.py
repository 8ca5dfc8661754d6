"""The gloo engine's collectives that move blocks (gather, scatter, allgatherv, alltoall,
alltoallv), mixed into ``GlooEngine`` (gloo.py). Gloo gathers equal blocks only and splits
contiguous buffers only, so allgatherv pads each block to the largest and alltoallv packs its
blocks in rank order; the proxy counts the real blocks, not these copies. Each is its
nonblocking form waited on (a call with a timeout polls the request instead).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .gloo_parts import _bytes, _CollRequest, _torch


class BlockCollectives:
    """Needs the engine's process group, rank and size, and its eager-send check."""

    _group: Any
    rank: int
    size: int

    def _check_eager(self) -> None:
        raise NotImplementedError

    def gather(self, sendbuf: np.ndarray, recvbuf: np.ndarray | None, root: int) -> None:
        self.igather(sendbuf, recvbuf, root).wait()

    def igather(self, sendbuf: np.ndarray, recvbuf: np.ndarray | None, root: int) -> _CollRequest:
        self._check_eager()
        _, dist = _torch()
        options = dist.GatherOptions()
        options.rootRank = root
        outputs = [self._blocks(recvbuf, sendbuf.nbytes)] if recvbuf is not None else []
        inputs = [_bytes(sendbuf)]
        return _CollRequest(self._group.gather(outputs, inputs, options), (outputs, inputs))

    def scatter(self, sendbuf: np.ndarray | None, recvbuf: np.ndarray, root: int) -> None:
        self.iscatter(sendbuf, recvbuf, root).wait()

    def iscatter(self, sendbuf: np.ndarray | None, recvbuf: np.ndarray, root: int) -> _CollRequest:
        self._check_eager()
        _, dist = _torch()
        options = dist.ScatterOptions()
        options.rootRank = root
        inputs = [self._blocks(sendbuf, recvbuf.nbytes, into=False)] if sendbuf is not None else []
        outputs = [_bytes(recvbuf, into=True)]
        return _CollRequest(self._group.scatter(outputs, inputs, options), (outputs, inputs))

    def allgatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int],
                   displs: list[int]) -> None:
        self.iallgatherv(sendbuf, recvbuf, counts, displs).wait()

    def iallgatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: list[int],
                    displs: list[int]) -> _CollRequest:
        # Gloo gathers equal blocks only: each rank's block padded to the largest, then every
        # block copied to its place (the proxy counts the real blocks, not this padding).
        self._check_eager()
        item = recvbuf.itemsize
        block = max(counts, default=0) * item
        mine = np.zeros(block, dtype=np.uint8)
        mine[: sendbuf.nbytes] = sendbuf.reshape(-1).view(np.uint8)
        padded = np.empty(block * self.size, dtype=np.uint8)
        blocks, send = self._blocks(padded, block), _bytes(mine)
        gathering = self._group.allgather([blocks], [send])

        def copy_out() -> None:
            out = recvbuf.reshape(-1).view(np.uint8)
            for r, (count, start) in enumerate(zip(counts, displs)):
                out[start * item : (start + count) * item] = padded[r * block : r * block + count * item]

        return _CollRequest(gathering, (blocks, send), copy_out)

    def alltoall(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
        self.ialltoall(sendbuf, recvbuf).wait()

    def ialltoall(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> _CollRequest:
        self._check_eager()
        _, dist = _torch()
        # Equal splits of the byte views along their only dimension: block j goes to rank j.
        tensors = (_bytes(recvbuf, into=True), _bytes(sendbuf))
        return _CollRequest(self._group.alltoall_base(*tensors, [], [], dist.AllToAllOptions()),
                            tensors)

    def alltoallv(self, sendbuf: np.ndarray, send_layout: tuple[list[int], list[int]],
                  recvbuf: np.ndarray, recv_layout: tuple[list[int], list[int]]) -> None:
        self.ialltoallv(sendbuf, send_layout, recvbuf, recv_layout).wait()

    def ialltoallv(self, sendbuf: np.ndarray, send_layout: tuple[list[int], list[int]],
                   recvbuf: np.ndarray, recv_layout: tuple[list[int], list[int]]) -> _CollRequest:
        # Gloo splits contiguous buffers only: the blocks are packed in rank order, exchanged
        # with alltoall_base's split sizes (in bytes), and each received one put at its place.
        self._check_eager()
        _, dist = _torch()
        item = sendbuf.itemsize
        source, target = sendbuf.reshape(-1).view(np.uint8), recvbuf.reshape(-1).view(np.uint8)
        (send_counts, send_at), (recv_counts, recv_at) = send_layout, recv_layout
        packed = np.concatenate([source[d * item : (d + c) * item] for c, d in zip(send_counts, send_at)]
                                or [np.empty(0, np.uint8)])
        landed = np.empty(sum(recv_counts) * item, dtype=np.uint8)
        tensors = (_bytes(landed, into=True), _bytes(packed))
        work = self._group.alltoall_base(*tensors, [c * item for c in recv_counts],
                                         [c * item for c in send_counts], dist.AllToAllOptions())

        def copy_out() -> None:
            start = 0
            for count, at in zip(recv_counts, recv_at):
                target[at * item : (at + count) * item] = landed[start : start + count * item]
                start += count * item

        return _CollRequest(work, tensors, copy_out)

    def _blocks(self, buf: np.ndarray, block: int, into: bool = True) -> list[Any]:
        """``size`` byte views of ``buf``, ``block`` bytes each, in rank order."""
        whole = _bytes(buf, into=into)
        return [whole[i * block : (i + 1) * block] for i in range(self.size)]
