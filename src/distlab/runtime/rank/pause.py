"""Holding the learner's processes still while the agent reads their memory.

A reading at a mark clears the shared arena, reads what the learner's processes hold, then reads
the arena again. Between those reads a thread of the learner's (or a process it started, which
maps the arena too) could move its state from one place to the other, and be counted in neither.
``paused`` stops every one of those processes (SIGSTOP: it cannot be caught, and it stops every
thread of a process) and lets them go on once the reading is done.

    with paused(learner_pids):   # a callable: the processes, listed again until none is new
        held = read_everything()
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

STOP_WAIT_S = 2.0  # a process in an uninterruptible wait stops once it leaves it; past this, read anyway


@contextlib.contextmanager
def paused(pids: Callable[[], list[int]]) -> Iterator[list[int]]:
    """Stops the processes ``pids()`` names, and those it names once they are stopped (a process
    may have started another meanwhile; a stopped one starts nothing), until every one is; they
    go on when the block ends, whatever it raised."""
    stopped: list[int] = []
    try:
        while True:
            new = [pid for pid in pids() if pid not in stopped]
            if not new:
                break
            for pid in new:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            _wait_stopped(new)
        yield stopped
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _wait_stopped(pids: list[int]) -> None:
    deadline = time.monotonic() + STOP_WAIT_S
    waiting = list(pids)
    while waiting and time.monotonic() < deadline:
        waiting = [pid for pid in waiting if not _all_threads_stopped(pid)]
        if waiting:
            time.sleep(0.0002)


def _all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` stopped (or the process gone): SIGSTOP reaches the threads one
    by one, and a thread still running could still move memory."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tids:
        try:
            state = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue  # the thread ended
        if state not in ("T", "t", "Z", "X"):
            return False
    return True
