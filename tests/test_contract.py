"""The check contract end to end, on a tiny problem of its own (tests/tiny_bank/01-tiny-max) that
depends on none of the real problems: a problem folder loads as a package, a declared run is made
once and shared by the checks that name it, cases come back with their results (by type, with
their task), a failed run fails every check that reads it (the first with the whole story), and
the fault-plan builders and the array judge say where a value is wrong."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import job_processes, run_cli

from distlab.bank import Bank
from distlab.errors import CardError
from distlab.grading import faults, first_mismatch
from distlab.grading.runner import Options, check_problem, load_checklist
from distlab.runtime.faults.plans import FaultPlanError
from distlab.runtime.jobspec import problem_package

TINY = Path(__file__).resolve().parent / "tiny_bank"

ALLREDUCE = '''import numpy as np

from distlab import MAX


def largest(comm, x):
    out = np.empty(1)
    comm.Allreduce(np.array([float(x)]), out, op=MAX)
    return float(out[0])
'''
DEADLOCK = '''import numpy as np


def largest(comm, x):
    got = np.empty(1)
    comm.Recv(got, source=(comm.Get_rank() + 1) % comm.Get_size())  # everyone waits: no sender
    return x
'''


class Quiet:
    """A reporter that keeps the narration for the asserts."""

    def __init__(self) -> None:
        self.said: list[str] = []

    def begin(self, *args: Any) -> None: ...
    def check_started(self, index: int, title: str) -> None: ...
    def compile_failed(self, summary: str, detail: str) -> None: ...
    def check_ended(self, result: Any) -> None: ...
    def end(self, results: Any) -> None: ...

    def say(self, text: str) -> None:
        self.said.append(text)


@pytest.fixture
def bank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "bank"
    shutil.copytree(TINY, root, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("DISTLAB_PROBLEMS", str(root))
    return root


def check(bank: Path, solution: str | Path, seed: int = 5, seal: bool = False) -> Any:
    entry = Bank(bank).problem("01")
    path = entry.path / f"{solution}.py" if isinstance(solution, str) else solution
    return check_problem(entry, path, Options(seed=seed, deadline_s=20, seal=seal), Quiet())


def verdicts(results: Any) -> list[tuple[str, str]]:
    return [(c.status, c.message) for c in results.checks]


def test_the_reference_passes_and_one_launch_serves_three_checks(bank: Path) -> None:
    results = check(bank, "reference", seed=11)
    assert [c.status for c in results.checks] == ["passed"] * 5, verdicts(results)
    made = sys.modules[problem_package(bank / "01-tiny-max") + ".check"].MADE
    assert made == [11]  # the declared run was made once for the three checks that read it
    assert results.launches == 2  # the shared batches, and the slow-rank run
    assert results.checks[1].metrics["cases"] == 6
    assert job_processes() == []


def test_the_starter_and_a_built_in_collective_each_fail_their_own_check(bank: Path, tmp_path: Path) -> None:
    starter = verdicts(check(bank, "starter"))
    assert starter[1][0] == "failed" and "on every rank; saw" in starter[1][1]
    assert starter[2][0] == "passed"
    cheat = tmp_path / "cheat.py"
    cheat.write_text(ALLREDUCE)
    seen = verdicts(check(bank, cheat))
    assert seen[1][0] == "passed" and seen[2][0] == "failed" and "called Allreduce" in seen[2][1]


def test_a_failed_run_fails_every_check_that_reads_it_and_tells_the_story_once(bank: Path, tmp_path: Path) -> None:
    stuck = tmp_path / "stuck.py"
    stuck.write_text(DEADLOCK)
    seen = verdicts(check(bank, stuck))
    assert seen[0][0] == "failed" and "deadlock" in seen[0][1].lower()
    assert "while running the batch with p = 2" in seen[0][1]
    for status, message in seen[1:4]:
        assert status == "failed" and message.startswith("not graded: its run failed in an earlier check")
    assert job_processes() == []


THREE_HANG = '''import numpy as np


def largest(comm, x):
    if comm.Get_size() == 3:  # everyone waits for a message nobody sends
        comm.Recv(np.empty(1), source=(comm.Get_rank() + 1) % 3)
    best, incoming = float(x), np.empty(1)
    for step in range(1, comm.Get_size()):
        right, left = (comm.Get_rank() + step) % comm.Get_size(), (comm.Get_rank() - step) % comm.Get_size()
        comm.Sendrecv(np.array([float(x)]), dest=right, recvbuf=incoming, source=left)
        best = max(best, incoming[0])
    return best
'''


def test_one_failing_task_loses_only_the_checks_that_read_it(bank: Path, tmp_path: Path) -> None:
    # Deadlocks in the batch with p = 3 only: the other batch runs again in a launch of its own,
    # so the check that reads only it is graded; the first check that reads the failed batch tells
    # the story, the later ones are not graded.
    hangs = tmp_path / "hangs.py"
    hangs.write_text(THREE_HANG)
    results = check(bank, hangs)
    seen = verdicts(results)
    assert seen[0] == ("passed", ""), seen
    assert seen[1][0] == "failed" and "deadlock" in seen[1][1].lower()
    assert "while running the batch with p = 3" in seen[1][1]
    for status, message in seen[2:4]:
        assert status == "failed" and message.startswith("not graded: its run failed in an earlier check")
    assert seen[4][0] == "passed"  # a run of its own, on two ranks
    assert results.launches == 3  # the batches, the p = 2 batch again, the slow-rank run
    assert job_processes() == []


def test_a_check_that_names_an_undeclared_run_is_refused_at_load(bank: Path) -> None:
    path = bank / "01-tiny-max" / "check.py"
    path.write_text(path.read_text().replace("def timed(t: CheckContext, batches: Run)",
                                             "def timed(t: CheckContext, bathces: Run)"))
    with pytest.raises(CardError, match=r"no @CHECKS.run declares what these ask for: timed: bathces"):
        load_checklist(Bank(bank).problem("01"))
    lint = run_cli("dev", "lint", "--no-run", env={"DISTLAB_PROBLEMS": str(bank)})
    assert lint.returncode == 1 and "bathces" in lint.stdout


def test_a_problem_folder_is_a_package_named_for_its_folder(tmp_path: Path) -> None:
    for root in ("a", "b"):
        folder = tmp_path / root / "90-twin"
        folder.mkdir(parents=True)
        (folder / "cases.py").write_text(f"WHERE = {root!r}\n")
        (folder / "programs.py").write_text("from .cases import WHERE\n")
        name = problem_package(folder)
        assert name == "distlab_problem_90_twin"
        # The same folder name under another root replaces the package and its modules.
        assert importlib.import_module(name + ".programs").WHERE == root


def test_fault_plan_builders_go_through_the_plan_parser() -> None:
    plan = faults.plan(faults.delay(src=1, dst=[0, 2], latency_s=0.01, wall=True),
                       faults.kill(rank=2, at_step=3), seed=4, where="a test plan")
    assert [f.kind for f in plan.faults] == ["delay", "kill"] and plan.seed == 4
    with pytest.raises(FaultPlanError, match=r"a test plan: fault\[0\].*latency_s"):
        faults.plan(faults.delay(src=0, latency_s=-1.0), seed=1, where="a test plan")


def test_first_mismatch_locates_the_first_wrong_element() -> None:
    want = np.arange(8, dtype=np.float64)
    assert first_mismatch(want + 1e-12, want, rtol=1e-9, atol=1e-9) is None
    got = want.copy()
    got[[3, 6]] = -1
    found = first_mismatch(got, want, rtol=1e-9)
    assert found is not None and found.describe() == "element 3: expected 3.0, saw -1.0 (2 of 8 elements wrong)"
    assert found.describe(at=300).startswith("element 300:")
    ints = np.arange(4)
    assert first_mismatch(ints + 1, ints, rtol=0.5, atol=2) is not None  # integers compare exactly
    shape = first_mismatch(np.zeros(3), np.zeros(4))
    assert shape is not None and shape.describe() == "holds (3,) elements, expected (4,)"
    # Strings where numbers are due (a solution's rank program hands back what it likes): all wrong.
    words = first_mismatch(np.array(["x"] * 8), want, rtol=1e-9)
    assert words is not None and words.wrong == 8 and words.describe().startswith("element 0: expected 0.0, saw 'x'")


def test_sealed_checks_give_the_verdicts_of_unsealed_ones(bank: Path, tmp_path: Path) -> None:
    """The learner's code in a process of its own per rank (runtime/seal/): every check's status
    and message as unsealed (the problems' own verdicts, sealed, are compared fixture by fixture by
    the verdict snapshot of the closing notes; the failure paths sealed: test_launcher_sealed.py)."""
    for solution in ("reference",):
        plain, sealed = check(bank, solution), check(bank, solution, seal=True)
        assert verdicts(sealed) == verdicts(plain), solution
        assert sealed.to_json()["seal"] == "on" and plain.to_json()["seal"] == "off"
        assert "unsealed" in plain.footer and "unsealed" not in sealed.footer
    assert job_processes() == []
