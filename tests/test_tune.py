"""The Tune step from the CLI: a sweep writes its data and its curve."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from distlab.errors import UsageError
from distlab.tune import parse_param

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
