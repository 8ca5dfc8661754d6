"""The learner processes of tests/test_seal_channel.py: one scenario each, honest or hostile.

    python tests/seal_child.py SCENARIO HANDLE [ARG]

Each scenario opens its end from the handle (the descriptors it inherited) and talks to the test,
which plays the agent. Results go to stdout as one JSON object per line; a failed assertion
exits non-zero. The hostile ones write into the arena and ring by hand, as a learner who read
this code could.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import struct
import sys
import threading
import time

import numpy as np

from distlab.runtime.seal import Call, CallFailed, CallRejected, LearnerEnd
from distlab.runtime.seal.arena import CONTROL, DATA
from distlab.runtime.seal.wire import (
    MAGIC,
    Buffer,
    decode_reply,
    encode_request,
    framed,
)

# The arrays of the round trip: (dtype, shape), every kind the whitelist has and some shapes.
CASES = [("<f4", (10,)), ("<f8", (3, 4)), ("<i8", (2, 3, 4)), ("<u1", (0,)), ("b1", (7,)),
         ("<c16", (5,)), ("<f2", (2, 2)), ("<i4", ()), ("<u2", (1, 1, 1, 1, 1, 1, 1, 1))]


def pattern(dtype: str, shape: tuple[int, ...], salt: int = 0) -> np.ndarray:
    """Deterministic contents, the same in the test: ``salt`` changes them."""
    values = np.arange(int(np.prod(shape)), dtype=np.int64) * 7 + 3 + salt
    return (values % 2 == 0 if dtype == "b1" else values.astype(dtype)).reshape(shape)


def boom(path: str, protocol: int) -> bytes:
    """A pickle whose unpickling creates ``path``: what a forged request would run in an agent
    that unpickled it."""

    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str, str]]:
            return (open, (path, "w"))

    return pickle.dumps(Boom(), protocol=protocol)


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def roundtrip(seal: LearnerEnd, _: str) -> None:
    for dtype, shape in CASES:
        send, out = pattern(dtype, shape), np.zeros(shape, dtype)
        reply = seal.call(Call.ALLREDUCE, (0,), inputs=(send,), outputs=(out,))
        # The test's agent answers with the input's bytes reversed (a change it can see).
        assert out.tobytes() == send.tobytes()[::-1], (dtype, shape)
        assert reply.written == (send.nbytes,)
    inplace = pattern("<f8", (64,))
    seal.call(Call.ALLREDUCE, (0,), inputs=(inplace,), outputs=(inplace,))
    assert (inplace == pattern("<f8", (64,)) * 2).all(), "in place: doubled by the agent"
    short = np.full(16, -1, np.int32)  # the agent sends 4 of 16 elements: the rest stays
    reply = seal.call(Call.RECV, (1, 5), outputs=(short,))
    assert short.tolist() == [1, 2, 3, 4] + [-1] * 12 and reply.ints == (1, 5, 4)
    try:  # the call raised in the agent: the learner gets its kind and message
        seal.call(Call.SEND, (3, 0), inputs=(short,))
        raise AssertionError("the failed Send returned")
    except CallFailed as e:
        assert (e.kind, e.message) == ("ValueError", "dest 3 is not a rank of this communicator")
    seal.call(Call.MARK, ("step",))
    seal.call(Call.COMPUTE, (0, 0.25, "matmul"))
    assert seal.call(Call.NOW).floats == (0.25,)
    say(done=True)


def many(seal: LearnerEnd, count: str) -> None:
    for _ in range(int(count)):
        seal.call(Call.NOW)
    say(done=True)


def _raw(seal: LearnerEnd, call_id: int, payload: bytes) -> tuple[int, str]:
    """Writes a block by hand (call id, then whatever follows), rings, returns the reply."""
    seal.arena.write_block("request", call_id, payload)
    seal._bell.ring()
    seal._bell.wait(lambda: seal.arena.block_id("reply") == call_id, 10)
    reply = decode_reply(seal.arena.read_block("reply"))
    return reply.status, reply.text


def forged(seal: LearnerEnd, path: str) -> None:
    size = seal.arena.data_size
    f4 = np.dtype("<f4")

    def req(op: int, ints: tuple[int, ...] = (), floats: tuple[float, ...] = (),
            inputs: tuple[Buffer, ...] = (), outputs: tuple[Buffer, ...] = (), text: str = "") -> bytes:
        return framed(encode_request(0, op, ints, floats, inputs, outputs, text))

    ok = Buffer(0, 40, f4, (10,))
    cases = {
        "bad op": req(999),
        "outside": req(Call.ALLREDUCE, (0,), inputs=(Buffer(size - 8, 40, f4, (10,)),), outputs=(ok,)),
        "negative": req(Call.ALLREDUCE, (0,), inputs=(Buffer(-64, 40, f4, (10,)),), outputs=(ok,)),
        "mismatch": req(Call.ALLREDUCE, (0,), inputs=(Buffer(0, 40, f4, (11,)),), outputs=(ok,)),
        "dtype": framed(struct.pack("<IHHBBBBHq", MAGIC, Call.ALLREDUCE, 0, 1, 0, 1, 1, 0, 0)
                        + struct.pack("<qqBBq", 0, 40, 99, 1, 10)  # dtype code 99
                        + struct.pack("<qqBBq", 64, 40, 11, 1, 10)),
        "dest": req(Call.SEND, (-5, 0), inputs=(ok,)),
        "nan": req(Call.COMPUTE, (0,), (float("nan"),)),
        "counts": req(Call.SEND, (1,), inputs=(ok,)),
        "trailing": framed(encode_request(0, Call.NOW, (), (), (), (), "") + b"12345678"),
        "garbage": np.random.default_rng(7).bytes(CONTROL - 8),
        "pickle body": framed(boom(path, 5)),
    }
    call_id = 0
    for name, payload in cases.items():
        call_id += 1
        status, text = _raw(seal, call_id, payload)
        say(case=name, status=status, text=text)
    # A pickle as the text of a valid request: accepted, as a string, and nothing more.
    seal._call_id = call_id
    seal.call(Call.MARK, (boom(path, 0).decode(),))
    # A request written without a new call id is not served again.
    seal._bell.ring()
    reply = seal.call(Call.NOW)
    say(case="after", status=0, floats=list(reply.floats))
    try:  # LearnerEnd itself: a rejection raises
        seal.call(999)
    except CallRejected as e:
        say(case="raised", text=str(e))


def scribble(seal: LearnerEnd, _: str) -> None:
    """Writes over the whole arena while the agent holds the call (from a second thread, told
    when by the test through stdin), then checks the answer."""
    send = pattern("<f4", (1 << 18,))  # 1 MiB
    out = np.zeros_like(send)

    def vandal() -> None:
        assert sys.stdin.readline().strip() == "served"
        seal.arena._map[: DATA + seal.arena.data_size] = b"\xff" * (DATA + seal.arena.data_size)
        say(scribbled=True)

    thread = threading.Thread(target=vandal)
    thread.start()
    seal.call(Call.ALLREDUCE, (0,), inputs=(send,), outputs=(out,))
    thread.join()
    assert (out == send + 1).all(), "the agent's answer came back whole"
    say(done=True)


def die(seal: LearnerEnd, _: str) -> None:
    send = pattern("<f8", (8,))
    buf = Buffer(0, send.nbytes, send.dtype, (8,))
    seal.arena.put(0, send)
    body = framed(encode_request(1, Call.SENDRECV, (1, 0, 1, 0), (), (buf,), (buf,), ""))
    seal.arena.write_block("request", 1, body)
    seal._bell.ring()
    os.kill(os.getpid(), signal.SIGKILL)


def exit_between(seal: LearnerEnd, _: str) -> None:
    seal.call(Call.NOW)
    sys.exit(3)


def close_end(seal: LearnerEnd, _: str) -> None:
    seal.call(Call.BARRIER)
    seal._bell.close()
    time.sleep(30)  # alive, with the channel closed: the test ends it


def deaf(seal: LearnerEnd, _: str) -> None:
    """Closes only the pipe its replies come on, then asks for a call: the agent's ring meets a
    pipe with no reader (EPIPE, where SIGPIPE would end a process that does not ignore it)."""
    os.close(seal._bell.read_fd)
    seal._call_id += 1
    seal.arena.write_block("request", seal._call_id, framed(encode_request(
        seal._call_id, Call.BARRIER, (), (), (), (), "")))
    seal._bell.ring()
    time.sleep(30)  # alive: the test ends it


def orphan_holds(seal: LearnerEnd, _: str) -> None:
    """Starts a process that inherits the doorbell's pipes, then dies: no EOF reaches the agent."""
    seal.call(Call.NOW)
    pid = os.fork()
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    say(orphan=pid)
    os.kill(os.getpid(), signal.SIGKILL)


def steal_rings(seal: LearnerEnd, _: str) -> None:
    """Opens a second read end of the pipe it rings on (through /proc), takes back the ring of
    a request it wrote, and dies leaving a child that holds the pipe: the agent, which may have
    seen the pipe readable, must not then block in a read."""
    thief = os.open(f"/proc/self/fd/{seal._bell.write_fd}", os.O_RDONLY | os.O_NONBLOCK)
    seal.call(Call.NOW)
    seal._call_id += 1
    seal.arena.write_block("request", seal._call_id, framed(encode_request(
        seal._call_id, Call.BARRIER, (), (), (), (), "")))
    seal._bell.ring()
    stolen = 0
    for _ in range(1000):  # the agent may read it first
        try:
            stolen += len(os.read(thief, 64))
        except BlockingIOError:
            time.sleep(0.0001)
        if stolen:
            break
    pid = os.fork()
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    say(orphan=pid, stolen=stolen)
    os.kill(os.getpid(), signal.SIGKILL)


def silent(seal: LearnerEnd, _: str) -> None:
    time.sleep(30)  # makes no call: the test ends it


def flood(seal: LearnerEnd, _: str) -> None:
    body = framed(encode_request(0, Call.NOW, (), (), (), (), ""))
    for call_id in range(1, 1_000_000):
        seal.arena.write_block("request", call_id, body)
        try:
            os.write(seal._bell.write_fd, b"!")  # never reads a reply
        except BlockingIOError:
            time.sleep(0.001)  # its own pipe is full: the agent reads it soon
        except OSError:
            return


def shrink(seal: LearnerEnd, _: str) -> None:
    fd = seal.arena.fd
    for size in (0, DATA, DATA + seal.arena.data_size * 2):
        try:
            os.ftruncate(fd, size)
            say(truncated=size)
        except PermissionError:
            say(refused=size)
    say(size=os.fstat(fd).st_size, now=list(seal.call(Call.NOW).floats))


def nobody(handle: str, _: str) -> None:
    """Drops to nobody first (the interpreter is already loaded: the venv's is under /root, out
    of nobody's reach), then opens its end from the inherited descriptors."""
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    arena_fd = int(dict(p.split("=") for p in handle.split(","))["arena"])
    try:
        open(f"/proc/{os.getppid()}/fd/{arena_fd}", "rb")
        by_path = "opened"
    except PermissionError:
        by_path = "refused"
    seal = LearnerEnd.open(handle)
    send, out = pattern("<i8", (1000,)), np.zeros(1000, np.int64)
    seal.call(Call.ALLREDUCE, (0,), inputs=(send,), outputs=(out,))
    say(uid=os.getuid(), by_path=by_path, ok=bool((out == send + 1).all()))


SCENARIOS = {f.__name__: f for f in (roundtrip, many, forged, scribble, die, exit_between,
                                     close_end, deaf, orphan_holds, steal_rings, silent, flood,
                                     shrink)}

if __name__ == "__main__":
    scenario, handle, arg = sys.argv[1], sys.argv[2], (sys.argv[3:] or [""])[0]
    if scenario == "nobody":
        nobody(handle, arg)
    else:
        SCENARIOS[scenario](LearnerEnd.open(handle), arg)
