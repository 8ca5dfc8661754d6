"""Ranks of a task with survivors (``Task(survivors=True)``) whose process ended without
reporting and not by the plan's signal (the learner's own os._exit, a crash, the kernel's OOM
killer): not a crash of the job but a death the others live through, recorded as a kill of the
plan is (in the launch's ``FaultState``, which a job with survivors always has), so the verdicts
read it the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..jobspec import RankOutcome, pid_path
from .process_faults import FaultState


class Deaths:
    """Looks for the deaths of one attempt, and records each in the attempt's FaultState."""

    def __init__(self) -> None:
        self._pids: dict[int, int] = {}

    def look(self, job_dir: Path, world: int, outcomes: Mapping[int, RankOutcome],
             faults: FaultState) -> None:
        """Records every rank, neither reported nor already dead, whose process is gone."""
        for rank in range(world):
            if rank in outcomes or rank in faults.killed:
                continue
            pid = self._pids.get(rank) or _pid_of(job_dir, rank)
            if pid is None:
                continue  # not started yet
            self._pids[rank] = pid
            if not _alive(pid):
                sentence = (f"rank {rank} died: its process ended without reporting, and the "
                            "others went on (a task with survivors)")
                faults.killed[rank] = sentence
                faults.events.append(sentence)


def _pid_of(job_dir: Path, rank: int) -> int | None:
    try:
        return int(pid_path(job_dir, rank).read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """The process runs (a zombie, ended but not reaped by its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
