"""Exam mode from the CLI: open, work, submit; late and bypassing files score zero, flagged."""

from __future__ import annotations

import html
import io
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PROBLEMS, run_cli
from rich.console import Console

from distlab.errors import UsageError
from distlab.exam import bypasses, parse_duration
from distlab.grading.console import ConsoleReporter
from distlab.grading.results import CheckResult
from distlab.runtime.seal import memgroup, sandbox

REFERENCE = (PROBLEMS / "03-ring-allreduce" / "reference.py").read_text()


def test_an_exam_is_opened_submitted_and_graded_on_its_own_seed(tmp_path: Path) -> None:
    folder = tmp_path / "exam"
    opened = run_cli("exam", "--problems", "03", "--time", "30m", "--out", str(folder))
    assert opened.returncode == 0, opened.stdout
    seed = json.loads((folder / "exam.json").read_text())["seeds"]["03"]
    # Seeds as wide as --seed takes: below 10**9 a rank found its own in 21 s (1 in 2**31 is below 2**32).
    assert 2**32 <= seed < 2**63
    (folder / "work" / "03-ring-allreduce.py").write_text(REFERENCE)
    graded = run_cli("exam", "--out", str(folder), "--submit")
    assert graded.returncode == 0, graded.stdout
    results = json.loads((folder / "results.json").read_text())
    assert results["schema"] == "distlab.exam/1"
    assert results["score"] == results["max_score"] == 12
    assert results["seal"] == "on" and results["tampered"] == ""
    # What the seal held here, for the assessor: as root, nobody in its own namespaces, a memory group.
    assert results["isolation"] == f"{sandbox.expected()}; {memgroup.available()}", results["isolation"]
    assert html.escape(f"seal on: {results['isolation']}") in (folder / "report.html").read_text()
    problem = results["problems"][0]
    assert problem["seed"] == seed and problem["late"] is False and problem["bypass"] == []
    # Open MPI's own counters saw nothing the proxy did not carry.
    assert problem["below_proxy"]["flagged"] is False and problem["bypass_traffic"] == ""
    assert problem["below_proxy"]["launches_measured"] >= 1
    assert (folder / "submitted" / "03-ring-allreduce.py").read_text() == REFERENCE
    assert "Exam: 12/12" in (folder / "report.html").read_text()
    verified = run_cli("exam", "--out", str(folder), "--verify")
    assert verified.returncode == 0 and "holds" in verified.stdout, verified.stdout


def test_verify_tells_results_edited_after_grading_and_a_kept_file_replaced(tmp_path: Path) -> None:
    folder = tmp_path / "exam"
    assert run_cli("exam", "--problems", "03", "--time", "30m", "--out", str(folder)).returncode == 0
    assert run_cli("exam", "--out", str(folder), "--submit").returncode == 0  # the starter: a low score
    signed = (folder / "results.json").read_text()
    results = json.loads(signed)
    assert results["score"] < 12
    results["score"] = results["problems"][0]["score"] = 12
    (folder / "results.json").write_text(json.dumps(results))
    edited = run_cli("exam", "--out", str(folder), "--verify")
    assert edited.returncode == 1, edited.stdout
    assert "does not carry this installation's signature" in edited.stdout
    (folder / "results.json").write_text(signed)
    (folder / "submitted" / "03-ring-allreduce.py").write_text(REFERENCE)  # a better file put in its place
    swapped = run_cli("exam", "--out", str(folder), "--verify")
    assert swapped.returncode == 1 and "is not the file graded for problem 03" in swapped.stdout, swapped.stdout
    assert "signature" not in swapped.stdout
    assert run_cli("exam", "--out", str(tmp_path / "none"), "--verify").returncode == 2


def test_a_late_file_that_bypasses_the_communicator_scores_zero_and_is_flagged(tmp_path: Path) -> None:
    folder = tmp_path / "exam"
    assert run_cli("exam", "--problems", "03", "--time", "1s", "--out", str(folder)).returncode == 0
    # The seeds give away every hidden variant: exam.json is for the assessor's account alone.
    assert (folder / "exam.json").stat().st_mode & 0o777 == 0o600
    opened_at = json.loads((folder / "exam.json").read_text())["started_at"]
    time.sleep(max(0.0, opened_at + 1.2 - time.time()))
    work = folder / "work" / "03-ring-allreduce.py"
    work.write_text("from mpi4py import MPI\n" + REFERENCE)
    os.utime(work, (opened_at, opened_at))  # `touch -d`: the mtime says before the deadline, the ctime not
    graded = run_cli("exam", "--out", str(folder), "--submit")
    assert graded.returncode == 0
    said = graded.stdout.find("was changed after the deadline")
    assert 0 <= said < graded.stdout.find("score "), graded.stdout  # late is said before any score
    problem = json.loads((folder / "results.json").read_text())["problems"][0]
    assert problem["late"] is True and problem["bypass"] == ["mpi4py"] and problem["score"] == 0
    page = (folder / "report.html").read_text()
    assert "changed after the deadline" in page and "imports mpi4py directly" in page


def test_a_link_a_fifo_or_a_missing_file_is_refused_and_nothing_behind_it_is_copied(tmp_path: Path) -> None:
    folder = tmp_path / "exam"
    assert run_cli("exam", "--problems", "01,02,03", "--time", "30m", "--out", str(folder)).returncode == 0
    secret = tmp_path / "assessors-only.txt"
    secret.write_text("the signing key, say")
    work = folder / "work"
    (work / "03-ring-allreduce.py").unlink()
    (work / "03-ring-allreduce.py").symlink_to(secret)  # the grader would copy it, as the assessor
    (work / "01-sync-parameter-server.py").unlink()
    os.mkfifo(work / "01-sync-parameter-server.py")  # reading it would hang the grader
    (work / "02-alpha-beta.py").unlink()
    graded = run_cli("exam", "--out", str(folder), "--submit", timeout=120)
    assert graded.returncode == 0, graded.stdout
    results = json.loads((folder / "results.json").read_text())
    refused = {doc["problem"]: doc["refused"] for doc in results["problems"]}
    assert refused == {"01": "01-sync-parameter-server.py is not a regular file",
                       "02": f"02-alpha-beta.py is missing from {work}",
                       "03": "03-ring-allreduce.py is a symbolic link: submit the file itself"}
    assert results["score"] == 0 and all(doc["totals"]["launches"] == 0 for doc in results["problems"])
    assert all(c["message"].startswith("not run: refused: ") for doc in results["problems"] for c in doc["checks"])
    assert all(not kept.is_symlink() and kept.read_bytes() == b"" for kept in (folder / "submitted").iterdir())
    assert "refused: 03-ring-allreduce.py is a symbolic link" in (folder / "report.html").read_text()


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A folder the sealed learner sees, as an assessor's exam folder (its /tmp, /var/tmp and /home
    are emptied: runtime/seal/sandbox.py), open to others as such a folder usually is."""
    parent = next((Path(p) for p in ("/srv", "/mnt", "/opt") if os.access(p, os.W_OK)), None)
    if parent is None:
        pytest.skip("no folder outside what the sandbox empties is writable here")
    folder = Path(tempfile.mkdtemp(prefix="distlab-exam-test-", dir=parent))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_graded_code_cannot_read_the_work_folder_where_files_change_after_the_deadline(outside_tmp: Path) -> None:
    """A stub submitted in time that runs a notes file written after the deadline: the notes would
    be graded and the stub not flagged late. The graded copy runs where the work folder is hidden.
    (Submitted with a relative --out, which the ranks, in folders of their own, must still find.)"""
    tmp_path = outside_tmp
    assert run_cli("exam", "--problems", "03", "--time", "30m", "--out", "exam", cwd=tmp_path).returncode == 0
    work = tmp_path / "exam" / "work"
    (work / "notes.txt").write_text(REFERENCE)
    (work / "03-ring-allreduce.py").write_text(
        "import pathlib\n"
        "exec((pathlib.Path(__file__).parents[1] / 'work' / 'notes.txt').read_text())\n")
    graded = run_cli("exam", "--out", "exam", "--submit", cwd=tmp_path)
    assert graded.returncode == 0, graded.stdout
    problem = json.loads((tmp_path / "exam" / "results.json").read_text())["problems"][0]
    assert problem["score"] == 0 and "FileNotFoundError" in json.dumps(problem["checks"]), problem["checks"][0]


def test_the_graded_code_cannot_read_another_exam_beside_its_own(outside_tmp: Path) -> None:
    """An outside tester's file exec'd another candidate's graded copy from an exam folder beside
    its own: every exam this installation opened is hidden from the graded code, and what the
    grader writes is the assessor's alone."""
    alice, bob = outside_tmp / "alice", outside_tmp / "bob"
    for folder in (alice, bob):
        assert run_cli("exam", "--problems", "03", "--time", "30m", "--out", str(folder)).returncode == 0
    (alice / "work" / "03-ring-allreduce.py").write_text(REFERENCE)
    assert run_cli("exam", "--out", str(alice), "--submit").returncode == 0
    assert (alice / "submitted").stat().st_mode & 0o777 == 0o700
    assert (alice / "results.json").stat().st_mode & 0o777 == 0o600
    (bob / "work" / "03-ring-allreduce.py").write_text(
        "import pathlib\n"
        "exec((pathlib.Path(__file__).parents[2] / 'alice' / 'submitted' / '03-ring-allreduce.py').read_text())\n")
    assert run_cli("exam", "--out", str(bob), "--submit").returncode == 0
    problem = json.loads((bob / "results.json").read_text())["problems"][0]
    assert problem["score"] == 0 and "FileNotFoundError" in json.dumps(problem["checks"]), problem["checks"][0]
    # Alice's exam.json or results.json copied into Bob's folder carry Alice's folder, signed.
    (bob / "results.json").write_bytes((alice / "results.json").read_bytes())
    copied = run_cli("exam", "--out", str(bob), "--verify")
    assert copied.returncode == 1 and "copied in from another exam" in copied.stdout, copied.stdout
    (bob / "exam.json").write_bytes((alice / "exam.json").read_bytes())
    regraded = run_cli("exam", "--out", str(bob), "--submit")
    assert regraded.returncode == 0 and "an exam file copied in from another exam" in regraded.stdout, regraded.stdout


def test_an_edited_exam_file_is_graded_as_tampered(tmp_path: Path) -> None:
    folder = tmp_path / "exam"
    assert run_cli("exam", "--problems", "03", "--time", "30m", "--out", str(folder)).returncode == 0
    state = json.loads((folder / "exam.json").read_text())
    state["seeds"]["03"] = 7  # a seed whose variants the candidate has seen
    (folder / "exam.json").write_text(json.dumps(state))
    (folder / "work" / "03-ring-allreduce.py").write_text(REFERENCE)
    graded = run_cli("exam", "--out", str(folder), "--submit")
    assert graded.returncode == 0, graded.stdout
    assert graded.stdout.index("tampered: ") < graded.stdout.find("score "), graded.stdout
    results = json.loads((folder / "results.json").read_text())
    assert "was edited after the exam opened" in results["tampered"]
    assert results["score"] == 0 and results["problems"][0]["passed"] is False


def test_an_exam_refuses_to_grade_unsealed_unless_told(tmp_path: Path) -> None:
    out = run_cli("exam", "--out", str(tmp_path / "x"), "--submit", "--seal", "off")
    assert out.returncode == 2 and "--allow-unsealed" in out.stdout + out.stderr


def test_exam_usage_errors_are_sentences(tmp_path: Path) -> None:
    out = run_cli("exam", "--out", str(tmp_path / "none"), "--submit")
    assert out.returncode == 2 and "holds no exam" in out.stdout + out.stderr
    out = run_cli("exam", "--out", str(tmp_path / "x"), "--problems", "03")
    assert out.returncode == 2 and "--problems and --time" in out.stdout + out.stderr


def test_durations_and_bypass_detection(tmp_path: Path) -> None:
    assert parse_duration("90m") == 5400 and parse_duration("1h30m") == 5400
    assert parse_duration("45s") == 45
    with pytest.raises(UsageError):
        parse_duration("soon")
    f = tmp_path / "s.py"
    f.write_text("import torch.distributed as dist\nimport numpy\n")
    assert bypasses(f) == ["torch.distributed"]


# The reference, except that whenever the task spans the whole job it sums on MPI_COMM_WORLD
# itself, with mpi4py reached through a built name: the import scan cannot see it.
DISGUISED_BYPASS = REFERENCE.replace("def allreduce(", "def ring_allreduce(") + '''

import importlib

_MPI = importlib.import_module("mpi" + "4py.MPI")


def allreduce(comm, buf, op=SUM):
    world = _MPI.COMM_WORLD
    if comm.Get_size() != world.Get_size():
        return ring_allreduce(comm, buf, op)
    world.Allreduce(_MPI.IN_PLACE, buf, op=getattr(_MPI, op.name))
'''


def test_a_disguised_bypass_is_caught_by_mpi_counters_and_scores_zero(tmp_path: Path) -> None:
    folder = tmp_path / "exam"
    assert run_cli("exam", "--problems", "03", "--time", "30m", "--out", str(folder)).returncode == 0
    (folder / "work" / "03-ring-allreduce.py").write_text(DISGUISED_BYPASS)
    # Unsealed, the candidate's code can reach MPI: Open MPI's own counters are the defence.
    graded = run_cli("exam", "--out", str(folder), "--submit", "--seal", "off", "--allow-unsealed")
    assert graded.returncode == 0, graded.stdout
    results = json.loads((folder / "results.json").read_text())
    assert results["seal"].startswith("off") and results["isolation"] == ""
    problem = results["problems"][0]
    assert problem["bypass"] == [] and problem["late"] is False  # the scan saw nothing
    assert problem["below_proxy"]["flagged"] is True
    assert problem["below_proxy"]["world_collectives"]["operations"] > 0
    assert problem["bypass_traffic"].startswith("bypassed the communicator: MPI carried ")
    assert problem["score"] == 0 and problem["passed"] is False
    assert "collective operation(s) on MPI_COMM_WORLD" in (folder / "report.html").read_text()


def test_a_learner_s_escape_sequences_reach_the_assessor_s_terminal_as_codes() -> None:
    """An exception's message with a cursor-up and erase-line would rewrite what the assessor reads
    ("✓ passed" over the failure): the console shows every control character but newline and tab."""
    out = io.StringIO()
    reporter = ConsoleReporter(Console(file=out, force_terminal=True, width=200))
    forged = "ValueError: \x1b[1A\x1b[2K\x1b[32m✓ passed\x1b[0m\rrest"
    reporter.check_ended(CheckResult("results", "failed", 0, 4, forged, 1, 0.1, details="line\x07two"))
    shown = out.getvalue()
    assert "\x1b[1A" not in shown and "\x1b[2K" not in shown and "\r" not in shown and "\x07" not in shown
    assert shown.count("\\x1b") == 4 and "line\\x07two" in shown  # shown as codes (rich colours the brackets)
