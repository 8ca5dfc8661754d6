"""Problem 16, loss scaling across ranks: the checker's replay and diagnoses, then `distlab check 16`.

The first half starts no process: the policy and its known misreadings, the hidden variants
(replayable, a nan after an inf, the policy drawn per case), the margins over many seeds (no
overflow decision depends on the order an engine adds float16 values in; the reference's weights
stay far inside the tolerance whatever the order, and casting before scaling lands far outside),
each diagnosis on evidence made from the replay, and the report's picture. The second half runs the
real CLI once per solution, all with seed 1616 (replay with `distlab check 16 --seed 1616
--solution ...`): the reference and the starter sealed, as a learner runs them; the fixtures
unsealed, each failing with its own symptom named and no other fixture's; the alternative on gloo;
and one sweep of `distlab tune 16` with `distlab report 16` drawing it. No run may leave a process
behind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from types import SimpleNamespace

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
    problem_modules,
)

SEED = 1616
FOLDER = PROBLEMS / "16-loss-scaling"
cases, judging, programs, check = problem_modules(FOLDER, "cases", "judging", "programs", "check")

SKIP, SCALE, WEIGHTS, WIRE = "every rank skips", "the scale follows", "the weights", "gradients travel"
ALL = (SKIP, SCALE, WEIGHTS, WIRE)
MARGIN_SEEDS = range(12)


def evidence(case, trace, skipped=None, scales=None):  # type: ignore[no-untyped-def]
    """What every rank of a correct run returns (the replay's own numbers), with one rank's skips
    or every rank's scales replaced where a test says so."""
    steps = []
    for rank in range(case.p):
        mine = trace.overflow if skipped is None or rank else skipped
        steps.append(programs.Steps([not s for s in mine], list(scales or trace.scale_after), list(trace.weights),
                                    [row[rank] for row in trace.losses], [True] * case.steps))
    return steps


# == the policy, the variants, the margins ===========================================================


def test_the_policy_and_its_misreadings() -> None:
    policy = cases.Policy(1024.0, 2.0, 0.5, 3)
    overflows = [False, False, True, False, False, False, False, True, False]
    assert cases.policy_scales(policy, overflows) == [1024, 1024, 512, 512, 512, 1024, 1024, 512, 512]
    # not reset on the overflow at step 2: the two clean steps before it count, so it grows at step 3
    assert cases.policy_scales(policy, overflows, reset=False)[:4] == [1024, 1024, 512, 1024]


def test_hidden_variants_replay_and_vary() -> None:
    first, again = cases.hidden_cases(SEED), cases.hidden_cases(SEED)
    assert first == again and first[0].p == 4 and first[1].p in (2, 3)
    drawn = [case for seed in range(5) for case in cases.hidden_cases(seed)]
    assert len({case.policy for case in drawn}) >= 6
    for case in drawn:
        kinds = [i.kind for i in case.injections]
        assert kinds[0] in ("inf", "-inf") and "nan" in kinds[1:]
        assert len({i.step for i in case.injections}) == 3
        assert all(0 <= i.rank < case.p and 0 <= i.index < cases.PARAMS for i in case.injections)


def distance(trace, exact) -> float:  # type: ignore[no-untyped-def]
    """The largest weight error of a trace against the exact one, over every step."""
    return max(judging.weight_error(w, e, exact.path) for w, e in zip(trace.weights, exact.weights))


def test_margins_over_many_seeds() -> None:
    """Whatever order the engine adds in, the decisions and scales are the replay's and the weights
    within a tenth of the tolerance; casting before scaling lands at least twice the tolerance away;
    every variant trains through its faults (the loss of the last 6 steps below the first 6's)."""
    worst_right, best_wrong = 0.0, np.inf
    for seed in MARGIN_SEEDS:
        for case in cases.hidden_cases(seed):
            exact = cases.trace(case)
            shuffled = cases.trace(case, order=np.random.default_rng([seed, case.p]))
            cast_first = cases.trace(case, cast_first=True)
            assert shuffled.overflow == exact.overflow and shuffled.scale_after == exact.scale_after, case.label()
            worst_right = max(worst_right, distance(shuffled, exact))
            best_wrong = min(best_wrong, distance(cast_first, exact))
            assert np.mean(exact.losses[-6:]) < np.mean(exact.losses[:6]), case.label()  # batches are noisy
    assert worst_right < judging.WEIGHT_TOLERANCE / 10 and best_wrong > 2 * judging.WEIGHT_TOLERANCE, (
        worst_right, best_wrong)


def test_a_sum_near_float16s_limit_is_ambiguous() -> None:
    near = np.array([[40000.0, 1.0], [25000.0, -1.0]])  # 65000: some orders round it to 65504, none to inf
    assert cases.partial_sum_peak(near) == 65000.0
    mixed = np.array([[40000.0], [40000.0], [-30000.0]])  # left to right overflows; -30000 first does not
    assert cases.partial_sum_peak(mixed) == 80000.0


def test_a_ranks_view_holds_its_own_data_and_no_key_of_it() -> None:
    """A rank's view (Case.for_rank) holds its batches themselves, the whole case's values, and no
    int that could be a key: a key would let a rank pass its data to the others in a few bytes."""

    def ints(value):  # type: ignore[no-untyped-def]
        if isinstance(value, (bool, np.bool_, float, str, np.ndarray)) or value is None:
            return []
        if isinstance(value, (int, np.integer)):
            return [int(value)]
        if isinstance(value, (tuple, list)):
            return [i for item in value for i in ints(item)]
        return [i for f in fields(value) for i in ints(getattr(value, f.name))]

    for case in cases.hidden_cases(SEED):
        keys = {k for rank in range(case.p) for k in cases.data_keys(case.seed, rank)}
        for rank in range(case.p):
            view = case.for_rank(rank)
            found = ints(view)
            assert view.seed == -1 and not keys & set(found) and all(abs(i) < 2**16 for i in found), found
            assert view.own is not None and view.own.x.shape == (case.steps, cases.BATCH, cases.PARAMS)
            for step in range(case.steps):
                for mine, whole in zip(view.batch(rank, step), case.batch(rank, step)):
                    assert mine.dtype == whole.dtype and np.array_equal(mine, whole)
            with pytest.raises(ValueError, match="view of the case holds no data of rank"):
                view.batch((rank + 1) % case.p, 0)
            hash(view)  # a view stays usable as a key, as the whole case is


# == the diagnoses, on evidence made from the replay =================================================


def test_each_diagnosis_on_made_up_evidence() -> None:
    case = cases.hidden_cases(SEED)[0]
    trace = cases.trace(case)
    assert judging.skip_problem(case, trace, evidence(case, trace)) is None
    assert judging.scale_problem(case, trace, evidence(case, trace)) is None
    assert judging.weight_problem(case, trace, evidence(case, trace))[0] is None

    first = trace.overflow.index(True)
    alone = list(trace.overflow)
    alone[first] = False  # rank 0 applies the step the others skip
    text = judging.skip_problem(case, trace, evidence(case, trace, skipped=alone))
    assert f"at step {first} rank 1 skipped, rank 0 did not" in text and "the overflow decision is local" in text

    no_reset = cases.policy_scales(case.policy, trace.overflow, reset=False)
    text = judging.scale_problem(case, trace, evidence(case, trace, scales=no_reset))
    assert "restart at 0 when a step overflows" in text and "local" not in text

    never = [False] * case.steps
    text = judging.skip_problem(case, trace, [replace(s, applied=[True] * case.steps) for s in
                                              evidence(case, trace, skipped=never)])
    assert "every rank applied the step" in text and "local" not in text and "nan got through" not in text
    assert "own buffer" not in text  # applying every step is not the skips of a flag on one's own buffer

    own = cases.trace(case, flag_own=True)  # every variant has a step whose sum alone overflows
    assert any(trace.sum_only) and own.overflow != trace.overflow
    text = judging.skip_problem(case, trace, [replace(s, applied=[not o for o in own.overflow]) for s in
                                              evidence(case, trace, skipped=own.overflow, scales=own.scale_after)])
    assert "a flag taken on each rank's own buffer before the reduce-scatter" in text and "local" not in text


def test_the_wire_check_names_a_whole_allreduce_and_a_wide_allgather() -> None:
    case = cases.hidden_cases(SEED)[0]
    step = SimpleNamespace(op_bytes={"Reduce_scatter": 96, "Allreduce": 4, "Allgather": 4 * 48 // case.p})
    assert judging.wire_problem(case, 0, [step, step]) is None
    whole = SimpleNamespace(op_bytes={"Allreduce": 100, "Allgather": 4 * 48 // case.p})
    assert "reduce-scattered nothing" in judging.wire_problem(case, 1, [step, whole])
    wide = SimpleNamespace(op_bytes={"Reduce_scatter": 96, "Allreduce": 4, "Allgather": 4 * 48})
    text = judging.wire_problem(case, 2, [wide])
    assert "at step 0 rank 2 allgathered 192 bytes" in text and "reduce-scattered nothing" not in text
    # every call counts (a receive is its sender's): the reference's step, then one that adds an Alltoall
    assert judging.sent_bytes(case, 0, [step, SimpleNamespace(op_bytes={**step.op_bytes, "Recv": 400})]) is None
    text = judging.sent_bytes(case, 3, [step, SimpleNamespace(op_bytes={**step.op_bytes, "Alltoall": 1536})])
    assert "at step 1 rank 3 sent 1684 bytes (Alltoall 1536, Reduce_scatter 96" in text


def test_the_reduce_scatters_payload_is_compared_within_two_float16_steps() -> None:
    want = np.array([1.0, -2.5, np.inf, np.nan, 0.0, 6e-8], np.float16)
    assert judging.same_float16(want.copy(), want)
    assert judging.same_float16(np.nextafter(want, np.float16(np.inf)).astype(np.float16)[[0, 1, 4, 5]],
                                want[[0, 1, 4, 5]])  # one float16 step off: a float32 ulp may round either way
    for wrong in ([1.01, -2.5, np.inf, np.nan, 0, 6e-8], [1, -2.5, -np.inf, np.nan, 0, 6e-8],
                  [1, -2.5, np.inf, 0, 0, 6e-8], [1, -2.5, np.inf, np.nan, 1e-6, 6e-8]):
        assert not judging.same_float16(np.array(wrong, np.float16), want), wrong


def test_the_picture_draws_from_numbers_only() -> None:
    summary = {"scales_log2": [[10, 11, 10], [10, 11, 10]], "injected_steps": [1], "skipped_steps": [1],
               "policy": "p"}
    svg = programs.figure(summary)
    assert svg.startswith("<svg") and svg.count("polyline") == 2 and svg.count('stroke="#cf222e"') == 1
    assert programs.figure({"scales_log2": [["<script>"]]}) == ""
    assert programs.figure({}) == ""


# == the CLI, end to end ==============================================================================


@pytest.fixture(scope="module")
def checked() -> CheckRuns:
    return CheckRuns("16", seed=SEED, timeout=180,
                     together=fixture_runs("16", sorted(BUGGY)))


# Each fixture: the checks that fail and the words of its own diagnosis, which no other run shows.
BUGGY: dict[str, tuple[set[str], str]] = {
    "local_decision.py": ({SKIP, SCALE, WEIGHTS}, "the overflow decision is local"),
    "no_unscale.py": ({SKIP, SCALE, WEIGHTS}, "unscale (divide by the scale) before the update"),
    "inf_only.py": ({SKIP, SCALE, WEIGHTS}, "nan got through while inf was caught"),
    "counter_not_reset.py": ({SKIP, SCALE, WEIGHTS}, "The count of clean steps must restart at 0"),
    "halve_no_skip.py": ({SKIP, SCALE, WEIGHTS}, "the update of an overflowed step was applied anyway"),
    # Where the scale reaches 65536 (seed 1616: p = 2, step 4) its float16 product is inf: 65536 is
    # past float16's largest, so every element it sends then is inf or nan, and the skips follow.
    "cast_before_scale.py": ({SKIP, SCALE, WEIGHTS, WIRE}, "what float16 makes of the gradients cast before the scale"),
    "flag_before_sum.py": ({SKIP, SCALE, WEIGHTS}, "a flag taken on each rank's own buffer before the reduce-scatter"),
    "allreduce_not_scatter.py": ({WIRE}, "and reduce-scattered nothing"),
    # An outside tester's forgeries, 11/11 sealed before the wire check counted every call, harness step by step.
    "forged_hidemark.py": ({WIRE}, "your own marks ['hidden'] do not end a step"),
    "forged_alltoall.py": ({WIRE}, "every byte a rank sends counts, whatever the call"),
    # Half the model kept after the last step (an outside tester's): the weight check crashed on the shapes.
    "short_weights.py": ({SKIP, SCALE, WEIGHTS}, "every rank keeps the whole model after the Allgather"),
}


def test_every_fixture_is_tested() -> None:
    assert fixture_names("16") == set(BUGGY) | {"alt_counted_flags.py", "forged_replay.py"}


@pytest.mark.slow
def test_a_replay_of_the_checker_in_the_learner_process_has_no_data_to_run_on(checked: Callable[..., Checked]) -> None:
    """An outside tester's forgery passed 11/11 sealed: it ran cases.trace on the case its rank was
    handed. Each rank is handed its own data only (Case.for_rank; unsealed too: test_launcher.py)."""
    run = checked("--solution", str(fixture_solution("16", "forged_replay.py")), "--seal", "on")
    assert_clean(run)
    assert run.rc == 1 and run.results is not None and run.results["score"] == 0, run.out
    assert "view of the case holds no data of rank" in run.flat, run.out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUGGY))
def test_buggy_solution_fails_with_its_symptom(name: str, checked: Callable[..., Checked]) -> None:
    failing, needle = BUGGY[name]
    run = checked("--solution", str(fixture_solution("16", name)))
    assert_clean(run)
    assert run.rc == 1, run.out
    assert {c for c in ALL if run.status(c) == "failed"} == failing, run.out
    text = run.messages()
    assert needle in text, f"{needle!r} missing from:\n{run.out}"
    for other, (_, words) in BUGGY.items():
        assert other == name or words not in text, f"{other}'s diagnosis in {name}'s run:\n{run.out}"
    assert f"distlab check 16 --seed {SEED}" in run.flat


@pytest.mark.slow
def test_reference_passes_sealed(checked: Callable[..., Checked]) -> None:
    run = checked("--solution", "reference")
    assert_clean(run)
    assert run.rc == 0, run.out
    r = run.results
    assert r is not None and r["seal"] == "on" and r["score"] == r["max_score"] == 11
    assert r["totals"]["launches"] == 1
    errors = [v for k, v in run.check(WEIGHTS)["metrics"].items() if k.startswith("worst_weight_error")]
    assert errors and max(errors) < judging.WEIGHT_TOLERANCE / 10, errors
    assert "every rank skipped steps" in run.flat and "identical replicas" in run.flat


@pytest.mark.slow
def test_starter_fails_with_helpful_messages(checked: Callable[..., Checked]) -> None:
    run = checked()  # no workspace file: the starter, sealed
    assert_starter_fails(run, ["every rank applied the step, the policy's trace skips it",
                               "rank 0's scale is 16384, the policy's 4096 (overflows at steps [0, 2, 4, 8, 23]); your scales: 16384",
                               "the step's skip differs from the trace's", "expected at most 112 (2 bytes for each"])
    assert run.results["score"] == 0 and set(run.failed()) == {c["name"] for c in run.results["checks"]}  # every check fails, none crashes


@pytest.mark.slow
def test_alternative_passes_on_gloo(checked: Callable[..., Checked]) -> None:
    assert_passes(checked("--solution", str(fixture_solution("16", "alt_counted_flags.py")), "--backend", "gloo"), "gloo")


@pytest.mark.slow
def test_tune_sweeps_the_growth_interval_and_the_report_draws_the_scales(tmp_path: Path) -> None:
    """A short interval grows the scale into overflow again and again: more steps skipped than the
    4 faults; a long one skips only the faults. The report draws every rank's scale, faults marked."""
    ws = tmp_path / "ws"
    tuned = run_cli("tune", "16", "--solution", "reference", "--param", "growth_interval=1,16", "--metric",
                    "skipped", "--beside", "loss", workspace=ws, timeout=120)
    flat = " ".join((tuned.stdout + tuned.stderr).split())
    assert tuned.returncode == 0, flat
    assert "growth_interval = 1: skipped = 23, loss = 2.47" in flat and "growth_interval = 16: skipped = 4, loss = 0.63" in flat
    page = tmp_path / "16.html"
    made = run_cli("report", "16", "--solution", "reference", "--out", str(page), workspace=ws, timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    html = page.read_text()
    figure = html[html.index('<section id="figure">'):]
    figure = figure[:figure.index("</section>")]
    assert figure.count("<polyline") == 4 and figure.count('stroke="#cf222e"') == 4  # a line per rank, per fault
    assert "16-growth_interval" in html  # the sweep's picture
    assert not leftovers()
