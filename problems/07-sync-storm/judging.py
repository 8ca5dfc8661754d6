"""How problem 07 judges the sums: the expected values, computed here, and the diagnosis of wrong ones.

Outside the ranks, every rank's gradients are regenerated and summed tensor by tensor, as one Allreduce
per tensor would, and the model is trained on the global batch in one process. ``diagnose_sums`` names
what is wrong with a rank's sums the way a reviewer would (a float32 buffer, a partial buffer never sent,
an average, ...).
"""

from __future__ import annotations

import functools

import numpy as np

from distlab.grading import CaseRun, agreement, first_mismatch

from . import cases as model
from .cases import Case
from .programs import StepRecord


def per_tensor_sums(case: Case, params: dict, step: int) -> tuple[list[dict], dict]:
    """Every rank's gradients of ``step``, and what one Allreduce(SUM) per tensor gives."""
    per_rank = [model.gradients(case.spec, params, *model.make_batch(case.spec, 0, step, r))
                for r in range(case.p)]
    sums = {name: g.copy() for name, g in per_rank[0].items()}
    for grads in per_rank[1:]:
        for name, g in grads.items():
            sums[name] += g
    return per_rank, sums


def single_process_training(case: Case) -> list[np.ndarray]:
    params = model.init_params(case.spec)
    for step in range(case.steps):
        model.apply_update(case.spec, params, per_tensor_sums(case, params, step)[1], case.p)
    return model.flat_params(params)


@functools.lru_cache(maxsize=16)
def first_step(case: Case) -> tuple[list[list[np.ndarray]], list[np.ndarray]]:
    """Every rank's gradients of step 0, and their per-tensor sums (computed once per case)."""
    per_rank, sums = per_tensor_sums(case, model.init_params(case.spec), 0)
    return [list(grads.values()) for grads in per_rank], list(sums.values())


def tolerance(want: np.ndarray) -> dict[str, float]:
    """Ints exact; floats up to summation order (float64 far tighter than float32)."""
    rtol = 0.0 if want.dtype.kind in "iu" else 1e-5 if want.dtype == np.float32 else 1e-12
    return {"rtol": rtol, "atol": rtol * (float(np.abs(want).max(initial=0.0)) or 1.0)}


def right(got: np.ndarray, want: np.ndarray) -> bool:
    return got.dtype == want.dtype and bool(agreement(got, want, **tolerance(want)).all())


def first_wrong(results: list[CaseRun]) -> str | None:
    """The first wrong sum of any training case (the results check's message), or None."""
    for result in results:
        per_rank, want = first_step(result.case)
        for rank, value in enumerate(result.values):
            message = diagnose_sums(result.case, rank, value.first_sums, want, per_rank[rank],
                                    value.steps[0])
            if message:
                return message
    return None


def diagnose_sums(case: Case, rank: int, got: list[np.ndarray], want: list[np.ndarray],
                  own: list[np.ndarray], step: StepRecord) -> str | None:
    """None if rank's sums are right; else what is wrong, named the way a reviewer would."""
    names = list(model.step_shapes(case.spec))
    head = f"{case.label()}: after step 0's flush(), rank {rank}"
    if len(got) != len(want):
        return f"{head} holds {len(got)} tensors, expected {len(want)}"
    wrong = [i for i in range(len(want)) if not right(got[i], want[i])]
    if not wrong:
        return None

    def tensor(i: int) -> str:
        return f"tensor #{i} {names[i]} ({got[i].dtype}, shape {got[i].shape})"

    if all(np.array_equal(got[i], own[i]) for i in wrong):
        if len(wrong) == len(want) or not step.collectives:
            sent = "no collective at all" if not step.collectives else \
                f"{sum(step.collectives.values())} collective(s)"
            return (f"{head}: every tensor still holds this rank's own gradient ({sent} in the step): "
                    "add() and flush() must reduce every tensor across the ranks")
        tails = unsent_tails(got, wrong)
        if tails:
            return (f"{head}: the last {tails} tensors added still hold this rank's own gradient: the "
                    "last partial buffer was never sent; flush() must send every buffer that is not empty")
        shown = ", ".join(tensor(i) for i in wrong[:3])
        return f"{head}: {len(wrong)} tensors were never reduced, e.g. {shown}"
    for i in wrong:
        g, w = got[i], want[i]
        if w.dtype == np.float64 and g.shape == w.shape and np.allclose(g, w, rtol=1e-6, atol=1e-6):
            rel = float(np.max(np.abs(g - w) / np.maximum(np.abs(w), 1e-30)))
            return (f"{head}: {tensor(i)} equals the per-tensor sum only to float32 precision (relative "
                    f"error up to {rel:.1e}): it went through a float32 buffer; pack each dtype in a "
                    "buffer of its own")
        if w.dtype == np.int64 and g.shape == w.shape:
            off = int(np.max(np.abs(g.astype(object) - w.astype(object))))
            return (f"{head}: {tensor(i)} is off by up to {off} (values up to "
                    f"2^{int(np.log2(max(int(np.abs(w).max()), 1)))}): its integers went through a "
                    "floating-point buffer, which cannot hold 64-bit integers exactly; pack each dtype in "
                    "a buffer of its own")
    i = wrong[0]
    g, w = got[i], want[i]
    if g.shape == w.shape and case.p > 1 and w.dtype.kind == "f":
        averaged = "the sum divided by p: Fusion sums (SUM); averaging is the caller's business"
        for factor, what in ((1.0 / case.p, averaged),
                             (float(case.p), "p times the sum: was a buffer reduced twice?")):
            if np.allclose(g, w * factor, rtol=1e-4, atol=1e-6):
                return f"{head}: {tensor(i)} holds {what}"
    if g.shape != w.shape or g.dtype != w.dtype:
        return f"{head}: {tensor(i)} came back as {g.dtype} {g.shape}"
    first = first_mismatch(g, w, **tolerance(w))
    assert first is not None  # tensor #i is wrong
    return (f"{head}: {tensor(i)}, element {first.index}: expected {first.expected!r}, saw {first.seen!r} "
            f"({len(wrong)} of {len(want)} tensors wrong)")


def unsent_tails(got: list[np.ndarray], wrong: list[int]) -> str:
    """'3 float32 and 1 int64' when the never-reduced tensors are, per dtype, exactly the last ones of
    that dtype in add order (a partial buffer left behind); '' otherwise."""
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


def human(nbytes: float) -> str:
    return f"{nbytes / 1024:.1f} KiB" if nbytes >= 1024 else f"{int(nbytes)} B"


def why_too_big(case: Case, dtype: str, nbytes: int, limit: int) -> str:
    """Why a buffer went past threshold + its largest tensor, named by how far past."""
    by_dtype = case.nbytes_by_dtype()
    if nbytes >= 0.9 * by_dtype.get(dtype, 0):
        return (f"one buffer of all {by_dtype[dtype]} {dtype} bytes of the step: the threshold was "
                "ignored until flush(); send a buffer as soon as it holds threshold_bytes")
    if dtype in by_dtype and nbytes > 1.5 * limit:
        return (f"{nbytes / case.threshold:.1f}x the threshold: is the threshold compared with a number of "
                "elements instead of bytes?")
    return "the buffer grew past the threshold before it was sent"
