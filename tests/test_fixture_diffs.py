"""Buggy fixtures kept as diffs against their problem's reference (tests/fixtures/NN/NAME.diff).

Every diff must still apply, strictly, to the current reference and give a Python file that
compiles; a diff whose context the reference no longer has must fail with a message that names
the fixture and the hunk, so that a change to a reference shows which fixtures to remake.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO
from e2e import FixtureDiffError, apply_diff, fixture_diffs, fixture_solution, parse_diff, reference_of

DIFFS = fixture_diffs()


def test_there_are_fixture_diffs() -> None:
    # The parametrized test below would pass on an empty list: make sure it has work to do.
    assert DIFFS, f"no tests/fixtures/*/*.diff under {FIXTURES}"


@pytest.mark.parametrize("diff", DIFFS, ids=[f"{d.parent.name}/{d.name}" for d in DIFFS])
def test_every_fixture_diff_applies_and_compiles(diff: Path, tmp_path: Path) -> None:
    problem, name = diff.parent.name, diff.with_suffix(".py").name
    text = diff.read_text()
    header = text[: text.index("\n--- ")].splitlines()
    assert header and all(line.startswith("#") for line in header), "the diff opens with '#' lines naming its bug"
    assert not (FIXTURES / problem / name).exists(), f"{name} is kept both whole and as a diff"
    path = fixture_solution(problem, name, into=tmp_path)
    assert path == tmp_path / problem / name  # the same name, so tracebacks read as the fixture's
    source = path.read_text()
    compile(source, str(path), "exec")
    assert source != reference_of(problem).read_text(), "the diff changes nothing"


def test_whole_file_fixtures_are_returned_as_they_are() -> None:
    assert fixture_solution("03", "syntax_error.py") == FIXTURES / "03" / "syntax_error.py"
    with pytest.raises(FileNotFoundError, match="no fixture 'nonexistent.py' for problem 03"):
        fixture_solution("03", "nonexistent.py")


REFERENCE = "".join(f"line {i}\n" for i in range(1, 21))
DIFF = """# Bug: lines 5 and 15 are changed.
--- reference.py
+++ fixture.py
@@ -3,5 +3,5 @@
 line 3
 line 4
-line 5
+line five
 line 6
 line 7
@@ -13,5 +13,6 @@
 line 13
 line 14
-line 15
+line fifteen
+an extra line
 line 16
 line 17
"""


def test_a_diff_applies_hunk_by_hunk() -> None:
    out = apply_diff(DIFF, REFERENCE, "toy.diff")
    assert out == REFERENCE.replace("line 5\n", "line five\n").replace(
        "line 15\n", "line fifteen\nan extra line\n")
    # The reference grew two lines above both hunks: each hunk is found where its lines moved.
    moved = "a new first line\nanother\n" + REFERENCE
    assert apply_diff(DIFF, moved, "toy.diff") == "a new first line\nanother\n" + out


def test_a_diff_whose_context_changed_names_the_fixture_and_the_hunk() -> None:
    drifted = REFERENCE.replace("line 14\n", "line 14, edited\n")
    with pytest.raises(FixtureDiffError) as failure:
        apply_diff(DIFF, drifted, "tests/fixtures/99/toy.diff")
    message = str(failure.value)
    assert "tests/fixtures/99/toy.diff no longer applies to the reference" in message
    assert "hunk 2 of 2 (@@ -13,5 +13,6 @@)" in message
    assert "expects at line 14\n    'line 14\\n'\nbut the reference has\n    'line 14, edited\\n'" in message
    assert "found nowhere else" in message


def test_a_real_fixture_diff_fails_on_a_changed_reference() -> None:
    diff = DIFFS[0]
    hunks = parse_diff(diff.read_text(), str(diff))
    reference = reference_of(diff.parent.name).read_text()
    context = next(line for line in hunks[-1].old if line.strip() and reference.count(line) == 1)
    where, name = str(diff.relative_to(REPO)), str(reference_of(diff.parent.name).relative_to(REPO))
    says = rf"{re.escape(where)} no longer applies to {re.escape(name)}: hunk {len(hunks)} of"
    with pytest.raises(FixtureDiffError, match=says):
        apply_diff(diff.read_text(), reference.replace(context, "# changed\n"), where, name)


def test_a_hunk_found_at_two_places_is_refused_rather_than_guessed() -> None:
    diff = "--- a\n+++ b\n@@ -1,1 +1,1 @@\n-same\n+changed\n"
    with pytest.raises(FixtureDiffError, match="found at 2 other places"):
        apply_diff(diff, "top\nsame\nmiddle\nsame\n", "twice.diff")


@pytest.mark.parametrize("diff, says", [
    ("stray text\n--- a\n+++ b\n@@ -1 +1 @@\n-x\n+y\n", "only '#' comment lines may come before"),
    ("# a comment\n--- a\n@@ -1 +1 @@\n-x\n+y\n", "not a unified diff"),
    ("--- a\n+++ b\n", "the diff has no hunk"),
    ("--- a\n+++ b\n@@ -1,2 +1,2 @@\n-x\n+y\n", "is cut short"),
    ("--- a\n+++ b\n@@ -1 +1 @@\n*x\n+y\n", "a line must start with ' ', '-' or '+'"),
])
def test_malformed_diffs_are_named(diff: str, says: str) -> None:
    with pytest.raises(FixtureDiffError, match=re.escape(says)):
        apply_diff(diff, "x\n", "bad.diff")


def test_no_newline_at_end_of_file_and_stripped_blank_context_lines() -> None:
    diff = "--- a\n+++ b\n@@ -1,3 +1,3 @@\n a\n\n-c\n\\ No newline at end of file\n+d\n"
    assert apply_diff(diff, "a\n\nc", "eof.diff") == "a\n\nd\n"
