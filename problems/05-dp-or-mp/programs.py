"""What runs on the ranks of problem 05. A rank's MLP case is its view (cases.MlpCase.for_rank): x, dL/dy
and its own shard of the weights; the expected values are the checker's (judging.single_device)."""

import traceback
from contextlib import suppress
from functools import reduce
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from distlab.grading import CaseRun, Counts

from .cases import NAMED_CASES, MlpCase, PlanCase, Weights, mlp_inputs

GRAD_NAMES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


def run_cases(comm, solution, cases: list[PlanCase] | list[MlpCase]) -> list[Any]:
    """The program of every task: the plan cases (one rank) or the MLP cases; it returns plain data
    (answers, arrays, parameter counts), never the learner's objects."""
    # One torch thread per process, as torchrun sets OMP_NUM_THREADS=1: ranks share the cores,
    # and idle intra-op threads spinning on tiny matrices would only steal them from each other.
    torch.set_num_threads(1)
    program = ask_plan if isinstance(cases[0], PlanCase) else run_mlp
    return [program(comm, solution, case) for case in cases]


# == the plan ====================================================================================


class PlanAnswer(NamedTuple):
    layout: dict[str, int] | None = None  # a well-formed answer
    other: str | None = None  # anything else, as repr
    error: str | None = None  # the exception plan raised


def normalize(value: Any) -> tuple[dict[str, int] | None, str | None]:
    """The learner's answer as plain data: ({dp, tp, pp} or None, None), or (None, its repr)."""
    if value is None:
        return None, None
    with suppress(AttributeError, TypeError, ValueError):
        if set(value.keys()) == {"dp", "tp", "pp"}:
            layout = {k: int(value[k]) for k in ("dp", "tp", "pp")}
            if all(layout[k] == value[k] for k in layout):
                return layout, None
    return None, repr(value)[:200]


def ask_plan(comm, solution, case: PlanCase) -> PlanAnswer:
    """The learner's plan for one case; an exception is kept as this case's answer (with the line of
    the learner's file it came from), not fatal."""
    try:
        # Copies: a plan that edits its arguments must not change the next case.
        value = solution.plan(dict(case.model), dict(case.devices), case.batch)
    except Exception as exc:  # noqa: BLE001 - reported for this case, the others still run
        path = Path(getattr(solution, "__file__", "") or "").resolve()
        lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path]
        where = f" ({path.name}, line {lines[-1]})" if lines and lines[-1] else ""
        return PlanAnswer(error=f"{type(exc).__name__}: {exc}{where}")
    return PlanAnswer(*normalize(value))


# == the tensor-parallel MLP ======================================================================


class MlpResult(NamedTuple):
    out: np.ndarray | str
    x_grad: np.ndarray | str
    grads: list[dict[str, np.ndarray | str]]  # per block: name -> gradient, or why there is none
    param_counts: list[int]  # per block: elements in module.parameters()


def _plain(t: Any, what: str) -> np.ndarray | str:
    if t is None:
        return f"{what} is None"
    if not isinstance(t, torch.Tensor):
        return f"{what} is a {type(t).__name__}, not a tensor"
    return t.detach().to(torch.float64).numpy().copy()


def _grad(block: Any, name: str) -> np.ndarray | str:
    param = reduce(lambda obj, part: getattr(obj, part, None), name.split("."), block)
    return f"ParallelMLP has no {name}" if param is None else _plain(getattr(param, "grad", None), f"{name}.grad")


def run_mlp(comm, solution, case: MlpCase) -> MlpResult:
    """Blocks of the learner's ParallelMLP, forward then backward, each marked for the counters. ``case``
    is this rank's view: ParallelMLP gets the weights in their whole shapes with only this rank's shard
    filled in (cases.MlpCase.handed)."""
    x0, gout = case.inputs()
    weights = case.handed(comm.Get_rank())
    blocks = [solution.ParallelMLP(comm, *(torch.from_numpy(w.copy()) for w in ws)) for ws in weights]
    x = torch.from_numpy(x0.copy()).requires_grad_(True)
    comm.mark("forward")  # phase_counts reads each rank's counters in "forward" and "backward"
    out = reduce(lambda y, block: block(y), blocks, x)
    comm.mark("backward")
    if isinstance(out, torch.Tensor) and out.requires_grad:
        (out * torch.from_numpy(gout)).sum().backward()
    comm.mark("read back")  # ends backward: the next case's set-up belongs to no phase a check reads
    return MlpResult(_plain(out, "the output"), _plain(x.grad, "x.grad"),
                     [{name: _grad(block, name) for name in GRAD_NAMES} for block in blocks],
                     [sum(p.numel() for p in block.parameters()) for block in blocks])


def phase_counts(result: CaseRun[MlpCase]) -> list[dict[str, Counts]]:
    """Per rank, its counters in this case's forward and backward: the nth phases of its task."""
    nth = next(i for i, case in enumerate(result.task.spec.cases or ()) if case is result.case)
    return [{phase: result.task.counts(rank, phase, nth) for phase in ("forward", "backward")}
            for rank in range(result.ranks)]


def one_device(x0: np.ndarray, gout: np.ndarray, weights: list[Weights]
               ) -> tuple[np.ndarray, np.ndarray, list[dict[str, np.ndarray]]]:
    """Whole blocks on one device, forward and backward, as nn.Linear and nn.GELU compute them: the
    output, dL/dx and the whole gradients per block (the checker's judging.single_device, the free run)."""
    torch.set_num_threads(1)  # as in the ranks (run_cases)
    params = [[torch.from_numpy(w.copy()).requires_grad_(True) for w in ws] for ws in weights]
    x = torch.from_numpy(x0.copy()).requires_grad_(True)
    out = reduce(lambda y, w: F.linear(F.gelu(F.linear(y, w[0], w[1])), w[2], w[3]), params, x)
    (out * torch.from_numpy(gout)).sum().backward()
    grads = [{name: t.grad.numpy() for name, t in zip(GRAD_NAMES, w)} for w in params]  # type: ignore[union-attr]
    return out.detach().numpy(), x.grad.numpy(), grads  # type: ignore[union-attr]


# == the free run =================================================================================


def main(comm, solution, hidden="512", tokens="256", blocks="2"):
    """A free run (distlab run, mpirun, torchrun): TP MLP blocks forward and backward, matmuls on the
    virtual clock; rank 0 compares with one device and asks plan about 7B on 8 x 80 GiB."""
    torch.set_num_threads(1)  # see run_cases
    p, rank = comm.Get_size(), comm.Get_rank()
    h, n, k, ffn = int(hidden), int(tokens), int(blocks), 4 * int(hidden)
    if ffn % p:
        return f"ffn = 4 * hidden = {ffn} must be a multiple of the {p} ranks" if rank == 0 else None
    case = MlpCase(p, 1, n, h, ffn, k, 12345)  # a free run: no hidden case, every rank may know the seed
    x0, gout, weights = mlp_inputs(case)
    mlp = [solution.ParallelMLP(comm, *(torch.from_numpy(w.astype(np.float32)) for w in ws))
           for ws in case.handed(rank)]
    out = torch.from_numpy(x0.astype(np.float32)).requires_grad_(True)
    flops = 2 * 2 * n * h * ffn / p  # two matmuls per block, this rank's share
    comm.mark("forward")
    for block in mlp:
        comm.compute(flops=flops, label="block forward")
        out = block(out)
    comm.mark("backward")
    comm.compute(flops=2 * flops * k, label="backward")
    (out * torch.from_numpy(gout.astype(np.float32))).sum().backward()
    if rank != 0:
        return None
    want, _, _ = one_device(x0, gout, weights)
    err = float(np.max(np.abs(out.detach().numpy() - want)))
    verdict = "matches" if err < 1e-3 * max(1.0, float(np.max(np.abs(want)))) else "DIFFERS FROM"
    tp_mib, dp_mib = 2 * n * h * 4 / 2**20, case.whole_params * 4 / 2**20  # float32 activations, gradients
    layout = solution.plan(dict(NAMED_CASES[2].model), dict(NAMED_CASES[2].devices), NAMED_CASES[2].batch)  # 7B
    return (f"p={p}, {k} block(s), hidden {h}, {n} tokens: output {verdict} one device (max err {err:.1e}); "
            f"TP moves {tp_mib:.2f} MiB per block per step (DP would move {dp_mib:.2f} MiB "
            f"of gradients); plan(7B, 8 x 80 GiB, batch 8) = {layout}")
