"""Problem 08, find the bottleneck: the checks' pure helpers, then `distlab check 08` end to end.

The first half needs no process: the hidden variants (deterministic per seed, every category of
fault present, natural imbalance well apart from the faults), the hidden mesh platform, the truth
read from replay marks, and the reference's pure functions (pairing schedule, detectors, trace).

The second half runs the real CLI once per solution (reference, starter, each fixture in
tests/fixtures/08/) on real MPI ranks with one fixed seed, so a failure replays with
`distlab check 08 --seed 4242 --solution ...`; each run is checked for its exit code, the check
that must fail, the symptom its message must name, and for processes left behind.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from conftest import FIXTURES, PROBLEMS
from e2e import (
    Checked,
    CheckRuns,
    assert_clean,
    fixture_runs,
    fixture_solution,
    load_file,
)

from distlab.grading import Widener
from distlab.runtime.jobspec import problem_package
from distlab.runtime.trace.chrome import validate_chrome_trace

SEED = 4242
FOLDER = PROBLEMS / "08-find-the-bottleneck"
FIXTURES_08 = FIXTURES / "08"


reference = load_file(FOLDER / "reference.py", "problem08_reference")
# The problem's package, as the checker loads it: the hidden variants and mesh, the rank programs,
# the truth from the replay and the readers of the learner's answer, and the checks.
PACKAGE = problem_package(FOLDER)
cases = importlib.import_module(PACKAGE + ".cases")
programs = importlib.import_module(PACKAGE + ".programs")
judging = importlib.import_module(PACKAGE + ".judging")
check = importlib.import_module(PACKAGE + ".check")


# -- the hidden variants ----------------------------------------------------------------------------


def all_variants(seed: int) -> list[Any]:
    return list(cases.hidden(seed).variants)


def test_variants_replay_per_seed_and_cover_every_case() -> None:
    assert cases.hidden(7) == cases.hidden(7)
    assert cases.hidden(7) != cases.hidden(8)
    for seed in range(50):
        h = cases.hidden(seed)
        kinds = {(v.straggler is not None, v.slow_link is not None) for v in all_variants(seed)}
        assert kinds == {(False, False), (True, False), (False, True), (True, True)}
        assert sorted(v.p for v in all_variants(seed)) == [6, 7, 8, 8, 8]
        assert h.twin.name == "healthy" and h.twin.p == cases.WORLD and replace(h.twin, probed=True) in h.variants
        assert all(v.fault_plan(seed) is None for v in all_variants(seed) if v.name == "healthy")
        for v in all_variants(seed):
            assert 6 <= v.p <= 8 and 6 <= v.steps <= 10
            assert len(v.compute) == v.p and all(len(row) == v.steps for row in v.compute)
            if v.slow_link is not None:
                i, j = v.slow_link
                assert 0 <= i < j < v.p and 0.15 <= v.link_factor <= 0.30
            if v.straggler is not None:
                assert 0 <= v.straggler < v.p and 1.5 <= v.factor <= 3.0


# -- margins: every checked figure with a tolerance keeps its common wrong answers 2x away ----------

MARGIN_SEEDS = range(500)  # 2000 held when written; 500 in the suite


@pytest.fixture(scope="module")
def margins() -> list[dict[str, Any]]:
    """Per seed, from the pure model of the replay (cases.replayed): each look-alike's distance
    from the job's ratio on each variant with a straggler, the twin's longest step, and the
    compute over the median rank of ordinary ranks and of stragglers."""
    rows = []
    for seed in MARGIN_SEEDS:
        h = cases.hidden(seed)
        platform = cases.mesh(h.mesh_seed)
        row: dict[str, Any] = {"seed": seed, "gaps": {}, "natural": [], "stragglers": []}
        for v in h.variants:
            compute, sync = cases.replayed(v, platform)
            ratio = sync.sum() / compute.sum()
            if v.straggler is not None:
                for name, wrong in cases.look_alikes(compute, sync).items():
                    row["gaps"].setdefault(name, []).append(abs(wrong - ratio) / ratio)
            over = compute.mean(axis=1) / np.median(compute.mean(axis=1))
            row["natural"].append(max(over[r] for r in range(v.p) if r != v.straggler))
            row["stragglers"] += [over[v.straggler]] if v.straggler is not None else []
        compute, sync = cases.replayed(h.twin, platform)
        row["twin_step_s"] = float((compute + sync).sum(axis=1).max() / h.twin.steps)
        rows.append(row)
    return rows


def test_the_model_of_the_replay_is_the_exchange_on_the_mesh() -> None:
    """Two ranks, one cable each way: sync is the wait for the slower rank plus two messages."""
    v = cases.Variant("toy", 2, 2, 1024, ((1e-3, 1e-3), (2e-3, 1e-3)))
    platform = cases.mesh(1)
    route = platform.route(0, 1), platform.route(1, 0)
    compute, sync = cases.replayed(v, platform)
    assert compute.tolist() == [[1e-3, 1e-3], [2e-3, 1e-3]]
    message = max(r.alpha_s + 2048 * r.beta_s_per_byte for r in route)
    assert sync[0, 0] == pytest.approx(1e-3 + 2 * message, rel=0.05)
    assert sync[1, 0] == pytest.approx(2 * message, rel=0.05)
    slowed = cases.replayed(replace(v, straggler=1, factor=2.0), platform)[1]
    assert slowed[0, 0] == pytest.approx(3e-3 + 2 * message, rel=0.05)


def test_every_common_wrong_ratio_stands_twice_the_tolerance_away(margins: list[dict[str, Any]]) -> None:
    """Rank 0's own ratio, the mean of the per-rank ratios and sync over sync + compute, on every
    variant with a straggler of every seed: at least 2x the ratio check's tolerance away, so each
    fails the check (the draw is repeated where one would not; the model is the replay's to ~0.5%)."""
    tolerance = cases.RATIO_TOLERANCE
    assert check.RATIO_TOLERANCE == tolerance == 0.03
    names = set(margins[0]["gaps"])
    assert names == {"rank 0's own ratio", "the mean of the per-rank ratios",
                     "sync over sync + compute (a fraction of the time, not a ratio)"}
    for name in names:
        nearest = min(min(row["gaps"][name]) for row in margins)
        assert nearest >= 2 * tolerance, (name, nearest)
    # The draw is not bent out of shape: the mean of ratios alone would sit within 2x on ~1 in 20.
    close = sum(min(row["gaps"]["the mean of the per-rank ratios"]) < 2.5 * tolerance for row in margins)
    assert 0 < close < len(margins) // 5


def test_the_draw_is_redone_only_where_a_look_alike_stands_near() -> None:
    redrawn = [s for s in range(200) if cases.hidden(s) != first_draw(s)]
    assert 5 <= len(redrawn) <= 50  # about 1 in 8
    for seed in redrawn:
        assert cases.separation(first_draw(seed)) < 2 * cases.RATIO_TOLERANCE
    assert cases.hidden(7) == first_draw(7)  # the replay hints of the tests stay put


def first_draw(seed: int) -> Any:
    """What hidden(seed) draws first, before any redraw."""
    rng = np.random.default_rng([seed, 8])
    small = [int(p) for p in rng.permutation([6, 7])]
    variants = (cases.make_variant("healthy", cases.WORLD, rng),
                cases.make_variant("straggler", cases.WORLD, rng, straggler=True),
                cases.make_variant("slow link", cases.WORLD, rng, slow_link=True),
                cases.make_variant("both", small[0], rng, straggler=True, slow_link=True),
                cases.make_variant("healthy", small[1], rng))
    seed_of_data = Widener(seed, 8)(int(rng.integers(1 << 31)))
    return cases.shuffled(cases.Hidden(seed_of_data, variants, replace(variants[0], probed=False)), seed)


def test_the_variants_run_in_an_order_of_the_seed_s_own() -> None:
    # One learner process runs every variant: in a fixed order, diagnose() could count its calls.
    orders = {tuple(v.name for v in cases.hidden(seed).variants) for seed in range(40)}
    assert len(orders) >= 10
    assert all(sorted(order) == ["both", "healthy", "healthy", "slow link", "straggler"] for order in orders)


def test_stragglers_and_natural_imbalance_keep_their_margins(margins: list[dict[str, Any]]) -> None:
    """The straggler band the card promises (natural up to ~1.2x, stragglers from 1.5x) holds on
    every seed: a threshold of 1.3 is exact, and one of 1.05 always misfires (noise_threshold)."""
    natural = [x for row in margins for x in row["natural"]]
    stragglers = [x for row in margins for x in row["stragglers"]]
    assert 1.05 < min(natural) and max(natural) < 1.25 and min(stragglers) > 1.4


def test_chatty_probes_cost_twice_the_overhead_allowed(margins: list[dict[str, Any]]) -> None:
    """An Allgather and a Barrier per step (chatty_probes) cost at least log2(8) = 3 message
    latencies each (>= 22.5 us): over the twin's longest step of any seed, more than 2 x 3%."""
    per_step = 2 * 3 * 0.9 * cases.LINK_LATENCY_US * 1e-6
    longest = max(row["twin_step_s"] for row in margins)
    assert per_step / longest >= 2 * check.MAX_OVERHEAD, longest


def round_trips(platform: Any, p: int, nbytes: int, slow: tuple[int, int] | None,
                factor: float) -> dict[tuple[int, int], float]:
    out = {}
    for i in range(p):
        for j in range(i + 1, p):
            there, back = platform.route(i, j), platform.route(j, i)
            beta = there.beta_s_per_byte + back.beta_s_per_byte
            if (i, j) == slow:
                beta /= factor
            out[(i, j)] = there.alpha_s + back.alpha_s + nbytes * beta
    return out


def test_mesh_has_its_own_cable_per_pair_with_spread_speeds() -> None:
    mesh = cases.mesh(123)
    assert mesh.route(2, 5).links == ("acc2>acc5",)  # direct: no two pairs share a cable
    pairs = [(i, j) for i in range(8) for j in range(8) if i != j]
    gbps = [8 / mesh.route(i, j).beta_s_per_byte / 1e9 for i, j in pairs]
    assert 0.85 * cases.LINK_GBPS <= min(gbps) and max(gbps) <= 1.15 * cases.LINK_GBPS
    assert max(gbps) / min(gbps) > 1.15  # the spread is real: healthy cables differ
    latency_us = [mesh.route(i, j).alpha_s * 1e6 for i, j in pairs]
    assert 0.9 * cases.LINK_LATENCY_US <= min(latency_us)
    assert max(latency_us) <= 1.1 * cases.LINK_LATENCY_US
    assert cases.mesh_toml(5) == cases.mesh_toml(5) != cases.mesh_toml(6)


def test_a_big_ping_shows_the_slow_link_and_a_tiny_one_does_not() -> None:
    for seed in range(30):
        h = cases.hidden(seed)
        platform = cases.mesh(h.mesh_seed)
        for v in [v for v in all_variants(seed) if v.slow_link]:
            for nbytes in (reference.PING_BYTES, 8):
                rtt = round_trips(platform, v.p, nbytes, v.slow_link, v.link_factor)
                typical = float(np.median(list(rtt.values())))
                slow = rtt[v.slow_link] / typical
                healthy = max(t for pair, t in rtt.items() if pair != v.slow_link) / typical
                if nbytes > 8:
                    assert slow > 2.5 and healthy < 1.35  # a threshold of 2x the median is exact
                else:
                    assert slow < 1.3  # latency alone: the slow link hides among the others


def test_a_rank_is_handed_only_its_own_part_of_the_variant() -> None:
    """The straggler and the slow link are the answer: they stay with the checker (the agents apply
    them as faults); a rank's process gets its own compute row and the job's shape, nothing more."""
    for seed in range(5):
        for v in all_variants(seed):
            for rank in range(v.p):
                part = v.for_rank(rank)
                assert type(part) is cases.Part and (part.rank, part.compute) == (rank, v.compute[rank])
                assert (part.p, part.steps, part.grad_elems, part.probed) == (v.p, v.steps, v.grad_elems, v.probed)
                text = repr(part)
                assert "straggler" not in text and "slow" not in text and v.name not in text
                factor = v.factor if rank == v.straggler else 1.0
                assert v.declared(rank) == tuple(x * factor for x in v.compute[rank])


def test_the_twins_call_list_is_the_harness_exchange() -> None:
    """harness_training, which the twin's record must equal, sends each peer exactly what
    harness_message asks of every run, in 2 (p - 1) Isends and as many Irecvs a step."""
    for seed in range(5):
        v = cases.hidden(seed).twin
        for rank in range(v.p):
            calls = cases.harness_training(v, rank)
            for peer in range(v.p):
                sent = sum(c[3] for c in calls if c[0] == "send" and c[1] == peer)
                assert sent == (judging.exchange_bytes(v, rank, peer) if peer != rank else 0)
                got = sum(c[3] for c in calls if c[0] == "recv" and c[1] == peer)
                assert got == (judging.exchange_bytes(v, peer, rank) if peer != rank else 0)
            kinds = [c[0] for c in calls]
            assert kinds.count("send") == kinds.count("recv") == 2 * (v.p - 1) * v.steps
            assert kinds.count("wait") == 2 * v.steps and kinds.count("compute") == v.steps


def test_readers_of_the_answer_never_raise_on_what_the_learner_returns() -> None:
    assert judging.finite(0.5) == 0.5 and judging.finite(10**400) is None
    assert judging.finite(float("nan")) is None and judging.finite("x") is None
    assert judging.shown("a" * 500).endswith("...") and len(judging.shown("a" * 500)) == 120
    assert judging.pings_of({"pings": "junk"}).shape == (0,)
    assert judging.pings_of({"pings": [[10**400]]}).shape == (0,)


def test_phase_times_read_the_marks() -> None:
    marks = [("step", 0.0), ("sync", 1.0), ("step", 1.5), ("sync", 2.0), ("trained", 4.0)]
    assert judging.phase_times(marks, 2) == ([1.0, 0.5], [0.5, 2.0], 4.0)


def test_plain_keeps_data_and_drops_the_learners_classes() -> None:
    class Mine:
        def __repr__(self) -> str:
            return "<Mine>"

    got = programs.plain({"a": np.int64(3), "b": (np.float32(0.5), [Mine()]), "c": np.arange(3)})
    assert got["a"] == 3 and type(got["a"]) is int
    assert got["b"] == (0.5, ["<Mine>"])
    assert np.array_equal(got["c"], np.arange(3))


def test_trace_tracks_group_complete_events_by_pid_and_tid() -> None:
    events = [{"ph": "M", "pid": 0, "tid": 0}, {"ph": "X", "pid": 0, "tid": 0},
              {"ph": "X", "pid": 0, "tid": 1}, {"ph": "X", "pid": 1, "tid": 0}, "junk"]
    assert sorted(judging.trace_tracks(events)) == [(0, 0), (0, 1), (1, 0)]


# -- the reference's pure functions -------------------------------------------------------------


@pytest.mark.parametrize("p", range(1, 10))
def test_pairings_meet_every_pair_once_in_disjoint_rounds(p: int) -> None:
    rounds = reference.pairings(p)
    seen = [pair for pairs in rounds for pair in pairs]
    assert sorted(seen) == [(i, j) for i in range(p) for j in range(i + 1, p)]
    for pairs in rounds:
        ranks = [r for pair in pairs for r in pair]
        assert len(ranks) == len(set(ranks))


def spans_for(compute: np.ndarray, sync: np.ndarray) -> np.ndarray:
    """(p, steps, 4) spans with steps laid end to end."""
    p, steps = compute.shape
    spans = np.zeros((p, steps, 4))
    for r in range(p):
        t = 0.0
        for k in range(steps):
            spans[r, k] = [t, t + compute[r, k], t + compute[r, k], t + compute[r, k] + sync[r, k]]
            t = spans[r, k, 3]
    return spans


def test_reference_detectors_and_ratio() -> None:
    compute = np.ones((8, 5)) * 1e-3
    compute[3] *= 1.18  # natural imbalance: not a straggler
    compute[6] *= 1.6  # a straggler
    sync = np.full((8, 5), 0.5e-3)
    spans = spans_for(compute, sync)
    assert reference.find_stragglers(spans) == [6]
    assert reference.sync_compute_ratio(spans) == pytest.approx(sync.sum() / compute.sum())
    rtt = np.full((6, 6), 2e-3) * np.random.default_rng(1).uniform(0.9, 1.1, size=(6, 6))
    rtt = (rtt + rtt.T) / 2
    rtt[1, 4] = rtt[4, 1] = 7e-3
    assert reference.find_slow_links(rtt) == [(1, 4)]
    assert reference.find_slow_links(np.zeros((1, 1))) == []


def test_reference_trace_is_valid_with_one_track_per_rank() -> None:
    spans = spans_for(np.full((4, 3), 1e-3), np.full((4, 3), 2e-4))
    trace = json.loads(json.dumps(reference.chrome_trace(spans)))
    assert validate_chrome_trace(trace) == []
    tracks = judging.trace_tracks(trace["traceEvents"])
    assert len(tracks) == 4 and all(len(events) == 6 for events in tracks.values())


# -- end to end ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checked() -> CheckRuns:
    return CheckRuns("08", seed=SEED, timeout=170,
                     together=fixture_runs("08", [*sorted(BUGGY), "alt_send_recv.py"]))


# fixture -> (the check that must fail, substrings its message must contain)
BUGGY: dict[str, tuple[str, list[str]]] = {
    "link_ends_as_stragglers.py": ("diagnose() names exactly the stragglers",
                                   ["are the ends of the slow link", "does not make them compute slower"]),
    "noise_threshold.py": ("diagnose() names exactly the stragglers",
                           ["variant 'healthy'", "a false positive", "natural imbalance"]),
    "rank0_ratio.py": ("sync/compute ratio", ["that is rank 0's own ratio", "sums sync and compute over every rank"]),
    "mean_of_ratios.py": ("sync/compute ratio", ["that is the mean of the per-rank ratios",
                                                 "sums sync and compute over every rank and step"]),
    "one_track.py": ("the Chrome trace", ["spans on one track", "give each rank its own pid"]),
    "tiny_pings.py": ("diagnose() names exactly the slow links",
                      ["was not named", "only pings of many bytes see it"]),
    "unsynced_pings.py": ("diagnose() names exactly the slow links",
                          ["a false positive", "were both ends of each ping ready"]),
    "chatty_probes.py": ("probes add at most 3%", ["3% over the", "extra communication calls during training"]),
    # Per-step Allgathers, and a patched exchange that makes the unprobed twin pay them too.
    "forged_twin_pays.py": ("probes add at most 3%", ["without probes: the unprobed run was not the harness's",
                                                      "call for call and byte for byte"]),
    # Read the fault plan off run_variant's frame: a rank holds only its Part, so it names nothing.
    "forged_fault_plan.py": ("diagnose() names exactly the stragglers", ["expected stragglers", "was not named"]),
    # An outside tester's: a trace nested 100,000 deep, which crashed the check (RecursionError).
    "forged_deep_trace.py": ("the Chrome trace", ["not JSON a viewer loads", "nested deeper than a parser goes"]),
}


# Each diagnosis that names a cause, and the fixture whose bug it is: silent on every other one.
NAMES_ITS_BUG = {
    "are the ends of the slow link": "link_ends_as_stragglers.py",
    "natural imbalance (uneven shards": "noise_threshold.py",
    "that is rank 0's own ratio": "rank0_ratio.py",
    "that is the mean of the per-rank ratios": "mean_of_ratios.py",
    "spans on one track": "one_track.py",
    "only pings of many bytes see it": "tiny_pings.py",
    "were both ends of each ping ready": "unsynced_pings.py",
    "extra communication calls during training: keep the numbers": "chatty_probes.py",
    "your pings are all zero": "forged_fault_plan.py",
    "the unprobed run was not the harness's": "forged_twin_pays.py",
    "nested deeper than a parser goes": "forged_deep_trace.py",
}


def test_the_table_has_a_diagnosis_for_every_buggy_fixture() -> None:
    fixtures = {path.with_suffix(".py").name for path in (FIXTURES_08).iterdir()
                if path.suffix in (".py", ".diff")}
    assert set(BUGGY) == fixtures - {"alt_send_recv.py"} == set(NAMES_ITS_BUG.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUGGY))
def test_buggy_solution_fails_with_its_symptom(name: str, checked: Callable[..., Checked]) -> None:
    failing, must = BUGGY[name]
    run = checked("--solution", str(fixture_solution("08", name)))
    assert_clean(run)
    assert run.rc == 1, run.out
    result = run.check(failing)
    assert result["status"] == "failed", run.out
    message = " ".join(result["message"].split())
    for text in must:
        assert text in message, f"{text!r} missing from: {message}"
    for phrase, owner in NAMES_ITS_BUG.items():
        assert (phrase in run.messages()) == (owner == name), (phrase, run.messages())
    assert f"distlab check 08 --seed {SEED}" in run.flat  # the replay hint


@pytest.mark.slow
def test_alternative_solution_passes(checked: Callable[..., Checked]) -> None:
    run = checked("--solution", str(fixture_solution("08", "alt_send_recv.py")))
    assert not run.leftovers
    assert run.rc == 0, run.out
    assert run.results is not None and run.results["score"] == run.results["max_score"]


@pytest.mark.slow
def test_reference_passes(checked: Callable[..., Checked]) -> None:
    run = checked("--solution", "reference")
    assert not run.leftovers
    assert run.rc == 0, run.out
    r = run.results
    assert r is not None and r["passed"] and r["score"] == r["max_score"] == 14
    assert "passed 08" in run.flat
    assert all(c["status"] == "passed" for c in r["checks"])
    overhead = run.check("probes add at most 3%")["metrics"]
    assert overhead["overhead"] == 0 and overhead["extra_calls"] == 0
    assert run.check("probes time compute")["metrics"]["worst_relative_error"] < 1e-6
    assert r["totals"]["launches"] == 1
    # The pure model the draw is judged with (cases.replayed) is the replay's ratio to 1%.
    h = cases.hidden(SEED)
    replay = [float(x) for x in re.findall(r": [0-9.]+ \(replay ([0-9.]+)\)", run.flat)]
    model = [sync.sum() / compute.sum() for compute, sync in
             (cases.replayed(v, cases.mesh(h.mesh_seed)) for v in h.variants)]
    assert len(replay) == len(model) and all(abs(m - t) <= 0.01 * t for m, t in zip(model, replay)), (model, replay)


@pytest.mark.slow
def test_starter_fails_with_helpful_messages(checked: Callable[..., Checked]) -> None:
    run = checked()  # no workspace file: the starter is checked
    assert not run.leftovers
    assert run.rc == 1, run.out
    assert run.results is not None and run.results["score"] == 0
    assert "the probes recorded no step" in run.flat
    assert "only rank 0's own spans reached rank 0" in run.flat
    assert "saw 0.000: nothing measured" in run.flat
    assert "saw 0 track(s)" in run.flat
    # No crash: every check ran and failed on what it judged.
    assert all(c["status"] == "failed" for c in run.results["checks"])
    assert "Traceback" not in run.out
