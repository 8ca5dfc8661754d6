"""How an exception that ends a rank's work becomes the ``RankError`` its outcome reports.

Used by the rank (runtime/rank/worker.py) and, under the seal, by the learner process
(runtime/rank/learner_main.py), which reports its failure to the agent in these same words.
"""

from __future__ import annotations

import resource
import traceback
from pathlib import Path

from ..comm.requests import LearnerAbort
from ..jobspec import Limits, RankError
from . import limits as rank_limits
from .guards import EngineMisuse
from .learner import SolutionLoadError, format_for, innermost_frame_in

# How much of a failure's words the learner's code may fill: an exception whose message was 20 MB
# made check 03's console 140 MB (every check that names the failure repeats it) and took 32 s.
SUMMARY_CHARS, WHERE_CHARS, TRACEBACK_CHARS = 2_000, 500, 20_000


def clipped(text: str, limit: int) -> str:
    """``text``, cut to its first ``limit`` characters, saying how many were left out; text clipped
    once (in the learner process) passes the agent's clipping unchanged."""
    if len(text) <= limit + _SAID_ROOM:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} characters more)"


_SAID_ROOM = 40  # "... (N characters more)" for any N a process can hold


def worded(kind: str, summary: str, where: str, detail: str, task_index: int) -> RankError:
    """A RankError with the learner-written parts clipped (``clipped``)."""
    return RankError(kind, clipped(summary, SUMMARY_CHARS), clipped(where, WHERE_CHARS),
                     clipped(detail, TRACEBACK_CHARS), task_index)


class ReportedFailure(Exception):
    """A failure already put in words (by the learner process, across the seal)."""

    def __init__(self, error: RankError) -> None:
        super().__init__(error.summary)
        self.error = error


def error_from(exc: BaseException, solution: Path | None, task_index: int, limits: Limits) -> RankError:
    if isinstance(exc, ReportedFailure):
        error = exc.error
        return RankError(error.kind, error.summary, error.where, error.traceback, task_index)
    if isinstance(exc, SolutionLoadError):
        return worded("import", exc.summary, exc.where, exc.detail, task_index)
    if isinstance(exc, LearnerAbort):
        kind, summary = "abort", str(exc)
    elif isinstance(exc, EngineMisuse):
        kind, summary = "misuse", str(exc)
    elif isinstance(exc, SystemExit):
        kind, summary = "exit", f"the solution called sys.exit({exc.code!r})"
    elif isinstance(exc, MemoryError):
        kind = "memory"
        summary = f"memory limit exceeded: the rank may use {limits.address_space_mb} MiB"
    elif (used_mb := _thread_found_no_room(exc)) is not None:
        kind = "memory"
        summary = (f"memory limit exceeded: a new thread found no room for its stack ({exc}); the rank "
                   f"may use {limits.address_space_mb} MiB of address space and reached {used_mb} MiB")
    elif isinstance(exc, rank_limits.CpuLimitExceeded):
        kind = "cpu"
        summary = f"CPU time limit exceeded: the rank may use {limits.cpu_seconds} s of CPU"
    elif isinstance(exc, OSError) and exc.errno == 27:  # EFBIG
        kind = "file-size"
        summary = f"file size limit exceeded: files may grow to {limits.file_size_mb} MiB"
    else:
        kind, summary = "exception", f"{type(exc).__name__}: {exc}"
    where = innermost_frame_in(exc.__traceback__, solution) if solution else ""
    detail = format_for(exc, solution) if solution else traceback.format_exc()
    return worded(kind, summary, where, detail, task_index)


# How far below its address-space limit a process can be when a thread fails to start for want
# of room: a thread stack (RLIMIT_STACK) and a malloc arena's 64 MiB reservation.
_ARENA_MB = 64


def _thread_found_no_room(exc: BaseException) -> int | None:
    """The process's largest address space in MiB, if ``exc`` says a thread could not start
    (Python's "can't start new thread"; C++'s std::thread, as in gloo, "Resource temporarily
    unavailable") and that space came within a stack and an arena of its limit; None otherwise.
    The peak (VmPeak), not the present size: the threads that took the room may be gone by now.
    EAGAIN from pthread_create has one other cause, the number of tasks (RLIMIT_NPROC,
    threads-max), which being this close to the address-space limit rules out as the one that
    mattered."""
    text = str(exc)
    if not isinstance(exc, RuntimeError) or not (
            "can't start new thread" in text or "Resource temporarily unavailable" in text):
        return None
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    stack_mb = 8 if stack == resource.RLIM_INFINITY else stack >> 20
    try:
        with open("/proc/self/status") as status:
            used_mb = next(int(line.split()[1]) >> 10 for line in status if line.startswith("VmPeak:"))
    except (OSError, StopIteration, ValueError):
        return None
    return used_mb if used_mb + stack_mb + _ARENA_MB > limit >> 20 else None
