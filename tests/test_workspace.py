"""The learner's workspace: starting never overwrites, progress survives corruption."""

from __future__ import annotations

from pathlib import Path

from distlab.bank import Bank
from distlab.workspace import Workspace

from conftest import PROBLEMS


def test_start_copies_the_starter_once_and_never_overwrites(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    entry = Bank(PROBLEMS).problem("03")
    path, created = ws.start(entry)
    assert created and path.read_text() == (entry.path / "starter.py").read_text()
    path.write_text("# my work\n")
    again, created_again = ws.start(entry)
    assert again == path and not created_again
    assert path.read_text() == "# my work\n"


def test_progress_round_trips(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    progress = ws.load_progress()
    progress.of("03").passed = True
    progress.of("03").hints_shown = 2
    ws.save_progress(progress)
    again = Workspace(tmp_path).load_progress()
    assert again.of("03").passed and again.of("03").hints_shown == 2
    assert not list(tmp_path.glob(".progress.json.*")), "no temp file left behind"


def test_a_corrupt_progress_file_is_reported_kept_aside_and_rebuilt(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    ws.progress_file.write_text("{ not json")
    progress = ws.load_progress()
    assert "unreadable" in progress.warning and "progress.json.corrupt" in progress.warning
    assert (tmp_path / "progress.json.corrupt").read_text() == "{ not json"
    assert Workspace(tmp_path).load_progress().warning == ""


def test_a_progress_file_of_the_wrong_shape_is_rebuilt_too(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    ws.progress_file.write_text('{"version": 1, "problems": {"03": {"bogus": 1}}}')
    assert "unreadable" in ws.load_progress().warning


def test_a_binary_progress_file_is_kept_aside_and_rebuilt_too(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    blob = b"\x89PNG\r\n\x1a\n\xff\xfe" + bytes(range(256))
    ws.progress_file.write_bytes(blob)
    progress = ws.load_progress()
    assert "unreadable" in progress.warning and "progress.json.corrupt" in progress.warning
    assert (tmp_path / "progress.json.corrupt").read_bytes() == blob
    assert Workspace(tmp_path).load_progress().warning == ""
