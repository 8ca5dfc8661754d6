"""The end-to-end harness of the problem tests (tests/test_problemNN.py).

Runs `distlab check NN ... --json FILE` through the real CLI, in a child process, and keeps what
a learner reads (the console), what a tool reads (the results JSON), the wall time, and the job
processes still alive afterwards (`run_check`, `CheckRuns`, `Checked`).
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import job_processes, run_cli

# -- running `distlab check` --------------------------------------------------------------------


@dataclass
class Checked:
    """One `distlab check NN` run, as the CLI left it."""

    args: tuple[str, ...]  # what followed `distlab check NN` (the --json path left out)
    rc: int
    out: str  # stdout + stderr as printed
    flat: str  # the same with every run of whitespace made one space (rich wraps long lines)
    results: dict[str, Any] | None  # the --json file, if written
    wall_s: float
    leftovers: list[str]  # job processes still alive ~1.5 s after the CLI exited

    def check(self, name_start: str) -> dict[str, Any]:
        """The first check whose name starts with ``name_start``."""
        assert self.results is not None, self.out
        found: list[dict[str, Any]] = [c for c in self.results["checks"] if c["name"].startswith(name_start)]
        names = [c["name"] for c in self.results["checks"]]
        assert found, f"no check named {name_start!r} in {names}"
        return found[0]

    def status(self, name_start: str) -> str:
        """The status ("passed", "failed") of the first check whose name starts with ``name_start``."""
        return str(self.check(name_start)["status"])

    def failed(self) -> list[str]:
        """The names of the checks that did not pass."""
        assert self.results is not None, self.out
        return [c["name"] for c in self.results["checks"] if c["status"] != "passed"]

    def messages(self) -> str:
        """Every check's message, whitespace runs made one space, in one string."""
        assert self.results is not None, self.out
        return " ".join(" ".join(c["message"].split()) for c in self.results["checks"])


def leftovers(wait_s: float = 1.5) -> list[str]:
    """conftest's job_processes(), after up to ``wait_s`` for processes on their way out."""
    end = time.monotonic() + wait_s
    while (found := job_processes()) and time.monotonic() < end:
        time.sleep(0.1)
    return found


def run_check(
    problem: str,
    *args: str,
    seed: int | None,
    timeout: float,
    time_limit: float | None = None,
    probe_leftovers: bool = True,
) -> Checked:
    """Runs `distlab check PROBLEM ARGS [--seed S] [--time-limit T] --json FILE` and reads it back.

    ``seed=None`` adds no --seed (the caller's ``args`` hold one, or the run takes the card's).
    ``probe_leftovers=False`` is for runs made side by side, whose processes would count as each
    other's leftovers: the caller probes once they have all ended.
    """
    extra = (*(("--seed", str(seed)) if seed is not None else ()),
             *(("--time-limit", str(time_limit)) if time_limit else ()))
    with tempfile.TemporaryDirectory(prefix=f"dl{problem}-") as scratch:
        json_path = Path(scratch) / "results.json"
        start = time.monotonic()
        proc = run_cli("check", problem, *args, *extra, "--json", str(json_path), timeout=timeout)
        wall = time.monotonic() - start
        left = leftovers() if probe_leftovers else []
        results = json.loads(json_path.read_text()) if json_path.exists() else None
    out = proc.stdout + proc.stderr
    return Checked(args + extra, proc.returncode, out, " ".join(out.split()), results, wall, left)


class CheckRuns:
    """`distlab check PROBLEM` runs, each made once and cached by its arguments.

    A test file holds one in a module-scoped fixture, so that tests reading the same run (its
    console, its JSON, its metrics) share it: a check takes seconds to a minute.
    """

    def __init__(self, problem: str, *, seed: int | None, timeout: float) -> None:
        self.problem, self.seed, self.timeout = problem, seed, timeout
        self._cache: dict[tuple[tuple[str, ...], float | None], Checked] = {}

    def __call__(self, *args: str, time_limit: float | None = None, fresh: bool = False) -> Checked:
        """The run with ``args``; ``fresh=True`` runs it again (and caches the new run)."""
        key = (args, time_limit)
        if fresh or key not in self._cache:
            self._cache[key] = run_check(self.problem, *args, seed=self.seed, timeout=self.timeout,
                                         time_limit=time_limit)
        return self._cache[key]


def assert_clean(run: Checked) -> None:
    """No rank, mpiexec or prterun of the run outlived the CLI."""
    assert not run.leftovers, "job processes outlived the CLI:\n" + "\n".join(run.leftovers)


def assert_output_has(run: Checked, texts: list[str]) -> None:
    """Each of ``texts`` is in the run's console output (whitespace runs made one space)."""
    for text in texts:
        assert text in run.flat, f"{text!r} missing from:\n{run.out}"
