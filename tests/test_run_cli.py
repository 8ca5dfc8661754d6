"""`distlab run`, `distlab platforms` and traces from the command line, as a learner uses them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import job_processes, run_cli

from distlab.runtime.trace.chrome import validate_chrome_trace


def test_a_traced_run_on_three_dc_writes_a_valid_chrome_trace_with_a_track_per_rank(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    out = run_cli("run", "03", "--solution", "reference", "--platform", "three-dc", "--ranks", "12",
                  "--trace", str(trace))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "matches the sum of all inputs" in out.stdout
    data = json.loads(trace.read_text())
    assert validate_chrome_trace(data) == []
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == set(range(12))
    assert {e["tid"] for e in spans} == {0, 1}  # virtual and wall tracks
    assert any(e["name"] == "wait" and e["dur"] > 0 for e in spans)
    assert job_processes() == []


def test_the_virtual_time_printed_is_the_same_on_every_run() -> None:
    times = []
    for _ in range(2):
        out = run_cli("run", "03", "--solution", "reference", "--platform", "three-dc", "--ranks", "6",
                      "--param", "n=65536")
        assert out.returncode == 0, out.stdout
        times.append(re.search(r"virtual (\d+\.\d+ [mu]?s)", out.stdout).group(1))
    assert times[0] == times[1]


def test_a_run_prints_its_metrics_summary() -> None:
    out = run_cli("run", "03", "--solution", "reference", "--ranks", "3", "--param", "n=30000")
    assert out.returncode == 0, out.stdout
    for needle in ("virtual time", "sync/compute", "idle", "messages"):
        assert needle in out.stdout


def test_run_errors_are_one_sentence() -> None:
    for args, needle in [
        (("run", "03", "--platform", "atlantis"), "no platform 'atlantis'"),
        (("run", "03", "--platform", "rack", "--ranks", "9"), "the run asked for 9"),
        (("run", "03", "--param", "oops"), "--param takes NAME=VALUE"),
        (("run", "03", "--clock", "sundial"), "unknown clock"),
        (("run", "03", "--faults", "/nonexistent.toml"), "nonexistent.toml"),
    ]:
        out = run_cli(*args)
        text = out.stdout + out.stderr
        assert out.returncode == 2, (args, text)
        assert needle in text, (args, text)
        assert "Traceback" not in text


def test_platforms_are_listed_and_drawn() -> None:
    listing = run_cli("platforms")
    assert listing.returncode == 0
    for name in ("laptop", "seed-lab", "rack", "three-dc", "cluster-100"):
        assert name in listing.stdout
    drawn = run_cli("platform", "show", "three-dc")
    assert drawn.returncode == 0 and "rank 11" in drawn.stdout and "datacenter" in drawn.stdout


def test_a_broken_platform_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "mine.toml"
    bad.write_text('format_version = 1\nname = "mine"\ndescription = "x"\nranks = ["gpu9"]\n')
    out = run_cli("platform", "show", str(bad))
    assert out.returncode == 2
    assert "mine.toml" in out.stdout + out.stderr and "Traceback" not in out.stdout + out.stderr


def test_check_can_grade_on_wall_time_for_real_clusters(tmp_path: Path) -> None:
    results = tmp_path / "r.json"
    out = run_cli("check", "03", "--solution", "reference", "--clock", "wall", "--json", str(results))
    assert out.returncode in (0, 1), out.stdout
    data = json.loads(results.read_text())
    assert data["totals"]["clock"] == "wall" and data["totals"]["virtual_s"] > 0
    timed = next(c for c in data["checks"] if c["name"].startswith("time within"))
    assert timed["metrics"]["clock"] == "wall"
    assert re.search(r"· wall \d", out.stdout.replace("\n", " "))
