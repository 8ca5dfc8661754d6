"""How an exception that ends a rank's work becomes the ``RankError`` its outcome reports.

Used by the rank (runtime/rank/worker.py) and, under the seal, by the learner process
(runtime/rank/learner_main.py), which reports its failure to the agent in these same words.
"""

from __future__ import annotations

import traceback
from pathlib import Path

from ..comm.requests import LearnerAbort
from ..jobspec import Limits, RankError
from . import limits as rank_limits
from .guards import EngineMisuse
from .learner import SolutionLoadError, format_for, innermost_frame_in


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
        return RankError("import", exc.summary, exc.where, exc.detail, task_index)
    if isinstance(exc, LearnerAbort):
        kind, summary = "abort", str(exc)
    elif isinstance(exc, EngineMisuse):
        kind, summary = "misuse", str(exc)
    elif isinstance(exc, SystemExit):
        kind, summary = "exit", f"the solution called sys.exit({exc.code!r})"
    elif isinstance(exc, MemoryError):
        kind = "memory"
        summary = f"memory limit exceeded: the rank may use {limits.address_space_mb} MiB"
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
    return RankError(kind, summary, where, detail, task_index)
