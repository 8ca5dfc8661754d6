"""The memory probe (runtime/rank/memory.py): what a learner's processes hold, read from /proc by
its rank's agent at each mark of a task that asks (Task(memory=True)), and once before the
learner's file is imported. Problem 13 grades on it (tests/test_problem13.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_launcher
from test_launcher import run

from distlab.grading.held import held_with_in_flight
from distlab.runtime.jobspec import Limits, Task
from distlab.runtime.rank.memory import descendants, held_bytes
from distlab.runtime.rank.pause import paused
from distlab.runtime.zygote.client import preload_for

LEARNER = Path(__file__).resolve().parent / "memory_learner.py"
MIB = 1 << 20

HOLDER = """
import mmap, os, sys, time
kind = sys.argv[1]
if kind == "array":
    held = b"x" * (24 << 20)
elif kind == "shared":
    held = mmap.mmap(-1, 24 << 20, mmap.MAP_SHARED)
    held.write(b"x" * (24 << 20))
elif kind == "memfd":
    fd = os.memfd_create("probe-test")
    os.ftruncate(fd, 24 << 20)
    held = mmap.mmap(fd, 24 << 20, mmap.MAP_SHARED)
    held.write(b"x" * (24 << 20))
    print(os.fstat(fd).st_ino, flush=True)
elif kind == "memfd unmapped":  # written through the descriptor, no mapping
    fd = os.memfd_create("probe-test")
    os.write(fd, b"x" * (24 << 20))
elif kind == "memfd mapped read-only":  # and the descriptor closed
    fd = os.memfd_create("probe-test")
    os.write(fd, b"x" * (24 << 20))
    held = mmap.mmap(fd, 24 << 20, mmap.MAP_SHARED, mmap.PROT_READ)
    held[::4096]
    os.close(fd)
elif kind == "pipes":  # 24 pipes of 1 MiB, full, never read
    import fcntl
    held = []
    for _ in range(24):
        r, w = os.pipe()
        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
        os.write(w, b"x" * (1 << 20))
        held.append((r, w))
print("ready", flush=True)
time.sleep(60)
"""


def holder(kind: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, kind], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc


@pytest.mark.parametrize("kind", ["array", "shared", "memfd", "memfd unmapped", "memfd mapped read-only", "pipes"])
def test_held_bytes_counts_a_process_s_own_pages_and_skips_the_arena(kind: str) -> None:
    idle = subprocess.Popen([sys.executable, "-c", "print('ready', flush=True); import time; time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    proc = holder(kind)
    try:
        assert idle.stdout is not None and idle.stdout.readline() == "ready\n"
        assert proc.stdout is not None
        inode = int(proc.stdout.readline()) if kind == "memfd" else None
        assert proc.stdout.readline() == "ready\n"
        extra = held_bytes([proc.pid]) - held_bytes([idle.pid])
        assert 23 * MIB < extra < 27 * MIB, extra / MIB
        if inode is not None:  # the seal's arena is a memfd: its mapping is the harness's, not counted
            assert held_bytes([proc.pid], skip_inodes=[inode]) - held_bytes([idle.pid]) < 2 * MIB
    finally:
        for p in (idle, proc):
            p.kill()
            p.wait()
    assert held_bytes([proc.pid]) == 0  # gone: nothing


def test_shared_memory_an_unsealed_rank_s_engine_maps_from_its_folders_is_not_counted(tmp_path: Path) -> None:
    # Unsealed, Open MPI's segments and the job folder's files share the rank's process; they are
    # the engine's and the harness's (held_bytes' skip_paths), as they are sealed, not the learner's.
    mapped = tmp_path / "engine" / "segment"
    mapped.parent.mkdir()
    script = (f"import mmap; f = open({str(mapped)!r}, 'w+b'); f.truncate(24 << 20); "
              "m = mmap.mmap(f.fileno(), 24 << 20); m.write(b'x' * (24 << 20)); print('ready', flush=True); "
              "import time; time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        counted = held_bytes([proc.pid])
        skipped = held_bytes([proc.pid], skip_paths=(f"{mapped.parent}/",))
        assert 23 * MIB < counted - skipped < 27 * MIB, (counted - skipped) / MIB
        assert abs(held_bytes([proc.pid], skip_paths=(f"{tmp_path}/elsewhere/",)) - counted) < MIB
    finally:
        proc.kill()
        proc.wait()


_FRAGMENTED_HEAP = """
import os
from distlab.grading import return_freed_memory
from distlab.runtime.rank.memory import held_bytes
blocks = [bytearray(8192) for _ in range(2000)]  # from the heap (below the mmap threshold), in a row
del blocks[::2]  # every other one freed: holes between live blocks, which no trim of the top returns
before = held_bytes([os.getpid()])
return_freed_memory()
print(before - held_bytes([os.getpid()]))
"""


def test_return_freed_memory_gives_back_the_pages_of_holes_in_the_heap() -> None:
    # Problem 07's program calls it before its mark "fuse": the gradient step's freed temporaries,
    # kept by the heap between live chunks, read as memory the learner made (one run in 15).
    given_back = int(subprocess.run([sys.executable, "-c", _FRAGMENTED_HEAP], capture_output=True,
                                    text=True, check=True, timeout=60).stdout)
    # Each freed 8 KiB block holds a whole page at least (4.1 MB in all, seen); without the trim
    # nothing comes back (-4 KiB, seen). Half of it, for the reading's own noise.
    assert given_back >= 500 * 4096


def test_descendants_finds_grandchildren() -> None:
    outer = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                              "print(p.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert outer.stdout is not None
        inner = int(outer.stdout.readline())
        assert descendants(os.getpid()).count(inner) == 1 and inner in descendants(outer.pid)
    finally:
        os.kill(inner, 9)
        outer.kill()
        outer.wait()


TICKER = """
import os, sys, threading, time
ticks = {"n": 0}
def tick():
    while True:
        ticks["n"] += 1
        time.sleep(0.001)
threading.Thread(target=tick, daemon=True).start()
if os.fork() == 0:  # a child that starts a grandchild of its own a moment later
    time.sleep(0.05)
    if os.fork() == 0:
        time.sleep(60)
    time.sleep(60)
while True:
    line = sys.stdin.readline()
    print(ticks["n"], flush=True)
"""


def test_paused_stops_every_thread_and_every_process_started_meanwhile() -> None:
    """A reading at a mark pauses the learner's processes (pause.py): a ticking thread does not
    tick until the block ends, and a process started while the others were being stopped is
    stopped too (the list is read again until nothing is new)."""
    proc = subprocess.Popen([sys.executable, "-c", TICKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None

    def ticks() -> int:
        proc.stdin.write("\n")
        proc.stdin.flush()
        return int(proc.stdout.readline())

    try:
        ticks()
        time.sleep(0.2)  # the grandchild exists
        family = [proc.pid, *descendants(proc.pid)]
        assert len(family) == 3
        seen: list[list[int]] = []

        def listed() -> list[int]:  # the grandchild only from the second listing on
            seen.append([])
            return family if len(seen) > 1 else family[:2]

        with paused(listed) as stopped:
            assert sorted(stopped) == sorted(family) and len(seen) == 3
            threads = [task / "stat" for pid in family for task in Path(f"/proc/{pid}/task").iterdir()]
            assert len(threads) == 4  # the ticker's two, one each below it
            assert {t.read_text().rpartition(")")[2].split()[0] for t in threads} == {"T"}
        first = ticks()
        time.sleep(0.1)
        assert ticks() > first + 10  # going on
    finally:
        for pid in descendants(proc.pid):
            os.kill(pid, 9)
        proc.kill()
        proc.wait()


@pytest.fixture
def sealed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(test_launcher, "SEAL", True)


@pytest.mark.usefixtures("sealed")
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_the_agent_reads_what_the_learner_holds_wherever_it_holds_it(backend: str) -> None:
    job = test_launcher.make_job("call_solution", [Task(ranks=1, args=("hold_everywhere",), memory=True)],
                                 LEARNER, backend=backend)
    result = run(job, deadline_s=60)
    assert result.ok, result.message
    outcome = result.task_outcomes(0)[0]
    readings = {name: held for name, held, _ in outcome.memory[1:]}
    before = outcome.memory[0][1]
    assert outcome.value == 50 * MIB
    # Read before the file was imported: its 30 MiB array came after.
    assert readings["start"] - before > 29 * MIB, (before, readings)
    growth = {name: (readings[name] - readings[prev]) / MIB
              for prev, name in [("start", "array"), ("array", "child"), ("child", "file")]}
    assert 19 < growth["array"] < 22, growth
    assert 39 < growth["child"] < 44, growth  # a process of its own, in a session of its own
    assert 9.5 < growth["file"] < 12, growth  # a file on the learner's own /tmp


@pytest.mark.usefixtures("sealed")
def test_memory_held_between_two_marks_shows_in_the_sampled_peak() -> None:
    # A reading at a mark is taken when the learner's code chose: its agent also samples it meanwhile.
    job = test_launcher.make_job("call_solution", [Task(ranks=1, args=("hold_between_marks",), memory=True,
                                                      memory_sampled=("start",))], LEARNER)
    result = run(job, deadline_s=60)
    assert result.ok, result.message
    (_, start, _), (_, end, peak) = result.task_outcomes(0)[0].memory[1:]
    assert abs(end - start) < 2 * MIB and peak - start > 29 * MIB, (start, end, peak)


@pytest.mark.usefixtures("sealed")
def test_a_mark_of_the_learner_s_own_neither_ends_the_sampling_nor_starts_a_new_peak() -> None:
    """Where the task names the program's marks, the learner's own mark inside a sampled span (an
    outside tester's, inside add()) lets the sampling go on to the program's next mark."""
    job = test_launcher.make_job("call_solution", [Task(ranks=1, args=("hold_past_an_own_mark",), memory=True,
                                                      memory_sampled=("start",), memory_named=("start", "end"))],
                                 LEARNER)
    result = run(job, deadline_s=60)
    assert result.ok, result.message
    (_, start, _), (_, mine, _), (_, end, peak) = result.task_outcomes(0)[0].memory[1:]
    assert abs(end - start) < 2 * MIB and abs(mine - start) < 2 * MIB and peak - start > 29 * MIB, (start, end, peak)


@pytest.mark.usefixtures("sealed")
def test_what_the_learner_keeps_in_the_arena_or_parks_in_its_agent_is_lost_or_counted() -> None:
    """An outside tester kept 24 MB of Adam's moments in the seal's arena, and another parked them in
    its agent as a message to itself: a reading clears the arena's data region (what was kept there
    reads as zeros after) and counts the bytes the rank sent itself and has not taken back."""
    job = test_launcher.make_job("call_solution", [Task(ranks=1, args=("hold_in_the_arena",), memory=True)],
                                 LEARNER)
    result = run(job, deadline_s=60)
    assert result.ok, result.message
    outcome = result.task_outcomes(0)[0]
    assert outcome.value is False  # the arena was cleared at the mark: its 24 MiB are gone
    (_, start, _), (_, in_arena, _), (_, parked, _), (_, back, _) = outcome.memory[1:]
    assert in_arena - start < 2 * MIB, (start, in_arena)  # cleared, so nothing held there to count
    assert parked - start > 23 * MIB and abs(back - parked) < 2 * MIB, (start, parked, back)


@pytest.mark.usefixtures("sealed")
def test_bytes_on_their_way_to_a_peer_at_a_mark_count_as_the_sender_s() -> None:
    """An outside tester parked Adam's moments in Isends to a neighbour, received at the next step:
    the readings of what the learners hold never see them, the counters do (grading/held.py)."""
    job = test_launcher.make_job("call_solution", [Task(ranks=2, args=("park_with_a_peer",), memory=True)], LEARNER)
    result = run(job, deadline_s=60)
    assert result.ok, result.message
    outcomes = result.task_outcomes(0)
    sender, receiver = (held_with_in_flight(outcomes, rank) for rank in (0, 1))
    assert sender.at("parked") - sender.at("start") > 23 * MIB, sender
    assert abs(sender.at("taken") - sender.at("start")) < 2 * MIB, sender
    assert abs(receiver.at("parked") - receiver.at("start")) < 2 * MIB, receiver  # nothing of its own away
    unread = [(name, held) for name, held, _ in outcomes[0].memory[1:]]  # the agent's own readings
    assert unread[1][1] - unread[0][1] < 2 * MIB, unread  # did not see them: the counters did


@pytest.mark.usefixtures("sealed")
def test_messages_a_learner_leaves_unreceived_to_itself_stop_at_its_memory_limit() -> None:
    """Sealed they wait in the agent, which no limit of the learner's bounds (an outside tester's
    sends took an agent to 3.3 GB; it keeps the rank's limits now): past half the rank's memory
    limit a send to itself is refused, in words the learner's code can catch."""
    job = test_launcher.make_job("call_solution", [Task(ranks=1, args=("flood_the_agent",))], LEARNER,
                                 limits=Limits(address_space_mb=1024))
    result = run(job, deadline_s=60)
    assert result.ok, result.message
    sent, said = result.task_outcomes(0)[0].value
    assert sent == 512 and "more than half its memory limit (512 MiB)" in said, (sent, said)


@pytest.mark.usefixtures("sealed")
def test_a_reading_the_learner_asks_for_itself_is_tampering() -> None:
    job = test_launcher.make_job("call_solution", [Task(ranks=1, args=("read_again",), memory=True)], LEARNER)
    result = run(job, deadline_s=60)
    assert result.status == "error", result.message
    assert "tampered with the channel" in result.message and "a memory reading its harness never asks for" in result.message


def test_unread_tasks_carry_no_readings() -> None:
    job = test_launcher.make_job("call_solution", [Task(ranks=1, args=("just_mark",))], LEARNER)
    assert not job.memory_probe
    result = run(job, deadline_s=60)
    assert result.ok, result.message
    assert result.task_outcomes(0)[0].memory == []


def test_a_job_that_reads_memory_preloads_what_the_solution_imports_anywhere(tmp_path: Path) -> None:
    # Imported in the zygote, torch's pages are held before the first reading: a learner who imports
    # it inside a method is not charged its hundred MiB as memory the method kept.
    program, solution = tmp_path / "program.py", tmp_path / "solution.py"
    program.write_text("import numpy\n")
    solution.write_text("def fuse(tensors):\n    import torch.nn.functional as F\n    return F\n")
    assert "torch" not in preload_for("mpi", str(program), sealed=True)
    assert "torch" in preload_for("mpi", str(program), sealed=True, solution_file=str(solution))
    solution.write_text("import json\n")
    assert "json" not in preload_for("mpi", str(program), sealed=True, solution_file=str(solution))


@pytest.mark.usefixtures("sealed")
def test_what_the_learner_keeps_in_a_thread_s_line_is_lost_or_counted() -> None:
    """A thread's call opens a line of its own, with an arena of its own (seal/lines.py): a reading
    clears it as it clears the first, where it holds nothing a call needs, and where it may (a reply
    the learner has not taken yet), counts what it holds."""
    job = test_launcher.make_job("call_solution", [Task(ranks=1, args=("hold_in_a_thread_s_line",), memory=True)],
                                 LEARNER)
    result = run(job, deadline_s=60)
    assert result.ok, result.message
    outcome = result.task_outcomes(0)[0]
    assert outcome.value[0] >= 2 and outcome.value[1:] == (True, True), outcome.value  # cleared, then kept
    (_, start, _), (_, cleared, _), (_, owed, _) = outcome.memory[1:]
    assert cleared - start < 2 * MIB, (start, cleared)
    assert owed - start > 23 * MIB, (start, owed)
