"""The learner process's end of the seal: every call crosses to the agent and waits for it.

    seal = LearnerEnd.open(handle)      # the string AgentEnd.handle() gave the child
    reply = seal.call(Call.SENDRECV, (dest, 0, source, 0), inputs=(send,), outputs=(recv,))
    # recv now holds what the agent received; reply.ints is (source, tag, count)

``call`` lays the buffers out in the data region (64-byte aligned, in order; an output that is
also an input shares its place), copies the inputs in, writes the request, rings, waits for the
reply with the same call id, and copies each output back into the caller's array in place, as
many bytes as the agent wrote. It raises ``CallRejected`` (the agent refused the request),
``CallFailed`` (the call raised in the agent), ``AgentGone`` (the channel closed) and
``ArenaTooSmall``. The learner trusts its agent: replies are read without suspicion.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .arena import ALIGN, Arena
from .calls import CALLS
from .doorbell import Doorbell, Woke
from .errors import AgentGone, ArenaTooSmall, CallFailed, CallRejected
from .wire import (
    DTYPE_CODE_OF,
    FAILED,
    MAX_NDIM,
    OK,
    REJECTED,
    Buffer,
    Reply,
    decode_reply,
    encode_request,
    framed,
)

Arg = int | float | str | np.integer | np.floating
# What the data region keeps resident between calls: the pages a larger call touched beyond it are
# given back after it (a first line's region is half the rank's memory: rank/sealed.py).
KEPT_RESIDENT = 64 << 20


class LearnerEnd:
    def __init__(self, arena: Arena, bell: Doorbell) -> None:
        self.arena = arena
        self._bell = bell
        self._call_id = 0

    @classmethod
    def open(cls, handle: str) -> LearnerEnd:
        """Opens the end described by ``AgentEnd.handle()``, from the inherited descriptors."""
        try:
            fields = dict(part.split("=", 1) for part in handle.split(","))
            arena_fd, size = int(fields["arena"]), int(fields["size"])
            read_fd, write_fd = (int(fd) for fd in fields["bell"].split(":"))
            spin_s = float(fields.get("spin", "0"))
        except (KeyError, ValueError):
            raise ValueError(f"not a seal handle: {handle!r}") from None
        return cls.attach(arena_fd, size, (read_fd, write_fd), spin_s)

    @classmethod
    def attach(cls, arena_fd: int, size: int, bell: tuple[int, int], spin_s: float = 0.0) -> LearnerEnd:
        """Opens the end from its descriptors (received, or inherited at these numbers): the
        arena's, and the doorbell's pipes (the one it reads, the one it rings on)."""
        return cls(Arena.attach(arena_fd, size), Doorbell(*bell, spin_s=spin_s, plain_reads=True))

    def call(self, op: int, args: Sequence[Arg] = (), inputs: Sequence[np.ndarray] = (),
             outputs: Sequence[np.ndarray] = (), timeout: float | None = None,
             comm: int = 0) -> Reply:
        """One call through the agent, on the learner's communicator ``comm``. ``args``: ints
        (ranks, tags, codes), floats and at most one text, each kind in order. Outputs are
        filled in place."""
        ints, floats, text = _sorted(args)
        if inputs or outputs:
            in_places, out_places, used = self._layout(op, inputs, outputs)
            for array, place in zip(inputs, in_places):
                self.arena.put(place.offset, array)
        else:
            in_places = out_places = ()
            used = 0
        self._call_id += 1
        call_id = self._call_id
        body = encode_request(call_id, op, ints, floats, in_places, out_places, text, comm)
        self.arena.write_block("request", call_id, framed(body))
        try:
            # A full socket (ring() False) needs no retry: the agent has bytes to read, and
            # looks at the block's call id after reading them.
            self._bell.ring()
        except ConnectionError:
            raise AgentGone("the agent closed the channel") from None
        woke = self._bell.wait(self._replied, timeout)
        if woke is Woke.TIMEOUT:
            raise TimeoutError(f"no reply from the agent within {timeout} s")
        if woke is not Woke.READY:
            raise AgentGone("the agent closed the channel")
        reply = decode_reply(self.arena.view_block("reply"))
        if reply.status == OK:
            for array, place, nbytes in zip(outputs, out_places, reply.written):
                self.arena.take_into(place.offset, min(nbytes, place.nbytes), array)
        if used > KEPT_RESIDENT:
            self.arena.release_beyond(KEPT_RESIDENT)
        # Taken: the data region owes this end nothing now, and the agent may clear it (at a
        # memory reading: AgentEnd.clear_data).
        self.arena.forget("reply")
        if reply.status == REJECTED:
            raise CallRejected(reply.text)
        if reply.status == FAILED:
            kind, _, message = reply.text.partition("\n")
            raise CallFailed(kind, message)
        return reply

    def _replied(self) -> bool:
        """Whether the reply block holds the answer to the call in flight."""
        return self.arena.block_id("reply") == self._call_id

    @property
    def spin_s(self) -> float:
        return self._bell.spin_s

    def _layout(self, op: int, inputs: Sequence[np.ndarray],
                outputs: Sequence[np.ndarray]) -> tuple[tuple[Buffer, ...], tuple[Buffer, ...], int]:
        """The inputs' and outputs' places in the data region, and the bytes of it they use."""
        at = end = 0
        places: dict[int, Buffer] = {}  # id(array) -> its place: an in-place call shares one
        laid: list[Buffer] = []
        for i, array in enumerate([*inputs, *outputs]):
            _check_array(array, output=i >= len(inputs))
            place = places.get(id(array))
            if place is None:
                place = Buffer(at, array.nbytes, array.dtype, array.shape)
                places[id(array)] = place
                end = at + array.nbytes
                at += -(-array.nbytes // ALIGN) * ALIGN
            laid.append(place)
        if end > self.arena.data_size:
            sig = CALLS.get(op)
            raise ArenaTooSmall(f"{sig.name if sig else f'op {op}'}'s buffers", end,
                                self.arena.data_size)
        return tuple(laid[: len(inputs)]), tuple(laid[len(inputs) :]), end

    def close(self) -> None:
        self._bell.close()
        self.arena.close()


def _sorted(args: Sequence[Arg]) -> tuple[tuple[int, ...], tuple[float, ...], str]:
    """A call's arguments by kind, each kind in order: ints, floats and the text."""
    ints: list[int] = []
    floats: list[float] = []
    texts: list[str] = []
    for arg in args:
        kind = type(arg)  # the exact types first: they are what the client passes
        if kind is int:
            ints.append(arg)  # type: ignore[arg-type]
        elif kind is float:
            floats.append(arg)  # type: ignore[arg-type]
        elif isinstance(arg, (int, np.integer)):
            ints.append(int(arg))
        elif isinstance(arg, (float, np.floating)):
            floats.append(float(arg))
        elif isinstance(arg, str) and not texts:
            texts.append(arg)
        else:  # a second text, or not an argument a call takes
            raise TypeError(f"call args are ints, floats and at most one str, not {args!r}")
    return tuple(ints), tuple(floats), texts[0] if texts else ""


def _check_array(array: np.ndarray, output: bool) -> None:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"a buffer must be a NumPy array, not {type(array).__name__}")
    if array.dtype not in DTYPE_CODE_OF:
        raise TypeError(f"a buffer of dtype {array.dtype} cannot cross the seal "
                        f"(numbers in native little-endian order only)")
    if not array.flags.c_contiguous:
        raise ValueError("a buffer must be C-contiguous (a strided view cannot cross the seal)")
    if array.ndim > MAX_NDIM:
        raise ValueError(f"a buffer has at most {MAX_NDIM} dimensions, not {array.ndim}")
    if output and not array.flags.writeable:
        raise ValueError("an output buffer must be writable")
