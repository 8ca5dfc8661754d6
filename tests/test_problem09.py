"""Problem 09, training across three data centers: the package's pure parts, then `distlab check 09`
end to end.

The first half needs no process: the clusters as platforms (the card's is three-dc, route for
route), the closed forms of the WAN bytes against the replay of a flat ring, the margins of the
hidden variants (the flat ring's bytes and time stand well outside the checks' bounds, the
hierarchy's time well inside), and the bills (the card's crosses 40% at about a billion
parameters, the seed document's figure).

The second half runs the real CLI once per solution (reference, starter, each fixture in
tests/fixtures/09/) with one fixed seed, so a failure replays with `distlab check 09 --seed 4309
--solution ...`; each run is checked for its exit code, the check that must fail, the symptom its
message must name, and for processes left behind.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest
from conftest import PROBLEMS
from e2e import (
    Checked,
    CheckRuns,
    assert_fails_with_symptom,
    fixture_names,
    fixture_solution,
    problem_modules,
)

from distlab.grading import collective_time
from distlab.platforms import load_shipped
from distlab.runtime.clock.replay import replay
from distlab.runtime.trace.events import COLL

SEED = 4309
FOLDER = PROBLEMS / "09-three-datacenters"
cases, check = problem_modules(FOLDER, "cases", "check")


def test_the_card_cluster_is_three_dc_route_for_route() -> None:
    ours, shipped = cases.CARD.platform(), load_shipped("three-dc")
    for a in range(12):
        for b in range(12):
            mine, theirs = ours.route(a, b), shipped.route(a, b)
            assert mine.alpha_s == pytest.approx(theirs.alpha_s)
            assert mine.beta_s_per_byte == pytest.approx(theirs.beta_s_per_byte)
            assert mine.price_per_byte == pytest.approx(theirs.price_per_byte)


def test_a_hidden_cluster_numbers_its_ranks_round_robin_across_data_centers() -> None:
    drawn = {cases.hidden_cluster(np.random.default_rng(seed)) for seed in range(100)}
    assert {(c.dcs, c.per_dc) for c in drawn} == {(2, 3), (2, 4), (4, 3), (4, 4)}
    assert all(c.round_robin and 0.01 <= c.wan_price_per_gb <= 0.09 for c in drawn)
    cluster = cases.Cluster(4, 3, 0.05, round_robin=True)
    assert cluster.datacenter_of() == [0, 1, 2, 3] * 3
    platform = cluster.platform()
    assert platform.route(0, 4).price_per_byte == 0  # ranks 0 and 4 share data center 0
    assert platform.route(0, 1).price_per_byte == pytest.approx(0.05e-9)


def flat_ring_wan_bytes(cluster: object, nbytes: int) -> float:
    """The replay's own count of a built-in Allreduce over every rank, on the priced links."""
    platform = cluster.platform()  # type: ignore[attr-defined]
    ranks = tuple(range(cluster.p))  # type: ignore[attr-defined]
    played = replay({r: [(COLL, "Allreduce", ranks, 0, nbytes, -1, 0.0, 0.0)] for r in ranks}, platform)
    return sum(b for link, b in played.link_bytes.items() if platform.link_price(link) > 0)


@pytest.mark.parametrize("cluster", [cases.CARD, cases.Cluster(4, 3, 0.05, True),
                                     cases.Cluster(2, 4, 0.05, True)], ids=str)
def test_the_closed_forms_of_the_wan_bytes_are_the_replay_s(cluster: object) -> None:
    nbytes = 1 << 20
    assert flat_ring_wan_bytes(cluster, nbytes) == pytest.approx(
        cluster.flat_ring_wan_bytes(nbytes), rel=0.01)  # type: ignore[attr-defined]


def hidden_clusters() -> set[object]:
    return {cases.hidden_cluster(np.random.default_rng(seed)) for seed in range(200)}


def test_every_hidden_cluster_keeps_the_flat_ring_well_outside_both_bounds() -> None:
    """On the card's cluster and every hidden one: the flat ring's WAN bytes at least 2x the 5%
    tolerance over the optimum, the hierarchy's time at least 10% under the 3x bound."""
    for cluster in hidden_clusters() | {cases.CARD}:
        for n in (1 << 18, (1 << 18) + 4096):
            nbytes = 4 * n
            assert cluster.flat_ring_wan_bytes(nbytes) >= 1.10 * cluster.optimal_wan_bytes(nbytes)
            flat = collective_time(cluster.platform(), "Allreduce", cluster.p, nbytes)
            assert cluster.hierarchical_time(nbytes) <= flat / 3 / 1.10, cluster


def test_the_card_s_bill_reaches_40_percent_at_about_a_billion_parameters() -> None:
    bill = cases.CARD_BILL
    assert bill.breakeven_params(0.4) == pytest.approx(0.96e9)
    wan, compute = bill.per_step(bill.breakeven_params(0.4))
    assert wan == pytest.approx(0.4 * compute)
    assert bill.wan_bytes_per_step(1e9) == 2 * 2 * 2 * 1e9  # 2 (D-1) x 2 bytes x N
    for rng in (np.random.default_rng(s) for s in range(50)):
        for b in cases.hidden_bills(rng):
            # The common wrong answers stand far outside the cost checks' tolerance (1e-6).
            n = b.breakeven_params(0.4)
            assert abs(b.breakeven_params(0.4 / 0.6) / n - 1) > 0.5  # 40% of the whole bill
            assert abs(2**30 / 1e9 - 1) > 0.07  # GiB for GB


# -- `distlab check 09` end to end --------------------------------------------------------------


@pytest.fixture(scope="module")
def checked() -> CheckRuns:
    return CheckRuns("09", seed=SEED, timeout=170)


# fixture -> (the check that must fail, substrings its message must contain)
BUGGY: dict[str, tuple[str, list[str]]] = {
    "flat_ring.py": ("bytes across data centers", ["exactly what one ring over all 12 ranks sends",
                                                   "the allreduce did not follow the data centers"]),
    "blocks_by_rank.py": ("bytes across data centers", ["numbered round-robin across data centers only",
                                                        "not from datacenter_of"]),
    "no_allgather.py": ("the sum is right", ["the allgather inside the data center is missing"]),
    "no_across.py": ("the sum is right", ["holds the sum over its own data center only",
                                          "the step between data centers is missing"]),
    "price_per_gib.py": ("cost per step", ["a GB is 1e9 bytes here, not 2^30"]),
    "one_phase.py": ("cost per step", ["both phases cross the WAN, 2 (D-1) n, not (D-1) n"]),
    "share_of_total.py": ("the model size at which", ["40% of the whole bill (WAN + compute)"]),
}

# Each diagnosis that names a cause, and the fixture whose bug it is: silent on every other one.
NAMES_ITS_BUG = {
    "the allreduce did not follow the data centers": "flat_ring.py",
    "not from datacenter_of": "blocks_by_rank.py",
    "the allgather inside the data center is missing": "no_allgather.py",
    "the step between data centers is missing": "no_across.py",
    "a GB is 1e9 bytes here": "price_per_gib.py",
    "both phases cross the WAN": "one_phase.py",
    "40% of the whole bill": "share_of_total.py",
}


def test_the_table_has_a_diagnosis_for_every_buggy_fixture() -> None:
    assert set(BUGGY) == fixture_names("09") - {"alt_leaders.py"} == set(NAMES_ITS_BUG.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUGGY))
def test_buggy_solution_fails_with_its_symptom(name: str, checked: Callable[..., Checked]) -> None:
    failing, must = BUGGY[name]
    run = checked("--solution", str(fixture_solution("09", name)))
    assert_fails_with_symptom(run, name, failing, must, NAMES_ITS_BUG)


@pytest.mark.slow
def test_a_leader_per_data_center_passes_too_on_gloo(checked: Callable[..., Checked]) -> None:
    run = checked("--solution", str(fixture_solution("09", "alt_leaders.py")), "--backend", "gloo")
    assert not run.leftovers
    assert run.rc == 0, run.out
    assert run.results is not None and run.results["score"] == run.results["max_score"]


@pytest.mark.slow
def test_reference_passes(checked: Callable[..., Checked]) -> None:
    run = checked("--solution", "reference")
    assert not run.leftovers
    assert run.rc == 0, run.out
    r = run.results
    assert r is not None and r["passed"] and r["score"] == r["max_score"] == 12 and r["seal"] == "on"
    assert r["totals"]["launches"] == 1
    faster = run.check("at least 3x faster")["metrics"]
    card = cases.CARD.label()
    assert faster[f"flat_ring_ms {card}"] / faster[f"yours_ms {card}"] > 4.5
    # The closed form of the reference's algorithm (the margins' model above) is the replay's.
    for label, n, ms in re.findall(r"(\d data centers x \d ranks[^:]*): n = (\d+) float32: yours ([\d.]+) ms",
                                   run.flat):
        cluster = cases.CARD if label == card else next(c for c in hidden_clusters() if c.label() == label)
        assert float(ms) * 1e-3 == pytest.approx(cluster.hierarchical_time(4 * int(n)), rel=0.03)
    wan = run.check("bytes across data centers")["metrics"]
    assert wan[f"wan_mib {card}"] == pytest.approx(wan[f"flat_ring_wan_mib {card}"] / 1.375, rel=0.01)
    assert run.check("the model size")["metrics"]["card_breakeven_params"] == pytest.approx(0.96e9)


@pytest.mark.slow
def test_starter_fails_with_helpful_messages(checked: Callable[..., Checked]) -> None:
    run = checked()  # no workspace file: the starter is checked
    assert not run.leftovers
    assert run.rc == 1, run.out
    assert run.status("the sum is right") == "passed"  # a flat allreduce: right, and slow
    assert "the allreduce did not follow the data centers" in run.flat
    assert "a hierarchical allreduce pays 2 (D-1) = 4 WAN latencies (a ring over all p ranks pays 22)" in run.flat
    assert "wan_bytes for 1.25e+08 parameters is 0.0" in run.flat
    assert "Traceback" not in run.out
