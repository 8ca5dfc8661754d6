"""Problem 15, a mixed cluster: the checker's rules and diagnoses, then `distlab check 15` end to end.

The first half starts no process: the lab's devices as the platform gives them, the card's split on
the reference's worked example, the hidden variants (replayable, every kind of device in each
training job, batches that do not divide), the tolerances against the common wrong answers over
many seeds, and every diagnosis on made-up evidence and on the fixtures' own answers (each names
its own mistake and stays silent on the others). The second half runs the real CLI once per
solution, all with seed 4242 (replay with `distlab check 15 --seed 4242 --solution ...`): the
reference and the starter sealed, as a learner runs them; the fixtures unsealed, but for a forgery
that only a sealed run shows (a patched SealedComm); the alternative on gloo; and `distlab report
15`. No run may leave a process behind. The forged fixtures are an outside tester's attacks: each
rank holds its own samples only, and what its process returns or declares is checked against the
agents' records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

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

SEED = 4242
FOLDER = PROBLEMS / "15-mixed-cluster"
cases, programs, judging, check = problem_modules(FOLDER, "cases", "programs", "judging", "check")


def _load(path: Path, name: str) -> ModuleType:
    """A solution file as a module, compiled from its source (no bytecode cache beside the fixtures)."""
    module = ModuleType(name)
    module.__file__ = str(path)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)  # noqa: S102 - our own fixtures
    return module


def solution(name: str) -> ModuleType:
    """A fixture, the reference or the starter, loaded in this process (its pure functions)."""
    path = FOLDER / name if name in ("reference.py", "starter.py") else fixture_solution("15", name)
    return _load(path, f"problem15_{name[:-3]}")


# == the lab, the split, the variants ================================================================


def test_devices_are_the_lab_platforms() -> None:
    a100, v100, ascend = (cases.lab_device(name) for name in ("n0-gpu0", "n2-gpu0", "n3-npu0"))
    assert (a100["samples_per_s"], v100["samples_per_s"], ascend["samples_per_s"]) == (940, 370, 770)
    assert v100["flops"] / a100["flops"] == pytest.approx(0.72, abs=0.01)  # what the FLOP/s trap rests on
    assert a100["unsupported_ops"] == [] and {"embedding_bag", "fft"} <= set(ascend["unsupported_ops"])
    assert sorted(cases.by_kind()) == ["a100", "ascend910", "v100"]


def test_the_worked_example_and_its_roundings() -> None:
    """The reference's docstring: B = 101 over 940, 370, 770, 770."""
    job = cases.Job(tuple(cases.lab_device(n) for n in ("n0-gpu0", "n2-gpu0", "n3-npu0", "n3-npu1")), 101)
    assert judging.card_split(job) == solution("reference.py").split_batch(101, list(job.devices)) == [34, 13, 27, 27]
    assert [round(s) for s in job.shares()] == [33, 13, 27, 27]  # one short
    assert cases.split_faults(job, [33, 13, 27, 27]) == ["the split sums to 100, not 101: 1 sample(s) lost every step"]
    assert cases.split_faults(job, [34, 13, 26, 28]) == [
        "rank 2 (n3-npu0, ascend910: 770 samples/s) gets 26, but its share is 27.29 (within 1)"]
    assert cases.split_faults(job, [33, 13, 28, 27]) == []  # any rounding within 1 that sums to B


def test_hidden_variants_replay_and_cover_the_lab() -> None:
    assert repr(cases.hidden(7)) == repr(cases.hidden(7)) != repr(cases.hidden(8))
    for seed in range(30):
        table, trainings = cases.hidden(seed)
        assert [t.job.p for t in trainings][0] in (3, 4) and [t.job.p for t in trainings][1] in (5, 6)
        for training in trainings:
            job = training.job
            assert {d["profile"] for d in job.devices} == {"a100", "v100", "ascend910"}
            assert len({d["name"] for d in job.devices}) == job.p and job.global_batch % job.p
            assert job.platform().device_of(job.p - 1).name == job.devices[-1]["name"]
        assert len(table.jobs) == 24 and table.jobs[:2] == tuple(t.job for t in trainings)
        assert sum(j.devices[0]["profile"].startswith("gpu-") for j in table.jobs) == 3  # another lab's speeds
        assert any(sum(round(s) for s in j.shares()) != j.global_batch for j in table.jobs)
        assert len(table.places) == 16 and sum(c.device["profile"] == "npu-y" for c in table.places) >= 3


def test_tolerances_keep_the_common_wrong_answers_twice_away() -> None:
    """Over 100 seeds' training jobs (2000 held when written): the card's split idles at most half the
    limit, the equal and the FLOP/s splits at least twice it. Over 5 seeds' gradient cases: each usual
    wrong gradient is at least twice the tolerance away on some rank, the right one far inside it."""
    limit = check.IDLE_LIMIT
    for seed in range(100):
        for job in (t.job for t in cases.hidden(seed)[1]):
            assert cases.idle_share(job, judging.card_split(job)) <= limit / 2, (seed, job.label())
            for wrong in ("equal", "flops"):
                assert cases.idle_share(job, cases.MISREADINGS[wrong][0](job)) >= 2 * limit, (seed, wrong, job.label())
    for seed in range(5):
        for training in map(cases.gradient_case, cases.hidden(seed)[1]):
            split, want, local = gradient_parts(training)
            batch = training.job.global_batch
            right = {n: sum(b / batch * g[n] for b, g in zip(split, local)) for n in want}
            assert judging.worst_error(right, want)[0] <= judging.TOLERANCE / 1000
            for name, values in wrong_gradients(training, local).items():
                error = max(judging.worst_error(v, want)[0] for v in values)
                assert error >= 2 * judging.TOLERANCE, (seed, name, error)


def gradient_parts(training) -> tuple[list[int], dict, list[dict]]:
    split = list(training.given_split)
    ends = np.cumsum([0, *split])
    want, *local = programs.one_process(training, [(0, training.job.global_batch), *zip(ends, ends[1:])])
    return split, want, local


def wrong_gradients(training, local: list[dict]) -> dict[str, list[dict]]:
    """Every rank's gradient under each usual mistake of sync_gradients."""
    split, batch, p = list(training.given_split), training.job.global_batch, training.job.p
    mix = lambda weights: {n: sum(w * g[n] for w, g in zip(weights, local)) for n in local[0]}  # noqa: E731
    weighted = [{n: b / batch * g for n, g in grads.items()} for b, grads in zip(split, local)]
    return {"mean": [mix([1 / p] * p)] * p, "sum": [mix([1] * p)] * p, "times B": [mix(split)] * p,
            "local": local, "weighted": weighted}


def test_a_rank_holds_its_own_samples_only() -> None:
    """A rank's view of a training (what its process is handed) has no seed and reads its own samples,
    the very ones the checker's global batch holds for it; another rank's it cannot read."""
    training = cases.hidden(SEED)[1][0]
    split = judging.card_split(training.job)
    whole = programs.global_samples(training, 2, split)
    ends = np.cumsum([0, *split])
    for rank in range(training.job.p):
        view = training.for_rank(rank)
        assert view.seed == -1 and view.shared_key == training.shared_key and str(training.seed) not in repr(view)
        mine = programs.samples(view, 2, rank, split[rank])
        assert all(np.array_equal(a.numpy(), b[ends[rank]:ends[rank + 1]].numpy()) for a, b in zip(mine, whole))
        with pytest.raises(ValueError, match=f"rank {rank}'s view of the training holds no samples of rank"):
            programs.samples(view, 2, (rank + 1) % training.job.p, 1)


def whole_numbers(value: object) -> list[int]:
    """Every whole number in a value: its dataclass fields, items and integer arrays, walked."""
    if isinstance(value, np.ndarray):
        return [int(x) for x in value.ravel()] if value.dtype.kind in "iu" else []
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return [int(value)]
    if dataclasses.is_dataclass(value):
        value = [getattr(value, f.name) for f in dataclasses.fields(value)]
    elif isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    return [n for item in value for n in whole_numbers(item)] if isinstance(value, (list, tuple)) else []


def test_a_rank_view_holds_its_samples_not_their_key() -> None:
    """An outside tester's attack on problem 03: a rank smuggled its data's key to the others inside a
    message of the right size, and each rebuilt every rank's data alone. A view holds no such key (no
    whole number but the shared key is a key's size), only its own samples, drawn: every sample a split
    trains it on (up to twice the global batch), the very arrays the checker draws for that rank."""
    for training in (t for whole in cases.hidden(SEED)[1] for t in (cases.gradient_case(whole), whole)):
        p, rows = training.job.p, 2 * training.job.global_batch
        keys = {training.seed, *(cases.data_keys(training.seed, r)[1] for r in range(p))}
        for rank in range(p):
            view = training.for_rank(rank)
            found = set(whole_numbers(view))
            assert not found & keys and {n for n in found if abs(n) >= 2**16} == {training.shared_key}
            # Of the checker's split (the answer split_batch is graded on), its own batch only.
            if training.given_split is not None:
                assert view.given_split == tuple(b if r == rank else -1 for r, b in enumerate(training.given_split))
            for step in range(cases.STEPS):
                mine, want = view.samples(step, rank, rows), training.samples(step, rank, rows)
                assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(mine, want)), (rank, step)
            with pytest.raises(ValueError, match=f"holds the first {rows} samples of steps 0 to {cases.STEPS - 1}"):
                view.samples(0, rank, rows + 1)


def test_malformed_values_fail_and_name_what_was_wrong() -> None:
    """The ranks' values come from the learner's process: a wrong kind or shape is a failed check
    that says what it was, never an exception in the checker."""
    table, trainings = cases.hidden(SEED)
    training = trainings[0]
    p, good_split = training.job.p, judging.card_split(training.job)
    assert judging.table_answers(table, programs.ask_table(Rank0(), solution("reference.py"), table))[1] is None
    for junk in (None, "x", ([], []), ([(good_split, None)] * len(table.jobs), [("host", None)] * len(table.places))):
        answers, why = judging.table_answers(table, junk)
        assert answers is None and why.startswith("rank 0 returned"), why
    weights = {"head.bias": np.zeros(4)}
    good = programs.Trained(good_split, None, None, [1.0] * cases.STEPS, weights)
    assert judging.trained_values(training, [good] * p)[1] is None
    for junk in ("x", good._replace(split=[1] * (p + 1)), good._replace(split=[10**9] * p),
                 good._replace(losses=[1.0]), good._replace(weights={"head.bias": "w"}), good._replace(placement=[])):
        values, why = judging.trained_values(training, [good] * (p - 1) + [junk])
        assert values is None and f"rank {p - 1} returned" in why, why
    values, why = judging.gradient_values(training, [{}] * (p - 1) + [np.zeros(3)])
    assert values is None and f"rank {p - 1} returned" in why
    gradient = cases.gradient_case(training)
    shapes = [{"head.bias": np.zeros(7), "image.weight": np.array(["a"])}] * p
    assert "away (relative)" in judging.gradient_message(gradient, shapes)[0]


class Rank0:
    """A communicator's one call that ask_table makes."""

    def Get_rank(self) -> int:  # noqa: N802 - the MPI name
        return 0


# == the diagnoses ====================================================================================


def test_each_gradient_mistake_is_named_alone() -> None:
    training = cases.gradient_case(cases.hidden(SEED)[1][0])
    split, want, local = gradient_parts(training)
    assert judging.gradient_message(training, [want] * len(split))[0] is None
    for name, values in wrong_gradients(training, local).items():
        message = judging.gradient_message(training, values)[0]
        assert message and judging.GRADIENT_SAYS[name] in message, (name, message)
        assert sum(phrase in message for phrase in judging.GRADIENT_SAYS.values()) == 1
    rng = np.random.default_rng(0)
    noise = [{n: g + 1e-3 * rng.standard_normal(g.shape) for n, g in want.items()} for _ in split]
    message = judging.gradient_message(training, noise)[0]
    assert "away (relative) from the global batch's gradient" in message and ": it is" not in message
    missing = [{**want, "head.bias": "head.bias.grad is None"}] * len(split)
    message = judging.gradient_message(training, missing)[0]
    assert "on rank 0 head.bias.grad is None; expected the global batch's gradient" in message


def test_a_split_that_hides_the_weighting_fails_the_training_and_no_other_fixtures_does() -> None:
    """The training grades sync_gradients on the learner's own split: one rank holding every sample
    makes a plain sum right, equal batches a plain mean, so either fails the training by itself.
    Over 30 seeds' training jobs (B never divisible by p) every other fixture's split shows the weighting."""
    training = cases.hidden(SEED)[1][0]
    p, batch = training.job.p, training.job.global_batch
    for split, plain in (([batch] + [0] * (p - 1), "sum"), ([0] * (p - 1) + [7], "sum"), ([5] * p, "mean")):
        values = [programs.Trained(split, None, None, [1.0] * cases.STEPS, {"head.bias": np.zeros(2)})] * p
        message = judging.training_message(training, values)[0]
        assert f"a plain {plain} of the ranks' gradients is then the global batch's" in message, message
    assert judging.weightless_split([batch - 1, 1] + [0] * (p - 2)) is None
    fixtures = {name: solution(name) for name, misreading in SPLITS.items() if misreading != RAISES}
    for seed in range(30):
        for job in (t.job for t in cases.hidden(seed)[1]):
            for name, fixture in fixtures.items():
                split = programs.ask_split(fixture, job)[0]
                assert (split is not None and judging.weightless_split(split) is not None) == (
                    name == "forged_degenerate_split.py"), (seed, name, split)


# fixture -> the misreading its split is named for, on every seed's table (None: a right split; RAISES: its
# split_batch raises, here as in the run, where the checker's card_split it reached for is no more in cases.py)
RAISES = "split_batch raised"
UNNAMED = "wrong, no misreading"  # a wrong split that no misreading of the card fits
SPLITS = {"equal_split.py": "equal", "floor_shares.py": "floor", "round_shares.py": "round", "flops_split.py": "flops",
          "starter.py": "equal", "reference.py": None, "alt_soonest_finish.py": None, "unweighted_mean.py": None,
          "op_by_name.py": None, "host_everywhere.py": None, "forged_no_comm.py": RAISES,
          "forged_equal_split_clock.py": "equal", "forged_cached_split.py": "equal",
          "forged_degenerate_split.py": UNNAMED}


@pytest.mark.parametrize("seed", [SEED, 1, 2, 3])
def test_split_messages_name_only_the_fixtures_own_misreading(seed: int) -> None:
    table = cases.hidden(seed)[0]
    for name, misreading in SPLITS.items():
        answers = [programs.ask_split(solution(name), job) for job in table.jobs]
        message = judging.split_message(table.jobs, answers)
        said = [k for k, phrase in judging.SPLIT_SAYS.items() if phrase in (message or "")]
        if misreading == RAISES:
            assert message and RAISES in message and not said, (seed, name, message)
            continue
        assert said == ([misreading] if misreading not in (None, UNNAMED) else []), (seed, name, message)
        assert (message is None) == (misreading is None), (name, message)


def test_place_messages_name_the_misplaced_layer() -> None:
    table = cases.hidden(SEED)[0]
    messages = {}
    for name in ("reference.py", "alt_soonest_finish.py", "op_by_name.py", "host_everywhere.py", "starter.py"):
        fixture = solution(name)
        messages[name] = [m for c in table.places
                          if (m := judging.place_message(c, *programs.ask_place(fixture, c.layers, c.device)))]
    assert messages["reference.py"] == messages["alt_soonest_finish.py"] == []
    assert ("expected 'tags' (embedding_bag) on the host; saw it on the accelerator, but ascend910 lacks"
            in messages["op_by_name.py"][0])
    assert ("expected 'tags' (embedding_bag) on the accelerator; saw it on the host, but a100 runs"
            in messages["host_everywhere.py"][0])
    assert all("lacks" in m for m in messages["starter.py"])
    case = table.places[0]
    assert "place raised KeyError" in judging.place_message(case, None, "place raised KeyError: 'x' (f.py, line 3)")


def idle_evidence(training, name: str) -> tuple[list, np.ndarray, float]:
    """What the idle check would read of a fixture's training: its ranks' answers, and each rank's
    compute per step as the program declares it."""
    fixture, job = solution(name), training.job
    split = programs.ask_split(fixture, job)[0]
    values = [programs.Trained(split, None, programs.ask_place(fixture, training.layers, device)[0], [], {})
              for device in job.devices]
    slowdown = [1 + cases.HOST_EXTRA * len(cases.needless_host(training.layers, d, v.placement))
                for d, v in zip(job.devices, values)]
    compute = np.array([[b * s / d["samples_per_s"]] * cases.STEPS for b, s, d in zip(split, slowdown, job.devices)])
    return values, compute, judging.idle_of(compute)


def test_idle_messages_name_the_split_or_the_placement() -> None:
    training = cases.hidden(SEED)[1][1]
    for name, phrase in (("equal_split.py", judging.SPLIT_SAYS["equal"]),
                         ("flops_split.py", judging.SPLIT_SAYS["flops"])):
        values, compute, idle = idle_evidence(training, name)
        message = judging.idle_message(training, values, compute, idle, check.IDLE_LIMIT)
        assert idle > 2 * check.IDLE_LIMIT and phrase in message and "on the host" not in message, message
        assert sum(p in message for p in judging.SPLIT_SAYS.values()) == 1
    values, compute, idle = idle_evidence(training, "host_everywhere.py")
    message = judging.idle_message(training, values, compute, idle, check.IDLE_LIMIT)
    assert "on the host, although its accelerator can" in message and "split" not in message.split("then waits")[1]
    assert judging.idle_of(idle_evidence(training, "reference.py")[1]) <= check.IDLE_LIMIT / 2


def test_the_free_run_bounds() -> None:
    lab = cases.lab()
    assert programs.bounds(lab, 4, split="equal")["idle_share"] == pytest.approx(0.433, abs=1e-3)
    assert programs.bounds(lab, 4)["idle_share"] < 0.01 < programs.bounds(lab, 4, global_batch="8")["idle_share"]
    with pytest.raises(ValueError, match="no profile h100"):
        programs.bounds(lab, 4, mix="a100,h100")


# == end to end through the CLI =========================================================================


@pytest.fixture(scope="module")
def checked() -> CheckRuns:
    return CheckRuns("15", seed=SEED, timeout=240,
                     together=fixture_runs("15", sorted(BUGGY)))


SPLIT, PLACE, GRADIENT, TRAINING, IDLE = "split_batch", "place", "sync_gradients", "4 SGD steps", "idle time"
ALL = {SPLIT, PLACE, GRADIENT, TRAINING, IDLE}

# fixture -> (the checks that fail, what their messages must say)
BUGGY: dict[str, tuple[set[str], list[str]]] = {
    "unweighted_mean.py": ({GRADIENT, TRAINING}, [
        "it is the plain mean of the ranks' gradients, each weighted 1/p (DDP's average)",
        "after 4 steps expected one process's weights", "so the synced gradients are not the global batch's"]),
    "floor_shares.py": ({SPLIT, TRAINING}, [
        "sample(s) lost every step", "Every answer of the table is every share rounded down",
        "each step trained on"]),
    "flops_split.py": ({SPLIT, IDLE}, [
        "Every answer of the table is a split in proportion to peak FLOP/s", "expected at most 5% idle; saw"]),
    "op_by_name.py": ({PLACE}, ["on the host; saw it on the accelerator, but ascend910 lacks"]),
    # forged: its sync reads rank 0's samples on every rank, which a rank's view of the training refuses
    "forged_no_comm.py": (ALL, ["view of the training holds no samples of rank 0"]),
    # forged: the checker's split, read where the harness handed it, was cached for the training
    "forged_cached_split.py": ({SPLIT, IDLE}, ["Every answer of the table is an equal split",
                                               "expected at most 5% idle; saw"]),
    # forged: every sample on rank 0 makes a plain SUM right; training on its own split shows no weighting
    "forged_degenerate_split.py": (ALL, ["gives every sample to one rank: a plain sum of the ranks' gradients",
                                         "it is the sum of the ranks' local mean gradients"]),
}
# Judged in this process by the check's own functions (the tests above): their checks' logic is the same.
IN_PROCESS = {"equal_split.py", "round_shares.py", "host_everywhere.py"}
# Forgeries of the learner's process that only a sealed run shows (unsealed, the class they patch is not used).
SEALED = {"forged_equal_split_clock.py"}
# What the checks say of a forgery, and the fixture it is said of: silent on every other fixture.
FORGED_SAYS = {"holds no samples of rank": "forged_no_comm.py",
               "the declared compute differs from the harness's": "forged_equal_split_clock.py",
               "sent, received or reduced": None,  # no fixture's: the gradients travel in each
               "the training cannot show whether sync_gradients weights": "forged_degenerate_split.py"}


def test_every_fixture_is_tested() -> None:
    names = fixture_names("15")
    assert names == set(BUGGY) | IN_PROCESS | SEALED | {"alt_soonest_finish.py"}
    assert set(SPLITS) >= names


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUGGY))
def test_buggy_solution_fails_with_its_symptom(name: str, checked: Callable[..., Checked]) -> None:
    failing, needles = BUGGY[name]
    run = checked("--solution", str(fixture_solution("15", name)))
    assert_clean(run)
    assert run.rc == 1, run.out
    assert {check_name for check_name in ALL if run.status(check_name) == "failed"} == failing, run.out
    for needle in needles:
        assert needle in run.messages(), f"{needle!r} missing from:\n{run.out}"
    for phrase, owner in FORGED_SAYS.items():
        assert owner == name or phrase not in run.messages(), f"{phrase!r} said of {name}:\n{run.out}"
    assert f"distlab check 15 --seed {SEED}" in run.flat


@pytest.mark.slow
def test_a_patched_compute_declaration_fails_the_idle_check_sealed(checked: Callable[..., Checked]) -> None:
    """An outside tester's forgery passed the idle check sealed with an equal split: every rank's
    patched SealedComm.compute declared B over the summed speeds. The declared compute must be the
    harness's for the rank's batch on its device; the other checks read it as an equal split."""
    run = checked("--solution", str(fixture_solution("15", "forged_equal_split_clock.py")), "--seal", "on")
    assert_clean(run)
    assert run.rc == 1 and run.results is not None and run.results["seal"] == "on", run.out
    assert {c for c in ALL if run.status(c) == "failed"} == {SPLIT, IDLE}, run.out
    assert "the declared compute differs from the harness's: rank 0" in run.messages(), run.out
    assert "Every answer of the table is an equal split" in run.messages(), run.out
    for phrase, owner in FORGED_SAYS.items():
        assert owner == "forged_equal_split_clock.py" or phrase not in run.messages(), run.out


@pytest.mark.slow
def test_reference_passes_sealed(checked: Callable[..., Checked]) -> None:
    run = checked("--solution", "reference")
    assert_clean(run)
    assert run.rc == 0, run.out
    r = run.results
    assert r is not None and r["seal"] == "on" and r["score"] == r["max_score"] == 13
    assert r["totals"]["launches"] == 1
    idle = run.check(IDLE)
    shares = [v for k, v in idle["metrics"].items() if k.startswith("idle_p")]
    assert shares and all(v["yours"] <= check.IDLE_LIMIT / 2 < 2 * check.IDLE_LIMIT < v["equal split"]
                          for v in shares), idle
    assert "as one process on the global batch" in run.flat and "idle on the virtual clock (an equal split:" in run.flat


@pytest.mark.slow
def test_starter_fails_with_helpful_messages(checked: Callable[..., Checked]) -> None:
    run = checked()  # no workspace file: the starter, sealed
    assert_starter_fails(run, ["Every answer of the table is an equal split", "saw it on the accelerator, but ascend910 lacks",
                               "it is the plain mean of the ranks' gradients", "expected at most 5% idle"])
    assert run.results["score"] == 0 and set(run.failed()) == {c["name"] for c in run.results["checks"]}  # every check fails, none crashes
    assert not [phrase for phrase in FORGED_SAYS if phrase in run.messages()], run.out


@pytest.mark.slow
def test_alternative_passes_on_gloo(checked: Callable[..., Checked]) -> None:
    assert_passes(checked("--solution", str(fixture_solution("15", "alt_soonest_finish.py")), "--backend", "gloo"), "gloo")


@pytest.mark.slow
def test_report_draws_the_equal_steps_beside_yours(tmp_path: Path) -> None:
    """The free run of the report: 3 steps with an equal split of 1200 over an A100, an A100, a V100
    and an Ascend (300 each), then 3 with the reference's (the V100 gets 147)."""
    page = tmp_path / "15.html"
    proc = run_cli("report", "15", "--solution", "reference", "--out", str(page), timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    html = page.read_text()
    assert "equal split: forward and backward, 300 samples" in html
    assert "your split: forward and backward, 147 samples" in html
    assert not leftovers()
