"""Starting a job's ranks as real processes and watching them until they finish or must be ended.

Call order: ``launch(job)`` writes the job folder, starts the ranks (mpiexec, or one process per
rank with torchrun's variables for gloo), then polls every 50 ms: outcome files, the launcher's
exit, the ranks' state slots and the deadline. It always ends with every process of the job gone,
whatever happened: a pass, a learner exception, a crash, a deadlock, the deadline, or Ctrl-C.

The decision of what a poll means (``judge``) is a pure function of what was observed, kept apart
from the side effects so it is tested without processes.

Process faults (``job.faults``: kill, stop, restart; docs/fault-plans.md). On each poll the
supervisor reads every rank's step from its state slot, asks ``ProcessFaults.due`` (through the pure
``due_signals``) which signals are due, sends them to the rank's pid (SIGKILL, SIGSTOP, SIGCONT
``cont_after_s`` later) and records each action's sentence in ``LaunchResult.fault_events``. A rank
killed by a fault makes the run "crashed" with the fault named, unless the other ranks carry on and
finish without it (code that survives a peer's death), which is a pass. While a fault holds a rank
stopped, the stall rule declares no deadlock: the job is meant to look stuck; the deadline still
holds. With a ``restart`` fault, a run that crashed starts again, in a fresh job folder, up to
``max_restarts`` times within the one deadline; the ranks read which attempt they are from the
environment variable ``DISTLAB_ATTEMPT`` (0 first, n after the nth restart). Each kill or stop fires
once per run, restarts included, and ``at_s`` triggers count from the first attempt's start.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ..comm import rankstate
from ..jobspec import JOB_FILE, Job, RankOutcome, outcome_path, write_pickle_atomically
from . import mpi_monitoring
from .deaths import Deaths
from .judge import Observation, judge, should_restart
from .leftovers import claim, new_job_dir, remove_shared_memory_dir
from .newcomers import Newcomers
from .process_faults import FaultState, apply_due_faults, process_faults
from .processes import rank_pids
from .start import Processes, failed_to_start, start_ranks
from .store_host import hosted_store
from .verdicts import LaunchResult, conclude

POLL_S = 0.05


def launch(
    job: Job,
    deadline_s: float = 60.0,
    stall_s: float = 3.0,
    keep_dir: Path | None = None,
) -> LaunchResult:
    """Runs the job to its end and returns what happened; never leaves a process behind.

    With a ``restart`` fault in ``job.faults``, a crashed attempt is followed by another in a fresh
    job folder (``keep_dir/attempt-N`` when folders are kept), within the same deadline; the result
    is the last attempt's, with ``attempts`` and the fault events of every attempt.
    """
    if keep_dir is None and os.environ.get("DISTLAB_KEEP_JOBS"):
        # For debugging the harness: leave every job folder (logs, stacks, states) in place.
        keep_root = Path(os.environ["DISTLAB_KEEP_JOBS"])
        keep_root.mkdir(parents=True, exist_ok=True)
        keep_dir = Path(tempfile.mkdtemp(prefix="distlab-job-", dir=keep_root))
    with hosted_store(job) as hosted:
        return _attempts(hosted.job, deadline_s, stall_s, keep_dir, hosted.server)


def _attempts(job: Job, deadline_s: float, stall_s: float, keep_dir: Path | None,
              store: Any = None) -> LaunchResult:
    """The attempts of a launch: one, or more under a ``restart`` fault."""
    faults = process_faults(job)
    started = time.monotonic()  # the clock of the deadline and of at_s triggers, for every attempt
    earlier: list[str] = []
    attempt = 0
    start_retried = False
    while True:
        kept = keep_dir if keep_dir is None or attempt == 0 else keep_dir / f"attempt-{attempt}"
        result = _run_attempt(job, attempt, started, deadline_s, stall_s, kept, faults, store)
        time_left = deadline_s - (time.monotonic() - started)
        if not start_retried and failed_to_start(result) and time_left > 5:
            # Open MPI's launcher sometimes fails to start on a heavily loaded machine before any
            # rank runs; nothing of the learner's ran, so trying once more is safe.
            start_retried = True
            continue
        if faults is None or not should_restart(result.status, attempt, faults.restarts, time_left):
            break
        earlier.append(f"attempt {attempt} {result.status}: {result.message}")
        attempt += 1
    result.attempts = attempt + 1
    result.restarted_after = earlier
    result.fault_events = list(faults.events) if faults is not None else []
    unfired = faults.faults.never_fired(frozenset(faults.fired)) if faults is not None else []
    if result.ok and unfired:
        result.status, result.message = "error", "; ".join(unfired)
    return result


def _run_attempt(
    job: Job,
    attempt: int,
    started: float,
    deadline_s: float,
    stall_s: float,
    keep_dir: Path | None,
    faults: FaultState | None,
    store: Any = None,
) -> LaunchResult:
    """One start of the job's ranks, polled to its end; every process of it is gone on return.
    ``store``: the launch's store server, where a gloo job with survivors learns of deaths."""
    if keep_dir is None:
        job_dir = new_job_dir()
    else:
        job_dir = keep_dir
        job_dir.mkdir(parents=True, exist_ok=True)
        claim(job_dir)
    write_pickle_atomically(job_dir / JOB_FILE, job)
    if faults is not None:
        faults.new_attempt()
    procs = start_ranks(job, job_dir, attempt)
    deaths = newcomers = None
    if job.survivors:  # gloo's survivors learn of a death from the store (engines/notices.py)
        deaths = Deaths(store, attempt)  # posted where there is a store (gloo, or joins)
        assert faults is not None  # a job with survivors always has one (process_faults)
        newcomers = Newcomers(job, job_dir, attempt, faults, store)
    world = job.world_size  # every rank started so far: newcomers join a running job
    outcomes: dict[int, RankOutcome] = {}
    pids: dict[int, int] = {}  # rank -> pid, once its pid file is there (fixed for the attempt)
    last_seqs: tuple[int, ...] = ()
    last_change = time.monotonic()
    try:
        while True:
            time.sleep(POLL_S)
            now = time.monotonic()
            _collect_outcomes(job_dir, world, outcomes)
            states = [s for r in range(world) if (s := rankstate.read_state(job_dir, r))]
            seqs = tuple(s.seq for s in states)
            if seqs != last_seqs:
                last_seqs, last_change = seqs, now
            killed: frozenset[int] = frozenset()
            stopped: frozenset[int] = frozenset()
            if faults is not None:
                if deaths is not None and newcomers is not None:
                    # Before the signals: a dead rank is signalled no more. A dead rank's
                    # replacement is announced before its death, so the survivors' next Admit
                    # waits for it.
                    deaths.look(job_dir, world, outcomes, faults)
                    gone = deaths.gone(job_dir, faults)
                    newcomers.start_due(states, now - started, gone, procs)
                    deaths.post(gone)
                    world = newcomers.world
                if apply_due_faults(faults, job_dir, world, states, outcomes, pids, now - started,
                                    founders=job.world_size):
                    # A rank just continued: it had no chance to move yet, so the stall clock
                    # starts again rather than counting its frozen time as no progress.
                    last_change = now
                killed, stopped = frozenset(faults.killed), faults.stopped()
            exited = procs.exited()
            if exited:  # a rank may have written its outcome and left since they were read
                _collect_outcomes(job_dir, world, outcomes)
            # Who is in which sub-communicator matters only to tell a stall from a collective.
            communicators = (rankstate.read_communicators(job_dir, world)
                             if now - last_change >= stall_s else {})
            obs = Observation(now - started, exited, outcomes, states, now - last_change, killed,
                              stopped, communicators)
            verdict = judge(obs, world, deadline_s, stall_s)
            if verdict.action == "wait":
                continue
            if verdict.action == "done":
                # Monitoring files are written at MPI_Finalize: give the ranks longer to get there.
                # After a death in an MPI job that spawned newcomers, the survivors' MPI_Finalize
                # does not return (seen here under ULFM): their outcomes are written, so they go.
                spawned = newcomers is not None and bool(newcomers.started)
                grace = 10.0 if job.mpi_monitoring else 0.5 if killed and spawned else 3.0
                _wait_briefly(procs, grace)
            # The verdict reads every rank started, newcomers included.
            result = conclude(
                verdict.action, dataclasses.replace(job, world_size=world), job_dir, procs,
                outcomes, states, now - started, obs.stalled_for_s, faults,
            )
            break
    except BaseException:
        procs.kill_all(rank_pids(job_dir, world))
        _cleanup(job_dir, keep_dir)
        raise
    # SIGKILL ends stopped ranks as well, and mpiexec/prterun never learn of a stop (they wait for
    # exits only), so no SIGCONT is needed first.
    procs.kill_all(rank_pids(job_dir, world))
    if job.mpi_monitoring and job.backend == "mpi" and result.ok:
        result.mpi_traffic = mpi_monitoring.read_job(job_dir, job.world_size)
    if newcomers is not None and result.ok and newcomers.never_started():
        result.status, result.message = "error", "; ".join(newcomers.never_started())
    _cleanup(job_dir, keep_dir)
    return result


def _wait_briefly(procs: Processes, seconds: float = 3.0) -> None:
    # Ranks that wrote their outcome are finalizing; give them a moment to leave on their own.
    end = time.monotonic() + seconds
    while not procs.exited() and time.monotonic() < end:
        time.sleep(POLL_S)


def _collect_outcomes(job_dir: Path, world: int, outcomes: dict[int, RankOutcome]) -> None:
    for rank in range(world):
        if rank in outcomes:
            continue
        path = outcome_path(job_dir, rank)
        if path.exists():
            with open(path, "rb") as f:
                outcomes[rank] = pickle.load(f)


def _cleanup(job_dir: Path, keep_dir: Path | None) -> None:
    remove_shared_memory_dir(job_dir)  # the ranks' segments: of no use once they are gone
    if keep_dir is None:
        shutil.rmtree(job_dir, ignore_errors=True)
