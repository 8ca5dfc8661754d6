"""The seal's channel (runtime/seal/) between an agent and a learner process, on real processes.

The test plays the agent; the learner is a child process (tests/seal_child.py, one scenario
each) that inherits the arena and its end of the socket, as the learner process will. Honest
scenarios check what crosses (dtypes, shapes, outputs in place, short receives); hostile ones
forge requests, write into the arena out of turn, die mid-call, close their end, flood, or
shrink the arena; each must end in a clear answer from the agent, never a crash or a hang.
The decoder, a pure function, is also fed garbage directly.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest
import seal_child
from seal_child import CASES, boom, pattern

import distlab
from distlab.runtime.seal import (
    AgentEnd,
    ArenaTooSmall,
    BadRequest,
    Call,
    LearnerEnd,
    LearnerFlooding,
    LearnerGone,
    Rejected,
    Request,
)
from distlab.runtime.seal.arena import CONTROL, Arena
from distlab.runtime.seal.calls import CALLS
from distlab.runtime.seal.doorbell import SPIN_S, Doorbell, spin_for
from distlab.runtime.seal.wire import Buffer, decode_request, encode_request, framed

pytestmark = pytest.mark.timeout(60)

CHILD = Path(seal_child.__file__)
SRC = str(Path(distlab.__file__).resolve().parents[1])  # this checkout's distlab, in the child


class Learner:
    """A learner process in one scenario, and the agent's end the test holds."""

    def __init__(self, scenario: str, arg: str = "", data_size: int = 1 << 21,
                 spin_s: float = 0.0) -> None:
        self.agent = AgentEnd.create(data_size, spin_s=spin_s)
        env = {**os.environ, "PYTHONPATH": SRC}
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), scenario, self.agent.handle(), arg],
            pass_fds=self.agent.child_fds, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        self.agent.watch(self.proc.pid)
        self._pending = b""

    def serve(self, timeout: float = 10) -> Request | Rejected:
        got = self.agent.serve(timeout)
        assert got is not None, f"no request within {timeout} s; {self.agent.where()}"
        return got

    def request(self, timeout: float = 10) -> Request:
        """The next request, which must be a valid one."""
        got = self.serve(timeout)
        assert isinstance(got, Request), got
        return got

    def line(self, timeout: float = 10) -> dict[str, object]:
        """The next JSON line the child printed (read unbuffered: select() sees only the pipe)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, "the learner process said nothing"
            chunk = os.read(fd, 65536)
            assert chunk, f"the learner process ended: {self.finish()}"
            self._pending += chunk
        text, self._pending = self._pending.split(b"\n", 1)
        return dict(json.loads(text))

    def finish(self, timeout: float = 10) -> str:
        """Waits for the child; its stderr (empty when it exited cleanly)."""
        _, err = self.proc.communicate(timeout=timeout)
        return err.decode()

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()
        self.agent.close()


@pytest.fixture
def learner() -> Iterator[Callable[..., Learner]]:
    """Starts learner processes; each is killed (if still running) and its agent closed after."""
    started: list[Learner] = []

    def start(scenario: str, arg: str = "", **options: Any) -> Learner:
        started.append(Learner(scenario, arg, **options))
        return started[-1]

    yield start
    for each in started:
        each.end()


def answer(agent: AgentEnd, request: Request) -> None:
    """The test's agent: what seal_child.roundtrip expects of each call."""
    if request.op == Call.ALLREDUCE:
        (data,) = request.inputs
        if request.inputs[0].dtype == np.float64 and request.inputs[0].shape == (64,):
            agent.reply(request, outputs=[data * 2])
        else:  # the bytes reversed, as the same dtype and shape
            raw = np.frombuffer(data.tobytes()[::-1], dtype=data.dtype).reshape(data.shape)
            agent.reply(request, outputs=[raw])
    elif request.op == Call.RECV:
        agent.reply(request, ints=(1, 5, 4), outputs=[np.arange(1, 5, dtype=np.int32)])
    elif request.op == Call.SEND:
        agent.fail(request, ValueError(f"dest {request.ints[0]} is not a rank of this communicator"))
    elif request.op == Call.NOW:
        agent.reply(request, floats=(0.25,))
    else:
        agent.reply(request)


@pytest.mark.parametrize("spin_s", [0.0, 1e-4], ids=["blocking", "spin"])
def test_round_trips_of_every_dtype_and_shape_fill_outputs_in_place(
        learner: Callable[..., Learner], spin_s: float) -> None:
    child = learner("roundtrip", spin_s=spin_s)
    seen = []
    for dtype, shape in CASES:  # step 1: the agent's copies of the inputs are exact
        request = child.serve()
        assert isinstance(request, Request) and request.name == "Allreduce"
        (data,) = request.inputs
        assert data.dtype == np.dtype(dtype) and data.shape == shape
        assert data.tobytes() == pattern(dtype, shape).tobytes()
        answer(child.agent, request)
    for _ in range(6):  # in place, a short receive, a failing send, mark, compute, now
        request = child.request()
        seen.append((request.name, request.ints, request.floats, request.text))
        answer(child.agent, request)
    assert seen[0][0] == "Allreduce" and seen[1] == ("Recv", (1, 5), (), "")
    assert seen[2] == ("Send", (3, 0), (), "")
    assert seen[3] == ("mark", (), (), "step") and seen[4] == ("compute", (0,), (0.25,), "matmul")
    assert child.line() == {"done": True}
    assert child.finish() == ""


@pytest.mark.parametrize("spin_s", [0.0, 1e-4], ids=["blocking", "spin"])
def test_thousands_of_calls_leave_no_rings_behind(learner: Callable[..., Learner], spin_s: float) -> None:
    """Each wait reads the rings it saw: were they left in the socket, the agent would take an
    honest learner for a flooder after a few hundred calls."""
    child = learner("many", "3000", spin_s=spin_s)
    for _ in range(3000):
        request = child.request()
        child.agent.reply(request, floats=(0.0,))
    assert child.line() == {"done": True}


def test_the_ends_spin_only_where_every_process_of_the_job_has_a_cpu() -> None:
    """Past the CPUs, a spinner would take the CPU that the end it waits for needs."""
    cpus = len(os.sched_getaffinity(0))
    assert spin_for(cpus) == SPIN_S > 0
    assert spin_for(cpus + 1) == 0.0


def test_forged_requests_get_a_rejection_and_a_pickle_is_never_unpickled(
        learner: Callable[..., Learner], tmp_path: Path) -> None:
    target, canary = tmp_path / "pwned", tmp_path / "canary"
    # The payload is live: unpickled anywhere, it creates its file.
    subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
                   input=boom(str(canary), 5), check=True)
    assert canary.exists()

    child = learner("forged", str(target))
    expected = {  # case -> what the agent's reason must say
        "bad op": "unknown op code 999", "outside": "runs past the data region",
        "negative": "both must be >= 0", "mismatch": "claims 40 bytes", "dtype": "dtype code 99",
        "dest": "dest is -5", "nan": "must be finite", "counts": "Send takes 2 ints, not 1",
        "trailing": "its fields", "garbage": "", "pickle body": "bad magic",
    }
    for case, says in expected.items():
        got = child.serve()
        assert isinstance(got, Rejected), f"{case}: served {got}"
        assert says in got.reason, f"{case}: {got.reason}"
        reply = child.line()
        assert reply["case"] == case and reply["status"] == 1 and says in str(reply["text"])
    mark = child.serve()  # the pickle as the text of a valid mark: a string, nothing more
    assert isinstance(mark, Request) and mark.name == "mark"
    assert mark.text == boom(str(target), 0).decode()
    child.agent.reply(mark)
    now = child.serve()  # the ring without a new call id was not served twice
    assert isinstance(now, Request) and now.name == "now", now
    child.agent.reply(now, floats=(1.5,))
    assert child.line() == {"case": "after", "status": 0, "floats": [1.5]}
    assert isinstance(child.serve(), Rejected)
    assert "unknown op code 999" in str(child.line()["text"])
    assert child.finish() == ""
    assert not target.exists(), "the agent ran the forged pickle"


def test_writes_into_the_arena_out_of_turn_change_nothing_of_the_call(
        learner: Callable[..., Learner]) -> None:
    child = learner("scribble")
    request = child.request()
    place = request.outputs[0]
    assert child.proc.stdin is not None
    child.proc.stdin.write(b"served\n")  # step 2: the learner writes 0xff over the whole arena
    child.proc.stdin.flush()
    assert child.line() == {"scribbled": True}
    arena = child.agent.arena
    assert arena.read_block("request") == b"\xff" * CONTROL, "the scribble happened"
    assert (arena.take(0, np.dtype("<u1"), (1 << 20,)) == 0xFF).all()
    (data,) = request.inputs  # step 3: the agent's request is its own copy
    assert (data == pattern("<f4", (1 << 18,))).all()
    assert request.outputs[0] == place and request.ints == (0,)
    child.agent.reply(request, outputs=[data + 1])
    assert child.line() == {"done": True}


def test_a_learner_killed_mid_call_is_named_with_its_call_and_signal(
        learner: Callable[..., Learner]) -> None:
    child = learner("die")
    t0 = time.monotonic()
    with pytest.raises(LearnerGone) as gone:
        request = child.serve()  # taken before it died, or not: both end in the same words
        while child.agent.learner_status() is None and time.monotonic() - t0 < 10:
            time.sleep(0.01)  # the agent's real call takes long enough for the child to die
        assert isinstance(request, Request) and request.name == "Sendrecv"
        child.agent.reply(request, outputs=[request.inputs[0]])
    assert str(gone.value) == "the learner process died in Sendrecv (killed by SIGKILL)"
    assert time.monotonic() - t0 < 5


def test_a_learner_that_exits_between_calls_or_closes_its_end(learner: Callable[..., Learner]) -> None:
    exits = learner("exit_between")
    answer(exits.agent, exits.request())
    with pytest.raises(LearnerGone, match=r"died after now \(exit status 3\)$"):
        exits.serve()
    closes = learner("close_end")
    answer(closes.agent, closes.request())
    with pytest.raises(LearnerGone) as gone:
        closes.serve()
    assert gone.value.closed and str(gone.value).endswith("closed its end of the channel after Barrier")
    deaf = learner("deaf")  # its reply pipe closed, its request pipe open
    request = deaf.request()
    with pytest.raises(LearnerGone) as gone:
        deaf.agent.reply(request)
    assert gone.value.closed and str(gone.value).endswith("closed its end of the channel in Barrier")


def test_a_learner_whose_child_holds_the_pipes_is_still_seen_dead(learner: Callable[..., Learner]) -> None:
    """No EOF comes (the orphan holds the pipe open): the pidfd tells."""
    child = learner("orphan_holds")
    answer(child.agent, child.request())
    orphan = int(str(child.line()["orphan"]))
    try:
        t0 = time.monotonic()
        with pytest.raises(LearnerGone, match="died after now .killed by SIGKILL."):
            child.serve()
        assert time.monotonic() - t0 < 2
    finally:
        os.kill(orphan, 9)


def test_a_learner_that_takes_back_its_rings_cannot_hold_its_agent_in_a_read(
        learner: Callable[..., Learner]) -> None:
    """A pipe's read end can be opened again through /proc: the agent's reads never block, so
    bytes taken from under it send it back to polling, where the learner's death shows."""
    child = learner("steal_rings")
    answer(child.agent, child.request())
    said = child.line()
    orphan = int(str(said["orphan"]))
    try:
        t0 = time.monotonic()
        with pytest.raises(LearnerGone, match=r"died (in|after) (Barrier|now) .killed by SIGKILL."):
            while True:  # the Barrier is answered if the agent read its ring first
                answer(child.agent, child.request())
        assert time.monotonic() - t0 < 2
    finally:
        os.kill(orphan, 9)


def test_a_silent_learner_times_out_the_wait(learner: Callable[..., Learner]) -> None:
    child = learner("silent")
    t0 = time.monotonic()
    assert child.agent.serve(timeout=0.3) is None
    assert 0.25 < time.monotonic() - t0 < 2
    assert child.agent.where() == "before its first call"


def test_a_learner_that_never_reads_its_replies_is_named_a_flooder(learner: Callable[..., Learner]) -> None:
    child = learner("flood")
    with pytest.raises(LearnerFlooding, match="does not read its replies"):
        for _ in range(100_000):
            request = child.serve()
            if isinstance(request, Request):
                child.agent.reply(request, floats=(0.0,))


def test_the_arena_cannot_be_shrunk_or_grown_by_the_learner(learner: Callable[..., Learner]) -> None:
    """A shrunk arena would make the agent's next read a SIGBUS: its size is sealed."""
    child = learner("shrink", data_size=1 << 16)
    sizes = [child.line() for _ in range(3)]
    assert all("refused" in s for s in sizes), sizes
    answer(child.agent, child.request())
    assert child.line() == {"size": child.agent.arena.size, "now": [0.25]}


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to nobody needs root")
def test_a_learner_running_as_nobody_uses_the_inherited_arena(learner: Callable[..., Learner]) -> None:
    child = learner("nobody")
    request = child.request()
    child.agent.reply(request, outputs=[request.inputs[0] + 1])
    # uid 65534 mapped the arena from its descriptor; the agent's /proc fd path stays shut.
    assert child.line() == {"uid": 65534, "by_path": "refused", "ok": True}


def test_buffers_larger_than_the_arena_fail_naming_both_sizes() -> None:
    agent = AgentEnd.create(4096)
    _, read_fd, write_fd = agent.child_fds
    seal = LearnerEnd(Arena.attach(os.dup(agent.arena.fd), 4096),
                      Doorbell(os.dup(read_fd), os.dup(write_fd), plain_reads=True))
    with pytest.raises(ArenaTooSmall, match=r"Allreduce's buffers need 8032 bytes .* holds 4096 "):
        seal.call(Call.ALLREDUCE, (0,), inputs=(np.zeros(1000, np.float32),),
                  outputs=(np.zeros(1000, np.float32),))
    for args in ((object(),), ("step", "two"), (1, None)):  # refused before anything crosses
        with pytest.raises(TypeError, match="call args are ints, floats and at most one str"):
            seal.call(Call.MARK, args)
    seal.close()
    agent.close()


def test_the_decoder_answers_garbage_with_bad_request_only() -> None:
    """Random blocks; valid requests cut short or run long; valid requests with bytes changed:
    BadRequest or a valid decode inside the arena, never another exception."""
    size = 1 << 20
    f8, u1 = np.dtype("<f8"), np.dtype("<u1")
    samples = [
        encode_request(5, Call.SENDRECV, (1, 0, 2, -1), (), (Buffer(0, 80, f8, (10,)),),
                       (Buffer(128, 80, f8, (2, 5)),), ""),
        encode_request(5, Call.WAITALL, (1, 2, 3), (), (), (Buffer(0, 6, u1, (1, 2, 3)),), ""),
        encode_request(5, Call.COMPUTE, (1,), (2.5e9,), (), (), "forward"),
    ]
    valid = [struct.pack("<Q", 5) + framed(body) for body in samples]
    valid = [block + bytes(CONTROL - len(block)) for block in valid]
    decoded = decode_request(valid[0], CALLS, size, 4)
    assert decoded.name == "Sendrecv" and decoded.outputs[0].shape == (2, 5)
    rng = np.random.default_rng(0)
    blocks = [rng.bytes(CONTROL) for _ in range(300)]
    for block, body in zip(valid, samples):
        for length in range(len(body) + 16):  # the body length field, every value around it
            blocks.append(block[:8] + struct.pack("<I", length) + block[12:])
        for _ in range(1000):  # one to four bytes changed anywhere in the body's span
            changed = bytearray(block)
            for at in rng.integers(0, len(body) + 12, size=int(rng.integers(1, 5))):
                changed[at] = int(rng.integers(0, 256))
            blocks.append(bytes(changed))
    outcomes = []
    for block in blocks:
        try:
            got = decode_request(block, CALLS, size, 4)
            assert all(b.offset + b.nbytes <= size for b in got.inputs + got.outputs)
            outcomes.append("valid")
        except BadRequest:
            outcomes.append("rejected")
    assert set(outcomes[:300]) == {"rejected"}, "a random block decoded"
    assert outcomes[300:].count("rejected") > 2000 and "valid" in outcomes[300:]


def test_a_blocking_call_may_carry_its_timeout_and_no_other_call_may() -> None:
    """One float more than its signature's is a timed call's own timeout (calls.py); on a call
    that takes none, or two more, the decoder refuses the request."""
    size = 1 << 20
    f8 = np.dtype("<f8")

    def decode(op: int, floats: tuple[float, ...], outputs: tuple[Buffer, ...] = ()) -> Any:
        body = encode_request(5, op, (1, 0), floats, (), outputs, "")
        block = struct.pack("<Q", 5) + framed(body)
        return decode_request(block + bytes(CONTROL - len(block)), CALLS, size, 4)

    place = (Buffer(0, 80, f8, (10,)),)
    assert decode(Call.RECV, (), place).floats == ()
    assert decode(Call.RECV, (0.5,), place).floats == (0.5,)
    with pytest.raises(BadRequest, match=r"Recv takes 0 floats \(or 1, with a timeout\), not 2"):
        decode(Call.RECV, (0.5, 0.5), place)
    with pytest.raises(BadRequest, match=r"Irecv takes 0 floats, not 1"):
        decode(Call.IRECV, (0.5,), place)


def test_an_empty_buffer_of_a_shape_numpy_cannot_make_is_refused() -> None:
    """(0, 2**62) float64 claims its zero bytes truly, but NumPy refuses to shape it: an outside
    tester's request crashed the agent's serve with NumPy's ValueError instead of a rejection."""
    size = 1 << 20
    f8 = np.dtype("<f8")

    def decode(shape: tuple[int, ...]) -> Any:
        body = encode_request(5, Call.RECV, (1, 0), (), (), (Buffer(0, 0, f8, shape),), "")
        block = struct.pack("<Q", 5) + framed(body)
        return decode_request(block + bytes(CONTROL - len(block)), CALLS, size, 4)

    assert decode((0, 5)).outputs[0].shape == (0, 5)
    with pytest.raises(BadRequest, match=r"larger than the data region"):
        decode((0, 2**62))
    np.empty((0, 5), dtype=f8).reshape((0, size // 8))  # the largest it accepts, NumPy shapes


NO_ROOM_FOR_A_LINE = """
import os, resource, socket
from distlab.runtime.seal.agent import AgentEnd
from distlab.runtime.seal.lines import AgentLines

first = AgentEnd.create(64 << 20)
lines = AgentLines.create(first)
theirs = socket.socket(fileno=os.dup(lines.child_fd))
lines.start(os.getpid(), serve=lambda end: None, refused=print)
status = open("/proc/self/status").read()
size_kib = int(status.split("VmSize:")[1].split()[0])
room = (size_kib << 10) + (32 << 20)  # less than another arena's 64 MiB
resource.setrlimit(resource.RLIMIT_AS, (room, room))
theirs.sendall(b"+")
assert lines.answer()
answer, fds, _, _ = socket.recv_fds(theirs, 256, 2)
print(answer.decode(), len(fds), len(lines.further))
"""


def test_an_agent_with_no_room_for_another_line_refuses_it_saying_why() -> None:
    """A learner thread's call asks for a line of its own (seal/lines.py); under the rank's
    address-space limit its arena may not fit: the ask is refused with the reason, which the
    thread's call raises, and the agent goes on (it opened nothing)."""
    done = subprocess.run([sys.executable, "-c", NO_ROOM_FOR_A_LINE], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC}, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("-no room for another arena ("), done.stdout
    assert done.stdout.rstrip().endswith(" 0 0"), done.stdout  # no descriptors, no line


def test_an_opener_asked_past_its_lines_is_named_once_and_shut() -> None:
    """A learner asks for further lines (seal/lines.py) past the number its client opens, here in
    one write of a thousand asks: the agent opens seven, names the tampering once, and shuts the
    opener instead of answering (and recording) every ask that follows."""
    from distlab.runtime.seal.lines import MAX_FURTHER, AgentLines

    first = AgentEnd.create(1 << 16)
    lines = AgentLines.create(first)
    theirs = socket.socket(fileno=os.dup(lines.child_fd))
    refused: list[str] = []
    served: list[AgentEnd] = []
    lines.start(os.getpid(), served.append, refused.append)
    try:
        theirs.sendall(b"+" * 1000)
        assert lines.answer() is False  # shut: the watcher stops looking at it
        assert len(lines.further) == MAX_FURTHER and len(refused) == 1, refused
        assert "asked for more than 7 further lines" in refused[0]
        given = 0
        while True:
            answer, fds, _, _ = socket.recv_fds(theirs, 1, 2)
            if not answer:
                break  # the agent shut the opener
            given += 1
            for fd in fds:
                os.close(fd)
        assert given == MAX_FURTHER
        with pytest.raises(OSError):
            for _ in range(100):
                theirs.send(b"+")
    finally:
        lines.close()
        theirs.close()
        first.close()
