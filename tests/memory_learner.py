"""The learner's file of tests/test_memory_probe.py: it holds memory in each of the places the
memory probe counts, a mark after each, and forges a reading the harness never asks for."""

import subprocess
import sys

import numpy as np

MIB = 1 << 20
STASH = np.ones(30 * MIB // 4, dtype=np.float32)  # 30 MiB, written (held) as the file is imported

# A process of its own, in a session of its own (detached from the learner), holding 40 MiB.
HOLDER = "import sys, time; held = b'x' * (40 << 20); print('ready', flush=True); time.sleep(120)"


def hold_everywhere(comm):
    comm.mark("start")
    grown = np.ones(20 * MIB // 4, dtype=np.float32)
    comm.mark("array")
    child = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, start_new_session=True)
    child.stdout.readline()
    comm.mark("child")
    with open("blob", "wb") as blob:  # in the learner's own folder: its /tmp, a tmpfs of its own
        blob.write(b"x" * (10 * MIB))
    comm.mark("file")
    return int(grown.nbytes + STASH.nbytes)


def hold_between_marks(comm):
    """30 MiB held for a while between two marks, and gone at each."""
    import time

    comm.mark("start")
    held = np.ones(30 * MIB // 4, dtype=np.float32)
    time.sleep(0.2)
    del held
    comm.mark("end")
    return 0


def just_mark(comm):
    comm.mark("start")
    return 1


def read_again(comm):
    """Sends the reading its harness sent before this file was imported: tampering."""
    from distlab.runtime.seal.calls import Call

    comm._end.call(Call.BEFORE_SOLUTION)
    comm.Barrier()


def _arena_descriptors():
    """This process's descriptors of the seal's arenas (memfds past 64 MiB), by number."""
    import os

    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("/memfd:") and os.fstat(int(name)).st_size > 64 * MIB:
            found.append(int(name))
    return sorted(found)


def hold_in_the_arena(comm):
    """24 MiB kept in the seal's arena (mapped again through /proc/self/fd), where the learner's
    processes hold nothing of it; then 24 MiB parked in the agent as a message to itself."""
    import mmap
    import os

    comm.mark("start")
    fd = _arena_descriptors()[0]
    size = os.fstat(fd).st_size  # its last 24 MiB: the whole would pass the limit
    arena = mmap.mmap(fd, 24 * MIB, mmap.MAP_SHARED, offset=size - 24 * MIB)
    kept = np.frombuffer(arena, dtype=np.uint8)
    kept[:] = 7
    comm.mark("in arena")
    survived = bool(kept[::4096].all())
    del kept
    parked = np.full(24 * MIB // 8, 3.0)
    request = comm.Isend(parked, comm.Get_rank(), 5)
    del parked
    comm.mark("parked")
    back = np.empty(24 * MIB // 8)
    comm.Recv(back, comm.Get_rank(), 5)
    request.Wait()
    comm.mark("taken back")  # in the learner's array now, no longer in the agent
    return survived


def hold_in_a_thread_s_line(comm):
    """24 MiB kept in the arena of the line a thread's call opened (seal/lines.py): cleared at a
    mark, where that line owes the learner nothing; then kept again with the line's reply made to
    read as not taken yet (its id written back by hand), which no reading may clear: counted."""
    import ctypes
    import mmap
    import os
    import threading

    from distlab.runtime.seal.arena import CONTROL

    comm.mark("start")
    thread = threading.Thread(target=comm.Barrier)  # a call off the main thread: a line of its own
    thread.start()
    thread.join()
    arenas = _arena_descriptors()
    line = max(arenas)  # the first line's arena came with the process; the thread's came after
    arena = mmap.mmap(line, os.fstat(line).st_size, mmap.MAP_SHARED)
    kept = np.frombuffer(arena, dtype=np.uint8)[-24 * MIB:]
    kept[:] = 7
    comm.mark("kept in a line")
    cleared = not kept[::4096].any()
    kept[:] = 7
    ctypes.c_uint64.from_buffer(arena, CONTROL).value = 12345  # "a reply not taken yet"
    comm.mark("kept, the reply not taken")
    survived = bool(kept[::4096].all())
    del kept
    return len(arenas), cleared, survived


def flood_the_agent(comm):
    """Messages to itself, unreceived: 32 MiB each until the agent refuses one; then taken back."""
    sent, said, requests = 0, "", []
    try:
        while sent < 4096:
            requests.append(comm.Isend(np.ones(4 * MIB), comm.Get_rank(), 1))
            sent += 32
    except MemoryError as refused:
        said = str(refused)
    back = np.empty(4 * MIB)
    for request in requests:
        comm.Recv(back, comm.Get_rank(), 1)
        request.Wait()
    return sent, said


def park_with_a_peer(comm):
    """Rank 0 sends rank 1 24 MiB before a mark, which rank 1 receives only after its own: at the
    mark they are on their way, in an agent, where no reading of the learners finds them."""
    comm.mark("start")
    request = comm.Isend(np.full(24 * MIB // 8, 3.0), 1, 5) if comm.Get_rank() == 0 else None
    comm.mark("parked")
    if request is None:
        comm.Recv(np.empty(24 * MIB // 8), 0, 5)
    else:
        request.Wait()
    comm.mark("taken")
    return 0


def hold_past_an_own_mark(comm):
    """A mark of its own right after the program's "start", then 30 MiB held for a while and gone
    by "end": had its own mark ended the sampling, nothing would show them."""
    import time

    comm.mark("start")
    comm.mark("mine")
    held = np.ones(30 * MIB // 4, dtype=np.float32)
    time.sleep(0.2)
    del held
    comm.mark("end")
    return 0
