"""`distlab report`: the HTML page has its sections, the learner's results and a timeline per rank.
Where Debian's Chromium is installed, the test also renders the page headless and keeps a
screenshot (tests/artifacts/report-03.png)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_cli


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> str:
    ws = tmp_path_factory.mktemp("ws")
    checked = run_cli("check", "03", "--solution", "reference", workspace=ws)
    assert checked.returncode == 0, checked.stdout
    swept = run_cli("tune", "03", "--solution", "reference", "--param", "n=1000,100000",
                    "--ranks", "2", workspace=ws)
    assert swept.returncode == 0, swept.stdout
    out = ws / "r.html"
    made = run_cli("report", "03", "--solution", "reference", "--out", str(out), workspace=ws)
    assert made.returncode == 0, made.stdout + made.stderr
    return out.read_text()


def test_the_page_holds_every_section(page: str) -> None:
    for section in ("results", "timeline", "metrics", "sweeps", "card"):
        assert f'id="{section}"' in page, section
    assert "<script" not in page  # self-contained and static
    assert "data:image/png;base64," in page  # the sweep curve, inline


def test_the_page_shows_the_results_and_the_figure_beside_its_bound(page: str) -> None:
    assert "passed 03" in page
    assert re.search(r'id="performance".*against the bound .* \(1\.0\d\dx\)', page)
    assert page.count('class="passed"') >= 5


def test_the_timeline_has_a_row_per_rank_with_spans(page: str) -> None:
    svg = page[page.index("<svg"):page.index("</svg>")]
    assert [f"rank {r}" for r in range(4)] == re.findall(r">(rank \d)<", svg)
    assert svg.count("<rect") > 4 + 8  # backgrounds plus communication spans


def test_a_report_without_results_says_how_to_get_them(tmp_path: Path) -> None:
    out = tmp_path / "empty.html"
    made = run_cli("report", "03", "--solution", "starter", "--out", str(out))
    assert made.returncode == 0
    assert "No results yet" in out.read_text()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_the_page_renders_in_headless_chromium(page: str, tmp_path: Path) -> None:
    html_file = tmp_path / "page.html"
    html_file.write_text(page)
    artifacts = REPO / "tests" / "artifacts"
    artifacts.mkdir(exist_ok=True)
    shot = artifacts / "report-03.png"
    shot.unlink(missing_ok=True)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1000,1400"]
    done = subprocess.run(["chromium", *flags, f"--screenshot={shot}", html_file.as_uri()],
                          capture_output=True, text=True, timeout=60)
    assert shot.exists() and shot.stat().st_size > 10_000, done.stderr[-2000:]
    dom = subprocess.run(["chromium", *flags, "--dump-dom", html_file.as_uri()],
                         capture_output=True, text=True, timeout=60)
    assert 'id="timeline"' in dom.stdout and "rank 3" in dom.stdout
    assert "Uncaught" not in dom.stderr
