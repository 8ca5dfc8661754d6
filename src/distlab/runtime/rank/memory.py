"""What the learner's processes hold in memory, as the kernel counts it: the memory probe's evidence.

A task that asks (``Task(memory=True)``) has its rank read this at each of its marks, and once
before the learner's file is imported (``LearnerProcess`` sealed, the rank itself unsealed). A
number the learner's code reports about its own memory (tracemalloc's) is the learner's to forge;
these are read from /proc by the rank's agent, outside the learner process.

Held memory is what a process keeps of its own: every anonymous page (``Anonymous`` in
/proc/PID/smaps_rollup: the heap, NumPy's arrays, private mappings), resident or swapped out (``Swap``),
and every resident page of a writable shared mapping (a shared anonymous mmap, a memfd, a file
on /dev/shm mapped in), but not the seal's arena, which the agent shares with it and whose pages
the harness's copies touch. Memory held through a descriptor rather than a mapping counts too:
a memfd's pages, the bytes waiting in a pipe; and, of a sandbox with its own writable tmpfs
folders (sandbox.py), what their files hold: data written to /tmp and read back later is memory
held outside the process. System V shared memory and message queues are refused outright
(seal/syscalls.py). Not counted: data queued in a socket's buffers (a few hundred KiB each).
Shared libraries and other files mapped read-only do not count: they are the same whoever runs.

Where the learner's code starts processes, each one's own pages count as well (COW pages of a
fork once per process: an over-count only where the code forks). Reading a process takes about a
millisecond (3 with torch imported; 10 more where it maps shared memory to count, whose mappings
smaps lists one by one), so only tasks that ask pay for it.
"""

from __future__ import annotations

import array
import fcntl
import os
import random
import termios
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from ..jobspec import BEFORE_SOLUTION

# Where a mounted sandbox gives the learner a tmpfs of its own (sandbox.py's scratch folders).
SCRATCH = ("tmp", "var/tmp", "dev/shm")
# How smaps names the files that are memory: a memfd, shared anonymous memory, System V's.
_MEMORY_FILES = (b"/memfd:", b"/dev/zero", b"/SYSV")


def held_bytes(pids: Iterable[int], skip_inodes: Iterable[int] = (), scratch_of: int | None = None,
               skip_paths: tuple[str, ...] = ()) -> int:
    """The bytes the processes ``pids`` hold (module docstring); ``skip_inodes``: the arenas'
    inodes, whose mappings are not counted; ``scratch_of``: a process whose root's scratch folders
    (its own tmpfs mounts) count too; ``skip_paths``: where files mapped in are not counted (an
    unsealed rank's engine's). A process that is gone counts nothing."""
    counted: set[int] = set(skip_inodes)  # shared memory, once
    skipped = tuple(path.encode() for path in skip_paths)
    total = 0
    for pid in pids:
        total += _mapped(pid, counted, skipped) + _in_descriptors(pid, counted)
    if scratch_of is not None:
        total += scratch_bytes(scratch_of)
    return total


def _mapped(pid: int, counted: set[int], skipped: tuple[bytes, ...] = ()) -> int:
    """Anonymous and swapped-out pages of every mapping, and the resident pages of each shared
    mapping of memory, or writable, not counted yet (its inode is then added to ``counted``).

    /proc/PID/smaps is made a page at a time, the mappings unlocked in between, and a mapping that
    changes meanwhile can be listed twice: the heap, whose end moves at each brk, was, and a correct
    fusion read 30-35 MiB high (its heap, twice) in one run of ten. So the anonymous pages come from
    smaps_rollup, which the kernel totals in one pass, and smaps is read only where maps lists a
    shared mapping to count, for those mappings, each once."""
    try:
        anonymous = _anonymous(pid)
        shared = _shared_to_count(pid, counted, skipped)
        return anonymous + (_resident(pid, shared) if shared else 0)
    except (FileNotFoundError, ProcessLookupError):
        return 0


def _anonymous(pid: int) -> int:
    """Anonymous pages, resident or swapped out, of all the process's mappings."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
        for line in rollup:
            if line.startswith((b"Anonymous:", b"Swap:")):
                total += int(line.split()[1]) << 10
    return total


def _shared_to_count(pid: int, counted: set[int], skipped: tuple[bytes, ...]) -> set[bytes]:
    """The start addresses of the shared mappings of memory, or writable, whose pages count (those
    of an inode in ``counted`` do not, nor files under ``skipped``; each inode found is added)."""
    starts = set()
    with open(f"/proc/{pid}/maps", "rb") as maps:
        for line in maps:
            fields = line.split(None, 5)  # range perms offset dev inode [path]
            perms, inode, path = fields[1], int(fields[4]), fields[5] if len(fields) > 5 else b""
            # Shared memory mapped read-only holds its pages too (written through a descriptor).
            if (perms[3:4] == b"s" and (perms[1:2] == b"w" or path.startswith(_MEMORY_FILES))
                    and inode not in counted and not (skipped and path.startswith(skipped))):
                starts.add(fields[0].split(b"-")[0])
                if inode:  # inode 0: shared anonymous memory, its own each time
                    counted.add(inode)
    return starts


def _resident(pid: int, starts: set[bytes]) -> int:
    """The resident pages of the mappings that begin at ``starts``, each counted once."""
    total, counting, seen = 0, False, set()
    with open(f"/proc/{pid}/smaps", "rb") as smaps:
        for line in smaps:
            head = line[:1]
            if head.isdigit() or b"a" <= head <= b"f":  # a mapping's first line: range perms ...
                start = line.split(b"-", 1)[0]
                counting = start in starts and start not in seen
                seen.add(start)
            elif counting and line.startswith(b"Rss:"):
                total += int(line.split()[1]) << 10
    return total


def _in_descriptors(pid: int, counted: set[int]) -> int:
    """What the process holds through its descriptors and no mapping: a memfd's pages (no folder
    shows its file), and the bytes waiting in a pipe (up to a megabyte each)."""
    total = 0
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for fd in descriptors:
        path = f"/proc/{pid}/fd/{fd}"
        try:
            target = os.readlink(path)
            if target.startswith("/memfd:"):
                status = os.stat(path)
                if status.st_ino not in counted:
                    counted.add(status.st_ino)
                    total += status.st_blocks * 512
            elif target.startswith("pipe:["):
                inode = int(target[6:-1])
                if inode not in counted:
                    counted.add(inode)
                    total += _queued(path)
        except (OSError, ValueError):
            continue  # closed meanwhile
    return total


def _queued(pipe: str) -> int:
    """Bytes waiting in a pipe, read through a descriptor of its own (FIONREAD)."""
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    try:
        waiting = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, waiting)
        return int(waiting[0])
    finally:
        os.close(fd)


def scratch_bytes(pid: int) -> int:
    """What the files in the process's own tmpfs folders hold: those not on the device this
    process sees at the same path (without mounts the learner writes into the job's folders,
    which are disk, not memory)."""
    total = 0
    for folder in SCRATCH:
        theirs = Path(f"/proc/{pid}/root") / folder
        try:
            if os.stat(theirs).st_dev == os.stat(Path("/") / folder).st_dev:
                continue
            usage = os.statvfs(theirs)
        except OSError:
            continue
        total += (usage.f_blocks - usage.f_bfree) * usage.f_frsize
    return total


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, theirs, ...), as /proc lists them now."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                children = Path(f"/proc/{parent}/task/{tid}/children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                found.append(child)
                queue.append(child)
    return found


# Open MPI's shared-memory transport maps a segment per rank of the node from here.
ENGINE_SEGMENTS = "/dev/shm/sm_segment."


def engine_paths(job_dir: Path) -> tuple[str, ...]:
    """Where an unsealed rank's engine and harness map shared memory in from: Open MPI's segments,
    PMIx's files and the rank's slot in the job's folder (resolved once, not at every sample)."""
    return ENGINE_SEGMENTS, f"{job_dir.resolve()}/"


def own_held_bytes(engine: tuple[str, ...]) -> int:
    """This process's held memory (unsealed: the rank and the learner's code are one process,
    and the figure is as advisory as every other counter there), but the shared memory mapped in
    from ``engine`` (``engine_paths``): the engine's, as it is sealed, and smaps need not be read
    for it (10 ms a reading with torch)."""
    return held_bytes([os.getpid()], skip_paths=engine)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
STEADY_THRESHOLD = 128 << 10  # glibc's starting value, which it raises as large blocks are freed


def steady_malloc() -> None:
    """Fixes glibc's thresholds at their starting values: every block of 128 KiB or more is its own
    mapping, returned to the kernel when freed, and the heap is trimmed past 128 KiB free. Left
    dynamic, glibc keeps a freed array's pages for the next one of its size, and a step's freed
    temporaries would read as memory the learner's code keeps. Called in the learner process
    before the learner's file is imported; the learner's code may change them, which can only
    make it hold more."""
    import ctypes

    libc = ctypes.CDLL(None)
    if hasattr(libc, "mallopt"):  # glibc; another C library keeps its own policy
        libc.mallopt(M_MMAP_THRESHOLD, STEADY_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, STEADY_THRESHOLD)



def return_freed_memory() -> None:
    """Gives the free pages of the process's heap back to the kernel (glibc's malloc_trim), for a
    problem's program about to set a mark whose reading should count what is held, not what the
    allocator kept of freed temporaries: freed chunks between live ones keep their pages, which
    steady_malloc's thresholds do not return (problem 07's gradient step left up to 4 MiB so, in
    one run of 15). Runs in the learner's process, where it can only lower a reading by memory
    nothing holds; does nothing under another C library. (distlab.grading's, for the programs.)"""
    import ctypes

    libc = ctypes.CDLL(None)
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)

class MemoryWitness:
    """How a rank reads its learner's memory (``held``), what it held before the learner's file was
    imported (``before_solution``, set once read; None until then), and the peak between readings.

    A reading at a mark is taken while the learner's code waits in its call, at a moment that code
    chose: it could drop what it holds just then and make it again after (an outside tester's
    solutions did, wrapping comm.mark). So from each mark the task names (``Task.memory_sampled``)
    to the next, a thread samples the learner at random intervals of a few milliseconds, and each
    reading carries the largest sample since the one before: memory held between those marks shows
    there, whenever it was held (to within a sample: something made and freed in a few milliseconds
    can slip between two). Sampling costs a core's fraction while it runs, so only there."""

    def __init__(self, held: Callable[[], int], before_solution: int | None = None,
                 held_at_mark: Callable[[], int] | None = None, parked_apart: bool = False) -> None:
        self.held = held
        # A reading at a mark, where no call is in flight, may read more than a sample can (the
        # sealed rank's: its arena's data region, cleared first).
        self.held_at_mark = held_at_mark or held
        # What the learner's code parked in its agent (messages to itself not yet received), set
        # per task where ``parked_apart`` (sealed): unsealed it is in the rank's own memory.
        self.parked_apart = parked_apart
        self.parked: Callable[[], int] = lambda: 0
        self.before_solution = before_solution
        self._peak = 0
        self._window = 0  # readings so far: a sample begun before a reading belongs to no later window
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        self._sampler: threading.Thread | None = None
        self._sampled: tuple[str, ...] = ()
        self._named: frozenset[str] = frozenset()
        self._active = threading.Event()  # set from a mark of ``_sampled`` to the next mark

    def watch(self, sampled: tuple[str, ...], named: tuple[str, ...] = ()) -> None:
        """A task that reads memory begins: sampling follows each mark named in ``sampled``, up to
        the next mark; where the program names its marks (``named``), up to the next of those: a
        mark the learner's code sets itself ends no span (an outside tester's mark inside add()
        would have stopped the sampling, and started a new peak, before the mark that is graded)."""
        self._peak, self._sampled = self.held() + self.parked(), sampled
        self._named = frozenset(named) | frozenset(sampled)
        self._active.clear()
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, args=(self._stop,), daemon=True)
        self._sampler.start()

    def unwatch(self) -> None:
        if self._stop is not None and self._sampler is not None:
            self._stop.set()
            self._active.set()  # wakes the sampler to see the stop
            self._sampler.join()
        self._stop = self._sampler = None

    def reading(self, mark: str) -> tuple[int, int]:
        """What is held now, at ``mark``, and the largest sample since the last reading (this one
        included); samples follow if the task names ``mark``."""
        now = self.held_at_mark() + self.parked()
        own = bool(self._named) and mark not in self._named  # the learner's: the span goes on
        with self._lock:
            peak = max(self._peak, now)
            self._peak = peak if own else now
            self._window += 0 if own else 1
        if mark in self._sampled:
            self._active.set()
        elif not own:
            self._active.clear()
        return now, peak

    def _sample(self, stop: threading.Event) -> None:
        jitter = random.Random()  # the learner's code must not know when: not the job's seed
        while self._active.wait() and not stop.wait(jitter.uniform(0.002, 0.010)):
            if not self._active.is_set():
                continue
            with self._lock:
                window = self._window
            value = self.held() + self.parked()  # a few milliseconds: a reading may come meanwhile
            with self._lock:
                if window == self._window:
                    self._peak = max(self._peak, value)

    def readings(self, marks: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
        """A task's TaskOutcome.memory: the reading before the solution first (-1: never read)."""
        before = -1 if self.before_solution is None else self.before_solution
        return [(BEFORE_SOLUTION, before, before), *marks]
