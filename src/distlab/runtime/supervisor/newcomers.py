"""The ranks a running job gains: ``count`` new ranks when a ``join`` fault's trigger passes, and
a dead rank started again alone under ``restart = "rank"``. Each is a real process, the next rank
of the job (world size, world size + 1, ...). On gloo the supervisor starts it as the others were
(start.py); it finds the job through the launch's store and waits there until the survivors admit
it (engines/admission.py). On MPI the members' Admit spawns it (a job gains processes only by
MPI_Comm_spawn), so the supervisor only announces it, and counts it once it runs. Each is announced on the store as it starts, and an Admit waits for the
announced ones to reach the lobby; ranks pause at a join's trigger step until the supervisor has
acted on it (as at a kill's), so "two join at step 60" means they are in at the first Admit from
step 60 on, however slowly their processes start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..comm import rankstate
from ..engines.admission import announce
from ..engines.notices import job_keys
from ..jobspec import Job, pid_path
from .process_faults import FaultState
from .start import Processes, start_newcomer


class Newcomers:
    """The newcomers of one attempt, and when each is due (see the module docstring)."""

    def __init__(self, job: Job, job_dir: Path, attempt: int, faults: FaultState,
                 store: Any) -> None:
        self._job, self._job_dir, self._attempt, self._faults = job, job_dir, attempt, faults
        self._store = store  # the launch's store server, where each newcomer is announced
        self.started: list[int] = []  # their ranks, in the order they started
        self._restarted: set[int] = set()  # dead ranks started again
        self._rank_restarts = faults.faults.rank_restarts_allowed()

    @property
    def world(self) -> int:
        """Every rank the attempt has started so far (on MPI: that the members have spawned)."""
        if self._job.backend == "gloo":
            return self._job.world_size + len(self.started)
        running = 0
        while running < len(self.started) and pid_path(self._job_dir, self.started[running]).exists():
            running += 1
        return self._job.world_size + running

    def never_started(self) -> list[str]:
        """Why the run failed although its ranks ended well, if a newcomer never got in: on MPI,
        announced but never spawned (on gloo one waits in the lobby, which ends the run)."""
        missing = self.started[self.world - self._job.world_size:]
        if not missing:
            return []
        return [f"rank(s) {', '.join(map(str, missing))} were due to join the running job, but "
                "the others finished without a comm.Admit() that would let them in"]

    def start_due(self, states: list[rankstate.RankState], elapsed_s: float,
                  gone: frozenset[int], procs: Processes) -> None:
        """Starts the newcomers due now: every join whose trigger has passed (a rank has started
        its step, or the wall clock its time), and a rank started again for each dead one in
        ``gone`` (whose deaths are about to be posted) while the plan's budget lasts."""
        faults = self._faults
        top_step = max((s.step for s in states), default=-1)
        for fault in faults.faults.joins_due(top_step, elapsed_s, frozenset(faults.fired)):
            faults.fired.add(fault.index)
            ranks = [self._start(procs) for _ in range(fault.count)]
            when = f"step {top_step}" if fault.at_step is not None else f"{elapsed_s:.1f} s (wall clock)"
            faults.events.append(f"rank(s) {', '.join(map(str, ranks))} joined at {when} by "
                                 f"fault[{fault.index}]")
        for dead in sorted(gone - self._restarted):
            if len(self._restarted) >= self._rank_restarts:
                break
            self._restarted.add(dead)
            again = self._start(procs, restarted=dead)
            faults.events.append(f"rank {dead} was started again alone, as rank {again} "
                                 "(restart = \"rank\")")

    def _start(self, procs: Processes, restarted: int | None = None) -> int:
        rank = self._job.world_size + len(self.started)
        # Announced first: an Admit that starts while the process starts waits for it.
        announce(self._store, job_keys(self._attempt), len(self.started), rank, restarted)
        self.started.append(rank)
        if self._job.backend == "gloo":  # on MPI the members' Admit spawns it
            start_newcomer(self._job, self._job_dir, self._attempt, rank, procs, restarted)
        return rank
