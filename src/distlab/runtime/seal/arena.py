"""The shared arena: one memory region per rank, the only memory the agent and its learner share.

The agent creates it with ``memfd_create`` and hands the learner process the file descriptor
(``pass_fds``): an inherited descriptor keeps working after the child changes uid (to ``nobody``,
say), where a path under /dev/shm would need permissions that other accounts could use too.
Nothing else names it, so no other process can map it.

Layout (offsets in bytes)::

    0       request block   (CONTROL bytes)  learner -> agent: wire.py's request
    CONTROL reply block     (CONTROL bytes)  agent -> learner: wire.py's reply
    DATA    data region     (data_size)      buffers, at offsets chosen by the learner per call

Each block starts with its call id (8 bytes), written last, so that a reader who sees a new id
sees the whole block (x86 keeps stores in order; the doorbell's system calls order them
everywhere else). The agent reads a block only as a copy (``read_block``) and the data region only
as copies (``take``): what the learner writes into the arena out of turn changes nothing of a call
already read.

The size is fixed at creation and *sealed* (``F_SEAL_SHRINK | F_SEAL_GROW``): a learner that
truncated the file would otherwise make the agent's next read of its mapping a SIGBUS, a crash of
the agent on the learner's command. So the arena never grows: a call whose buffers do not fit
fails with ``ArenaTooSmall`` naming both sizes, and the caller sizes the arena from the problem's
largest buffers. Pages are only allocated when touched, so a generous size costs address space
(which counts against the learner's RLIMIT_AS), not memory.
"""

from __future__ import annotations

import ctypes
import fcntl
import math
import mmap
import os
from typing import Literal

import numpy as np

CONTROL = 8192  # bytes per control block: the largest request wire.py accepts fits in it
DATA = 2 * CONTROL
ALIGN = 64  # where the learner's end places buffers: a cache line, so copies run at full speed

Block = Literal["request", "reply"]
_BLOCK_AT = {"request": 0, "reply": CONTROL}


class Arena:
    """A mapping of the arena, from either end. Create with ``create`` (agent) or ``attach``
    (learner, from the inherited descriptor)."""

    def __init__(self, fd: int, data_size: int) -> None:
        self.fd = fd
        self.data_size = data_size
        self.size = DATA + data_size
        self.size_mb = -(-self.size >> 20)  # the address space its mapping takes, in whole MiB
        self.inode = os.fstat(fd).st_ino  # what a reading of the learner's memory skips
        self._map = mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._view = memoryview(self._map)
        # The call ids as ctypes views: one load or store each, for the doorbell's spin.
        self._ids = {
            name: ctypes.c_uint64.from_buffer(self._map, at) for name, at in _BLOCK_AT.items()
        }

    @classmethod
    def create(cls, data_size: int) -> Arena:
        """A new arena with ``data_size`` bytes of data region, its size sealed."""
        if data_size < 0:
            raise ValueError(f"the arena's data size must be >= 0, not {data_size}")
        fd = os.memfd_create("distlab-seal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, DATA + data_size)
            seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            return cls(fd, data_size)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, fd: int, data_size: int) -> Arena:
        """The learner's mapping of an arena it inherited; checks the size it was told."""
        actual = os.fstat(fd).st_size
        if actual != DATA + data_size:
            raise ValueError(f"arena fd {fd} holds {actual} bytes, expected {DATA + data_size}")
        return cls(fd, data_size)

    # -- the control blocks ------------------------------------------------------------------

    def block_id(self, block: Block) -> int:
        """The call id at the head of a block (one load: what the doorbell spins on)."""
        return int(self._ids[block].value)

    def read_block(self, block: Block) -> bytes:
        """A copy of the whole block: everything after is decided on this copy alone."""
        at = _BLOCK_AT[block]
        return self._map[at : at + CONTROL]

    def view_block(self, block: Block) -> memoryview:
        """The block in place, uncopied: for the learner's end, which trusts what its agent
        wrote there (the agent reads the learner's blocks only as copies)."""
        at = _BLOCK_AT[block]
        return self._view[at : at + CONTROL]

    def write_block(self, block: Block, call_id: int, framed: bytes) -> None:
        """Writes what follows the call id (wire.framed), then the call id: a reader that sees
        the id sees the rest."""
        if len(framed) > CONTROL - 8:
            raise ValueError(f"a {block} of {len(framed)} bytes does not fit in {CONTROL - 8}")
        at = _BLOCK_AT[block]
        self._map[at + 8 : at + 8 + len(framed)] = framed
        self._ids[block].value = call_id

    def forget(self, block: Block) -> None:
        """Sets the block's call id to 0: the learner's end has taken the reply (agent.py's
        clear_data waits for it)."""
        self._ids[block].value = 0

    # -- the data region ---------------------------------------------------------------------

    def _span(self, offset: int, nbytes: int) -> slice:
        # Checked here too, not only in wire.py: the agent's own code must not reach the blocks.
        if offset < 0 or nbytes < 0 or offset + nbytes > self.data_size:
            raise ValueError(f"[{offset}, {offset + nbytes}) is outside the data region")
        return slice(DATA + offset, DATA + offset + nbytes)

    def put(self, offset: int, array: np.ndarray) -> None:
        """Copies a C-contiguous array into the data region at ``offset``."""
        # The mapping takes the array's buffer as plain bytes: a quarter of the time of a NumPy
        # copy through a uint8 view, for the small arrays most calls carry.
        self._map[self._span(offset, array.nbytes)] = array.data

    def take(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A copy (aligned, owned by the caller) of the array at ``offset``."""
        nbytes = math.prod(shape) * dtype.itemsize  # math.prod: np.prod costs 100 times more
        span = self._span(offset, nbytes)
        return np.frombuffer(self._map, dtype, nbytes // dtype.itemsize, span.start).reshape(shape).copy()

    def take_into(self, offset: int, nbytes: int, target: np.ndarray) -> None:
        """Copies the first ``nbytes`` at ``offset`` over the start of ``target`` (a receive
        that got less than its buffer holds leaves the rest as it was)."""
        span = self._span(offset, nbytes)
        if nbytes:  # a view of an empty array cannot be cast to bytes
            target.data.cast("B")[:nbytes] = self._view[span]

    def clear_data(self) -> None:
        """Gives the data region's pages back (its bytes read as zeros after): between calls it
        holds nothing a call needs, and a learner that kept its own arrays there (mapping the
        arena again through /proc/self/fd) held memory no reading of its processes counts."""
        self._map.madvise(mmap.MADV_REMOVE, DATA, self.data_size)

    def release_beyond(self, nbytes: int) -> None:
        """Gives back the data region's pages past its first ``nbytes`` (a page multiple): what
        a call larger than most used, which would otherwise stay resident in the memfd."""
        if nbytes < self.data_size:
            self._map.madvise(mmap.MADV_REMOVE, DATA + nbytes, self.data_size - nbytes)

    def data_held(self) -> int:
        """The bytes the arena holds beyond its control blocks (tmpfs counts a memfd's pages)."""
        return max(0, os.fstat(self.fd).st_blocks * 512 - DATA)

    def close(self) -> None:
        """Unmaps the arena and closes this end's descriptor."""
        # The views export the mapping's buffer: mmap refuses to close while they live.
        self._ids.clear()
        self._view.release()
        self._map.close()
        os.close(self.fd)
