"""Problem 13, sharded optimizer states (ZeRO-1/2): the checks' pure helpers, then `distlab check 13`
end to end.

The first half starts no process: the paper's closed forms and the reference's calculator, the
MLP's gradient, the hidden variants, the walk over the optimizer object, the diagnoses, and the
margins: over many hidden variants each tolerance keeps the right answer within half of it and the
common wrong answers at least twice it away (the ranks' float32 arithmetic simulated here).

The second half runs the real CLI once per solution (the reference sealed, as a learner runs it;
the starter; every fixture in tests/fixtures/13/ unsealed; the alternative on gloo) with one fixed
seed, so a failure replays with `distlab check 13 --seed 1313 --solution ...`; then the free run's
sweep (`distlab tune 13`) and its picture (`distlab report 13`).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import PROBLEMS, run_cli
from e2e import (
    Checked,
    CheckRuns,
    assert_clean,
    assert_passes,
    assert_starter_fails,
    fixture_names,
    fixture_runs,
    fixture_solution,
    leftovers,
    load_file,
    problem_modules,
)

from distlab.grading import HeldMemory

SEED = 1313
FOLDER = PROBLEMS / "13-zero-sharding"
cases, programs, judging = problem_modules(FOLDER, "cases", "programs", "judging")
MARGIN_SEEDS = range(8)  # 150 held when written (this file's margin functions); 8 in the suite

reference = load_file(FOLDER / "reference.py", "problem13_reference")


# -- the pieces --------------------------------------------------------------------------------------


def test_the_calculator_gives_the_papers_figures_and_the_closed_forms() -> None:
    assert [round(judging.zero_gb(7.5e9, 64, s), 1) for s in range(4)] == [120.0, 31.4, 16.6, 1.9]
    for q in cases.memory_cases(3):
        assert reference.memory_per_rank_gb(q.params, q.ranks, q.stage) == pytest.approx(judging.zero_gb(q.params, q.ranks, q.stage))
    assert judging.zero_gb(1e9, 1, 3) == judging.zero_gb(1e9, 1, 0) == 16.0  # one rank: nothing to shard


def test_the_gradient_is_the_mean_squared_errors() -> None:
    case = cases.trainings(4)[1]
    w, (x, y) = cases.initial_weights(case).astype(np.float64), cases.batch(case, 0, 0)
    loss, grad = cases.loss_and_gradient(case, w, x, y)
    for i in (0, case.inputs * case.hidden + 3, case.size - 2, case.size - 1):
        bumped = w.copy()
        bumped[i] += 1e-6
        assert grad[i] == pytest.approx((cases.loss_and_gradient(case, bumped, x, y)[0] - loss) / 1e-6, rel=1e-3, abs=1e-7)


def test_hidden_variants_replay_per_seed_vary_and_never_divide() -> None:
    assert cases.trainings(5) == cases.trainings(5) and cases.memory_cases(5) == cases.memory_cases(5)
    drawn = [c for seed in range(30) for c in cases.trainings(seed)]
    assert all(c.size % c.p for c in drawn) and {c.p for c in drawn} == {2, 3, 4}
    for c in drawn:  # whole moments show in the readings; a rank's sends fit its agent's copy
        assert 2 * c.size * 4 - c.shard_bytes() >= 2 * judging.HELD_SLACK
        assert 4 * c.steps * (c.size + -(-c.size // c.p)) <= 64 << 20
    assert len({(c.lr, c.beta1, c.beta2, c.eps) for c in drawn}) == len(drawn)
    sizes = [q.params for seed in range(10) for q in cases.memory_cases(seed)[4:]]
    assert min(sizes) < 1e9 and max(sizes) > 1e11


def test_the_walk_finds_every_array_the_optimizer_keeps_and_skips_the_comm() -> None:
    class Comm:
        def Get_rank(self) -> int:
            return 0

    class Opt:
        def __init__(self) -> None:
            self.comm, self.moments = Comm(), {"m": np.ones(3, np.float32), "v": [np.zeros((2, 2))]}
            self.inner, self.steps = type("Inner", (), {})(), 3
            self.inner.hidden = np.arange(5.0)

    found = programs.reachable_arrays(Opt())
    assert set(found) == {"opt.moments['m']", "opt.moments['v'][0]", "opt.inner.hidden"}
    assert found["opt.moments['v'][0]"].shape == (2, 2)


# -- the diagnoses ----------------------------------------------------------------------------------


def _small(drawn: Any) -> Any:
    """A drawn case on a small MLP (its size still not divisible by p): the arithmetic of the checks,
    without 10^6 parameters to train."""
    case = replace(drawn, inputs=24, hidden=70)
    return case if case.size % case.p else replace(case, hidden=71)


def _case() -> Any:
    return _small(cases.trainings(7)[0])


def test_the_weights_diagnoses_name_only_their_own_mistake() -> None:
    case = _case()
    right, initial = judging.plain_adam(case), cases.initial_weights(case)
    as_ranks = [right.weights.astype(np.float32)] * case.p
    assert judging.weights_problem(case, as_ranks, [None] * case.p) is None
    kept = (case.size // case.p) * case.p
    dropped = right.weights.astype(np.float32)
    dropped[kept:] = initial[kept:]
    drifted = [np.where(np.arange(case.size) // -(-case.size // case.p) == r, right.weights, initial).astype(np.float32)
               for r in range(case.p)]
    said = {"bias": judging.weights_problem(case, [judging.plain_adam(case, first_step=2).weights] * case.p, [None] * case.p),
            "drop": judging.weights_problem(case, [dropped] * case.p, [None] * case.p),
            "drift": judging.weights_problem(case, drifted, [None] * case.p),
            "initial": judging.weights_problem(case, [initial] * case.p, [None] * case.p),
            "other": judging.weights_problem(case, [right.weights + 0.01 * case.lr] * case.p, [None] * case.p)}
    names = {"bias": "counts steps from 2", "drop": "drop the remainder", "drift": "never allgathered",
             "initial": "no update was applied"}
    for key, message in said.items():
        assert message is not None
        for other, phrase in names.items():
            assert (phrase in message) == (key == other), (key, message)


def test_the_state_diagnoses() -> None:
    case = _case()
    adam = judging.plain_adam(case)
    per = -(-case.size // case.p)

    def state(r: int, m: np.ndarray, v: np.ndarray, start: int | None = None) -> dict[str, Any]:
        return {"start": r * per if start is None else start, "m": m, "v": v, "nbytes": 4 * (m.size + v.size)}

    shards = [state(r, adam.m[r * per:(r + 1) * per], adam.v[r * per:(r + 1) * per]) for r in range(case.p)]
    assert judging.coverage_problem(case, shards) is None
    assert all(judging.values_problem(case, r, s, adam) is None for r, s in enumerate(shards))
    assert all(judging.state_size_problem(case, r, s) is None for r, s in enumerate(shards))
    whole = [state(0, adam.m, adam.v, 0)] * case.p
    assert "not sharded" in judging.coverage_problem(case, whole)
    assert "1/p of plain Adam's" in judging.state_size_problem(case, 0, whole[0])
    as_float64 = dict(shards[0], nbytes=2 * shards[0]["nbytes"])
    assert "the moments are float64" in judging.state_size_problem(case, 0, as_float64)
    assert "float64" not in judging.state_size_problem(case, 0, whole[0])
    floor = [state(r, adam.m[:case.size // case.p], adam.v[:case.size // case.p], r * (case.size // case.p))
             for r in range(case.p)]
    assert "drop the remainder" in judging.coverage_problem(case, floor)
    # ceil(N / p) shards whose state() says they start at r * (N // p): not the remainder dropped
    misplaced = [state(r, adam.m[r * per:(r + 1) * per], adam.v[r * per:(r + 1) * per], r * (case.size // case.p))
                 for r in range(case.p)]
    text = judging.coverage_problem(case, misplaced)
    assert "belong to no rank's shard" in text and "drop the remainder" not in text and "ranks' shards" in text
    summed = state(1, case.p * shards[1]["m"], case.p**2 * shards[1]["v"])
    assert "summed, not averaged" in judging.values_problem(case, 1, summed, adam)
    assert "summed" not in judging.values_problem(case, 1, state(1, 2 * shards[1]["m"], shards[1]["v"]), adam)
    full = {"opt.m": np.where(np.arange(case.size) < per, adam.m, 0.0), "opt.buffer": np.ones(case.size)}
    assert "opt.m holds an array" in judging.hidden_copies(case, (0, per), full, adam)
    assert judging.hidden_copies(case, (0, per), {"opt.buffer": np.ones(case.size)}, adam) is None


def test_a_rank_is_handed_its_own_batches_and_must_be_seen_sending_its_updated_shard() -> None:
    """The view holds no seed and no other rank's batch; the travel evidence accepts the updated
    shard (or the update itself, padded or not) after every step and names a rank that never sent
    it (plain data parallel's whole-gradient allreduce), or whose log overflowed."""
    from distlab.grading import COLLECTIVE, Sent, SentLog

    case = _case()
    view = case.for_rank(1)
    assert not hasattr(view, "seed") and len(view.batches) == case.steps and view.size == case.size
    assert all(np.array_equal(x, cases.batch(case, 1, s)[0]) for s, (x, _) in enumerate(view.batches))
    assert np.array_equal(view.weights, cases.initial_weights(case))
    adam, per = judging.plain_adam(case), -(-case.size // case.p)
    lo, hi = cases.shard_of(case.size, case.p, case.p - 1)  # the last shard: padded when sent whole
    padded = [np.concatenate([w[lo:hi], np.zeros(per - (hi - lo))]).astype(np.float32) for w in adam.path]
    deltas = np.diff([cases.initial_weights(case).astype(np.float64), *adam.path], axis=0)
    grad = Sent("Reduce_scatter", COLLECTIVE, np.zeros(per * case.p, np.float32), 0)

    def log(items: list[np.ndarray]) -> SentLog:
        return SentLog([grad, *(Sent("Allgather", COLLECTIVE, data, k) for k, data in enumerate(items))])

    assert judging.unshared_update(case, 3, (lo, hi), log(padded), adam) is None
    assert judging.unshared_update(case, 3, (lo, hi), log([d[lo:hi] for d in deltas]), adam) is None
    said = judging.unshared_update(case, 3, (lo, hi), log(padded[:4]), adam)
    assert said is not None and "never sent its updated shard" in said and "after step 5" in said
    whole = SentLog([Sent("Allreduce", COLLECTIVE, np.zeros(case.size, np.float32), k) for k in range(case.steps)])
    assert "after step 1" in judging.unshared_update(case, 3, (lo, hi), whole, adam)
    assert "more than the harness keeps" in judging.unshared_update(case, 3, (lo, hi), SentLog(overflowed=True), adam)


def held(case: Any, before: int, footprint: int, kept: int, between: int | None = None) -> HeldMemory:
    """A rank's memory readings, as its agent takes them: before the solution, then at the training's
    marks, each step's pause ("rest" to "kept") holding ``kept``, or up to ``between`` while sampled."""
    step = (("rest", kept, kept), ("kept", kept, max(kept, between or 0)))
    return HeldMemory(before, (("footprint", footprint, footprint), *step * case.steps, ("done", kept, kept)))


def test_the_memory_probe_reads_the_training_and_names_whole_size_keeping() -> None:
    probe = cases.trainings(3)[0]
    shard, whole, base = probe.shard_bytes(), 2 * probe.size * 4, 25 << 20
    assert judging.train_marks(probe)[:3] == ["footprint", "rest", "kept"]
    ready = base + probe.harness_bytes()  # the view's arrays there, the optimizer not yet
    assert judging.footprint_problem(probe, 0, held(probe, base, ready, ready + shard + (700 << 10)), True) is None
    more = judging.footprint_problem(probe, 2, held(probe, base, ready, ready + 2 * shard), True)
    assert "rank 2's process holds" in more and "2.00x its shard" in more and "whole m and v" not in more
    said = judging.footprint_problem(probe, 0, held(probe, base, ready, ready + whole), True)
    assert "as much as plain Adam's whole m and v" in said
    # Kept from the import: the optimizer then grows by its shard alone, but the process held more before it.
    stash = judging.footprint_problem(probe, 1, held(probe, base, ready + whole, ready + whole + shard), True)
    assert "already held" in stash and "kept from the import of your file" in stash and "whole m and v" not in stash
    # ... read in the launch's first task only: later ones start with what the harness kept of the earlier.
    assert judging.footprint_problem(probe, 1, held(probe, base, ready + whole, ready + whole + shard), False) is None
    assert judging.footprint_problem(probe, 1, held(probe, base, ready + (1 << 20), ready + (1 << 20) + shard), True) is None
    hidden = judging.footprint_problem(probe, 1, held(probe, base, ready, ready + 1728), True)  # the moments on disk
    assert "less than its shard's moments" in hidden and "where does it keep them?" in hidden
    # Unsealed, a rank that was never read before the solution (-1) is judged on its growth alone.
    assert judging.footprint_problem(probe, 0, held(probe, -1, ready + whole, ready + whole + shard), True) is None
    # Scratch dropped for each reading at a mark and made again after: the pause's samples show it.
    dodged = judging.footprint_problem(probe, 2, held(probe, base, ready, ready + shard, between=ready + whole), True)
    assert dodged is not None and "as much as plain Adam's whole m and v" in dodged


def test_the_calculator_and_byte_diagnoses() -> None:
    questions = cases.memory_cases(2)
    right = [judging.zero_gb(q.params, q.ranks, q.stage) for q in questions]
    assert judging.calculator_problems(questions, right) == []
    stage2_whole = [judging.zero_gb(q.params, q.ranks, 1 if q.stage == 2 else q.stage) for q in questions]
    wrong = judging.calculator_problems(questions, stage2_whole)
    assert wrong and all("keeps the fp16 gradients whole" in w for w in wrong)
    gib = judging.calculator_problems(questions, [g * 1e9 / 2**30 for g in right])
    assert len(gib) == len(questions) and all("GiB" in w and "gradients whole" not in w for w in gib)
    case = _case()
    assert judging.bytes_problem(case, 0, 1000.0, 1000.0) is None
    assert "AND an allgather" in judging.bytes_problem(case, 0, 1500.0, 1000.0)
    assert "is missing" in judging.bytes_problem(case, 0, 500.0, 1000.0)


# -- the margins ------------------------------------------------------------------------------------


def _as_ranks(case: Any, first_step: int = 1, average: bool = True, drop: bool = False) -> tuple[np.ndarray, ...]:
    """The ranks' arithmetic: float32 weights, gradients and moments, a float32 sum over the ranks."""
    w = cases.initial_weights(case)
    m, v = np.zeros(case.size, np.float32), np.zeros(case.size, np.float32)
    for step in range(case.steps):
        g = np.sum([cases.local_gradient(case, w, r, step)[1] for r in range(case.p)], axis=0, dtype=np.float32)
        g = g / case.p if average else g
        m, v = case.beta1 * m + (1 - case.beta1) * g, case.beta2 * v + (1 - case.beta2) * g**2
        t = step + first_step
        update = (case.lr * (m / (1 - case.beta1**t)) / (np.sqrt(v / (1 - case.beta2**t)) + case.eps)).astype(np.float32)
        if drop:
            update[(case.size // case.p) * case.p:] = 0
        w = w - update
    return w, m, v


def test_the_weight_margin_at_full_size() -> None:
    """float32 ranks within half the weight tolerance of float64 plain Adam on the models the checks
    train (10^6 weights: the largest rounding of any of them)."""
    for case in cases.trainings(SEED):
        w = _as_ranks(case)[0]
        assert np.max(np.abs(w - judging.plain_adam(case).weights)) <= judging.WEIGHT_TOL * case.lr / 2


def test_the_weight_and_moment_margins_over_hidden_variants() -> None:
    """float32 ranks within half the tolerances of float64 plain Adam; the bias correction from t = 2
    and the dropped remainder at least twice the weight tolerance away; summed gradients' moments
    at least twice the moment tolerance away. (Summed gradients' weights are not held to a margin:
    Adam is scale-free but for eps, so they may land within the tolerance; the moments say it.)
    On small MLPs with the drawn hyperparameters (the full size: the test above)."""
    for seed in MARGIN_SEEDS:
        for case in map(_small, cases.trainings(seed)):
            right, atol = judging.plain_adam(case), judging.WEIGHT_TOL * case.lr
            w, m, v = _as_ranks(case)
            assert np.max(np.abs(w - right.weights)) <= atol / 2, seed
            assert judging.moments_close(m, right.m) and judging.moments_close(v, right.v), seed
            worst = max(np.max(np.abs(m - right.m)) / np.max(np.abs(right.m)), np.max(np.abs(v - right.v)) / np.max(right.v))
            assert worst <= judging.MOMENT_TOL / 2, seed
            bias, drop = _as_ranks(case, first_step=2)[0], _as_ranks(case, drop=True)[0]
            for wrong in (bias, drop):
                assert np.max(np.abs(wrong - right.weights)) >= 2 * atol, seed
            w_sum, m_sum, _ = _as_ranks(case, average=False)
            # the diagnoses recognise these mistakes by their own trajectories, within half the tolerance
            assert np.max(np.abs(bias - judging.plain_adam(case, first_step=2).weights)) <= atol / 2, seed
            assert np.max(np.abs(w_sum - judging.plain_adam(case, average=False).weights)) <= atol / 2, seed
            assert np.max(np.abs(m_sum - right.m)) >= 2 * judging.MOMENT_TOL * np.max(np.abs(right.m)), seed


def test_the_size_and_byte_margins_over_hidden_variants() -> None:
    """Padded shards of ceil(N / p) sit within half the state slack of 1/p, and their reduce-scatter
    plus allgather within half the byte slack of the allreduce; whole moments (p x), an allreduce
    plus an allgather (1.5x) and a missing phase (0.5x) at least twice the slack away."""
    for seed in range(200):
        for case in cases.trainings(seed):
            padded = -(-case.size // case.p) * case.p
            assert padded / case.size - 1 <= judging.STATE_SLACK / 2
            assert padded / case.size - 1 <= judging.BYTES_SLACK / 2
            assert case.p - 1 >= 2 * judging.STATE_SLACK
            for ratio in (1.5, 0.5):
                assert abs(ratio - 1) >= 2 * judging.BYTES_SLACK


def test_the_figure_draws_every_stage() -> None:
    svg = programs.figure({"params": 7.5e9, "gpus": 64, "gb_per_rank": 16.6406, "stage": 2})
    for label in ("120.0 GB", "31.4 GB", "16.6 GB", "1.9 GB", "stage 3", "your calculator, stage 2"):
        assert label in svg
    assert programs.figure({"oops": 1}) == ""


# -- end to end -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checked() -> CheckRuns:
    return CheckRuns("13", seed=SEED, timeout=120,
                     together=fixture_runs("13", sorted(BUGGY)))


WEIGHTS, STATE, BYTES, CALC = "the weights equal", "each rank holds its 1/p", "bytes per step", "the memory calculator"

# fixture -> (checks that must fail, substrings their messages hold)
BUGGY: dict[str, tuple[list[str], list[str]]] = {
    "bias_from_two.py": ([WEIGHTS], ["counts steps from 2"]),
    "sum_not_mean.py": ([WEIGHTS, STATE], ["the gradients were summed, not averaged", "SUM of the ranks' gradients"]),
    "drop_remainder.py": ([WEIGHTS, STATE], ["drop the remainder", "belong to no rank's shard"]),
    "no_allgather.py": ([WEIGHTS, BYTES], ["never allgathered", "one of the two phases"]),
    "allreduce_then_allgather.py": ([BYTES], ["AND an allgather"]),
    "whole_size_moments.py": ([STATE], ["a whole-size moment on every rank"]),
    "full_moments.py": ([STATE], ["the optimizer state is not sharded"]),
    "stage2_whole_grads.py": ([CALC], ["keeps the fp16 gradients whole"]),
    "reused_whole_buffers.py": ([STATE], ["keeps nothing whole-size between steps", "as much as plain Adam's whole m and v"]),
    "forged_quiet_probe.py": ([STATE], ["keeps nothing whole-size between steps", "as much as plain Adam's whole m and v"]),
    "stash_at_import.py": ([STATE], ["memory kept from the import of your file counts"]),
    "forged_calculator.py": ([CALC], ["raised StopIteration"]),
    "forged_unsharded_mmap.py": ([STATE], ["never sent its updated shard of the weights"]),
    "forged_solo_allgather.py": ([STATE], ["never sent its updated shard of the weights"]),
    "forged_global_whole_moments.py": ([STATE], ["keeps nothing whole-size between steps",
                                                 "as much as plain Adam's whole m and v"]),
    # An outside tester's: the program's calculator answering lists, then nothing; both crashed the check.
    "forged_calculator_lists.py": ([CALC], ["saw a list, not a number"]),
    "forged_no_answers.py": ([CALC], ["handed back 0 values for", "one value per case expected"]),
}

# Each diagnosis that names a cause, and the fixtures whose bug it is: silent on every other one.
NAMES_ITS_BUG = {
    "counts steps from 2": {"bias_from_two.py"},
    "summed, not averaged": {"sum_not_mean.py"},
    "drop the remainder": {"drop_remainder.py"},
    "never allgathered": {"no_allgather.py"},
    "AND an allgather": {"allreduce_then_allgather.py"},
    "a whole-size moment": {"whole_size_moments.py"},
    "not sharded": {"full_moments.py"},
    "fp16 gradients whole": {"stage2_whole_grads.py"},
    "keeps nothing whole-size between steps": {"reused_whole_buffers.py", "forged_quiet_probe.py",
                                               "forged_global_whole_moments.py"},
    "kept from the import of your file": {"stash_at_import.py"},
    "raised StopIteration": {"forged_calculator.py"},
    "never sent its updated shard": {"forged_unsharded_mmap.py", "forged_solo_allgather.py"},
    "not a number": {"forged_calculator_lists.py"},
    "one value per case expected": {"forged_no_answers.py"},
}


def test_every_buggy_fixture_has_a_row_and_a_diagnosis() -> None:
    assert fixture_names("13") - {"alt_array_split.py"} == set(BUGGY) == set().union(*NAMES_ITS_BUG.values())


@pytest.mark.slow
# The first of these runs every fixture's check in one launch of the CLI (CheckRuns' together):
# about 70 s alone, past the suite's 180 s per test on a loaded 2-core machine (4 workers did).
@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", sorted(BUGGY))
def test_buggy_solution_fails_with_its_symptom(name: str, checked: Callable[..., Checked]) -> None:
    failing, needles = BUGGY[name]
    run = checked("--solution", str(fixture_solution("13", name)))
    assert_clean(run)
    assert run.rc == 1, run.out
    assert sorted(run.failed()) == sorted(run.check(n)["name"] for n in failing), run.out
    for needle in needles:
        assert needle in run.messages() and needle in run.flat, (needle, run.out)
    for phrase, owners in NAMES_ITS_BUG.items():
        assert (phrase in run.messages()) == (name in owners), (phrase, run.out)
    assert f"distlab check 13 --seed {SEED}" in run.flat  # the replay hint


@pytest.mark.slow
def test_reference_passes_sealed(checked: Callable[..., Checked]) -> None:
    run = checked("--solution", "reference")
    assert_clean(run)
    assert run.rc == 0, run.out
    r = run.results
    assert r is not None and r["passed"] and r["score"] == r["max_score"] == 12 and r["seal"] == "on"
    assert r["totals"]["launches"] == 1
    metrics = {k: v for c in r["checks"] for k, v in c["metrics"].items()}
    losses = [v for k, v in metrics.items() if k.startswith("loss_p")]
    assert len(losses) == 2 and all(after < before for before, after in losses)  # real training: the loss fell
    assert all(abs(v - 1) <= 0.01 for k, v in metrics.items() if k.startswith("bytes_over_dp"))
    assert "120.0 / 31.4 / 16.6 / 1.9 GB" in run.flat


@pytest.mark.slow
def test_alternative_passes_on_gloo(checked: Callable[..., Checked]) -> None:
    # Sealed, as a learner runs it: on gloo the memory probe runs only where the learner's process holds no engine.
    run = checked("--solution", str(fixture_solution("13", "alt_array_split.py")), "--backend", "gloo", "--seal", "on")
    assert_passes(run, "gloo")
    assert "the memory probe" in run.flat


@pytest.mark.slow
def test_starter_fails_with_helpful_messages(checked: Callable[..., Checked]) -> None:
    run = checked()  # no workspace file: the starter is checked
    assert_starter_fails(run, ["still holds the initial weights: no update was applied", "belong to no rank's shard",
                               "it sent nothing", "expected 120 GB, saw 0"])
    assert run.results is not None and run.results["score"] == 0


@pytest.mark.slow
def test_tune_sweeps_the_stages_and_report_draws_them(tmp_path: Path) -> None:
    proc = run_cli("tune", "13", "--solution", "reference", "--param", "stage=0,3", "--metric", "gb_per_rank",
                   "--fixed", "steps=1", "--out", str(tmp_path / "stage"), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = list(csv.DictReader((tmp_path / "stage.csv").open()))
    assert [float(r["gb_per_rank"]) for r in rows] == pytest.approx([120.0, 1.875])
    assert [float(r["bound"]) for r in rows] == pytest.approx([120.0, 1.875]) and (tmp_path / "stage.png").exists()
    page = tmp_path / "13.html"
    proc = run_cli("report", "13", "--solution", "reference", "--out", str(page), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    html = page.read_text()
    assert '<section id="figure">' in html and "31.4 GB" in html and "optimizer states" in html
    assert not leftovers()
