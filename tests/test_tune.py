"""The Tune step from the CLI: a sweep writes its data and its curve."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from distlab.errors import UsageError
from distlab.tune import parse_param, spans_decades, time_unit

from conftest import job_processes, run_cli


def test_a_sweep_writes_one_row_per_value_and_a_plot(tmp_path: Path) -> None:
    prefix = tmp_path / "sweep"
    out = run_cli("tune", "03", "--solution", "reference", "--ranks", "3",
                  "--param", "n=3000,300000", "--out", str(prefix))
    assert out.returncode == 0, out.stdout + out.stderr
    rows = list(csv.DictReader(open(prefix.with_suffix(".csv"))))
    assert [r["n"] for r in rows] == ["3000", "300000"]
    times = [float(r["virtual_s"]) for r in rows]
    assert 0 < times[0] < times[1]  # more bytes, more virtual time
    assert prefix.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert job_processes() == []


def test_parameters_are_parsed_or_refused_clearly() -> None:
    assert parse_param("threshold=1024, 4096") == ("threshold", ["1024", "4096"])
    for bad in ("threshold", "=1,2", "n="):
        with pytest.raises(UsageError, match="NAME=V1,V2"):
            parse_param(bad)


def test_a_problems_bound_is_kept_beside_each_figure_and_drawn(tmp_path: Path) -> None:
    # The tiny problem's programs.py gives the bound of its free run (p - 1 rounds of messages per
    # repeat), computed in the supervisor; its reference is that exchange, so it lands on the bound.
    prefix = tmp_path / "sweep"
    tiny = Path(__file__).resolve().parent / "tiny_bank"
    out = run_cli("tune", "01", "--solution", "reference", "--ranks", "3", "--param", "repeat=1,4,16",
                  "--out", str(prefix), env={"DISTLAB_PROBLEMS": str(tiny)})
    assert out.returncode == 0, out.stdout + out.stderr
    rows = list(csv.DictReader(open(prefix.with_suffix(".csv"))))
    bounds = [float(r["bound"]) for r in rows]
    assert bounds[1] == pytest.approx(4 * bounds[0]) and bounds[2] == pytest.approx(16 * bounds[0])
    for r in rows:
        assert float(r["virtual_s"]) == pytest.approx(float(r["bound"]), rel=0.05)
    assert "(bound " in out.stdout
    assert prefix.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_second_metric_is_kept_in_its_column_and_drawn_beside(tmp_path: Path) -> None:
    """--beside: a second figure of each run (here its virtual time beside its message count, and a name no
    run returns) in a column of its own and on a right-hand axis of the same plot."""
    tiny = Path(__file__).resolve().parent / "tiny_bank"
    for beside, expect in (("virtual_s", "number"), ("no_such_figure", "missing")):
        prefix = tmp_path / beside
        out = run_cli("tune", "01", "--solution", "reference", "--ranks", "2", "--param", "repeat=1,4",
                      "--metric", "messages", "--beside", beside, "--out", str(prefix),
                      env={"DISTLAB_PROBLEMS": str(tiny)})
        assert out.returncode == 0, out.stdout + out.stderr
        rows = list(csv.DictReader(open(prefix.with_suffix(".csv"))))
        if expect == "number":
            assert float(rows[1][beside]) > float(rows[0][beside]) > 0 and ", virtual_s = " in out.stdout
        else:
            assert [r[beside] for r in rows] == ["", ""] and all("no metric 'no_such_figure'" in r["note"] for r in rows)
        assert prefix.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_sweep_plot_reads_time_in_a_persons_units_on_log_axes_where_values_span_decades() -> None:
    assert time_unit("virtual_s", [2e-6, 9e-5]) == (1e6, "us")
    assert time_unit("step_p50_s", [0.004, 0.02]) == (1e3, "ms")
    assert time_unit("virtual_s", [1.5]) == (1.0, "s")
    assert time_unit("auc", [0.7, 0.8]) == (1.0, "")
    assert time_unit("samples_per_s", [28342.4]) == (1.0, "")  # a rate, not a time
    assert spans_decades([8, 1024, 1 << 20]) and not spans_decades([1, 50]) and not spans_decades([0, 1000])


def test_sweeps_with_other_fixed_values_keep_their_own_files(tmp_path: Path) -> None:
    """09's two curves, the learner's allreduce and the flat ring, side by side in the workspace
    (and in the report): the default file names carry each --fixed value. 09's free run takes
    its card's 12 ranks, where 4 would sit in one data center."""
    ws = tmp_path / "ws"
    for method in ("yours", "flat"):
        out = run_cli("tune", "09", "--solution", "reference", "--param", "mib=0.5,2",
                      "--fixed", f"method={method}", workspace=ws)
        assert out.returncode == 0, out.stdout + out.stderr
    yours, flat = (list(csv.DictReader(open(ws / "tune" / f"09-mib-method-{m}.csv"))) for m in ("yours", "flat"))
    for mine, ring in zip(yours, flat):
        assert 3 * float(mine["virtual_s"]) < float(ring["virtual_s"])  # the hierarchy on 12 ranks
    assert job_processes() == []
