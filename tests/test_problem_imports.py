"""A problem's files import only ``distlab`` and ``distlab.grading``: dev lint names any other
import of distlab, with its file and line, and the shipped bank has none."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import PROBLEMS, run_cli
from distlab.grading.imports import forbidden_imports, problem_import_findings


def test_the_shipped_problems_import_only_the_public_doors() -> None:
    leaks = {p.name: problem_import_findings(p) for p in sorted(PROBLEMS.glob("[0-9][0-9]-*"))}
    assert {name: found for name, found in leaks.items() if found} == {}


@pytest.mark.parametrize("line, caught", [
    ("from distlab.runtime.comm.stats import CommStats", "distlab.runtime.comm.stats"),
    ("import distlab.platforms", "distlab.platforms"),
    ("from distlab.bank import Bank", "distlab.bank"),
    ("from distlab import SUM", None),
    ("from distlab.grading import Checklist", None),
    ("import numpy as np", None),
])
def test_each_import_is_judged_by_its_module(tmp_path: Path, line: str, caught: str | None) -> None:
    path = tmp_path / "check.py"
    # Inside a function, where a plain text search of the file's top would miss it.
    path.write_text(f"def late():\n    {line}\n")
    found = forbidden_imports(path)
    assert found == ([f"check.py:2: imports {caught}"] if caught else [])


def test_dev_lint_rejects_a_problem_that_reaches_into_the_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bank = tmp_path / "problems"
    bank.mkdir()
    shutil.copy(PROBLEMS / "index.toml", bank / "index.toml")
    shutil.copytree(PROBLEMS / "03-ring-allreduce", bank / "03-ring-allreduce")
    monkeypatch.setenv("DISTLAB_PROBLEMS", str(bank))
    clean = run_cli("dev", "lint", "--problems", "03", "--no-run")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    check = bank / "03-ring-allreduce" / "check.py"
    lines = check.read_text().splitlines()
    first_import = next(i for i, line in enumerate(lines) if line.startswith(("import ", "from ")))
    lines.insert(first_import, "from distlab.runtime.supervisor import launch")
    check.write_text("\n".join(lines) + "\n")
    lint = run_cli("dev", "lint", "--problems", "03", "--no-run")
    assert lint.returncode == 1
    out = " ".join(lint.stdout.split())
    assert "imports distlab.runtime.supervisor" in out
    assert "only distlab and distlab.grading" in out
