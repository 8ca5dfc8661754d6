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
    assert (bank / "26-gossip-sum" / "card.toml").is_file()
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


@pytest.mark.timeout(900)  # 16 checks, two at a time: about 80 s on a quiet machine
def test_the_real_bank_lints_clean_every_starter_failing_and_every_reference_passing() -> None:
    # What CI must run: the whole `distlab dev lint`, starters and references included.
    out = run_cli("dev", "lint", timeout=600)
    assert out.returncode == 0, out.stdout
    written = sorted({m for m in re.findall(r"^ (\d\d) ", out.stdout, re.MULTILINE)})
    assert len(written) >= 8, out.stdout  # the basic tier at least
    for number in written:
        assert re.search(rf"^ {number} +ok +starter fails +fails as it should", out.stdout, re.M), number
        assert re.search(rf"^ {number} +ok +reference passes +passes in", out.stdout, re.M), number
    assert re.search(r"\d+ ok, 0 failing", out.stdout)
    assert job_processes() == []
