"""What runtime II's side channels cost (issue 12): the time from a rank's SIGKILL to the
survivors' ``distlab.PeerFailed``, and for them to revoke, shrink and finish one Allreduce, each
against a 4-rank Allreduce of the same run (MPI under Open MPI's ULFM: gloo has no survivors
yet); and a set plus a get on the task's store against an 8-byte MPI round trip. Report-only
rows: the issue sets no targets for them.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import HarnessError
from ..runtime.jobspec import Task

RANKS = 4
MPI_TIMEOUT_S = 15.0  # a run takes under a second
DIAGNOSES: list[str] = []  # runs that had to be ended, and whether they had measured


@dataclass(frozen=True)
class SurvivorTimings:
    allreduce_s: float  # a 4-rank Allreduce of 8 KiB through the proxy, the baseline
    detect_s: float  # SIGKILL to PeerFailed, the median over the survivors
    shrink_and_finish_s: float  # PeerFailed to the survivors' first Allreduce done
    store_s: float  # a set and a get of 8 bytes on the task's store
    pingpong_s: float  # an 8-byte Send/Recv round trip, the store's baseline


def death_command(out: Path, mpiexec: str) -> list[str]:
    return [mpiexec, "-n", str(RANKS), "--oversubscribe", "--bind-to", "none", "--with-ft", "ulfm",
            sys.executable, "-m", "distlab.bench.survivor_ranks", "--out", str(out)]


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


def store_timings(rounds: int) -> dict[str, float]:
    from ..runs import Program, run, run_options  # the front door for runs, as every job starts

    program = Program(Path(__file__).with_name("survivor_ranks.py"), "store_round_trip")
    done = run(program, [Task(ranks=2, args=(rounds,), store=True)], run_options("mpi"),
               deadline_s=120)
    if not done.ok:
        raise HarnessError(f"the store benchmark failed: {done.result.message}")
    return done.tasks[0].values[0]  # type: ignore[no-any-return]


def measure(quick: bool, run_to_end: Callable[[list[str], dict[str, str], float], tuple[int, str]],
            mpiexec: str, env: dict[str, str]) -> SurvivorTimings:
    deaths = [one_death(run_to_end, mpiexec, env) for _ in range(1 if quick else 3)]
    store = store_timings(20 if quick else 200)

    def median(key: str) -> float:
        return statistics.median(d[key] for d in deaths)

    return SurvivorTimings(median("allreduce_s"), median("detect_s"),
                           median("shrink_and_finish_s"), store["store_s"], store["pingpong_s"])
