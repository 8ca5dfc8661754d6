"""The benchmark's MPI half runs on 4 ranks and reports every figure.

No timing is asserted: this machine is shared and noisy, so the speed targets live in
``distlab bench`` for people to read, not here.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from distlab.bench.suite import Figure, figures_table, run_mpi_timings
from distlab.bench.timings import ALLREDUCE_BYTES, RANKS


def _is_positive_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def test_quick_mpi_benchmark_reports_every_figure_as_a_positive_number(tmp_path: Path) -> None:
    out = tmp_path / "timings.json"
    run_mpi_timings(out, quick=True)

    data = json.loads(out.read_text())
    assert data["ranks"] == RANKS and data["quick"] is True
    by_size = {item["nbytes"]: item for item in data["allreduce"]}
    assert sorted(by_size) == sorted(ALLREDUCE_BYTES)
    sides = ("ring_s", "builtin_s", "builtin_out_of_place_s")
    figures = {f"allreduce {n} {side}": by_size[n][side] for n in by_size for side in sides}
    for key in ("pingpong_raw_s", "pingpong_proxy_s", "sendrecv_raw_s", "sendrecv_proxy_s",
                "clocked_raw_s", "clocked_proxy_s"):
        figures[key] = data.get(key)
    not_positive = {name: v for name, v in figures.items() if not _is_positive_number(v)}
    assert not not_positive, f"figures missing or not positive: {not_positive}"


def test_the_proxy_cost_rows_are_measured_and_report_only() -> None:
    from distlab.bench.proxy_cost import measure
    from distlab.bench.suite import proxy_cost_figures

    cost = measure(rounds=1, calls=40)
    assert all(_is_positive_number(v) for v in cost.__dict__.values()), cost
    rows = proxy_cost_figures(cost)
    assert [r.name for r in rows] == [
        "proxy Python per Sendrecv, hot", "proxy Python per Sendrecv, cache cleared"
    ]
    assert all(r.limit is None and r.met is None for r in rows)  # explained, never judged


def test_a_forked_launch_is_timed_against_a_fresh_one_of_the_same_run() -> None:
    from distlab.bench.start_cost import StartTimings, launch_s
    from distlab.bench.suite import start_figures

    forked, fresh = launch_s("gloo", forked=True, ranks=2), launch_s("gloo", forked=False, ranks=2)
    assert forked > 0 and fresh > 0
    mpi, gloo = start_figures(StartTimings(mpi=(0.5, 1.0), gloo=(forked, fresh)))
    assert (mpi.judged, mpi.limit, gloo.limit) == (0.5, None, 0.5)
    assert gloo.judged == forked / fresh and gloo.baseline == "started afresh"


def test_the_figures_table_folds_on_an_80_column_terminal_and_cuts_no_figure() -> None:
    figures = [
        Figure("ring vs built-in Allreduce, 16 MiB, 4 ranks", 14.2e-3, "built-in Allreduce",
               12.43e-3, 1.14, "x", 1.2),
        Figure("proxy per small operation (8 B ping-pong)", 12.3e-6, "raw mpi4py", 9.2e-6,
               3.1, "us per message", 30.0),
    ]
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(figures_table(figures, "distlab bench"))
    text = out.getvalue()
    assert "\u2026" not in text, text  # rich's ellipsis: something was elided
    for header in ("benchmark", "measured", "baseline", "ratio", "overhead", "target"):
        assert header in text, text
    assert "14.20 ms" in text and "1.14x" in text and "12.3 us" in text, text


def test_check_03_is_timed_sealed_and_unsealed_each_said_explicitly() -> None:
    from distlab.bench.seal_cost import measure_check

    asked: list[tuple[str, ...]] = []
    timed = measure_check(3, lambda extra: asked.append(extra) or float(len(asked)))
    # The default of check is sealed: a baseline run without --seal off would be sealed too.
    assert asked == [("--seal", "on")] * 3 + [("--seal", "off")] * 3
    assert timed == (2.0, 5.0)  # each the median of its three runs


def test_the_seal_s_call_and_message_costs_are_measured_sealed_and_unsealed() -> None:
    from distlab.bench.seal_cost import Pair, SealTimings, per_call_s, per_message_s
    from distlab.bench.suite import seal_figures

    call = Pair(per_call_s(8, 20, seal=True), per_call_s(8, 20, seal=False))
    message = Pair(per_message_s(8, 20, seal=True), per_message_s(8, 20, seal=False))
    assert all(_is_positive_number(s) for s in (*call.__dict__.values(), *message.__dict__.values()))
    rows = seal_figures(SealTimings(call, Pair(2 * call.sealed_s, 2 * call.plain_s), message,
                                    Pair(2 * message.sealed_s, 2 * message.plain_s), Pair(3.0, 2.0)))
    assert [r.name for r in rows] == [
        "sealed call 8 B (Sendrecv to itself)", "sealed call 1 MiB (Sendrecv to itself)",
        "sealed message 8 B (ping-pong, 2 ranks)", "sealed message 1 MiB (ping-pong, 2 ranks)",
        "check 03 reference, sealed"]
    assert rows[0].judged == (call.sealed_s - call.plain_s) * 1e6 and rows[0].limit == 30.0
    assert rows[2].judged == (message.sealed_s - message.plain_s) * 1e6 and rows[2].limit is None
    assert rows[4].judged == 1.5 and rows[4].met is True  # 3.0 s sealed against 2.0 s: the limit


def test_a_peer_death_and_the_store_are_timed_against_baselines_of_the_same_run() -> None:
    from distlab.bench.suite import run_to_end, survivor_figures
    from distlab.bench.survivor_cost import measure
    from distlab.runtime.supervisor import mpi_env, mpiexec_path

    timings = measure(True, run_to_end, mpiexec_path(), mpi_env())
    values = [*timings.mpi.__dict__.values(), *timings.gloo.__dict__.values(),
              *timings.mpi_join.__dict__.values(), *timings.gloo_join.__dict__.values(),
              timings.store_s, timings.pingpong_s]
    assert all(_is_positive_number(v) for v in values), timings
    rows = survivor_figures(timings)
    assert [r.name for r in rows] == [
        "SIGKILL to PeerFailed (MPI, ULFM)", "survivors revoke, shrink, finish an Allreduce (MPI, ULFM)",
        "SIGKILL to PeerFailed (gloo, store notices)",
        "survivors revoke, shrink, finish an Allreduce (gloo, store notices)",
        "Admit with no one waiting (MPI)", "Admit a joiner, then the grown group's Allreduce (MPI)",
        "Admit with no one waiting (gloo)", "Admit a joiner, then the grown group's Allreduce (gloo)",
        "store set + get, 8 B"]
    assert all(r.limit is None and r.ratio == r.judged for r in rows)
    # Each sees the death long before any deadline would.
    assert timings.mpi.detect_s < 5.0 and timings.gloo.detect_s < 5.0
