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

import dataclasses
import pickle
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
    fixture_runs,
    fixture_solution,
    problem_modules,
)

from distlab.grading import Widener, collective_time
from distlab.platforms import load_shipped
from distlab.runtime.clock.replay import replay
from distlab.runtime.trace.events import COLL

SEED = 4309
FOLDER = PROBLEMS / "09-three-datacenters"
cases, check, judging = problem_modules(FOLDER, "cases", "check", "judging")


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
    assert judging.breakeven_params(bill, 0.4) == pytest.approx(0.96e9)
    wan, compute = judging.per_step(bill, judging.breakeven_params(bill, 0.4))
    assert wan == pytest.approx(0.4 * compute)
    assert judging.wan_bytes_per_step(bill, 1e9) == 2 * 2 * 2 * 1e9  # 2 (D-1) x 2 bytes x N
    for rng in (np.random.default_rng(s) for s in range(50)):
        for b in cases.hidden_bills(rng):
            # The common wrong answers stand far outside the cost checks' tolerance (1e-6).
            n = judging.breakeven_params(b, 0.4)
            assert abs(judging.breakeven_params(b, 0.4 / 0.6) / n - 1) > 0.5  # 40% of the whole bill
            assert abs(2**30 / 1e9 - 1) > 0.07  # GiB for GB


def test_a_rank_s_view_holds_its_own_data_and_no_answer() -> None:
    """What the ranks are handed (for_rank): their own input's key, never the seed, nothing of
    another rank's data; the sums, the training and the bills' closed forms are judging.py's."""
    rng = np.random.default_rng(9)
    cluster = cases.hidden_cluster(rng)
    whole = cases.buffers(cluster, rng, Widener(9, 9))[-1]
    views = [whole.for_rank(r) for r in range(cluster.p)]
    assert all(v.seed == -1 and whole.seed not in (v.own or ()) for v in views)
    assert all(np.array_equal(v.input(r), whole.input(r)) for r, v in enumerate(views))
    with pytest.raises(ValueError, match="holds no data of rank 1"):
        views[0].input(1)
    assert np.array_equal(judging.expected_sum(whole), np.sum([v.input(r) for r, v in enumerate(views)], axis=0,
                                                              dtype=np.float64))
    training = cases.Training(cases.CARD, 6, 32, 8, 0.05, 1234)
    mine = training.for_rank(3)
    assert mine.seed == -1 and mine.for_rank(3) == mine
    assert np.array_equal(mine.gradient(np.ones(6), 3), training.gradient(np.ones(6), 3))
    with pytest.raises(ValueError, match="holds no data of rank 4"):
        mine.shard(4)
    for cls, answer in ((cases.Buffer, "expected"), (cases.Training, "expected"), (cases.Bill, "per_step"),
                        (cases.Bill, "breakeven_params"), (cases.Bill, "wan_bytes_per_step")):
        assert not hasattr(cls, answer), f"{cls.__name__}.{answer}: an answer within the ranks' reach"


def _leaves(value: object) -> list[object]:
    """Every leaf of a view: its dataclasses' fields and its tuples and lists walked."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [leaf for f in dataclasses.fields(value) for leaf in _leaves(getattr(value, f.name))]
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def test_a_rank_s_view_holds_its_data_itself_and_no_key_of_it() -> None:
    """A view holds the rank's data, made by its agent, never a key of it: a key is a few bytes a
    rank could smuggle to the others in a message, from which they would rebuild its data."""
    rng = np.random.default_rng(9)
    cluster = cases.hidden_cluster(rng)
    wholes = [*cases.buffers(cluster, rng, Widener(9, 9)), cases.timed_buffer(cluster, rng, Widener(9, 9)),
              cases.Training(cases.CARD, 6, 32, 8, 0.05, 1234)]
    for whole in wholes:
        p = whole.cluster.p
        keys = {whole.seed} | {cases.data_key(whole.seed, r, kind) for r in range(p) for kind in (0, 1, 2)}
        for rank in range(p):
            view = pickle.loads(pickle.dumps(whole.for_rank(rank)))  # as it travels to the learner
            leaves = _leaves(view)
            ints = {int(v) for v in leaves if isinstance(v, (int, np.integer)) and not isinstance(v, bool)}
            assert not ints & keys and max(ints) < 2**31, (whole.label(), rank, ints)
            mine = (whole.input(rank),) if isinstance(whole, cases.Buffer) else whole.shard(rank)
            arrays = [v for v in leaves if isinstance(v, np.ndarray)]
            assert len(arrays) == len(mine), (whole.label(), rank)
            for got, want in zip(arrays, mine):
                assert got.dtype == want.dtype and np.array_equal(got, want), (whole.label(), rank)
            if isinstance(whole, cases.Buffer):
                got = view.input(rank)
                assert got.dtype == mine[0].dtype and np.array_equal(got, mine[0])
            else:
                assert all(np.array_equal(a, b) for a, b in zip(view.shard(rank), mine))
                w = np.linspace(-1, 1, whole.features)
                assert np.array_equal(view.gradient(w, rank), whole.gradient(w, rank))


class _Replayed:
    """A task's replay as wan_bytes_into reads it: the bytes between each pair of ranks."""

    def __init__(self, pair_bytes: dict[tuple[int, int], int]) -> None:
        self.pair_bytes = pair_bytes

    def timeline(self) -> _Replayed:
        return self


def test_sums_need_the_other_data_centers_bytes() -> None:
    cluster = cases.Cluster(2, 2, 0.05, round_robin=True)  # ranks 0, 2 in data center 0; 1, 3 in 1
    inside_only = _Replayed({(0, 2): 800, (2, 0): 800, (1, 3): 800, (3, 1): 800})
    assert judging.wan_bytes_into(inside_only, cluster) == [0, 0]
    wrong = judging.too_few_wan_bytes("x", cluster, judging.wan_bytes_into(inside_only, cluster), 400)
    assert wrong is not None and "data center 0 received 0 bytes" in wrong and "never crossed the WAN" in wrong
    across = _Replayed({(0, 1): 200, (2, 3): 200, (1, 0): 200, (3, 2): 200, (0, 9): 10**6})
    assert judging.wan_bytes_into(across, cluster) == [400, 400]
    assert judging.too_few_wan_bytes("x", cluster, [400, 400], 400) is None


def test_every_element_of_a_long_buffer_is_checked_and_a_sampled_sum_is_named() -> None:
    buffer = cases.Buffer(cases.CARD, 9001, "float64", 11)
    want = judging.expected_sum(buffer)
    sampled = [buffer.input(rank).astype(np.float64) for rank in range(cases.CARD.p)]
    for got in sampled:
        got[::97] = want[::97]  # summed where a sample of every 97th element looks, its input elsewhere
    wrong = judging.wrong_sums(buffer, sampled)
    assert wrong is not None and "holds the sum at every 97th element only" in wrong
    one_off = want.copy()
    one_off[4321] += 1.0  # one element of 9001, where no sample of every 97th looks
    wrong = judging.wrong_sums(buffer, [one_off] + [want] * (cases.CARD.p - 1))
    assert wrong is not None and "element 4321" in wrong and "every 97th" not in wrong


def test_whatever_a_rank_returns_gives_a_named_failure_not_a_crash() -> None:
    buffer = cases.Buffer(cases.CARD, 5, "float32", 7)
    good = [judging.expected_sum(buffer).astype(np.float32)] * cases.CARD.p
    assert judging.wrong_sums(buffer, good) is None
    for junk in ("abc", None, np.zeros(4), np.zeros((5, 1)), [1, 2, "x", 4, 5], {"a": 1}):
        wrong = judging.wrong_sums(buffer, [junk] + good[1:])
        assert wrong is not None and "rank 0's buffer came back as" in wrong, junk
    training = cases.Training(cases.CARD, 6, 32, 8, 0.05, 1234)
    assert judging.bad_training(training, 0, (np.zeros(6), [0.0] * 8)) is None
    for junk in (None, (np.zeros(5), [0.0] * 8), (np.zeros(6),), "ab", (np.zeros(6), ["x"] * 8)):
        assert "not its weights" in (judging.bad_training(training, 0, junk) or ""), junk
    bill = cases.CARD_BILL
    for junk in (None, [], {}, {"breakeven": "x"}, {"breakeven": [1.0, 2.0]}, {"breakeven": object()}):
        assert str(bill.label()) in (judging.wrong_breakeven(bill, junk) or ""), junk
        assert str(bill.label()) in (judging.wrong_costs(bill, junk) or ""), junk
    wan_step, compute = judging.per_step(bill, 125e6)
    partial = {"wan_bytes 1.25e+08": judging.wan_bytes_per_step(bill, 125e6), "step 1.25e+08": (wan_step,)}
    assert "not 2 numbers" in (judging.wrong_costs(bill, partial) or "")
    assert "is 0.0, expected" in (judging.wrong_costs(bill, {**partial, "wan_bytes 1.25e+08": 0.0}) or "")
    assert "expected" in (judging.wrong_breakeven(bill, {"breakeven": float("nan")}) or "")


# -- `distlab check 09` end to end --------------------------------------------------------------


@pytest.fixture(scope="module")
def checked() -> CheckRuns:
    return CheckRuns("09", seed=SEED, timeout=170,
                     together=fixture_runs("09", sorted(BUGGY)))


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
    # An outside tester's forgery: a rank's view of its case holds neither the sum nor the others' data.
    "forged_frames.py": ("the sum is right", ["AttributeError: 'Buffer' object has no attribute 'expected'"]),
    # Another: summed only where the ranks' returned sample looked (every 97th element), WAN bytes padded.
    "forged_sampled_sum.py": ("the sum is right", ["holds the sum at every 97th element only",
                                                   "every element of buf is summed, not a sample of them"]),
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
    "object has no attribute 'expected'": "forged_frames.py",
    "not a sample of them": "forged_sampled_sum.py",
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
