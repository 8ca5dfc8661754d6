"""Inputs a new user gives by mistake (or on purpose) are refused in one sentence, exit code 2,
before any process starts; odd but valid Python (a BOM, a coding line) runs."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

from distlab import options
from distlab.errors import UsageError
from distlab.runtime.rank.learner import SolutionLoadError, compile_check, load_module

from conftest import PROBLEMS, job_processes, run_cli

REFERENCE = PROBLEMS / "03-ring-allreduce" / "reference.py"


def refused(out: object, needle: str, begun: bool = False) -> None:
    """Exit code 2, the sentence, no traceback, and (unless ``begun``: the file is read when the
    check begins, still before any rank) no check begun, its header never printed."""
    text = out.stdout + out.stderr  # type: ignore[attr-defined]
    assert out.returncode == 2, text  # type: ignore[attr-defined]
    assert needle in text, text
    assert "Traceback" not in text and "internal error" not in text, text
    if not begun:
        assert "distlab check 03 ·" not in text and "distlab run 03 ·" not in text, text
    assert "1. " not in text, "a check started"


# -- the options, one function each -----------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 7, 2**63 - 1])
def test_seeds_in_range_are_kept(seed: int) -> None:
    assert options.seed(seed) == seed


@pytest.mark.parametrize("seed", [-1, 2**63, 2**64 + 5])
def test_seeds_out_of_range_are_refused(seed: int) -> None:
    with pytest.raises(UsageError, match=r"--seed must be an integer from 0 to 2\*\*63-1"):
        options.seed(seed)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0.0, -3.0, 1e9])
def test_time_limits_that_are_no_deadline_are_refused(value: float) -> None:
    with pytest.raises(UsageError, match="--time-limit must be a positive number of seconds"):
        options.time_limit(value)


def test_a_sensible_time_limit_is_kept() -> None:
    assert options.time_limit(0.5) == 0.5 and options.time_limit(None) is None


def test_the_seal_is_on_unless_said_off_or_the_run_is_timed_on_the_wall_clock() -> None:
    assert options.seal(None) is True and options.seal(None, "virtual") is True
    assert options.seal(None, "wall") is False  # each call's trip through the agent would be timed
    assert options.seal("on", "wall") is True and options.seal("off") is False
    with pytest.raises(UsageError, match="unknown seal 'maybe'"):
        options.seal("maybe")


def test_a_json_path_is_refused_when_a_folder_or_a_file_to_keep(tmp_path: Path) -> None:
    progress = tmp_path / "progress.json"
    progress.write_text("{}")
    with pytest.raises(UsageError, match="is a folder"):
        options.json_path(tmp_path, keep={"your progress file": progress})
    with pytest.raises(UsageError, match="is your progress file"):
        options.json_path(tmp_path / "." / "progress.json", keep={"your progress file": progress})
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="is a file, not a folder"):
        options.json_path(blocker / "r.json", keep={})
    fine = tmp_path / "new" / "r.json"
    assert options.json_path(fine, keep={"your progress file": progress}) == fine
    assert not list(tmp_path.rglob(".r.json*")), "the trial leaves nothing behind"


def test_a_solution_that_is_a_folder_or_missing_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is a folder"):
        options.solution_file(str(tmp_path))
    with pytest.raises(UsageError, match="does not exist"):
        options.solution_file(str(tmp_path / "nope.py"))
    mine = tmp_path / "mine.py"
    mine.write_text("x = 1\n")
    assert options.solution_file(str(mine)) == mine.resolve()


# -- reading the learner's file -----------------------------------------------------------------


def bom_file(tmp_path: Path) -> Path:
    path = tmp_path / "bom.py"
    path.write_bytes(b"\xef\xbb\xbf" + REFERENCE.read_bytes())
    return path


def latin1_file(tmp_path: Path) -> Path:
    path = tmp_path / "latin1.py"
    text = "# -*- coding: latin-1 -*-\n# caf\u00e9 au lait, \u00e0 la main\n" + REFERENCE.read_text()
    path.write_bytes(text.encode("latin-1"))
    return path


@pytest.mark.parametrize("make", [bom_file, latin1_file], ids=["utf-8 BOM", "coding latin-1"])
def test_a_bom_or_a_coding_line_is_valid_python_that_compiles_and_imports(
    tmp_path: Path, make: object
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    compile_check(path)
    module = load_module(path, f"solution_{path.stem}")
    assert callable(module.allreduce)


def test_a_solution_edited_within_the_same_second_is_loaded_as_it_is_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python trusts a .pyc whose source kept its size and modification second; the learner's
    file is compiled from its bytes every time, so a one-character fix is what gets checked."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as on a learner's machine
    path = tmp_path / "solution.py"
    path.write_text("ANSWER = 1\n")
    stamp = path.stat().st_mtime_ns
    assert load_module(path, "solution_same_second").ANSWER == 1
    path.write_text("ANSWER = 2\n")  # the same size
    os.utime(path, ns=(stamp, stamp))  # and the same modification time
    assert load_module(path, "solution_same_second").ANSWER == 2
    assert not (tmp_path / "__pycache__").exists()


def test_a_binary_solution_is_refused_in_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "blob.py"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(UsageError, match="is binary, not Python source text"):
        compile_check(path)


def test_a_file_that_is_not_utf_8_and_says_no_coding_is_a_syntax_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "undeclared.py"
    path.write_bytes("x = \"caf\u00e9\"\n".encode("latin-1"))
    with pytest.raises(SolutionLoadError, match="SyntaxError"):
        compile_check(path)


def test_a_latin_1_solution_runs_on_real_ranks(tmp_path: Path) -> None:
    out = run_cli("run", "03", "--ranks", "2", "--solution", str(latin1_file(tmp_path)))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "matches the sum of all inputs" in out.stdout
    assert not job_processes()


# -- the CLI refuses before any process starts --------------------------------------------------


@pytest.mark.parametrize("seed", ["-1", str(2**63), str(2**64 + 1)])
def test_check_and_run_refuse_a_seed_out_of_range(seed: str) -> None:
    refused(run_cli("check", "03", "--solution", "reference", "--seed", seed), "--seed must be")
    refused(run_cli("run", "03", "--solution", "reference", "--seed", seed), "--seed must be")


@pytest.mark.parametrize("limit", ["nan", "inf", "-inf", "0", "-1"])
def test_check_refuses_a_time_limit_that_is_no_deadline(limit: str) -> None:
    out = run_cli("check", "03", "--solution", "reference", "--time-limit", limit)
    refused(out, "--time-limit must be a positive number of seconds")


def test_check_refuses_a_json_folder_before_running(tmp_path: Path) -> None:
    refused(run_cli("check", "03", "--solution", "reference", "--json", str(tmp_path)), "is a folder")
    assert list(tmp_path.iterdir()) == []


def test_check_refuses_to_write_its_json_over_the_progress_file(workspace: Path) -> None:
    workspace.mkdir(parents=True)
    progress = workspace / "progress.json"
    progress.write_text(json.dumps({"version": 1, "problems": {"01": {"passed": True}}}))
    before = progress.read_text()
    out = run_cli("check", "03", "--solution", "reference", "--json", str(progress))
    refused(out, "is your progress file")
    assert progress.read_text() == before


def test_check_refuses_a_solution_folder_and_a_binary_solution(tmp_path: Path) -> None:
    refused(run_cli("check", "03", "--solution", str(tmp_path)), "is a folder")
    blob = tmp_path / "blob.py"
    blob.write_bytes(bytes(range(256)) * 4)
    refused(run_cli("check", "03", "--solution", str(blob)), "is binary, not Python source text",
            begun=True)


def test_the_results_file_is_written_atomically_and_leaves_no_stray_file(tmp_path: Path) -> None:
    from distlab.grading.results import Results, write

    results = Results("03", "t", "s.py", "mpi", 1, "now", 0.0, [])
    folder = tmp_path / "taken"
    folder.mkdir()
    with pytest.raises(OSError):
        write(results, folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    write(results, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["problem"] == "03"
