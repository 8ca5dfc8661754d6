"""Ranks of a task with survivors (``Task(survivors=True)``) whose process ended without
reporting and not by the plan's signal (the learner's own os._exit, a crash, the kernel's OOM
killer): not a crash of the job but a death the others live through, recorded as a kill of the
plan is (in the launch's ``FaultState``, which a job with survivors always has), so the verdicts
read it the same way.

On gloo, which has no failure detector, the survivors learn of a death from the launch's store:
once a dead rank's process is gone (killed by the plan, reclaimed, or ended by itself), ``Deaths``
posts its notice there (engines/notices.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..engines.notices import publish_death
from ..jobspec import RankOutcome, outcome_path, pid_path
from .process_faults import FaultState


class Deaths:
    """Looks for the deaths of one attempt, and records each in the attempt's FaultState."""

    def __init__(self, store: Any = None, attempt: int = 0) -> None:
        self._pids: dict[int, int] = {}
        self._store, self._attempt = store, attempt  # where deaths are posted (gloo), or None
        self._posted: set[int] = set()

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
            # Gone, but it may have written its outcome since this poll read the outcomes: a
            # rank that finished is no death.
            if not _alive(pid) and not outcome_path(job_dir, rank).exists():
                sentence = (f"rank {rank} died: its process ended without reporting, and the "
                            "others went on (a task with survivors)")
                faults.killed[rank] = sentence
                faults.events.append(sentence)

    def gone(self, job_dir: Path, faults: FaultState) -> frozenset[int]:
        """The killed ranks whose processes are gone and whose deaths are not posted yet (a
        reclaimed one lives on through its grace period); none where nothing is posted."""
        if self._store is None:
            return frozenset()
        found = set()
        for rank in faults.killed:
            if rank not in self._posted:
                pid = self._pids.get(rank) or _pid_of(job_dir, rank)
                if pid is None or not _alive(pid):
                    found.add(rank)
        return frozenset(found)

    def post(self, ranks: frozenset[int]) -> None:
        """Posts these deaths (``gone``'s), for the survivors' watches to see."""
        for rank in sorted(ranks):
            publish_death(self._store, self._attempt, rank)
            self._posted.add(rank)


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
