"""What runs on the ranks of problem 05, and the same MLP on one device (the expected values)."""

import traceback
from contextlib import suppress
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from distlab.grading import CommStats

from .cases import NAMED_CASES, MlpCase, PlanCase, Weights, mlp_inputs

GRAD_NAMES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


def run_cases(comm, solution, cases: list[PlanCase] | list[MlpCase]) -> list[Any]:
    """The program of every task: the plan cases (one rank) or the MLP cases; it returns plain data
    (answers, arrays, parameter counts, CommStats), never the learner's objects."""
    # One torch thread per process, as torchrun sets OMP_NUM_THREADS=1: ranks share the cores,
    # and idle intra-op threads spinning on tiny matrices would only steal them from each other.
    torch.set_num_threads(1)
    program = ask_plan if isinstance(cases[0], PlanCase) else run_mlp
    return [program(comm, solution, case) for case in cases]


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
    with suppress(AttributeError, TypeError, ValueError):
        if set(value.keys()) == {"dp", "tp", "pp"}:
            layout = {k: int(value[k]) for k in ("dp", "tp", "pp")}
            if all(layout[k] == value[k] for k in layout):
                return layout, None
    return None, repr(value)[:200]


def where_in(exc: BaseException, solution: Any) -> str:
    """', line N of your file' for the deepest frame of the learner's file, if any."""
    path = Path(getattr(solution, "__file__", "") or "").resolve()
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path]
    return f" ({path.name}, line {lines[-1]})" if lines and lines[-1] else ""


def ask_plan(comm, solution, case: PlanCase) -> PlanAnswer:
    """The learner's plan for one case; an exception is kept as this case's answer, not fatal."""
    try:
        # Copies: a plan that edits its arguments must not change the next case.
        value = solution.plan(dict(case.model), dict(case.devices), case.batch)
    except Exception as exc:  # noqa: BLE001 - reported for this case, the others still run
        return PlanAnswer(error=f"{type(exc).__name__}: {exc}{where_in(exc, solution)}")
    return PlanAnswer(*normalize(value))


# == the tensor-parallel MLP ======================================================================


@dataclass
class MlpResult:
    out: np.ndarray | str
    x_grad: np.ndarray | str
    grads: list[dict[str, np.ndarray | str]]  # per block: name -> gradient, or why there is none
    param_counts: list[int]  # per block: elements in module.parameters()
    forward: CommStats
    backward: CommStats

    def phases(self) -> tuple[tuple[str, CommStats], ...]:
        return (("forward", self.forward), ("backward", self.backward))


def _plain(t: Any, what: str) -> np.ndarray | str:
    if t is None:
        return f"{what} is None"
    if not isinstance(t, torch.Tensor):
        return f"{what} is a {type(t).__name__}, not a tensor"
    return t.detach().to(torch.float64).numpy().copy()


def _grad(block: Any, name: str) -> np.ndarray | str:
    param = reduce(lambda obj, part: getattr(obj, part, None), name.split("."), block)
    if param is None:
        return f"ParallelMLP has no {name}"
    return _plain(getattr(param, "grad", None), f"{name}.grad")


def run_mlp(comm, solution, case: MlpCase) -> MlpResult:
    """Blocks of the learner's ParallelMLP, forward then backward; counts comm around each."""
    x0, gout, weights = mlp_inputs(case)
    blocks = [solution.ParallelMLP(comm, *(torch.from_numpy(w.copy()) for w in ws)) for ws in weights]
    x = torch.from_numpy(x0.copy()).requires_grad_(True)
    before = comm.stats.snapshot()
    out = reduce(lambda y, block: block(y), blocks, x)
    middle = comm.stats.snapshot()
    if isinstance(out, torch.Tensor) and out.requires_grad:
        (out * torch.from_numpy(gout)).sum().backward()
    after = comm.stats.snapshot()
    return MlpResult(_plain(out, "the output"), _plain(x.grad, "x.grad"),
                     [{name: _grad(block, name) for name in GRAD_NAMES} for block in blocks],
                     [sum(p.numel() for p in block.parameters()) for block in blocks],
                     middle.since(before), after.since(middle))


@dataclass
class Expected:
    out: np.ndarray
    x_grad: np.ndarray
    grads: list[dict[str, np.ndarray]]  # whole gradients per block
    weights: list[Weights]


def single_device(case: MlpCase) -> Expected:
    """The same blocks on one device, forward and backward, as nn.Linear and nn.GELU compute them."""
    torch.set_num_threads(1)  # as in the ranks (run_cases)
    x0, gout, weights = mlp_inputs(case)
    params = [{name: torch.from_numpy(w.copy()).requires_grad_(True) for name, w in zip(GRAD_NAMES, ws)}
              for ws in weights]
    x = torch.from_numpy(x0.copy()).requires_grad_(True)
    out = x
    for w in params:
        out = F.linear(F.gelu(F.linear(out, w["fc1.weight"], w["fc1.bias"])), w["fc2.weight"], w["fc2.bias"])
    (out * torch.from_numpy(gout)).sum().backward()
    grads = [{name: t.grad.numpy() for name, t in w.items()} for w in params]  # type: ignore[union-attr]
    return Expected(out.detach().numpy(), x.grad.numpy(), grads, weights)  # type: ignore[union-attr]


# == the free run =================================================================================


def main(comm, solution, hidden="512", tokens="256", blocks="2"):
    """A free run (distlab run, mpirun, torchrun): TP MLP blocks forward and backward, matmuls on the
    virtual clock; rank 0 compares with one device and asks plan about 7B on 8 x 80 GiB."""
    torch.set_num_threads(1)  # see run_cases
    p, rank = comm.Get_size(), comm.Get_rank()
    h, n, k, ffn = int(hidden), int(tokens), int(blocks), 4 * int(hidden)
    if ffn % p:
        return f"ffn = 4 * hidden = {ffn} must be a multiple of the {p} ranks" if rank == 0 else None
    case = MlpCase(p, 1, n, h, ffn, k, 12345)
    x0, gout, weights = mlp_inputs(case)
    mlp = [solution.ParallelMLP(comm, *(torch.from_numpy(w.astype(np.float32)) for w in ws)) for ws in weights]
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
    want = single_device(case)
    err = float(np.max(np.abs(out.detach().numpy() - want.out)))
    verdict = "matches" if err < 1e-3 * max(1.0, float(np.max(np.abs(want.out)))) else "DIFFERS FROM"
    tp_mib, dp_mib = 2 * n * h * 4 / 2**20, case.whole_params * 4 / 2**20  # float32 activations, gradients
    layout = solution.plan(dict(NAMED_CASES[2].model), dict(NAMED_CASES[2].devices), NAMED_CASES[2].batch)  # 7B
    return (f"p={p}, {k} block(s), hidden {h}, {n} tokens: output {verdict} one device (max err {err:.1e}); "
            f"TP moves {tp_mib:.2f} MiB per block per step (DP would move {dp_mib:.2f} MiB "
            f"of gradients); plan(7B, 8 x 80 GiB, batch 8) = {layout}")
