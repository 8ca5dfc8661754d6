"""distlab calibrate: the fit, the platform file it writes, its errors, and a quick run end to end.

The fit and the file are pure and checked to the last bits; the end-to-end run starts real MPI
ranks on a shared, noisy machine, so it asserts what the run produced, never how fast it was.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from rich.console import Console

from distlab.calibrate import (
    Fit, MachineModel, fit_alpha_beta, platform_toml, powers, robust_fit, run_calibration,
    write_platform,
)
from distlab.calibrate import command
from distlab.calibrate.fit import QUICK_PLAN
from distlab.errors import HarnessError, UsageError
from distlab.platforms import load_platform

from conftest import job_processes

SIZES = [2**k for k in range(3, 23)]  # 8 B .. 4 MiB


def line(alpha: float, beta: float) -> list[float]:
    return [alpha + n * beta for n in SIZES]


def model(alpha: float, beta: float, ranks: int = 4) -> MachineModel:
    return MachineModel(
        name="calibrated-mpi", description="a test machine", ranks=ranks, alpha_s=alpha,
        beta_s_per_byte=beta, flops=5.3e10, memory_gib=2.5, notes=("made by a test",),
    )


def quiet_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, color_system=None), out


# -- the fit ----------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha,beta", [(9.4e-6, 1.34e-10), (1.5e-4, 2.1e-10), (1e-9, 1e-12)])
def test_the_fit_recovers_alpha_and_beta_from_points_on_a_line(alpha: float, beta: float) -> None:
    fit = fit_alpha_beta(SIZES, line(alpha, beta))
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-9)
    assert fit.beta_s_per_byte == pytest.approx(beta, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)


def test_the_fit_weighs_relative_errors_so_small_sizes_decide_alpha() -> None:
    # 5 % noise at the largest size alone would swamp a 10 us latency in an unweighted fit.
    times = line(1e-5, 1e-10)
    times[-1] *= 1.05
    fit = fit_alpha_beta(SIZES, times)
    assert fit.alpha_s == pytest.approx(1e-5, rel=0.02)
    assert 0.9 < fit.r2 < 1.0


def test_a_size_spoiled_by_a_stall_is_set_aside_and_the_line_fitted_without_it() -> None:
    times = line(1e-5, 1e-10)
    times[SIZES.index(65536)] *= 20  # a 64 KiB median twenty times the line (seen with gloo)
    fit, dropped = robust_fit(SIZES, times)
    assert dropped == [65536]
    assert fit.alpha_s == pytest.approx(1e-5, rel=1e-9)
    assert fit.beta_s_per_byte == pytest.approx(1e-10, rel=1e-9)


def test_the_fit_refuses_points_that_cannot_make_a_line() -> None:
    with pytest.raises(ValueError):
        fit_alpha_beta([8, 8, 8], [1e-5, 1e-5, 1e-5])


def test_the_size_ranges_run_from_8_bytes_to_4_mib() -> None:
    assert powers(8, 4 << 20, 2) == tuple(SIZES)
    quick = powers(8, 4 << 20, 4)
    assert quick[0] == 8 and quick[-1] == 4 << 20 and len(quick) == 11


def test_fit_predicts_the_line() -> None:
    assert Fit(2e-6, 1e-9, 1.0).predict(1000) == pytest.approx(3e-6)


# -- the platform file ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "alpha,beta", [(9.397123456789e-06, 1.3401234567891e-10), (1.493e-4, 2.094e-10)]
)
def test_the_written_file_loads_and_every_route_has_the_fitted_alpha_and_beta(
    tmp_path: Path, alpha: float, beta: float
) -> None:
    path = tmp_path / "deep" / "calibrated-mpi.toml"
    written = write_platform(path, model(alpha, beta))
    loaded = load_platform(path)
    assert loaded.name == written.name == "calibrated-mpi"
    assert loaded.max_ranks() == 4
    for src, dst in ((0, 1), (1, 0), (2, 3), (3, 0)):
        route = loaded.route(src, dst)
        assert route.alpha_s == pytest.approx(alpha, rel=1e-9)
        assert route.beta_s_per_byte == pytest.approx(beta, rel=1e-9)
        assert len(route.links) == 2  # device -> switch -> device: a star
    assert loaded.device_of(0).flops == pytest.approx(5.3e10)
    assert loaded.device_of(0).host == "machine"


def test_the_file_says_format_version_1_and_records_the_fit_in_comments() -> None:
    text = platform_toml(model(1e-5, 1e-10, ranks=2))
    assert "format_version = 1" in text
    assert text.startswith("# made by a test\n")
    assert text.count('kind = "device"') == 2


# -- errors: one sentence, before anything is measured ----------------------------------------


def test_an_unknown_backend_is_a_usage_error() -> None:
    console, _ = quiet_console()
    with pytest.raises(UsageError, match="unknown backend 'nccl': use mpi or gloo"):
        run_calibration(console, "nccl", 4, None, True)


@pytest.mark.parametrize("ranks", [1, 0, -3])
def test_fewer_than_two_ranks_is_a_usage_error(ranks: int) -> None:
    console, _ = quiet_console()
    with pytest.raises(UsageError, match="at least 2 ranks"):
        run_calibration(console, "mpi", ranks, None, True)


def test_an_unwritable_output_path_is_a_usage_error_before_any_run(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    console, out = quiet_console()
    started = time.monotonic()
    with pytest.raises(UsageError, match="a-file is a file, not a folder"):
        run_calibration(console, "mpi", 2, blocker / "sub" / "calibrated.toml", True)
    with pytest.raises(UsageError, match="it is a folder"):
        run_calibration(console, "mpi", 2, tmp_path, True)
    assert time.monotonic() - started < 5  # nothing was launched
    assert out.getvalue() == ""


def test_a_busy_machine_s_flat_ping_pong_is_measured_again_and_refused_after_the_last_try(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As seen under the suite's load: every size ~1 ms, a scheduler tick per round trip, so the
    # fit's beta came out negative. The measurement is what a busy machine gave; the retry is real.
    flat = [1.08e-3 + (2e-4 if n == 2048 else 0.0) - n * 1e-12 for n in QUICK_PLAN.ping_sizes]
    good = [1e-5 + n * 1e-10 for n in QUICK_PLAN.ping_sizes]
    given = iter([flat, good])
    monkeypatch.setattr(command, "measure_ping_pong", lambda backend, plan: next(given))
    console, out = quiet_console()
    times, fit, dropped = command._ping_pong_fit(console, "mpi", QUICK_PLAN)
    assert times == good and fit.beta_s_per_byte == pytest.approx(1e-10) and dropped == []
    assert "not a latency and a bandwidth: the machine is probably busy; measuring again (try 2 of 3)" in (
        " ".join(out.getvalue().split()))

    monkeypatch.setattr(command, "measure_ping_pong", lambda backend, plan: flat)
    console, out = quiet_console()
    with pytest.raises(HarnessError, match="in each of 3 tries; the machine was probably too busy"):
        command._ping_pong_fit(console, "mpi", QUICK_PLAN)
    assert "try 3 of 3" in out.getvalue()


# -- end to end -------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_quick_calibration_on_mpi_writes_the_platform_and_prints_the_comparison(
    workspace: Path,
) -> None:
    console, out = quiet_console()
    path = run_calibration(console, "mpi", 2, None, True)
    assert path == workspace / "platforms" / "calibrated-mpi.toml"
    platform = load_platform(path)
    route = platform.route(0, 1)
    assert route.alpha_s > 0 and route.beta_s_per_byte > 0
    assert platform.name == "calibrated-mpi" and platform.max_ranks() == 2
    text = out.getvalue()
    for expected in ("ping-pong", "alpha =", "R^2 =", "ring allreduce", "64 KiB", "1 MiB",
                     "analytic", "replayed", "wall/analytic", "wall/replayed", "alpha-beta model"):
        assert expected in text, expected
    deadline = time.monotonic() + 3
    while job_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job_processes() == []


def test_out_overrides_the_default_path(tmp_path: Path) -> None:
    console, _ = quiet_console()
    target = tmp_path / "mine" / "here.toml"
    assert run_calibration(console, "mpi", 3, target, True) == target
    assert load_platform(target).max_ranks() == 3


def test_the_ring_table_folds_on_a_narrow_terminal_and_elides_no_figure() -> None:
    from distlab.calibrate import RingRow
    from distlab.calibrate.command import ring_table

    rows = [RingRow(2**20, 1.234567e-3, 2.345678e-3, 3.456789e-3)]
    out = io.StringIO()
    Console(file=out, width=50, color_system=None).print(ring_table(rows, 4, "mpi"))
    text = out.getvalue()
    assert "…" not in text
    for ratio in (f"{rows[0].ratio_analytic:.2f}", f"{rows[0].ratio_replayed:.2f}"):
        assert ratio in text


def test_a_calibrated_platform_is_found_by_its_name(workspace: Path) -> None:
    from distlab.calibrate import default_output
    from distlab.platforms import resolve

    from conftest import run_cli

    write_platform(default_output("mpi"), model(2e-6, 1e-10))
    platform = resolve("calibrated-mpi")
    assert platform.name == "calibrated-mpi" and platform.max_ranks() == 4
    shown = run_cli("platform", "show", "calibrated-mpi", workspace=workspace)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "calibrated-mpi" in shown.stdout
    listed = run_cli("platforms", workspace=workspace)
    assert "calibrated-mpi" in listed.stdout


def test_the_platform_doc_lists_every_shipped_platform() -> None:
    from distlab.platforms import shipped_names

    from conftest import REPO

    doc = (REPO / "docs" / "platform-format.md").read_text()
    for name in shipped_names():
        assert f"| `{name}`" in doc, name
    words = {4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}
    assert f"ships {words[len(shipped_names())]} platforms" in doc
