"""The encoding of requests and replies: fixed, small, and validated field by field.

The agent trusts nothing the learner sends. So a request is not pickled (unpickling runs whatever
code the bytes name) nor JSON (a structure to walk and type-check): it is a struct header and
arrays of plain numbers, whose every field the agent checks before it uses any of them. All
little-endian::

    request block   u64 call id, u32 body length, body
    body            u32 magic, u16 op, u16 communicator, u8 #ints, u8 #floats, u8 #inputs,
                    u8 #outputs, u16 #text
                    #ints x i64, #floats x f64, (#inputs + #outputs) x buffer, text (UTF-8)
    buffer          i64 offset (in the data region), i64 bytes, u8 dtype code, u8 ndim,
                    ndim x i64 dims

``decode_request`` is a pure function of the block's bytes, the op table and the data region's
size; it returns a ``Decoded`` or raises ``BadRequest`` naming the first field that is wrong, and
nothing else (tests/test_seal_channel.py feeds it garbage to show it). It checks: the magic; a
known op; each count against the op's signature and the global caps; the exact length; each int
inside its bounds; each float finite and >= 0; each buffer's offset and size >= 0 and inside the
data region, its dtype in the whitelist (native little-endian numbers, nothing else), its ndim at
most MAX_NDIM, its dims >= 0, and dims x itemsize equal to its size; the text valid UTF-8 and
not longer than the op allows; the call id above the last one seen.

Replies go the other way, to a learner that trusts its agent; they use the same header style
(``encode_reply``/``decode_reply``) for symmetry, not for safety.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass, field
from typing import NamedTuple, NoReturn

import numpy as np

from .arena import CONTROL
from .errors import BadRequest

MAGIC = 0x32534C44  # "DLS2"
MAX_INTS, MAX_FLOATS, MAX_BUFFERS, MAX_NDIM, MAX_TEXT = 64, 8, 32, 8, 1024
I64_MAX = 2**63 - 1

_BLOCK = struct.Struct("<QI")  # call id, body length
# magic, op, communicator, #ints, #floats, #inputs, #outputs, #text bytes
_HEAD = struct.Struct("<IHHBBBBH")
_BUF = struct.Struct("<qqBB")  # offset, bytes, dtype code, ndim
_REPLY = struct.Struct("<BBBBH")  # status, #ints, #floats, #written, #text bytes
# Compiled once per count: a format built per call costs more than the unpacking it does.
_QS = tuple(struct.Struct(f"<{n}q") for n in range(MAX_INTS + 1))
_BUFS = tuple(struct.Struct(f"{_BUF.format}{n}q") for n in range(MAX_NDIM + 1))  # with the dims

# The dtypes a buffer may have, by code: numbers in native little-endian order only (no objects,
# no structured or byte-swapped types). Code 0 is never valid.
DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(t) for t in (
    "b1", "<i1", "<u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16",
))
DTYPE_CODE: dict[str, int] = {d.str: code for code, d in enumerate(DTYPES, start=1)}
# The same, keyed by the dtype itself: a lookup costs a third of reading ``dtype.str``. Equal
# dtypes hash alike (int64 as "l" or "q"); a byte-swapped or structured one is absent.
DTYPE_CODE_OF: dict[np.dtype, int] = {d: code for code, d in enumerate(DTYPES, start=1)}

OK, REJECTED, FAILED = 0, 1, 2


@dataclass(frozen=True)
class Int:
    """One int argument of an op, and the closed range it must lie in."""

    name: str
    lo: int
    hi: int


@dataclass(frozen=True)
class Signature:
    """What one op's request may carry. ``more`` admits up to MAX_INTS further ints of one
    kind after the fixed ones (Waitall's requests, Reduce_scatter's counts); ``timed``, one
    float more than ``floats``: the call's own timeout (runtime/comm/timed.py)."""

    name: str
    ints: tuple[Int, ...] = ()
    more: Int | None = None
    floats: int = 0
    inputs: range = range(0, 1)
    outputs: range = range(0, 1)
    text: int = 0  # the longest text, in bytes; 0: none
    timed: bool = False
    # Derived once (the decoder runs on every call): the most ints a request may carry, and
    # each int's (lo, hi) in order, as long as the most.
    most_ints: int = field(init=False, repr=False, compare=False)
    bounds: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fixed = len(self.ints)
        most = fixed + (MAX_INTS - fixed if self.more is not None else 0)
        extra = () if self.more is None else ((self.more.lo, self.more.hi),) * (most - fixed)
        object.__setattr__(self, "most_ints", most)
        object.__setattr__(self, "bounds", tuple((arg.lo, arg.hi) for arg in self.ints) + extra)


class Buffer(NamedTuple):
    """A validated place in the data region: where, how many bytes, and the array it holds."""

    offset: int
    nbytes: int
    dtype: np.dtype
    shape: tuple[int, ...]


class Decoded(NamedTuple):
    """A request that passed every check, before its input buffers are copied out."""

    call_id: int
    op: int
    name: str
    ints: tuple[int, ...]
    floats: tuple[float, ...]
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    text: str
    comm: int = 0  # which of the learner's communicators (0: the task's; service.py numbers the rest)


def call_id_of(block: bytes) -> int:
    """The call id a block claims (for a rejection's reply, which must name it)."""
    return int(_BLOCK.unpack_from(block, 0)[0])


def encode_request(call_id: int, op: int, ints: tuple[int, ...], floats: tuple[float, ...],
                   inputs: tuple[Buffer, ...], outputs: tuple[Buffer, ...], text: str,
                   comm: int = 0) -> bytes:
    """The body of a request block (the learner's end; the call id is written by the arena)."""
    raw_text = text.encode() if text else b""
    n_ints, n_floats, n_buffers = len(ints), len(floats), len(inputs) + len(outputs)
    if (n_ints > MAX_INTS or n_floats > MAX_FLOATS or len(raw_text) > MAX_TEXT
            or n_buffers > MAX_BUFFERS):
        raise ValueError(
            f"a call carries at most {MAX_INTS} ints, {MAX_FLOATS} floats, {MAX_BUFFERS} buffers "
            f"and {MAX_TEXT} bytes of text; this one {n_ints}, {n_floats}, "
            f"{n_buffers} and {len(raw_text)}"
        )
    head = _packing(f"{_HEAD.format}{n_ints}q{n_floats}d").pack(
        MAGIC, op, comm, n_ints, n_floats, len(inputs), len(outputs), len(raw_text), *ints, *floats)
    if not n_buffers:
        return head + raw_text
    parts = [head]
    for buf in inputs + outputs:
        shape = buf.shape
        parts.append(_BUFS[len(shape)].pack(buf.offset, buf.nbytes, DTYPE_CODE_OF[buf.dtype],
                                            len(shape), *shape))
    parts.append(raw_text)
    return b"".join(parts)


@functools.cache
def _packing(layout: str) -> struct.Struct:
    """A struct per layout, made once: building one per call costs more than the packing it does.
    The agent asks only for counts it has checked against their caps, so there are few."""
    return struct.Struct(layout)


def decode_request(block: bytes, table: dict[int, Signature], data_size: int,
                   last_id: int) -> Decoded:
    """Validates a copy of the request block (see the module's docstring for every check)."""
    if len(block) != CONTROL:
        raise BadRequest(f"a request block has {CONTROL} bytes, this one {len(block)}")
    call_id, length = _BLOCK.unpack_from(block, 0)
    if not last_id < call_id <= I64_MAX:
        raise BadRequest(f"call id {call_id} does not follow the last one ({last_id})")
    if not _HEAD.size <= length <= CONTROL - _BLOCK.size:
        raise BadRequest(f"body length {length} is outside [{_HEAD.size}, {CONTROL - _BLOCK.size}]")
    # Offsets below are in the block; ``end`` is where the body claims to end. Nothing past it
    # is read: every unpack is checked against it first (the block itself is longer).
    at, end = _BLOCK.size, _BLOCK.size + length
    magic, op, comm, n_ints, n_floats, n_in, n_out, n_text = _HEAD.unpack_from(block, at)
    if magic != MAGIC:
        raise BadRequest(f"bad magic {magic:#010x} (a request starts with {MAGIC:#010x})")
    sig = table.get(op)
    if sig is None:
        raise BadRequest(f"unknown op code {op}")
    _check_counts(sig, n_ints, n_floats, n_in, n_out, n_text)
    at += _HEAD.size
    need = at + 8 * (n_ints + n_floats) + (n_in + n_out) * _BUF.size + n_text
    if need > end:
        raise BadRequest(f"{sig.name}: the body has {length} bytes, its counts need "
                         f"{need - _BLOCK.size} or more")
    numbers = _packing(f"<{n_ints}q{n_floats}d").unpack_from(block, at)
    ints, floats = numbers[:n_ints], numbers[n_ints:]
    at += 8 * (n_ints + n_floats)
    for value, (lo, hi) in zip(ints, sig.bounds):
        if not lo <= value <= hi:
            _bad_int(sig, ints)
    for i, value in enumerate(floats):
        if not (math.isfinite(value) and value >= 0):
            raise BadRequest(f"{sig.name}: float {i} is {value}, must be finite and >= 0")
    buffers = []
    for i in range(n_in + n_out):
        buf, at = _decode_buffer(sig.name, i, block, at, end, data_size)
        buffers.append(buf)
    if at + n_text != end:
        raise BadRequest(f"{sig.name}: the body has {length} bytes, its fields "
                         f"{at + n_text - _BLOCK.size}")
    text = ""
    if n_text:
        try:
            text = block[at:end].decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadRequest(f"{sig.name}: the text is not UTF-8 ({e.reason})") from None
    return Decoded(call_id, op, sig.name, ints, floats, tuple(buffers[:n_in]),
                   tuple(buffers[n_in:]), text, comm)


def _check_counts(sig: Signature, n_ints: int, n_floats: int, n_in: int, n_out: int,
                  n_text: int) -> None:
    fixed = len(sig.ints)
    if not fixed <= n_ints <= sig.most_ints:
        raise BadRequest(f"{sig.name} takes {fixed}{'+' if sig.more else ''} ints, not {n_ints}")
    if n_floats != sig.floats and not (sig.timed and n_floats == sig.floats + 1):
        also = f" (or {sig.floats + 1}, with a timeout)" if sig.timed else ""
        raise BadRequest(f"{sig.name} takes {sig.floats} floats{also}, not {n_floats}")
    if n_in not in sig.inputs or n_out not in sig.outputs:
        raise BadRequest(f"{sig.name} takes {_counts(sig.inputs)} input and {_counts(sig.outputs)}"
                         f" output buffers, not {n_in} and {n_out}")
    if n_text > sig.text:
        raise BadRequest(f"{sig.name} takes at most {sig.text} bytes of text, not {n_text}")


def _counts(allowed: range) -> str:
    return str(allowed.start) if len(allowed) == 1 else f"{allowed.start}-{allowed.stop - 1}"


def _bad_int(sig: Signature, ints: tuple[int, ...]) -> NoReturn:
    """Raises for the first int outside its bounds (the caller saw one is)."""
    for i, value in enumerate(ints):
        arg = sig.ints[i] if i < len(sig.ints) else sig.more
        assert arg is not None  # _check_counts admitted no more ints than the signature has
        if not arg.lo <= value <= arg.hi:
            raise BadRequest(f"{sig.name}: {arg.name} is {value}, must be in [{arg.lo}, {arg.hi}]")
    raise AssertionError("no int is out of bounds")


def _decode_buffer(op: str, i: int, block: bytes, at: int, end: int,
                   data_size: int) -> tuple[Buffer, int]:
    if at + _BUF.size > end:
        raise BadRequest(f"{op}: buffer {i} runs past the end of the body")
    offset, nbytes, code, ndim = _BUF.unpack_from(block, at)
    at += _BUF.size
    if offset < 0 or nbytes < 0:
        raise BadRequest(f"{op}: buffer {i} has offset {offset} and {nbytes} bytes; both must be >= 0")
    if offset + nbytes > data_size:
        raise BadRequest(f"{op}: buffer {i} at offset {offset} with {nbytes} bytes runs past the "
                         f"data region ({data_size} bytes)")
    if not 1 <= code <= len(DTYPES):
        raise BadRequest(f"{op}: buffer {i} has dtype code {code}, not one of 1-{len(DTYPES)}")
    if ndim > MAX_NDIM:
        raise BadRequest(f"{op}: buffer {i} has {ndim} dimensions, at most {MAX_NDIM}")
    if at + 8 * ndim > end:
        raise BadRequest(f"{op}: buffer {i}'s shape runs past the end of the body")
    shape = _QS[ndim].unpack_from(block, at)
    at += 8 * ndim
    if ndim and min(shape) < 0:
        raise BadRequest(f"{op}: buffer {i} has shape {shape}; dims must be >= 0")
    dtype = DTYPES[code - 1]
    if math.prod(shape) * dtype.itemsize != nbytes:  # Python ints: no overflow to hide a lie
        raise BadRequest(f"{op}: buffer {i} is {shape} x {dtype.itemsize} bytes ({dtype}), "
                         f"but claims {nbytes} bytes")
    # An empty buffer's other dims could still be any size (0 x 2**62: zero bytes), which NumPy
    # refuses to shape: none may be larger than the data region. (A buffer of bytes lies in the
    # region, checked above, and so do its dims.)
    if not nbytes and math.prod(d for d in shape if d) * dtype.itemsize > max(data_size, dtype.itemsize):
        raise BadRequest(f"{op}: buffer {i} has shape {shape}, larger than the data region "
                         f"({data_size} bytes) in its other dimensions")
    return Buffer(offset, nbytes, dtype, shape), at


# -- replies (agent -> learner) ----------------------------------------------------------------

class Reply(NamedTuple):
    """What the agent answered: a status, results, and how many bytes each output received."""

    status: int
    ints: tuple[int, ...] = ()
    floats: tuple[float, ...] = ()
    written: tuple[int, ...] = ()
    text: str = ""


def encode_reply(reply: Reply) -> bytes:
    raw = reply.text.encode() if reply.text else b""
    ints, floats, written = reply.ints, reply.floats, reply.written
    if raw:
        room = CONTROL - _BLOCK.size - _REPLY.size - 8 * (len(ints) + len(floats) + len(written))
        if len(raw) > room:  # a long error message is cut (at a character boundary), not refused
            raw = raw[:room].decode("utf-8", "ignore").encode()
    layout = _packing(f"{_REPLY.format}{len(ints)}q{len(floats)}d{len(written)}q")
    return layout.pack(reply.status, len(ints), len(floats), len(written), len(raw), *ints,
                       *floats, *written) + raw


def decode_reply(block: bytes | memoryview) -> Reply:
    """A reply from a copy of its block, or (the learner's end, which trusts its agent and
    reads each reply once) from a view of it in the arena."""
    status, n_ints, n_floats, n_written, n_text = _REPLY.unpack_from(block, _BLOCK.size)
    layout = _packing(f"{_REPLY.format}{n_ints}q{n_floats}d{n_written}q")
    values = layout.unpack_from(block, _BLOCK.size)[5:]
    at = _BLOCK.size + layout.size
    text = bytes(block[at : at + n_text]).decode("utf-8", "replace") if n_text else ""
    return Reply(status, values[:n_ints], values[n_ints : n_ints + n_floats],
                 values[n_ints + n_floats :], text)


def framed(body: bytes) -> bytes:
    """A body preceded by its u32 length: what ``Arena.write_block`` puts after the call id."""
    return struct.pack("<I", len(body)) + body
