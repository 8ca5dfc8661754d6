"""A rank of a task whose ranks survive their peers (``Task(survivors=True)``): its engine, which
raises PeerFailed for a peer's death instead of ending the job (MPI under ULFM; gloo over the
launch's store), and, for a rank that joins the running job (a ``join`` fault's, a dead rank
started again alone), the communicator that admitted it and a clock at the others' time. A gloo
newcomer is started by the supervisor and told so in its environment; an MPI one is spawned by
the members' Admit, with ``--joined PATH --members ... --replacing ...`` on its command line.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..clock.online import Timekeeper
from ..comm.rankstate import RankSlot
from ..engines.base import Engine
from ..jobspec import (
    ATTEMPT_ENV,
    JOINED_ENV,
    RANK_MODULE,
    RESTARTED_ENV,
    SPAWN_ENV,
    Job,
)
from .backend import detect_backend, make_engine


@dataclass(frozen=True)
class JoinedAs:
    """How an MPI newcomer was spawned: the group it merges into (its path and every member's
    world rank, the old ones first) and, per newcomer, the dead rank it replaces (-1: none)."""

    path: str
    members: tuple[int, ...]
    replacing: tuple[int, ...]

    @classmethod
    def parse(cls, path: str, members: str, replacing: str) -> JoinedAs:
        return cls(path, tuple(map(int, members.split(","))), tuple(map(int, replacing.split(","))))

    def world_rank(self, spawned_rank: int) -> int:
        """This newcomer's world rank, from its rank among the spawned processes."""
        return self.members[len(self.members) - len(self.replacing) + spawned_rank]

    def tell(self, spawned_rank: int) -> None:
        """Says in the environment, as on gloo, that this rank joined (and whom it replaces)."""
        os.environ[JOINED_ENV] = "1"
        if self.replacing[spawned_rank] >= 0:
            os.environ[RESTARTED_ENV] = str(self.replacing[spawned_rank])


def spawn_command(job_dir: Path, sealed: bool) -> Any:
    """The command line of the newcomers an MPI Admit spawns: the rank worker as the supervisor
    starts it (through the zygote's stand-in where it keeps one: SPAWN_ENV), told where it joins
    (``JoinedAs``)."""
    start = json.loads(os.environ.get(SPAWN_ENV, "null")) or [sys.executable, "-P", "-m", RANK_MODULE]

    def command(path: str, members: list[int], replacing: list[int | None]) -> list[str]:
        return [*start, "--job", str(job_dir),
                *(["--sealed"] if sealed else []), "--joined", path,
                "--members", ",".join(map(str, members)),
                # One word: argparse would take a leading -1 for an option.
                "--replacing=" + ",".join(str(-1 if r is None else r) for r in replacing)]
    return command


def surviving_engine(job: Job, job_dir: Path, slot: RankSlot,
                     joined_as: JoinedAs | None = None) -> Engine:
    """The engine of a job whose ranks outlive their peers: a peer's death raises PeerFailed
    instead of ending the job (MPI under ULFM; gloo over the launch's store)."""
    attempt = int(os.environ.get(ATTEMPT_ENV, "0"))
    if job.backend == "mpi":
        return _surviving_mpi(job, job_dir, slot, attempt, joined_as)
    from ..engines.surviving_gloo import newcomer, surviving_world

    if joined():  # a rank that joins the running job: it waits until the others admit it
        _, world_rank, _ = detect_backend()
        return newcomer(job.store_address, attempt, world_rank, slot.running,
                        lambda: slot.blocked("Admit", ()))
    return surviving_world(job.store_address, attempt, slot.running)


def _surviving_mpi(job: Job, job_dir: Path, slot: RankSlot, attempt: int,
                   joined_as: JoinedAs | None) -> Engine:
    from ..engines import mpi
    from ..engines.surviving import Joining, SurvivingEngine

    joining = None
    if job.store_address:  # the plan adds ranks: the supervisor announces them on the store
        joining = Joining(job.store_address, attempt, spawn_command(job_dir, job.seal))
        # Connected now, while the slot says running: a spawned newcomer imports torch for its
        # client (seconds), and a first Admit that did it would look like a stall.
        joining.connect()
    inner = (mpi.from_parent(list(joined_as.members), joined_as.path) if joined_as is not None
             else make_engine("mpi"))
    return SurvivingEngine(inner, slot.running, joining)  # type: ignore[arg-type, return-value]


def joined() -> bool:
    """This rank joins a running job (engines/admission.py): its task starts on the communicator
    that admitted it, whose size is not the task's."""
    return os.environ.get(JOINED_ENV) == "1"


def task_clock(platform: Any, side: Engine | None) -> Timekeeper | None:
    """The online clock of a task, if it has one; a rank that joined the running job starts at
    the others' time (they catch up with it in their comm.Admit())."""
    if side is None:
        return None
    clock = Timekeeper(platform, side)
    if joined():
        clock.catch_up()
    return clock
