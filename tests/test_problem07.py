"""Problem 07, the gradient sync storm: the package's pure helpers, then `distlab check 07` end to end.

The unit tests run the model, the budgets and the diagnoses in this process, with the reference
Fusion over a fake comm (no ranks). The end-to-end tests check every solution in tests/fixtures/07/
once, through the real CLI on real MPI ranks, and read what a learner reads (the console) and
what a tool reads (--json); no rank, mpiexec or prterun may outlive a command. All runs use one
seed, so a failure here replays with `distlab check 07 --seed 4242`. The Tune step's sweep of the
free run's threshold is run once too.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import importlib.util
import math
import pickle
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from conftest import FIXTURES, PROBLEMS, run_cli
from e2e import (
    Checked,
    CheckRuns,
    assert_clean,
    assert_output_has,
    fixture_runs,
    fixture_solution,
    leftovers,
    load_file,
)

from distlab.grading import HeldMemory, Widener
from distlab.runtime.jobspec import problem_package

SEED = 4242
PROBLEM = PROBLEMS / "07-sync-storm"


# the problem's package modules, the very ones check.py imports (the model lives in cases.py)
cases, programs, judging, check = (importlib.import_module(f"{problem_package(PROBLEM)}.{module}")
                            for module in ("cases", "programs", "judging", "check"))
reference = load_file(PROBLEM / "reference.py", "problem07_reference_under_test")


# -- unit tests of the package's helpers -----------------------------------------------------------


class FakeComm:
    """One rank alone: Allreduce leaves the sum (its own values) and notes the buffer."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = None) -> None:
        self.calls.append((str(recvbuf.dtype), int(recvbuf.nbytes)))


def small_case(p: int = 1, seed: int = 3, big: bool = True) -> Any:
    rng = np.random.default_rng(seed)
    return cases.make_case(p, rng, Widener(seed, 7), cases.DTYPE_ORDER, big_table=big)


def test_gradients_follow_the_declared_names_shapes_and_dtypes() -> None:
    case = small_case()
    spec = case.spec
    grads = cases.gradients(spec, cases.init_params(spec), *cases.make_batch(spec, 0, 0, 0))
    names = list(cases.step_shapes(spec))
    assert list(grads) == names and len(names) >= 200  # hundreds of small tensors
    assert [(str(g.dtype), g.nbytes) for g in grads.values()] == list(cases.step_shapes(spec).values())
    assert {str(g.dtype) for g in grads.values()} == set(cases.DTYPE_ORDER)
    other = cases.gradients(spec, cases.init_params(spec), *cases.make_batch(spec, 0, 1, 1))
    assert [(str(g.dtype), g.nbytes) for g in other.values()] == list(cases.step_shapes(spec).values())
    # The fingerprints need more than float64's 53 bits, and their sums over 8 ranks fit int64.
    fp = grads["fingerprints"]
    assert int(np.abs(fp).max()) > 2**53
    assert int(np.abs(fp).max()) * 8 < 2**63


def test_two_dtype_variants_carry_only_their_dtypes() -> None:
    rng = np.random.default_rng(5)
    for dtypes in (("float32", "int64"), ("float32", "float64")):
        case = cases.make_case(2, rng, Widener(5, 7), dtypes, big_table=False)
        grads = cases.gradients(case.spec, cases.init_params(case.spec),
                                *cases.make_batch(case.spec, 0, 0, 1))
        assert {str(g.dtype) for g in grads.values()} == set(dtypes)
        assert len(grads) == case.tensors


def test_budgets_and_threshold_choice() -> None:
    case = small_case()
    by_dtype = case.nbytes_by_dtype()
    total = sum(by_dtype.values())
    assert case.collective_budget() == math.ceil(total / case.threshold) + 3
    # The big table is larger than the threshold; the ordinary float32 tensors fill 4-7 buffers.
    assert case.largest() > case.threshold
    assert by_dtype["float32"] - case.largest("float32") > 4 * case.threshold


def test_the_memory_case_is_drawn_as_training_is_but_of_12_to_16_mib() -> None:
    """Its threshold, tables, dtypes and data are drawn as the training cases' are (an earlier probe's 2-3 MiB
    threshold told it apart); only its size differs, and a fusion holding its whole step holds past its
    budget and the slack."""
    plan = cases.plan_for(3)
    case = plan.memory
    assert case == cases.plan_for(3).memory != cases.plan_for(4).memory
    step = sum(case.nbytes_by_dtype().values())
    assert 12 << 20 <= step < (16 << 20) + (8 << 10) and case.p == 2 and isinstance(case, cases.Case)
    thresholds = [c.threshold for seed in range(20) for c in cases.plan_for(seed).cases]
    for seed in range(20):
        memory = cases.plan_for(seed).memory
        assert min(thresholds) // 2 <= memory.threshold <= max(thresholds) < 1 << 20
        assert set(memory.spec.dtypes) <= set(cases.DTYPE_ORDER) and memory.spec.dim in (8, 16)
        assert all(8 <= v < 65 or 1536 <= v < 2049 for v in memory.spec.vocab)
        assert judging.budget(memory) + judging.HELD_SLACK < sum(memory.nbytes_by_dtype().values()) / 2
    assert plan.world >= case.p


def held(before: int, start: int, fuse: int, added: int, peak: int | None = None, step1: int = 0) -> HeldMemory:
    """Readings at the training program's marks, two steps alike; ``peak``: the most held between "fuse" and
    "added" (added's own); ``step1``: what the second step holds more at every mark."""
    marks: list[tuple[str, int, int]] = []
    for extra in (0, step1):
        marks += [("step", start + extra, start + extra), ("fuse", fuse + extra, fuse + extra),
                  ("added", added + extra, max(added, peak or 0) + extra)]
    return HeldMemory(before, tuple(marks))


def test_the_memory_check_names_copies_and_memory_kept_from_the_import() -> None:
    case, base = cases.plan_for(3).memory, 30 << 20
    step = sum(case.nbytes_by_dtype().values())
    start = base + judging.harness_bytes(case)
    fuse = start + step
    assert judging.held_problem(case, 0, held(base, start, fuse, fuse + judging.budget(case))) is None
    early = judging.held_problem(case, 1, held(base, start, fuse, fuse + step))
    assert "rank 1's process held" in early and "are tensors copied long before their buffer is due?" in early
    stash = judging.held_problem(case, 0, held(base, start + step, fuse + step, fuse + step))
    assert "already held" in stash and "kept from the import of your file" in stash and "copied long" not in stash
    made = judging.held_problem(case, 0, held(base, start, fuse + step, fuse + step), step=0)
    assert made is not None and "already held" in made  # taken between "step" and "fuse": not the gradients
    assert judging.held_problem(case, 0, held(-1, start + (60 << 20), fuse + (60 << 20), fuse + (60 << 20))) is None
    # Copies dropped just as "added" was read, held before it: the sampled peak shows them, in either step.
    hidden = judging.held_problem(case, 1, held(base, start, fuse, fuse + (1 << 20), peak=fuse + step))
    assert hidden is not None and "are tensors copied long before their buffer is due?" in hidden
    later = held(base, start, fuse, fuse, step1=step)
    assert judging.held_problem(case, 0, later, step=1) is None
    later = HeldMemory(base, later.marks[:5] + (("added", fuse + step, fuse + 2 * step),))
    assert "step 1: rank 0's process held up to" in judging.held_problem(case, 0, later, step=1)
    # Buffers too large hold that memory themselves: named as the cause, not copies.
    large = judging.held_problem(case, 0, held(base, start, fuse, fuse + (30 << 20)), largest_buffer=4 << 20)
    assert large is not None and "its buffers reached" in large and "copied long before" not in large


def test_parse_bytes() -> None:
    assert programs.parse_bytes("0") == 0
    assert programs.parse_bytes("65536") == 65536
    assert programs.parse_bytes("64K") == programs.parse_bytes("64KiB") == 65536
    assert programs.parse_bytes("1M") == 1 << 20
    assert programs.parse_bytes("1.5k") == 1536


def test_auc() -> None:
    labels = np.array([0, 0, 1, 1.0])
    assert programs.auc(np.array([0.1, 0.2, 0.8, 0.9]), labels) == 1.0
    assert programs.auc(np.array([0.9, 0.8, 0.2, 0.1]), labels) == 0.0
    assert programs.auc(np.array([0.5, 0.5, 0.5, 0.5]), labels) == 0.5  # ties count half
    rng = np.random.default_rng(0)
    scores, labels = rng.integers(0, 5, 120).astype(float), (rng.random(120) < 0.4).astype(float)
    pos, neg = scores[labels > 0.5], scores[labels < 0.5]
    pairs = np.mean([(a > b) + 0.5 * (a == b) for a in pos for b in neg])
    assert programs.auc(scores, labels) == pytest.approx(pairs)


def test_reference_fusion_keeps_the_budgets_on_a_fake_comm() -> None:
    """One rank: the sums are the tensors themselves; the calls show the packing."""
    case = small_case()
    spec = case.spec
    grads = list(cases.gradients(spec, cases.init_params(spec), *cases.make_batch(spec, 0, 0, 0)).values())
    before = [g.copy() for g in grads]
    comm = FakeComm()
    fusion = reference.Fusion(comm, case.threshold)
    for _ in range(2):  # two cycles: the second starts empty
        comm.calls.clear()
        for g in grads:
            fusion.add(g)
        fusion.flush()
        assert all(np.array_equal(a, b) for a, b in zip(grads, before))
        assert len(comm.calls) <= case.collective_budget()
        for dtype, nbytes in comm.calls:
            assert nbytes <= case.threshold + case.largest(dtype)
        sent = {d: sum(n for dd, n in comm.calls if dd == d) for d in cases.DTYPE_ORDER}
        assert sent == case.nbytes_by_dtype()  # every byte once, each in its own dtype
        # every buffer but the last of its dtype holds at least the threshold
        for dtype in cases.DTYPE_ORDER:
            sizes = [n for d, n in comm.calls if d == dtype]
            assert all(n >= case.threshold for n in sizes[:-1])
    assert fusion.pending == {}
    zero = reference.Fusion(FakeComm(), 0)  # threshold 0: one Allreduce per tensor
    for g in grads[:10]:
        zero.add(g)
    zero.flush()
    assert len(zero.comm.calls) == 10


def test_per_tensor_sums_and_single_process_training() -> None:
    case = small_case(p=3, big=False)
    per_rank, want = judging.first_step(case)
    assert len(per_rank) == 3
    for i in (0, 1, 2, len(want) - 1):
        assert want[i].dtype == per_rank[0][i].dtype
        assert np.array_equal(want[i], per_rank[0][i] + per_rank[1][i] + per_rank[2][i])
    final = judging.single_process_training(case)
    start = cases.flat_params(cases.init_params(case.spec))
    assert len(final) == len(start)
    assert all(np.isfinite(a).all() for a in final)
    assert any(not np.array_equal(a, b) for a, b in zip(final, start))


def test_diagnoses_name_the_symptoms() -> None:
    case = small_case(p=2, big=False)
    per_rank, want = judging.first_step(case)
    own = per_rank[0]
    made = 9  # collectives the rank's step made
    assert judging.diagnose_sums(case, 0, [w.copy() for w in want], want, own, made) is None

    # float64 through a float32 buffer
    got = [w.copy() for w in want]
    i64 = next(i for i, w in enumerate(want) if w.dtype == np.float64 and w.size > 4)
    got[i64] = want[i64].astype(np.float32).astype(np.float64)
    message = judging.diagnose_sums(case, 0, got, want, own, made)
    assert message and "only to float32 precision" in message and f"tensor #{i64}" in message

    # int64 through a float64 buffer: the sum rounded, or each rank's value rounded and summed in float64
    fp = list(cases.step_shapes(case.spec)).index("fingerprints")
    for buffer in (np.float64, np.float32):
        summed = sum(rank[fp].astype(buffer) for rank in per_rank).astype(np.int64)
        for rounded in (want[fp].astype(buffer).astype(np.int64), summed):
            got = [w.copy() for w in want]
            got[fp] = rounded
            message = judging.diagnose_sums(case, 0, got, want, own, made)
            name = np.dtype(buffer).name
            assert message and f"went through a {name} buffer" in message and f"tensor #{fp}" in message, message


def test_an_int64_mismatch_is_blamed_on_a_float_buffer_only_where_rounding_explains_it() -> None:
    """Integers far below 2^53 cannot have been rounded by a float64, nor large ones into values no float
    holds: those get another message (and the averaged ones theirs)."""
    case = small_case(p=2, big=False)
    per_rank, want = judging.first_step(case)
    names = list(cases.step_shapes(case.spec))
    hits, fp = names.index("hits[0]"), names.index("fingerprints")
    assert int(want[hits].max()) < 2**24 < 2**53 < int(want[fp].max())
    off_by_one = want[hits].copy()
    off_by_one[int(np.argmax(off_by_one))] += 1
    unrounded = want[fp] + 1  # large, but no float64 holds these values
    assert not all(int(np.float64(v)) == v for v in unrounded.tolist())
    for i, wrong, says in ((hits, off_by_one, "which a float32 holds exactly"),
                           (fp, unrounded, "not what float64 or float32 rounding of them gives"),
                           (hits, want[hits] // 2, "the sum divided by p")):
        got = [w.copy() for w in want]
        got[i] = wrong
        message = judging.diagnose_sums(case, 0, got, want, per_rank[0], 9)
        assert message and says in message and f"tensor #{i}" in message, message
        assert "went through a" not in message and "floating-point buffer, which" not in message, message
    assert judging.rounded_through(want[fp].astype(np.float64).astype(np.int64), want[fp], 2) == "float64"
    assert judging.rounded_through(off_by_one, want[hits], 2) == ""



def test_diagnoses_name_the_other_symptoms() -> None:
    case = small_case(p=2, big=False)
    per_rank, want = judging.first_step(case)
    own, made = per_rank[0], 9
    # the last tensors of each dtype never reduced
    got = [w.copy() for w in want]
    for i in (len(want) - 1, len(want) - 2, len(want) - 3):
        got[i] = own[i].copy()
    message = judging.diagnose_sums(case, 0, got, want, own, made)
    assert message and "the last partial buffer was never sent" in message

    # nothing reduced at all
    nothing = 0
    message = judging.diagnose_sums(case, 0, [o.copy() for o in own], want, own, nothing)
    assert message and "no collective at all" in message

    # averaged instead of summed
    got = [w / 2 if w.dtype.kind == "f" else w.copy() for w in want]
    message = judging.diagnose_sums(case, 0, got, want, own, made)
    assert message and "divided by p" in message


def _fake_run(fusion_class: Any, case: Any) -> Any:
    """One rank's step of ``case`` through ``fusion_class`` on a FakeComm, as the check reads a CaseRun."""
    comm = FakeComm()
    fusion = fusion_class(comm, case.threshold)
    for dtype, nbytes in cases.step_shapes(case.spec).values():
        fusion.add(np.zeros(nbytes // np.dtype(dtype).itemsize, dtype))
    fusion.flush()
    return SimpleNamespace(case=case, values=[SimpleNamespace(allreduces=[comm.calls])])


# the buffer fixtures -> what the memory check must name (the real bug), over every seed
BUFFER_BUGS = {"threshold_elements.py": "compared with a number of elements instead of bytes",
               "unbounded_buffer.py": "the threshold was ignored until flush()"}


def test_buffer_diagnoses_over_many_variants() -> None:
    """On 60 sessions' cases, packed as the reference and the two buffer fixtures pack them (sizes only, no
    ranks): the reference within every bound, each fixture named for its own bug and not the other's, its
    buffer past threshold + its largest tensor by at least twice that slack, and the reference's
    analytic step (its collectives at 50 us, the bytes at the plan's bandwidth) at least 1.5x the 10x
    speed-up, where one Allreduce per tensor is 1x."""
    fixtures = {name: load_file(fixture_solution("07", name), f"problem07_{name[:-3]}").Fusion for name in BUFFER_BUGS}
    for seed in range(60):  # 300 held when written; 60 in the suite
        plan = cases.plan_for(seed)
        assert judging.too_big_buffer([_fake_run(reference.Fusion, c) for c in plan.cases]) is None
        for name, fusion in fixtures.items():
            runs = [_fake_run(fusion, c) for c in plan.cases]
            message = judging.too_big_buffer(runs)
            assert message and BUFFER_BUGS[name] in message, (seed, message)
            other = next(phrase for n, phrase in BUFFER_BUGS.items() if n != name)
            assert other not in message, (seed, message)
            over = max((n - r.case.threshold) / r.case.largest(d) for r in runs for d, n in r.values[0].allreduces[0])
            assert over >= 2, (seed, name, over)
        case = plan.perf[0]
        p, alpha = case.p, 2 * (case.p - 1) * check.ALPHA_S
        sizes = [n for _, n in _fake_run(reference.Fusion, case).values[0].allreduces[0]]
        ring = [2 * (p - 1) / p * n * plan.beta for n in sizes]
        fused = len(sizes) * alpha + sum(ring)
        per_tensor = sum(alpha + 2 * (p - 1) / p * n * plan.beta for _, n in cases.step_shapes(case.spec).values())
        assert per_tensor / fused >= 1.5 * check.SPEEDUP, (seed, per_tensor / fused)


def test_sum_tolerances_keep_float32_rounding_and_averages_twice_away() -> None:
    """Over 20 sessions' cases: a sum divided by p is at least twice the tolerance from the right sum
    in every tensor, and float64 sums rounded through float32 (the mixed-dtype buffer) are in some
    tensor of each case that has float64 ones (a case fails on its first wrong tensor; a tensor of
    two elements can be float32-exact to 1e-13 by chance, seed 2's)."""
    for seed in range(20):
        for case in cases.plan_for(seed).cases:
            rounded: list[bool] = []
            for want in judging.first_step(case)[1]:
                if want.dtype.kind != "f" or not np.abs(want).max(initial=0):
                    continue
                atol = judging.tolerance(want)["atol"]
                if want.dtype == np.float64:
                    rounded.append(np.abs(want.astype(np.float32).astype(np.float64) - want).max() >= 2 * atol)
                if case.p > 1:
                    assert np.abs(want / case.p - want).max() >= 2 * atol, seed
            assert not rounded or any(rounded), seed
            assert not rounded or sum(rounded) >= len(rounded) - 1, seed  # a chance tensor, no more


def test_a_rank_holds_only_its_own_data() -> None:
    """A rank is handed Case.for_rank(rank): no seed, its own batches (the same as the checker's), no other's;
    the checker's answers live in judging.py, not in what the rank imports."""
    case = small_case(p=3, big=False)
    view = case.for_rank(1)
    assert view.spec.seed == -1 and view.p == case.p and view.threshold == case.threshold
    for step in (0, 1):
        mine, want = cases.make_batch(view.spec, 0, step, 1), cases.make_batch(case.spec, 0, step, 1)
        assert all(np.array_equal(a, b) for a, b in zip(mine, want))
    assert all(np.array_equal(a, b) for a, b in zip(cases.flat_params(cases.init_params(view.spec)),
                                                     cases.flat_params(cases.init_params(case.spec))))
    assert cases.step_shapes(view.spec) == cases.step_shapes(case.spec)
    for other in (0, 2):
        with pytest.raises(ValueError, match="holds no data of rank"):
            cases.make_batch(view.spec, 0, 0, other)
    timed = cases.Timed(case, True).for_rank(2)
    assert timed.case.spec.seed == -1 and timed.case.spec.own is not None and timed.case.spec.own[0] == 2
    assert not hasattr(cases, "per_tensor_sums") and not hasattr(cases, "single_process_training")


def _view_leaves(value: Any) -> list[Any]:
    """Every int and array a rank's view holds, through its dataclasses, tuples and lists."""
    if dataclasses.is_dataclass(value):
        return [leaf for f in dataclasses.fields(value) for leaf in _view_leaves(getattr(value, f.name))]
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _view_leaves(item)]
    return [value] if isinstance(value, (int, np.integer, np.ndarray)) else []


def test_a_rank_view_holds_its_data_not_a_key_of_it() -> None:
    """No int in a rank's view is the seed or a key of any rank's batches (a rank could send one in a few bytes);
    the view's arrays are that rank's batches, equal to the whole case's, and its only key is the shared one."""
    case = small_case(p=3, big=False)
    secrets = {case.spec.seed} | {cases.data_keys(case.spec.seed, r)[1] for r in range(case.p)}
    for rank in range(case.p):
        for view in (case.for_rank(rank), cases.Timed(case, False).for_rank(rank).case):
            leaves = _view_leaves(view)
            ints = {int(x) for x in leaves if not isinstance(x, np.ndarray)}
            assert not ints & secrets
            assert ints - set(case.spec.vocab) <= {case.p, case.threshold, case.steps, case.spec.dim, rank, -1,
                                                    case.spec.shared}
            arrays = [x for x in leaves if isinstance(x, np.ndarray)]
            want = [a for step in range(case.steps) for a in cases.make_batch(case.spec, 0, step, rank)]
            assert len(arrays) == len(want)
            assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(arrays, want))
            for step in range(case.steps):
                got = cases.make_batch(view.spec, 0, step, rank)
                assert all(np.array_equal(a, b) for a, b in zip(got, cases.make_batch(case.spec, 0, step, rank)))
            assert pickle.loads(pickle.dumps(view)) == view  # it travels pickled to the learner's process
            with pytest.raises(ValueError, match="holds only its training batches"):
                cases.make_batch(view.spec, 0, case.steps, rank)


def test_plan_is_a_pure_function_of_the_seed() -> None:
    plan = cases.plan_for
    a, b, c = plan(1), plan(1), plan(2)
    assert a == b and a != c
    assert [case.p for case in a.cases][:3] == [1, 2, 4] and a.cases[3].p in (3, 5)
    assert a.world <= 8
    for case in a.cases:
        assert 200 <= case.tensors or len(case.spec.dtypes) == 2


# -- end to end, through the CLI ------------------------------------------------------------------


@pytest.fixture(scope="module")
def checked() -> CheckRuns:
    return CheckRuns("07", seed=SEED, timeout=240,
                     together=fixture_runs("07", [*sorted(BUGGY), "alt_arena.py"]))


def fixture(name: str) -> tuple[str, ...]:
    return ("--solution", str(fixture_solution("07", name)))


# name -> (substrings the output must contain, {check name start: status}).
BUGGY: dict[str, tuple[list[str], dict[str, str]]] = {
    "mixed_dtypes.py": (
        ["(float64, shape", "equals the per-tensor sum only to float32 precision",
         "pack each dtype in a buffer of its own"],
        {"results equal": "failed"},
    ),
    "no_final_flush.py": (
        ["tensors added still hold this rank's own gradient",
         "the last partial buffer was never sent", "flush() must send every buffer"],
        {"results equal": "failed"},
    ),
    "per_tensor.py": (
        ["one collective per tensor", "about as slow as one Allreduce per tensor"],
        {"results equal": "passed", "training": "passed", "collectives per step": "failed",
         "step at least 10x": "failed"},
    ),
    "unbounded_buffer.py": (
        ["in one Allreduce; a buffer may hold at most threshold + its largest tensor",
         "the threshold was ignored until flush()"],
        {"results equal": "passed", "collectives per step": "passed", "step at least 10x": "passed",
         "buffer memory bounded": "failed"},
    ),
    "threshold_elements.py": (
        ["buffers of 4 x the threshold", "compared with a number of elements instead of bytes"],
        {"results equal": "passed", "buffer memory bounded": "failed"},
    ),
    # forged (an outside tester's attacks): each must fail on the agents' evidence, not the rank's testimony
    "copies_until_flush.py": (
        ["held up to", "while add() ran than before the step's first add()", "are tensors copied long before their buffer is due?"],
        {"results equal": "passed", "collectives per step": "passed", "step at least 10x": "passed",
         "buffer memory bounded": "failed"},
    ),
    "forged_quiet_probe.py": (
        ["are tensors copied long before their buffer is due?"],
        {"results equal": "passed", "collectives per step": "passed", "step at least 10x": "passed",
         "buffer memory bounded": "failed"},
    ),
    "forged_mark_hook.py": (
        ["held up to", "are tensors copied long before their buffer is due?"],
        {"results equal": "passed", "collectives per step": "passed", "step at least 10x": "passed",
         "buffer memory bounded": "failed"},
    ),
    "forged_probe_detect.py": (
        ["held up to", "threshold + its largest tensor", "are tensors copied long before their buffer is due?"],
        {"results equal": "passed", "collectives per step": "passed", "step at least 10x": "passed",
         "buffer memory bounded": "failed"},
    ),
    "forged_recording_bypass.py": (
        ["which the harness's RecordingComm never noted"],
        {"results equal": "passed", "collectives per step": "passed", "buffer memory bounded": "failed"},
    ),
    "forged_untraced_copies.py": (
        ["which the harness's RecordingComm never noted", "; and the memory probe",
         "are tensors copied long before their buffer is due?"],
        {"results equal": "passed", "collectives per step": "passed", "buffer memory bounded": "failed"},
    ),
    "forged_local_recompute.py": (
        ["view of the case holds no data of rank"],
        {"results equal": "failed", "training": "failed", "buffer memory bounded": "failed"},
    ),
    "forged_own_mark.py": (
        ["made 314 (Allreduce x313, Bcast x1)", "your own mark(s) 'x' do not end the harness's \"step\" phase"],
        {"results equal": "passed", "collectives per step": "failed", "step at least 10x": "failed",
         "buffer memory bounded": "passed"},
    ),
}


# fixture -> the phrase of its real bug (every rejection names the bug; tested in each fixture's run below).
# A fixture with two bugs may show another's phrase too (SHARED_BUG).
REAL_BUG = {
    "mixed_dtypes.py": "pack each dtype in a buffer of its own",
    "no_final_flush.py": "the last partial buffer was never sent",
    "per_tensor.py": "one collective per tensor",
    "unbounded_buffer.py": BUFFER_BUGS["unbounded_buffer.py"],
    "threshold_elements.py": BUFFER_BUGS["threshold_elements.py"],
    "copies_until_flush.py": "are tensors copied long before their buffer is due?",
    "forged_quiet_probe.py": "are tensors copied long before their buffer is due?",
    "forged_mark_hook.py": "are tensors copied long before their buffer is due?",
    "forged_probe_detect.py": "are tensors copied long before their buffer is due?",
    "forged_recording_bypass.py": "which the harness's RecordingComm never noted",
    "forged_untraced_copies.py": "; and the memory probe",
    "forged_local_recompute.py": "view of the case holds no data of rank",
    "forged_own_mark.py": "do not end the harness's \"step\" phase",
}


def test_every_buggy_fixture_has_a_row() -> None:
    names = {path.stem + ".py" for path in (FIXTURES / "07").iterdir()
             if path.suffix in (".py", ".diff") and not path.stem.startswith("alt_")}
    assert names == set(REAL_BUG) == set(BUGGY)
    assert all(phrase in " ".join(BUGGY[name][0]) for name, phrase in REAL_BUG.items())
    others = [(name, phrase) for name, phrase in REAL_BUG.items()]  # and no row's phrase is another's
    assert all(p not in q or p == q for n, p in others for m, q in others if n != m)


# The fixtures that do two wrong things: each may show the phrase of the other's bug as well.
SHARED_BUG = {"forged_untraced_copies.py": {"forged_recording_bypass.py", "copies_until_flush.py",
                                            "forged_quiet_probe.py", "forged_mark_hook.py",
                                            "forged_probe_detect.py"}}


def phrases_of_others(name: str) -> list[str]:
    allowed = SHARED_BUG.get(name, set()) | {other for other in REAL_BUG if REAL_BUG[other] == REAL_BUG[name]}
    return [phrase for other, phrase in REAL_BUG.items() if other != name and other not in allowed]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUGGY))
def test_buggy_solution_fails_with_its_symptom(name: str, checked: Callable[..., Checked]) -> None:
    must, statuses = BUGGY[name]
    run = checked(*fixture(name))
    assert_clean(run)
    assert run.rc == 1, run.out
    assert_output_has(run, must)
    assert not [phrase for phrase in phrases_of_others(name) if phrase in run.messages()], run.out
    for check_name, status in statuses.items():
        assert run.status(check_name) == status, run.out
    assert run.results is not None and run.results["score"] < run.results["max_score"]
    assert f"distlab check 07 --seed {SEED}" in run.flat  # the replay hint


@pytest.mark.slow
def test_alternative_solution_passes(checked: Callable[..., Checked]) -> None:
    run = checked(*fixture("alt_arena.py"))
    assert not run.leftovers
    assert run.rc == 0, run.out
    assert run.results is not None and run.results["score"] == run.results["max_score"]


@pytest.mark.slow
def test_reference_passes(checked: Callable[..., Checked]) -> None:
    run = checked("--solution", "reference")
    assert not run.leftovers
    assert run.rc == 0, run.out
    assert "passed 07" in run.flat
    r = run.results
    assert r is not None and r["passed"] and r["score"] == r["max_score"] == 13
    assert all(c["status"] == "passed" and c["message"] == "" for c in r["checks"])
    speed = next(c for c in r["checks"] if c["name"].startswith("step at least 10x"))
    assert speed["metrics"]["worst_speedup"] >= 10
    assert 0 < speed["metrics"]["measured_s"] <= speed["metrics"]["bound_s"]
    assert r["totals"]["clock"] == "virtual"


@pytest.mark.slow
def test_starter_fails_with_a_helpful_message(checked: Callable[..., Checked]) -> None:
    run = checked()  # no workspace file: the starter is checked
    assert not run.leftovers
    assert run.rc == 1, run.out
    assert "checking the starter" in run.flat
    assert "every tensor still holds this rank's own gradient (no collective at all" in run.flat
    assert run.results is not None and run.results["score"] == 0


@pytest.mark.slow
def test_tune_sweeps_the_free_run_threshold(tmp_path: Path) -> None:
    proc = run_cli("tune", "07", "--solution", "reference", "--ranks", "2",
                   "--param", "threshold=0,16K,256K", "--fixed", "steps=1", "--metric", "sync_s",
                   "--out", str(tmp_path / "sweep"), timeout=180)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert not leftovers()
    rows = list(csv.reader((tmp_path / "sweep.csv").read_text().splitlines()))
    assert rows[0] == ["threshold", "sync_s", "note", "bound"]  # 07 gives no bound: the column stays empty
    assert all(row[3] == "" for row in rows[1:])
    times = {programs.parse_bytes(t): float(s) for t, s, _, _ in rows[1:]}
    assert sorted(times) == [0, 16384, 262144]
    # threshold 0 is one Allreduce per tensor: the slowest; fusion cuts the latency terms
    assert times[0] > 5 * times[16384] > 0 and times[262144] <= times[16384]
    assert min(times, key=times.__getitem__) == 262144  # the fastest
