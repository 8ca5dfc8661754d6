"""Problem 11, topology-aware rings: the package's pure parts, then `distlab check 11` end to end.

The first half needs no process: the card's server is `rack` link for link, the best ring of
every server found by trying all 5040 rings (the card's: 64 Gb/s against the naive ring's 32),
every hidden server's naive ring at most half the best (so 1.9x is within reach and the naive
ring far from it), each socket's CPUs on this machine, and the report's picture drawn from rank
0's ring alone (numbers only: anything else draws nothing).

The second half runs the real CLI once per solution (reference, starter, each fixture in
tests/fixtures/11/) with one fixed seed: each run is checked for its exit code, the check that
must fail, the symptom its message must name, and for processes left behind.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from conftest import PROBLEMS
from e2e import (
    Checked,
    CheckRuns,
    assert_fails_with_symptom,
    fixture_names,
    fixture_runs,
    fixture_solution,
    problem_modules,
)

from distlab.platforms import load_shipped

SEED = 4311
FOLDER = PROBLEMS / "11-topology-rings"
cases, programs, judging = problem_modules(FOLDER, "cases", "programs", "judging")
GBPS = 8 / 1e9


def test_the_card_server_is_rack_link_for_link() -> None:
    ours, shipped = cases.CARD.platform, load_shipped("rack")
    for a in range(8):
        for b in range(8):
            assert ours.route(a, b).links == shipped.route(a, b).links
            assert ours.route(a, b).alpha_s == pytest.approx(shipped.route(a, b).alpha_s)
            assert ours.route(a, b).beta_s_per_byte == pytest.approx(shipped.route(a, b).beta_s_per_byte)


def test_the_best_ring_doubles_the_naive_one_on_the_card_and_on_every_hidden_server() -> None:
    card = cases.CARD
    assert (card.best * GBPS, card.bottleneck(cases.NAIVE) * GBPS) == (pytest.approx(64), pytest.approx(32))
    for seed in range(40):
        machine = cases.hidden_machine(np.random.default_rng(seed), "x")
        assert machine.best == pytest.approx(min(machine.qpi_gbps, machine.pcie_gbps) / GBPS)
        assert machine.bottleneck(cases.NAIVE) <= machine.best / 2
        # Names follow nothing: the GPUs sorted by name are a slow ring on most hidden servers.
        assert sorted(machine.gpu_names) == [f"gpu{g}" for g in range(8)]


def test_each_socket_gets_half_of_this_machine_s_cpus() -> None:
    assert cases.numa_cpus(frozenset({0, 1})) == (("socket0", (0,)), ("socket1", (1,)))
    assert cases.numa_cpus(frozenset(range(8))) == (("socket0", (0, 1, 2, 3)), ("socket1", (4, 5, 6, 7)))
    assert cases.numa_cpus(frozenset({3})) == (("socket0", (3,)), ("socket1", (3,)))


def test_the_picture_is_drawn_from_a_ring_of_numbers_only() -> None:
    svg = programs.figure({"ring": [0, 1, 4, 5, 2, 3, 6, 7]})
    assert svg.startswith("<svg") and svg.count("<path") == 8 and svg.count("#cf222e") == 2
    for junk in ({"ring": "<script>"}, {"ring": [0, 1]}, {}):
        assert programs.figure(junk) == ""


# -- `distlab check 11` end to end --------------------------------------------------------------


@pytest.fixture(scope="module")
def checked() -> CheckRuns:
    return CheckRuns("11", seed=SEED, timeout=170,
                     together=fixture_runs("11", sorted(BUGGY)))


# fixture -> (the check that must fail, substrings its message must contain)
BUGGY: dict[str, tuple[str, list[str]]] = {
    "naive_ring.py": ("the ring's slowest hop", ["that is the naive order 0..7"]),
    "by_device_name.py": ("the ring's slowest hop", ["sorted by device name",
                                                     "the names do not follow the tree"]),
    "by_switch_name.py": ("the ring's slowest hop", ["crosses the socket link 4 times (twice is the least)"]),
    "pin_by_rank.py": ("each rank runs on", ["the other socket: read the socket off the tree"]),
    "pin_not_applied.py": ("each rank runs on", ["every CPU: no affinity was applied"]),
    "forged_fake_sum.py": ("allreduce along your ring", ["rank 0 sent its ring successor",
                                                         "the harness's allreduce did not run as written"]),
    "forged_frames.py": ("best_ring returns every rank once", ["RuntimeError: no case"]),
    "forged_two_rank_ring.py": ("the ring's slowest hop", ["rank 0's best_ring returned [0, 1], not every rank 0..7 once"]),
    # An outside tester's: the ring as floats 0.0..7.0 crashed the check ("the check itself crashed").
    "forged_float_ring.py": ("best_ring returns every rank once", ["[0.0, 1.0,", "float where ranks are ints"]),
}

NAMES_ITS_BUG = {
    "that is the naive order 0..7": "naive_ring.py",
    "sorted by device name": "by_device_name.py",
    "(twice is the least)": "by_switch_name.py",
    "read the socket off the tree": "pin_by_rank.py",
    "no affinity was applied": "pin_not_applied.py",
    "did not run as written": "forged_fake_sum.py",
    "RuntimeError: no case": "forged_frames.py",
    "returned [0, 1], not every rank": "forged_two_rank_ring.py",
    "where ranks are ints": "forged_float_ring.py",
}


def test_every_rank_hands_back_its_whole_sum_and_any_order_of_adding_gives_its_bits() -> None:
    case = cases.Case(cases.CARD, cases.numa_cpus(), 1 << 16, 7)
    inputs = [cases.values(case.nbytes, cases.data_key(case.seed, r)) for r in range(cases.P)]
    assert all(np.array_equal(x, np.round(x)) for x in inputs)  # whole numbers: exact sums
    forward, backward = sum(inputs), sum(inputs[::-1])
    right = [cases.digest(forward)] * cases.P
    assert cases.digest(backward) == case.digest() and judging.sum_problem(case, list(range(8)), right) is None
    off = forward.copy()
    off[12345] += 1  # one element: a sample of every 4096th would not have looked there
    wrong = judging.sum_problem(case, list(range(8)), right[:5] + [cases.digest(off)] + right[6:])
    assert wrong is not None and "did not leave rank 5 the sum" in wrong


def test_the_table_has_a_diagnosis_for_every_buggy_fixture() -> None:
    assert set(BUGGY) == fixture_names("11") - {"alt_fewest_crossings.py"} == set(NAMES_ITS_BUG.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUGGY))
def test_buggy_solution_fails_with_its_symptom(name: str, checked: Callable[..., Checked]) -> None:
    failing, must = BUGGY[name]
    run = checked("--solution", str(fixture_solution("11", name)))
    assert_fails_with_symptom(run, name, failing, must, NAMES_ITS_BUG)


@pytest.mark.slow
def test_the_fewest_crossings_by_search_passes_too_on_gloo(checked: Callable[..., Checked]) -> None:
    run = checked("--solution", str(fixture_solution("11", "alt_fewest_crossings.py")), "--backend", "gloo")
    assert not run.leftovers
    assert run.rc == 0, run.out
    assert run.results is not None and run.results["score"] == run.results["max_score"]


@pytest.mark.slow
def test_reference_passes(checked: Callable[..., Checked]) -> None:
    run = checked("--solution", "reference")
    assert not run.leftovers
    assert run.rc == 0, run.out
    r = run.results
    assert r is not None and r["passed"] and r["score"] == r["max_score"] == 8 and r["seal"] == "on"
    assert r["totals"]["launches"] == 1
    times = run.check("allreduce along your ring")["metrics"]
    card = cases.CARD.label()
    assert times[f"naive_ms {card}"] / times[f"yours_ms {card}"] >= 1.95


@pytest.mark.slow
def test_starter_fails_with_helpful_messages(checked: Callable[..., Checked]) -> None:
    run = checked()
    assert not run.leftovers
    assert run.rc == 1, run.out
    assert "that is the naive order 0..7" in run.flat
    assert "no affinity was applied" in run.flat
    assert "Traceback" not in run.out


@pytest.mark.slow
def test_the_report_draws_the_tree_with_the_ring_on_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from conftest import run_cli

    out = tmp_path / "r.html"
    made = run_cli("report", "11", "--solution", "reference", "--out", str(out), workspace=tmp_path / "ws")
    assert made.returncode == 0, made.stdout + made.stderr
    page = out.read_text()
    figure = page[page.index('<section id="figure">'):]
    figure = figure[:figure.index("</section>")]
    assert "<h2>The picture</h2><svg" in figure
    assert figure.count("#cf222e") == 2  # the reference's ring crosses the socket link once each way
