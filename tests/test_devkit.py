"""The author's kit through the CLI, on a throwaway bank: dev new scaffolds a problem that lint
proves sound (its starter fails, its reference passes); a broken card and a stray file are named."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from conftest import PROBLEMS, job_processes, run_cli


@pytest.fixture
def bank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "problems"
    root.mkdir()
    shutil.copy(PROBLEMS / "index.toml", root / "index.toml")
    monkeypatch.setenv("DISTLAB_PROBLEMS", str(root))
    return root


def test_a_scaffolded_problem_passes_lint_end_to_end(bank: Path) -> None:
    made = run_cli("dev", "new", "gossip-sum", "--title", "Gossip a sum", "--tier", "expert")
    assert made.returncode == 0, made.stdout + made.stderr
    for name in ("card.toml", "check.py", "programs.py", "cases.py", "starter.py", "reference.py"):
        assert (bank / "26-gossip-sum" / name).is_file()
    listed = run_cli("list")
    assert "Gossip a sum" in listed.stdout
    lint = run_cli("dev", "lint", "--problems", "26")
    assert lint.returncode == 0, lint.stdout
    assert "fails as it should" in lint.stdout and "passes in" in lint.stdout
    assert job_processes() == []


def test_lint_names_a_broken_card_a_missing_hint_and_a_stray_file(bank: Path) -> None:
    shutil.copytree(PROBLEMS / "03-ring-allreduce", bank / "03-ring-allreduce")
    card = bank / "03-ring-allreduce" / "card.toml"
    card.write_text(card.read_text().replace('tier = "basic"', 'tier = "legendary"'))
    (bank / "03-ring-allreduce" / "notes.txt").write_text("scratch")
    lint = run_cli("dev", "lint", "--no-run")
    assert lint.returncode == 1
    out = " ".join(lint.stdout.split())
    assert "key 'tier' must be one of basic, advanced, expert; got 'legendary'" in out
    assert "unexpected: notes.txt" in out


def test_dev_new_refuses_a_bad_or_taken_slug(bank: Path) -> None:
    for slug, needle in (("Bad Slug", "must be lower-case"), ("ring-allreduce", "exists already")):
        out = run_cli("dev", "new", slug)
        assert out.returncode == 2 and needle in out.stdout + out.stderr


def test_progress_shows_tiers_and_the_next_problem() -> None:
    out = run_cli("progress")
    assert out.returncode == 0
    assert "basic tier" in out.stdout and "0/8 passed" in out.stdout
    assert re.search(r"next: \d\d · ", out.stdout)


def test_the_real_bank_lints_clean() -> None:
    # The static half of `distlab dev lint` over the real bank. Its other half (every starter fails,
    # every reference passes) is what each problem's own test file proves with its reference and
    # starter runs (tests/test_problemNN*.py): running it here too would start those 16 checks again.
    out = run_cli("dev", "lint", "--no-run")
    assert out.returncode == 0, out.stdout
    written = sorted({m for m in re.findall(r"^ (\d\d) ", out.stdout, re.MULTILINE)})
    assert len(written) >= 8, out.stdout  # the basic tier at least
    assert re.search(r"\d+ ok, 0 failing", out.stdout)


def test_every_written_problem_has_a_test_file_that_runs_its_reference_and_its_starter() -> None:
    # The guard that keeps the static lint above honest: a problem without these tests would have
    # a reference nobody proved to pass and a starter nobody proved to fail.
    numbers = sorted({d.name[:2] for d in PROBLEMS.iterdir() if (d / "check.py").exists()})
    assert len(numbers) >= 8
    for number in numbers:
        files = sorted(PROBLEMS.parent.glob(f"tests/test_problem{number}*.py"))
        text = "\n".join(f.read_text() for f in files)
        assert re.search(r"def test_(reference_passes|correct_solutions_pass)", text), number
        assert re.search(r"def test_starter_fails", text), number


def test_a_problem_written_the_old_way_is_named_by_lint(bank: Path) -> None:
    made = run_cli("dev", "new", "split-sum", "--title", "Split sum", "--tier", "advanced")
    assert made.returncode == 0, made.stdout + made.stderr
    folder = bank / "26-split-sum"
    (folder / "programs.py").rename(folder / "check_programs.py")  # the parts of before the packages
    lint = run_cli("dev", "lint", "--no-run", "--problems", "26")
    assert lint.returncode == 1
    out = " ".join(lint.stdout.split())
    assert "missing programs.py" in out and "unexpected: check_programs.py" in out
    assert "no programs.py; a problem is a package" in out


def test_lint_without_runs_fails_a_card_on_an_unknown_platform_or_a_solution_outside(bank: Path) -> None:
    for number, slug in (("03", "ring-allreduce"), ("01", "sync-parameter-server")):
        shutil.copytree(PROBLEMS / f"{number}-{slug}", bank / f"{number}-{slug}")
    card = bank / "03-ring-allreduce" / "card.toml"
    card.write_text(card.read_text().replace('platform = "laptop"', 'platform = "lapptop"'))
    card = bank / "01-sync-parameter-server" / "card.toml"
    card.write_text(card.read_text().replace('solution_file = "01-sync-parameter-server.py"',
                                             'solution_file = "../01.py"'))
    lint = run_cli("dev", "lint", "--no-run")
    assert lint.returncode == 1, lint.stdout
    out = " ".join(lint.stdout.split())
    assert "no platform 'lapptop'" in out
    assert "key 'solution_file' must be a file name inside the workspace" in out


def test_list_shows_a_card_with_a_toml_syntax_error_as_broken(bank: Path) -> None:
    shutil.copytree(PROBLEMS / "03-ring-allreduce", bank / "03-ring-allreduce")
    card = bank / "03-ring-allreduce" / "card.toml"
    card.write_text(card.read_text().replace('tier = "basic"', "tier = basic"))
    listed = run_cli("list")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "AllReduce by hand" in line)
    assert "broken" in row and "ready" not in row
