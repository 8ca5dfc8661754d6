"""The end-to-end harness of the problem tests (tests/test_problemNN.py).

Two jobs, shared by every problem's test file:

* Run `distlab check NN ... --json FILE` through the real CLI, in a child process, and keep what a
  learner reads (the console), what a tool reads (the results JSON), the wall time, and the job
  processes still alive afterwards (`run_check`, `CheckRuns`, `Checked`).
* Give the path of a solution fixture in tests/fixtures/NN/ (`fixture_solution`). A fixture is a
  whole file, NAME.py, or, when it is the reference with a small edit, NAME.diff: a unified diff
  against problems/NN-*/reference.py that this module applies, strictly, into a temporary folder.
  A diff whose context no longer matches the reference fails loudly, naming the fixture and the
  hunk: a fixture cannot drift silently away from the reference it is a mistake of.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import json
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from conftest import FIXTURES, PROBLEMS, REPO, job_processes, run_cli

from distlab.runtime.jobspec import problem_package

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
    A solution given as a path (a fixture) is checked with ``--seal off`` unless ``args`` say
    ``--seal`` (see ``UNSEALED_FIXTURES``); the reference, the starter and a workspace file run as
    a learner runs them, sealed.
    ``probe_leftovers=False`` is for runs made side by side, whose processes would count as each
    other's leftovers: the caller probes once they have all ended.
    """
    extra = (*(("--seal", "off") if _unsealed_fixture(args) else ()),
             *(("--seed", str(seed)) if seed is not None else ()),
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


def _unsealed_fixture(args: tuple[str, ...]) -> bool:
    """Why fixtures run unsealed: a fixture's verdict is the check's own logic, which the seal
    does not change (``assert_same_verdict`` on a few fixtures both ways; every fixture of 01-16
    was checked both ways with one seed, 777: the same verdicts, but for 03's covert-channel
    fixtures, which only the seal closes, and 06's ready_never_cleared, since fixed), while sealed
    each call crosses to the rank's agent, which made the whole suite 40% slower (963 s against
    695 s): more than its time budget."""
    if "--seal" in args or "--solution" not in args:
        return False
    solution = args[args.index("--solution") + 1]
    return solution not in ("reference", "starter")


class CheckRuns:
    """`distlab check PROBLEM` runs, each made once and cached by its arguments.

    A test file holds one in a module-scoped fixture, so that tests reading the same run (its
    console, its JSON, its metrics) share it: a check takes seconds to a minute.

    ``together`` names runs, each ``("--solution", FIXTURE)`` (or with ``"--seed", S`` after it,
    the same S for all, where ``seed`` is None), made by one `distlab check` of
    several solutions the first time any of them is asked for: the CLI's start, the checker's
    imports (torch, for a problem that trains a model) and the zygote of the ranks are paid once
    for all of them, not once each (about half of a torch problem's fixture time). Each comes back
    as its own Checked: its part of the console, its results, its exit status (0 passed, 1 not).
    """

    def __init__(self, problem: str, *, seed: int | None, timeout: float,
                 together: Sequence[tuple[str, ...]] = ()) -> None:
        self.problem, self.seed, self.timeout = problem, seed, timeout
        self._cache: dict[tuple[tuple[str, ...], float | None], Checked] = {}
        for args in together:
            assert (len(args) == 2 or (len(args) == 4 and args[2] == "--seed" and seed is None)) and (
                args[0] == "--solution" and _unsealed_fixture(args) and args[2:] == together[0][2:]), (
                f"only fixtures checked with their default options and one seed run together, not {args}")
        self._together = list(together)

    def __call__(self, *args: str, time_limit: float | None = None, fresh: bool = False) -> Checked:
        """The run with ``args``; ``fresh=True`` runs it again (and caches the new run)."""
        key = (args, time_limit)
        if not fresh and key not in self._cache and time_limit is None and args in self._together:
            self._run_together()
        if fresh or key not in self._cache:
            self._cache[key] = run_check(self.problem, *args, seed=self.seed, timeout=self.timeout,
                                         time_limit=time_limit)
        return self._cache[key]

    def _run_together(self) -> None:
        waiting = [args for args in self._together if (args, None) not in self._cache]
        seed = int(waiting[0][3]) if len(waiting[0]) == 4 else self.seed
        for args, checked in zip(waiting, check_together(self.problem, [a[1] for a in waiting],
                                                         seed=seed, timeout=self.timeout)):
            self._cache[(args, None)] = checked


def check_together(problem: str, solutions: list[str], *, seed: int | None, timeout: float,
                   probe_leftovers: bool = True) -> list[Checked]:
    """One `distlab check PROBLEM --solution A --solution B ... --seal off --json FILE`, cut into
    a Checked per solution: the console at each solution's header line, the JSON list in order.
    ``timeout`` is per solution; the leftover probe, made once at the end, counts for each
    (``probe_leftovers`` as run_check's)."""
    header = f"distlab check {problem} · "
    extra = ("--seal", "off", *(("--seed", str(seed)) if seed is not None else ()))
    with tempfile.TemporaryDirectory(prefix=f"dl{problem}-") as scratch:
        json_path = Path(scratch) / "results.json"
        start = time.monotonic()
        proc = run_cli("check", problem, *(a for s in solutions for a in ("--solution", s)), *extra,
                       "--json", str(json_path), timeout=timeout * len(solutions))
        wall = time.monotonic() - start
        left = leftovers() if probe_leftovers else []
        listed = json.loads(json_path.read_text()) if json_path.exists() else None
    lines = proc.stdout.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith(header)]
    table = next((i for i, line in enumerate(lines) if line.startswith(f"{len(solutions)} solutions · ")),
                 len(lines))
    if listed is None or len(starts) != len(solutions):  # the command failed as a whole: each says so
        out = proc.stdout + proc.stderr
        return [Checked(("--solution", s, *extra), proc.returncode, out, " ".join(out.split()), None,
                        wall, left) for s in solutions]
    checked = []
    for i, solution in enumerate(solutions):
        out = "".join(lines[starts[i]:starts[i + 1] if i + 1 < len(starts) else table]) + proc.stderr
        results = listed[i]
        assert results["solution"] == str(Path(solution).resolve()), (results["solution"], solution)
        checked.append(Checked(("--solution", solution, *extra), 0 if results["passed"] else 1, out,
                               " ".join(out.split()), results, results["wall_s"], left))
    return checked


def assert_same_verdict(sealed: Checked, unsealed: Checked) -> None:
    """The same exit status, score and status of every check, sealed and unsealed."""
    assert sealed.results is not None and unsealed.results is not None, sealed.out + unsealed.out
    assert sealed.results["seal"] == "on" and unsealed.results["seal"] == "off"
    verdict = [(c["name"], c["status"]) for c in sealed.results["checks"]]
    assert verdict == [(c["name"], c["status"]) for c in unsealed.results["checks"]], sealed.out
    assert (sealed.rc, sealed.results["score"]) == (unsealed.rc, unsealed.results["score"])


def assert_fails_with_symptom(run: Checked, fixture: str, failing: str, must: list[str],
                              names_its_bug: dict[str, str]) -> None:
    """A buggy fixture's run, as every problem's test file judges one: no process left, exit 1,
    the check ``failing`` failed with each text of ``must`` in its message, every diagnosis of
    ``names_its_bug`` (phrase -> the fixture whose bug it names) said in its own fixture's run
    and in no other, and the seed to replay printed."""
    assert_clean(run)
    assert run.rc == 1, run.out
    assert run.status(failing) == "failed", run.out
    message = " ".join(run.check(failing)["message"].split())
    for text in must:
        assert text in message, f"{text!r} missing from: {message}"
    for phrase, owner in names_its_bug.items():
        assert (phrase in run.messages()) == (owner == fixture), (phrase, run.messages())
    if "--seed" in run.args:  # the replay hint
        assert f"--seed {run.args[run.args.index('--seed') + 1]}" in run.flat, run.out


def assert_passes(run: Checked, backend: str | None = None) -> None:
    """A correct solution's run (the reference, an alternative): no process left, exit 0, every
    point scored, on ``backend`` when one is named."""
    assert_clean(run)
    assert run.rc == 0, run.out
    assert run.results is not None and run.results["passed"], run.out
    assert run.results["score"] == run.results["max_score"], run.out
    assert backend is None or run.results["backend"] == backend, run.out


def assert_starter_fails(run: Checked, said: list[str]) -> None:
    """The starter's run: no process left, exit 1, told it is the starter, failed through wrong
    results (no traceback), and each text of ``said`` in its console."""
    assert_clean(run)
    assert run.rc == 1 and "checking the starter" in run.flat and "Traceback" not in run.out, run.out
    assert run.results is not None, run.out
    assert_output_has(run, said)


def assert_clean(run: Checked) -> None:
    """No rank, mpiexec or prterun of the run outlived the CLI."""
    assert not run.leftovers, "job processes outlived the CLI:\n" + "\n".join(run.leftovers)


def assert_output_has(run: Checked, texts: list[str]) -> None:
    """Each of ``texts`` is in the run's console output (whitespace runs made one space)."""
    for text in texts:
        assert text in run.flat, f"{text!r} missing from:\n{run.out}"


# -- solution fixtures, whole or as a diff against the reference -----------------------------------


class FixtureDiffError(Exception):
    """A fixture's .diff is malformed or no longer applies to the problem's reference."""


@dataclass(frozen=True)
class Hunk:
    """One hunk of a unified diff: the lines the reference must have, and what replaces them."""

    header: str  # "@@ -58,7 +58,7 @@", to name the hunk in messages
    old_start: int  # 1-based first line of ``old`` in the reference (for an empty ``old``: after it)
    old: list[str]  # context and removed lines, with their line endings
    new: list[str]  # context and added lines, with their line endings


def _lines(text: str) -> list[str]:
    """``text`` cut after each "\n", the endings kept (str.splitlines also cuts at \f, \x1c, ...)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_diff(text: str, where: str) -> list[Hunk]:
    """The hunks of a one-file unified diff, after its header comment (``#`` lines).

    A bare empty line inside a hunk counts as an empty context line: editors strip the single
    space that `diff -u` writes there. ``where`` names the diff in error messages.
    """
    lines = _lines(text)
    i = 0
    while i < len(lines) and not lines[i].startswith("--- "):
        if lines[i].strip() and not lines[i].startswith("#"):
            raise FixtureDiffError(f"{where}, line {i + 1}: only '#' comment lines may come before "
                                   f"the '--- ' line, not {lines[i].rstrip()!r}")
        i += 1
    if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
        raise FixtureDiffError(f"{where}: no '--- reference' and '+++ fixture' lines: not a unified diff")
    i += 2
    hunks: list[Hunk] = []
    while i < len(lines):
        if not lines[i].strip():  # blank lines between hunks or at the end
            i += 1
            continue
        match = _HUNK_HEADER.match(lines[i])
        if not match:
            raise FixtureDiffError(f"{where}, line {i + 1}: expected a hunk header '@@ -a,b +c,d @@', "
                                   f"saw {lines[i].rstrip()!r} (one file per diff)")
        header = lines[i].rstrip("\n")
        old_len = int(match[2]) if match[2] is not None else 1
        new_len = int(match[4]) if match[4] is not None else 1
        old: list[str] = []
        new: list[str] = []
        last: list[list[str]] = []  # the list(s) the previous line went to, for "\ No newline"
        i += 1
        while i < len(lines) and (len(old) < old_len or len(new) < new_len or lines[i].startswith("\\")):
            line = lines[i]
            tag, body = (line[0], line[1:]) if line != "\n" else (" ", "\n")
            if tag == "\\":  # "\ No newline at end of file": the previous line has no "\n"
                for target in last:
                    target[-1] = target[-1].rstrip("\n")
            elif tag in " -+":
                last = [old, new] if tag == " " else [old] if tag == "-" else [new]
                for target in last:
                    target.append(body)
            else:
                raise FixtureDiffError(f"{where}, line {i + 1}: in hunk {len(hunks) + 1} ({header}), "
                                       f"a line must start with ' ', '-' or '+': {line.rstrip()!r}")
            i += 1
        if (len(old), len(new)) != (old_len, new_len):
            raise FixtureDiffError(f"{where}: hunk {len(hunks) + 1} ({header}) is cut short: "
                                   f"{len(old)} old and {len(new)} new lines, its header says "
                                   f"{old_len} and {new_len}")
        hunks.append(Hunk(header, int(match[1]), old, new))
    if not hunks:
        raise FixtureDiffError(f"{where}: the diff has no hunk")
    return hunks


def _find_hunk(reference: list[str], hunk: Hunk, number: int, count: int, expected: int, start: int,
               where: str, reference_name: str) -> int:
    """Where ``hunk.old`` stands in ``reference``: at ``expected`` (0-based, the header's line moved
    by the earlier hunks' shift), or else at its one place from ``start`` on. Every line must match
    exactly: no fuzz, and a hunk found at two other places is refused rather than guessed."""
    size = len(hunk.old)
    if start <= expected and reference[expected:expected + size] == hunk.old:
        return expected
    elsewhere = [at for at in range(start, len(reference) - size + 1) if reference[at:at + size] == hunk.old]
    if len(elsewhere) == 1:
        return elsewhere[0]
    seen = reference[expected:expected + size]
    first = next((k for k, (want, got) in enumerate(zip(hunk.old, seen)) if want != got), len(seen))
    want = hunk.old[first] if first < size else "(nothing)"
    got = seen[first] if first < len(seen) else "(the end of the file)"
    found = "found nowhere else" if not elsewhere else f"found at {len(elsewhere)} other places"
    raise FixtureDiffError(
        f"{where} no longer applies to {reference_name}: hunk {number} of {count} ({hunk.header}) expects "
        f"at line {expected + first + 1}\n    {want!r}\nbut the reference has\n    {got!r}\n"
        f"(and the hunk's lines are {found}). Has the reference changed? Remake the fixture from "
        f"the current reference and write its diff again (docs/writing-a-problem.md, section 5)."
    )


def apply_diff(diff_text: str, reference_text: str, where: str, reference_name: str = "the reference") -> str:
    """``reference_text`` with the unified diff ``diff_text`` applied, strictly (see _find_hunk).

    ``where`` names the diff and ``reference_name`` the reference in error messages.
    """
    hunks = parse_diff(diff_text, where)
    reference = _lines(reference_text)
    out: list[str] = []
    done = 0  # reference lines consumed so far
    shift = 0  # how far the hunks found so far stand from their headers' line numbers
    for number, hunk in enumerate(hunks, start=1):
        # An empty "old" (a pure insertion) comes after line old_start; any other hunk starts at it.
        stated = hunk.old_start if not hunk.old else hunk.old_start - 1
        at = _find_hunk(reference, hunk, number, len(hunks), stated + shift, done, where, reference_name)
        out += reference[done:at]
        out += hunk.new
        done = at + len(hunk.old)
        shift = at - stated
    out += reference[done:]
    return "".join(out)


def reference_of(problem: str) -> Path:
    """problems/NN-*/reference.py for problem ``problem`` ("04")."""
    found = sorted(PROBLEMS.glob(f"{problem}-*/reference.py"))
    assert len(found) == 1, f"expected one problems/{problem}-*/reference.py, found {found}"
    return found[0]


_materialized: dict[tuple[str, str, Path | None], Path] = {}
_session_dir: Path | None = None


def _scratch() -> Path:
    """One folder per test process for materialized fixtures, removed when the process ends."""
    global _session_dir
    if _session_dir is None:
        _session_dir = Path(tempfile.mkdtemp(prefix="distlab-fixtures-"))
        atexit.register(shutil.rmtree, _session_dir, ignore_errors=True)
    return _session_dir


def fixture_solution(problem: str, name: str, into: Path | None = None) -> Path:
    """The solution file of fixture ``name`` ("missing_scale.py") of problem ``problem`` ("04").

    tests/fixtures/NN/NAME.py is returned as it is. tests/fixtures/NN/NAME.diff is applied to the
    problem's current reference and written as NAME.py (same name, so tracebacks and messages
    read as the fixture's) under ``into``, or a folder of this test process; once per process.
    """
    assert name.endswith(".py"), f"a fixture is named as its solution file, NAME.py, not {name!r}"
    whole = FIXTURES / problem / name
    as_diff = whole.with_suffix(".diff")
    if whole.exists():
        assert not as_diff.exists(), f"{whole} and {as_diff} both exist: keep one"
        return whole
    if not as_diff.exists():
        raise FileNotFoundError(f"no fixture {name!r} for problem {problem}: neither {whole} nor {as_diff}")
    key = (problem, name, into)
    if key not in _materialized:
        reference = reference_of(problem)
        # Bytes, decoded by hand: read_text() would turn "\r\n" into "\n" and break byte identity.
        text = apply_diff(as_diff.read_bytes().decode(), reference.read_bytes().decode(),
                          str(as_diff.relative_to(REPO)), str(reference.relative_to(REPO)))
        target = (into or _scratch()) / problem / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text.encode())
        _materialized[key] = target
    return _materialized[key]


def fixture_runs(problem: str, names: Sequence[str]) -> list[tuple[str, str]]:
    """The arguments that check each named fixture (``NAME.py`` or ``NAME.diff``) of ``problem``,
    for ``CheckRuns(together=...)``."""
    return [("--solution", str(fixture_solution(problem, Path(name).stem + ".py"))) for name in names]


def fixture_diffs() -> list[Path]:
    """Every fixture kept as a diff, tests/fixtures/NN/NAME.diff."""
    return sorted(FIXTURES.glob("*/*.diff"))


def fixture_names(problem: str) -> set[str]:
    """The fixtures of a problem, each by the solution file it makes (a diff's name as .py)."""
    return {p.stem + ".py" for p in (FIXTURES / problem).iterdir() if p.suffix in (".py", ".diff")}


def problem_modules(folder: Path, *names: str) -> tuple[ModuleType, ...]:
    """The named modules of a problem's package ("cases", "judging", ...), imported as the checker
    imports them (through the package, so that their relative imports work)."""
    package = problem_package(folder)
    return tuple(importlib.import_module(f"{package}.{name}") for name in names)


def load_file(path: Path, name: str) -> ModuleType:
    """A module file (a reference, a fixture) imported under ``name``, registered in sys.modules
    first: dataclasses look their module up while a class is built."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
