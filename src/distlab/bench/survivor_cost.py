"""What runtime II's side channels cost (issue 12): the time from a rank's SIGKILL to the
survivors' ``distlab.PeerFailed``, and for them to revoke, shrink and finish one Allreduce, each
against a 4-rank Allreduce of the same run, on MPI under Open MPI's ULFM (mpiexec started here,
so that the engine's own detection is timed) and on gloo (a job through the front door: there the
supervisor's notice of the death is the detection); the membership barrier of an elastic job
(comm.Admit()) with no one waiting, and the Admit that takes a joiner in with the grown group's
first Allreduce (on MPI it spawns the joiner), against the same Allreduce, on each engine; and a set plus a get on the task's store
against an 8-byte MPI round trip. Report-only rows: the issue sets no targets for them.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import HarnessError
from ..runtime.jobspec import Task

RANKS = 4
MPI_TIMEOUT_S = 15.0  # a run takes under a second
DIAGNOSES: list[str] = []  # runs that had to be ended, and whether they had measured


@dataclass(frozen=True)
class DeathTimings:
    allreduce_s: float  # a 4-rank Allreduce of 8 KiB through the proxy, the baseline
    detect_s: float  # SIGKILL to PeerFailed, the median over the survivors
    shrink_and_finish_s: float  # PeerFailed to the survivors' first Allreduce done


@dataclass(frozen=True)
class JoinTimings:
    admit_s: float  # comm.Admit() with no one waiting, 4 ranks
    reform_s: float  # the Admit that takes a joiner in, and the grown group's first Allreduce


@dataclass(frozen=True)
class SurvivorTimings:
    mpi: DeathTimings
    gloo: DeathTimings
    mpi_join: JoinTimings
    gloo_join: JoinTimings
    store_s: float  # a set and a get of 8 bytes on the task's store
    pingpong_s: float  # an 8-byte Send/Recv round trip, the store's baseline


def death_command(out: Path, mpiexec: str) -> list[str]:
    return [mpiexec, "-n", str(RANKS), "--oversubscribe", "--bind-to", "none", "--with-ft", "ulfm",
            sys.executable, "-P", "-m", "distlab.bench.survivor_ranks", "--out", str(out)]


def one_death(run_to_end: Callable[[list[str], dict[str, str], float], tuple[int, str]],
              mpiexec: str, env: dict[str, str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="distlab-bench-") as tmp:
        out = Path(tmp) / "death.json"
        try:
            code, output = run_to_end(death_command(out, mpiexec),
                                      {**env, "OMPI_MCA_btl": "self,tcp"}, MPI_TIMEOUT_S)
        except HarnessError as stuck:
            # Now and then (about one run in twenty here) a survivor's MPI_Finalize never returns
            # under ULFM: the figures were written before it, and run_to_end ended every process.
            DIAGNOSES.append(f"{stuck}; figures written: {out.exists()}")
            if not out.exists():
                raise
            code, output = -1, str(stuck)
        if not out.exists():
            raise HarnessError(f"the survivors benchmark measured nothing (exit {code}):\n"
                               + "\n".join(output.strip().splitlines()[-20:]))
        return json.loads(out.read_text())  # type: ignore[no-any-return]


def one_gloo_death() -> dict[str, float]:
    """A 4-rank gloo job with survivors through the front door, whose rank 2 SIGKILLs itself."""
    with tempfile.TemporaryDirectory(prefix="distlab-bench-") as tmp:
        return _harness_run("through_a_death_on_gloo",
                            Task(ranks=RANKS, args=(str(Path(tmp) / "death.killed"),),
                                 survivors=True), "gloo")


def one_join(backend: str) -> dict[str, float]:
    """A 4-rank job with survivors that one rank joins at step 1 (survivor_ranks.py)."""
    from ..runtime.faults.plans import parse_fault_plan

    plan = parse_fault_plan({"format_version": 1, "fault": [{"kind": "join", "at_step": 1}]},
                            "the joiner benchmark")
    return _harness_run("admit_a_joiner", Task(ranks=RANKS, survivors=True), backend, plan)


def store_timings(rounds: int) -> dict[str, float]:
    return _harness_run("store_round_trip", Task(ranks=2, args=(rounds,), store=True), "mpi")


def _harness_run(program_name: str, task: Task, backend: str, faults: Any = None) -> dict[str, float]:
    """Rank 0's value of one of survivor_ranks.py's programs, run as every job runs."""
    from ..runs import Program, run, run_options  # the front door for runs, as every job starts

    program = Program(Path(__file__).with_name("survivor_ranks.py"), program_name)
    done = run(program, [task], run_options(backend, faults=faults), deadline_s=120)
    if not done.ok:
        raise HarnessError(f"the {program_name} benchmark failed: {done.result.message}")
    return done.tasks[0].values[0]  # type: ignore[no-any-return]


def measure(quick: bool, run_to_end: Callable[[list[str], dict[str, str], float], tuple[int, str]],
            mpiexec: str, env: dict[str, str]) -> SurvivorTimings:
    runs = 1 if quick else 3
    mpi = [one_death(run_to_end, mpiexec, env) for _ in range(runs)]
    gloo = [one_gloo_death() for _ in range(runs)]
    joins = {backend: [one_join(backend) for _ in range(runs)] for backend in ("mpi", "gloo")}
    store = store_timings(20 if quick else 200)
    return SurvivorTimings(_medians(mpi), _medians(gloo), _join_medians(joins["mpi"]),
                           _join_medians(joins["gloo"]), store["store_s"], store["pingpong_s"])


def _join_medians(joins: list[dict[str, float]]) -> JoinTimings:
    return JoinTimings(statistics.median(j["admit_s"] for j in joins),
                       statistics.median(j["reform_s"] for j in joins))


def _medians(deaths: list[dict[str, float]]) -> DeathTimings:
    def median(key: str) -> float:
        return statistics.median(d[key] for d in deaths)

    return DeathTimings(median("allreduce_s"), median("detect_s"), median("shrink_and_finish_s"))
