"""A rank of a task whose ranks survive their peers (``Task(survivors=True)``): its engine, which
raises PeerFailed for a peer's death instead of ending the job (MPI under ULFM; gloo over the
launch's store), and, for a rank that joins the running job (a ``join`` fault's, a dead rank
started again alone), the communicator that admitted it and a clock at the others' time.
"""

from __future__ import annotations

import os
from typing import Any

from ..clock.online import Timekeeper
from ..comm.rankstate import RankSlot
from ..engines.base import Engine
from ..jobspec import ATTEMPT_ENV, JOINED_ENV, Job
from .backend import detect_backend, make_engine


def surviving_engine(job: Job, slot: RankSlot) -> Engine:
    """The engine of a job whose ranks outlive their peers: a peer's death raises PeerFailed
    instead of ending the job (MPI under ULFM; gloo over the launch's store)."""
    if job.backend == "mpi":
        from ..engines.surviving import SurvivingEngine

        return SurvivingEngine(make_engine("mpi"), slot.running)  # type: ignore[arg-type, return-value]
    from ..engines.surviving_gloo import newcomer, surviving_world

    attempt = int(os.environ.get(ATTEMPT_ENV, "0"))
    if joined():  # a rank that joins the running job: it waits until the others admit it
        _, world_rank, _ = detect_backend()
        return newcomer(job.store_address, attempt, world_rank, slot.running,
                        lambda: slot.blocked("Admit", ()))
    return surviving_world(job.store_address, attempt, slot.running)


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
