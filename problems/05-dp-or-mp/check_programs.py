"""Problem 05's rank programs: what runs on the ranks, next to the learner's code.

run_cases is the program of every launch: it asks the learner's plan for each plan case (on one
rank), or runs blocks of the learner's ParallelMLP forward and backward on p ranks and counts the
communication around each phase. What comes back is plain data (PlanAnswer, MlpResult): answers,
arrays, parameter counts and CommStats, never the learner's objects. Nothing is judged here; the
expected values are computed in the supervisor (check_rule.py, check_diagnoses.py).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distlab.grading import CommStats, check_part

scenario = check_part(__file__, "scenario")


# == the plan ====================================================================================


@dataclass
class PlanAnswer:
    layout: dict[str, int] | None = None  # a well-formed answer
    other: str | None = None  # anything else, as repr
    error: str | None = None  # the exception plan raised


def normalize(value: Any) -> tuple[dict[str, int] | None, str | None]:
    """The learner's answer as plain data: ({dp, tp, pp} or None, None), or (None, its repr)."""
    if value is None:
        return None, None
    try:
        if set(value.keys()) == {"dp", "tp", "pp"}:
            layout = {k: int(value[k]) for k in ("dp", "tp", "pp")}
            if all(layout[k] == value[k] for k in layout):
                return layout, None
    except (AttributeError, TypeError, ValueError):
        pass
    return None, repr(value)[:200]


def where_in(exc: BaseException, solution: Any) -> str:
    """', line N of your file' for the deepest frame of the learner's file, if any."""
    path = str(Path(getattr(solution, "__file__", "") or "").resolve())
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if str(Path(frame.filename).resolve()) == path:
            line = frame.lineno
    return f" ({Path(path).name}, line {line})" if line else ""


def run_plans(comm, solution, cases):
    """Asks the learner's plan for each case; an exception is kept per case, not fatal."""
    answers = []
    for case in cases:
        try:
            # Copies: a plan that edits its arguments must not change the next case.
            value = solution.plan(dict(case.model), dict(case.devices), case.batch)
        except Exception as exc:  # noqa: BLE001 - reported for this case, the others still run
            answers.append(PlanAnswer(error=f"{type(exc).__name__}: {exc}{where_in(exc, solution)}"))
            continue
        layout, other = normalize(value)
        answers.append(PlanAnswer(layout=layout, other=other))
    return answers


# == the tensor-parallel MLP ======================================================================


GRAD_NAMES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


@dataclass
class MlpResult:
    out: np.ndarray | str
    x_grad: np.ndarray | str
    grads: list[dict[str, np.ndarray | str]]  # per block: name -> gradient, or why there is none
    param_counts: list[int]  # per block: elements in module.parameters()
    forward: CommStats
    backward: CommStats


def _plain(t: Any, what: str) -> np.ndarray | str:
    if t is None:
        return f"{what} is None"
    if not isinstance(t, torch.Tensor):
        return f"{what} is a {type(t).__name__}, not a tensor"
    return t.detach().to(torch.float64).numpy().copy()


def _grads(block: Any) -> dict[str, np.ndarray | str]:
    grads: dict[str, np.ndarray | str] = {}
    for name in GRAD_NAMES:
        obj = block
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is None:
            grads[name] = f"ParallelMLP has no {name}"
        else:
            grads[name] = _plain(getattr(obj, "grad", None), f"{name}.grad")
    return grads


def run_mlp(comm, solution, cases):
    """Blocks of the learner's ParallelMLP, forward then backward; counts comm around each."""
    results = []
    for case in cases:
        x0, gout, weights = scenario.mlp_inputs(case)
        blocks = [solution.ParallelMLP(comm, *(torch.from_numpy(w.copy()) for w in ws)) for ws in weights]
        x = torch.from_numpy(x0.copy()).requires_grad_(True)
        before = comm.stats.snapshot()
        out = x
        for block in blocks:
            out = block(out)
        middle = comm.stats.snapshot()
        if isinstance(out, torch.Tensor) and out.requires_grad:
            (out * torch.from_numpy(gout)).sum().backward()
        after = comm.stats.snapshot()
        results.append(MlpResult(
            out=_plain(out, "the output"),
            x_grad=_plain(x.grad, "x.grad"),
            grads=[_grads(block) for block in blocks],
            param_counts=[sum(p.numel() for p in block.parameters()) for block in blocks],
            forward=middle.since(before),
            backward=after.since(middle),
        ))
    return results


# == the program of every launch =================================================================


def one_thread() -> None:
    """One torch thread per process, as torchrun sets OMP_NUM_THREADS=1: ranks share the cores,
    and idle intra-op threads spinning on tiny matrices would only steal them from each other."""
    torch.set_num_threads(1)


def run_cases(comm, solution, kind, cases):
    """The program of every launch: the plan cases (on one rank) or the MLP cases."""
    one_thread()
    return run_plans(comm, solution, cases) if kind == "plan" else run_mlp(comm, solution, cases)
