"""`distlab report`: the HTML page has its sections, the learner's results and a timeline per rank.
Where Debian's Chromium is installed (``scripts/setup.sh --with-browser``, as the README's test
command does), the test also renders the page headless, checks that the console stays silent, and
keeps a screenshot (tests/artifacts/report-03.png)."""

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
    # Each check's recorded figures, beside its verdict (03: the cases, bytes and time over bounds).
    assert re.search(r'<table class="figures"><tr><td>cases</td><td>\d+</td>', page)
    assert "<td>worst_time_over_bound</td>" in page


def test_the_timeline_has_a_row_per_rank_with_spans(page: str) -> None:
    svg = page[page.index("<svg"):page.index("</svg>")]
    assert [f"rank {r}" for r in range(4)] == re.findall(r">(rank \d)<", svg)
    assert svg.count("<rect") > 4 + 8  # backgrounds plus communication spans


def test_the_timeline_draws_what_the_metrics_count_and_its_legend_says_each_colour(page: str) -> None:
    # Compute, communication and idle add up to the run's time on every rank: the legend gives each
    # share, the bars of each colour cover that share of the rows, and idle is the metrics' idle.
    legend = dict(re.findall(r'<span data-part="(\w+)">.*?\(([\d.]+)%\)</span>', page))
    assert set(legend) == {"compute", "communication", "idle"}
    assert sum(float(v) for v in legend.values()) == pytest.approx(100.0, abs=0.2)
    assert "blocked in a call" in page and "waiting for the slowest rank" in page
    idle = re.search(r"idle ([\d.]+)% ", page)
    assert idle and float(idle.group(1)) == pytest.approx(float(legend["idle"]), abs=0.1)
    svg = page[page.index("<svg"):page.index("</svg>")]
    ranks = len(re.findall(r">rank \d<", svg))
    row = float(re.search(r'<rect x="70" y="4" width="([\d.]+)"', svg).group(1))
    for part, share in legend.items():
        drawn = sum(float(w) for w in re.findall(rf'width="([\d.]+)"[^>]*data-part="{part}"', svg))
        assert drawn / (row * ranks) == pytest.approx(float(share) / 100, abs=0.02), part


def test_a_report_without_results_says_how_to_get_them(tmp_path: Path) -> None:
    out = tmp_path / "empty.html"
    made = run_cli("report", "03", "--solution", "starter", "--out", str(out))
    assert made.returncode == 0
    assert "No results yet" in out.read_text()


CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1000,1400",
    # Every console message of the page goes to stderr as "...:CONSOLE:..." lines.
    "--enable-logging=stderr", "--v=0",
]


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=90,
    )


def _console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


needs_chromium = pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="Debian's chromium is not installed (scripts/setup.sh --with-browser installs it)",
)


@needs_chromium
def test_the_console_check_sees_errors_on_a_broken_page(tmp_path: Path) -> None:
    # The control: without it, "no console lines" below could mean the logging never worked.
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>console.error('boom'); missing();</script></body></html>")
    dom = _chromium(tmp_path / "profile", "--dump-dom", broken.as_uri())
    lines = _console_lines(dom.stderr)
    assert any("boom" in line for line in lines), dom.stderr[-2000:]
    assert any("Uncaught ReferenceError" in line for line in lines)


@needs_chromium
def test_the_page_renders_in_headless_chromium_without_console_messages(
    page: str, tmp_path: Path
) -> None:
    html_file = tmp_path / "page.html"
    html_file.write_text(page)
    artifacts = REPO / "tests" / "artifacts"
    artifacts.mkdir(exist_ok=True)
    shot = artifacts / "report-03.png"
    shot.unlink(missing_ok=True)
    done = _chromium(tmp_path / "profile", f"--screenshot={shot}", html_file.as_uri())
    assert shot.exists() and shot.stat().st_size > 10_000, done.stderr[-2000:]
    dom = _chromium(tmp_path / "profile", "--dump-dom", html_file.as_uri())
    for section in ("results", "timeline", "metrics", "sweeps", "card"):
        assert f'id="{section}"' in dom.stdout, section
    assert "rank 3" in dom.stdout
    assert _console_lines(dom.stderr) == [] and _console_lines(done.stderr) == []
