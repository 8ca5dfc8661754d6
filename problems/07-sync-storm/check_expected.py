"""Problem 07's expected values, computed here, and the diagnosis of wrong sums.

Outside the ranks, the checker regenerates every rank's gradients and sums them tensor by tensor,
which is what one Allreduce per tensor would give, and trains on the global batch in one process.
``diagnose_sums`` compares what a rank holds after step 0 with those sums and names the symptom
the way a reviewer would (a float32 buffer, a partial buffer never sent, an average, ...).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from distlab.grading import check_part

model = check_part(__file__, "model")
cases = check_part(__file__, "cases")
programs = check_part(__file__, "programs")


def rank_gradients(case: cases.Case, params: dict[str, Any], step: int) -> list[list[np.ndarray]]:
    return [model.gradients(case.spec, params, *model.make_batch(case.spec, 0, step, r))
            for r in range(case.p)]


def per_tensor_sums(per_rank: list[list[np.ndarray]]) -> list[np.ndarray]:
    """What one Allreduce(SUM) per tensor gives: each tensor summed over the ranks."""
    sums = [g.copy() for g in per_rank[0]]
    for grads in per_rank[1:]:
        for s, g in zip(sums, grads):
            s += g
    return sums


def single_process_training(case: cases.Case) -> list[np.ndarray]:
    params = model.init_params(case.spec)
    for step in range(case.steps):
        sums = per_tensor_sums(rank_gradients(case, params, step))
        model.apply_update(case.spec, params, sums, case.p)
    return model.flat_params(params)


def close(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Element-wise: ints exact; floats up to summation order (float64 far tighter than float32)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return np.zeros(want.shape, dtype=bool)
    if want.dtype.kind in "iu" or np.array_equal(got, want):
        return got == want
    rtol = 1e-5 if want.dtype == np.float32 else 1e-12
    scale = float(np.abs(want).max(initial=0.0)) or 1.0
    return np.isclose(got, want, rtol=rtol, atol=rtol * scale)


def describe(names: list[str], grads: list[np.ndarray], i: int) -> str:
    g = grads[i]
    return f"tensor #{i} {names[i]} ({g.dtype}, shape {g.shape})"


def diagnose_sums(case: cases.Case, rank: int, got: list[np.ndarray], want: list[np.ndarray],
                  own: list[np.ndarray], step: programs.StepRecord) -> str | None:
    """None if rank's sums are right; else what is wrong, named the way a reviewer would."""
    names = model.tensor_names(case.spec)
    head = f"{case.label()}: after step 0's flush(), rank {rank}"
    if len(got) != len(want):
        return f"{head} holds {len(got)} tensors, expected {len(want)}"
    wrong = [i for i in range(len(want)) if not close(got[i], want[i]).all()]
    if not wrong:
        return None
    unchanged = [i for i in wrong if np.array_equal(got[i], own[i])]
    if len(unchanged) == len(wrong):
        if len(wrong) == len(want) or not step.collectives:
            sent = "no collective at all" if not step.collectives else \
                f"{sum(step.collectives.values())} collective(s)"
            return (f"{head}: every tensor still holds this rank's own gradient ({sent} in the "
                    "step): add() and flush() must reduce every tensor across the ranks")
        tails = _unsent_tails(names, got, wrong)
        if tails:
            return (f"{head}: the last {tails} tensors added still hold this rank's own gradient: "
                    "the last partial buffer was never sent; flush() must send every buffer "
                    "that is not empty")
        shown = ", ".join(describe(names, got, i) for i in wrong[:3])
        return f"{head}: {len(wrong)} tensors were never reduced, e.g. {shown}"
    for i in wrong:
        g, w = got[i], want[i]
        if w.dtype == np.float64 and g.shape == w.shape and np.allclose(g, w, rtol=1e-6, atol=1e-6):
            rel = float(np.max(np.abs(g - w) / np.maximum(np.abs(w), 1e-30)))
            return (f"{head}: {describe(names, got, i)} equals the per-tensor sum only to float32 "
                    f"precision (relative error up to {rel:.1e}): it went through a float32 "
                    "buffer; pack each dtype in a buffer of its own")
        if w.dtype == np.int64 and g.shape == w.shape:
            off = int(np.max(np.abs(g.astype(object) - w.astype(object))))
            return (f"{head}: {describe(names, got, i)} is off by up to {off} (values up to "
                    f"2^{int(np.log2(max(int(np.abs(w).max()), 1)))}): its integers went through "
                    "a floating-point buffer, which cannot hold 64-bit integers exactly; pack each "
                    "dtype in a buffer of its own")
    i = wrong[0]
    g, w = got[i], want[i]
    if g.shape == w.shape and case.p > 1 and w.dtype.kind == "f":
        averaged = "the sum divided by p: Fusion sums (SUM); averaging is the caller's business"
        for factor, what in ((1.0 / case.p, averaged),
                             (float(case.p), "p times the sum: was a buffer reduced twice?")):
            if np.allclose(g, w * factor, rtol=1e-4, atol=1e-6):
                return f"{head}: {describe(names, got, i)} holds {what}"
    if g.shape != w.shape or g.dtype != w.dtype:
        return f"{head}: {describe(names, got, i)} came back as {g.dtype} {g.shape}"
    ok = close(g, w)
    j = int(np.argmin(ok.reshape(-1)))
    return (f"{head}: {describe(names, got, i)}, element {j}: expected "
            f"{w.reshape(-1)[j].item()!r}, saw {g.reshape(-1)[j].item()!r} ({len(wrong)} of "
            f"{len(want)} tensors wrong)")


def _unsent_tails(names: list[str], got: list[np.ndarray], wrong: list[int]) -> str:
    """'3 float32 and 1 int64' when the never-reduced tensors are, per dtype, exactly the last
    ones of that dtype in add order (a partial buffer left behind); '' otherwise."""
    by_dtype: dict[str, list[int]] = {}
    for i, g in enumerate(got):
        by_dtype.setdefault(str(g.dtype), []).append(i)
    parts = []
    for dtype, indices in by_dtype.items():
        mine = [i for i in wrong if i in set(indices)]
        if mine and mine != indices[len(indices) - len(mine):]:
            return ""
        if mine:
            parts.append(f"{len(mine)} {dtype}")
    return " and ".join(parts)


@functools.lru_cache(maxsize=16)
def first_step(case: cases.Case) -> tuple[list[list[np.ndarray]], list[np.ndarray]]:
    """Every rank's gradients of step 0, and their per-tensor sums (computed once per case)."""
    per_rank = rank_gradients(case, model.init_params(case.spec), 0)
    return per_rank, per_tensor_sums(per_rank)


_VERDICTS: dict[int, str | None] = {}


def first_wrong(plan: cases.Plan, train: list[Any]) -> str | None:
    """The first wrong sum of any case (the results check's message), or None; judged once per
    run (every check asks)."""
    key = id(train[0])
    if key not in _VERDICTS:
        _VERDICTS[key] = _first_wrong(plan, train)
    return _VERDICTS[key]


def _first_wrong(plan: cases.Plan, train: list[Any]) -> str | None:
    for case, task_run in zip(plan.cases, train):
        per_rank, want = first_step(case)
        for rank, result in enumerate(task_run.values):
            message = diagnose_sums(case, rank, result.first_sums, want, per_rank[rank],
                                    result.steps[0])
            if message:
                return message
    return None
