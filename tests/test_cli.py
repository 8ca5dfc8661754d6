"""The command line as a learner uses it: list, show, start, hint, solution, and its errors."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import DISTLAB, PROBLEMS, run_cli


def test_list_shows_all_25_slots_by_tier() -> None:
    out = run_cli("list")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.strip()[:2].isdigit()]
    assert len(lines) == 25
    assert "basic tier" in out.stdout and "expert tier" in out.stdout
    assert "AllReduce by hand over MPI" in out.stdout and "coming" in out.stdout


def test_show_renders_the_four_scenario_parts_and_the_dist_steps() -> None:
    out = run_cli("show", "03")
    assert out.returncode == 0, out.stderr
    for part in ("Background", "Constraints", "Fault injection", "Monitoring metrics",
                 "Define", "Instrument", "Simulate", "Tune"):
        assert part in out.stdout


def test_start_copies_once_and_then_keeps_the_learners_file(workspace: Path) -> None:
    first = run_cli("start", "03")
    assert first.returncode == 0 and "wrote" in first.stdout
    mine = workspace / "03-ring-allreduce.py"
    mine.write_text("# mine\n")
    second = run_cli("start", "03")
    assert second.returncode == 0 and "already exists" in second.stdout
    assert mine.read_text() == "# mine\n"


def test_hint_shows_one_more_each_time_and_stops_at_the_last() -> None:
    assert "hint 1/5" in run_cli("hint", "03").stdout
    second = run_cli("hint", "03").stdout
    assert "hint 2/5" in second and "hint 1/5" in second
    for _ in range(4):
        last = run_cli("hint", "3").stdout
    assert "hint 5/5" in last and "last hint" in last


def test_solution_is_locked_until_passed_unless_forced() -> None:
    locked = run_cli("solution", "03")
    assert locked.returncode == 2
    assert "opens once your solution passes" in locked.stdout
    assert "Traceback" not in locked.stdout + locked.stderr
    forced = run_cli("solution", "03", "--force")
    assert forced.returncode == 0 and "def allreduce" in forced.stdout


def test_passing_your_own_file_unlocks_the_solution_and_records_progress(workspace: Path) -> None:
    run_cli("start", "03")
    reference = Path(__file__).resolve().parents[1] / "problems/03-ring-allreduce/reference.py"
    (workspace / "03-ring-allreduce.py").write_text(reference.read_text())
    checked = run_cli("check", "03")
    assert checked.returncode == 0, checked.stdout
    progress = json.loads((workspace / "progress.json").read_text())
    assert progress["problems"]["03"]["passed"] is True
    assert json.loads((workspace / "results/03.json").read_text())["passed"] is True
    assert run_cli("solution", "03").returncode == 0
    assert "passed" in run_cli("list").stdout


def test_several_solutions_are_graded_on_one_seed_as_each_would_be_alone(workspace: Path, tmp_path: Path) -> None:
    """`distlab check 03 --solution A --solution B`: each graded in turn on the same hidden
    variants (one seed drawn for all), a table of the scores, a JSON list in the order given, and
    exit 1 unless every one passed; each verdict is the one its check alone gives."""
    buggy = str(Path(__file__).parent / "fixtures" / "03" / "no_allgather.py")
    listed = tmp_path / "results.json"
    both = run_cli("check", "03", "--solution", "reference", "--solution", buggy, "--seal", "off",
                   "--json", str(listed))
    out = " ".join(both.stdout.split())
    assert both.returncode == 1, out
    results = json.loads(listed.read_text())
    assert [r["solution"] for r in results] == [str(PROBLEMS / "03-ring-allreduce" / "reference.py"), buggy]
    assert [r["passed"] for r in results] == [True, False] and results[0]["seed"] == results[1]["seed"]
    seed = results[0]["seed"]
    assert f"2 solutions · seed {seed}" in out and "12/12 │ passed" in out, out
    assert out.count("distlab check 03 · ") == 2
    alone = tmp_path / "alone.json"
    single = run_cli("check", "03", "--solution", buggy, "--seal", "off", "--seed", str(seed), "--json", str(alone))
    assert single.returncode == 1
    verdict = json.loads(alone.read_text())
    assert [(c["name"], c["status"], c["message"]) for c in verdict["checks"]] == [
        (c["name"], c["status"], c["message"]) for c in results[1]["checks"]]
    assert not (workspace / "progress.json").exists()  # neither is the learner's own file


def test_errors_are_one_sentence_with_exit_code_2() -> None:
    for args, needle in [
        (("show", "42"), "no problem '42'"),
        (("show", "17"), "coming but not written yet"),
        (("check", "03", "--backend", "smoke-signals"), "unknown backend"),
        (("check", "03", "--solution", "/nonexistent/x.py"), "does not exist"),
        (("check", "03", "--solution", "reference", "--solution", "/nonexistent/x.py"), "does not exist"),
        (("check", "03", "--time-limit", "0"), "must be a positive number"),
        (("frobnicate",), "No such command"),
    ]:
        out = run_cli(*args)
        text = out.stdout + out.stderr
        assert out.returncode == 2, (args, text)
        assert needle in text, (args, text)
        assert "Traceback" not in text


def test_a_corrupt_progress_file_is_reported_not_a_traceback(workspace: Path) -> None:
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "progress.json").write_text("\x00garbage")
    out = run_cli("list")
    assert out.returncode == 0
    assert "unreadable" in out.stdout and "Traceback" not in out.stdout + out.stderr


# Card text in square brackets, the way learners' code advice reads; rich's markup and Markdown's
# links would each eat a different part of it.
BRACKETS = "send np.concatenate([signs, np.float32([scale]).view(np.uint8)]) into buf[lo:hi]"
LINKLIKE = "x[i](y) and \\[kept] and [bold]"


@pytest.fixture
def bracket_bank(tmp_path: Path) -> Path:
    """The real index and problem 03, whose card's first hint and background hold brackets."""
    root = tmp_path / "problems"
    root.mkdir()
    shutil.copy(PROBLEMS / "index.toml", root / "index.toml")
    shutil.copytree(PROBLEMS / "03-ring-allreduce", root / "03-ring-allreduce")
    card = root / "03-ring-allreduce" / "card.toml"
    text = card.read_text().replace("hints = [\n", f"hints = [\n    {json.dumps(BRACKETS)},\n", 1)
    text = text.replace('background = """\n', f'background = """\n{LINKLIKE.replace(chr(92), chr(92) * 2)} {BRACKETS}\n', 1)
    card.write_text(text)
    return root


def test_hints_with_square_brackets_print_verbatim(bracket_bank: Path) -> None:
    out = run_cli("hint", "03", env={"DISTLAB_PROBLEMS": str(bracket_bank)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert BRACKETS in out.stdout


def test_the_card_keeps_its_square_brackets_through_markdown(bracket_bank: Path) -> None:
    out = run_cli("show", "03", env={"DISTLAB_PROBLEMS": str(bracket_bank), "COLUMNS": "400"})
    assert out.returncode == 0, out.stdout + out.stderr
    flat = " ".join(out.stdout.replace("│", " ").split())
    assert BRACKETS in flat and LINKLIKE in flat


def test_an_error_message_quoting_the_learners_text_keeps_its_brackets() -> None:
    out = run_cli("show", "[bold]x")
    assert out.returncode == 2
    assert "no problem '[bold]x'" in out.stdout


def test_a_piped_solution_is_the_reference_file_exactly_even_at_80_columns() -> None:
    reference = (PROBLEMS / "03-ring-allreduce" / "reference.py").read_text()
    assert max(len(line) for line in reference.splitlines()) > 80  # else the test proves nothing
    out = run_cli("solution", "03", "--force", env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == reference


def test_a_solution_on_an_80_column_terminal_keeps_every_code_line_whole() -> None:
    from rich.console import Console

    from distlab.cli import print_code

    reference = (PROBLEMS / "03-ring-allreduce" / "reference.py").read_text()
    screen = io.StringIO()
    print_code(Console(file=screen, force_terminal=True, width=80, color_system=None), reference)
    shown = screen.getvalue()
    for line in reference.splitlines():
        assert line.rstrip() in shown, line


def test_tables_fold_on_a_narrow_terminal_and_elide_nothing() -> None:
    for command in (("platforms",), ("progress",), ("platform", "show", "rack")):
        out = run_cli(*command, env={"COLUMNS": "40"})
        assert out.returncode == 0, out.stdout + out.stderr
        assert "…" not in out.stdout, (command, out.stdout)


def test_piped_output_uses_the_full_line_width() -> None:
    from distlab.platforms import load_shipped, shipped_names

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run([*DISTLAB, "platforms"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in shipped_names():
        description = load_shipped(name).description
        assert any(description in line for line in out.stdout.splitlines()), description
