"""What runs on the ranks of problem 12 (the same model on one process, the expected values, is
judging.one_process, in the checker only).

The model is a small MLP cut into four stages, one per rank, trained for real in float64:
6 features -> 8 -> 8 -> 8 -> 3 classes, tanh between, cross-entropy at the end. The harness's
Stage runs the learner's stage for one micro-batch at a time, keeps what autograd saved for its
backward (the stashed activation) and declares each forward and backward on the virtual clock
with the case's hidden stage times, labelled "forward i" / "backward i": the checks read the
schedule, the bubble and the stash from those spans, never from what a rank says.

Each rank holds its stage's view of the case (cases.Pipe.for_rank): its own layers' starting
weights, the features on stage 0, the labels on the last stage, as arrays (no key they were drawn
from); what the others hold comes only in messages.
"""

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .cases import (
    CLASSES,
    FEATURES,
    GPIPE,
    LEARNING_RATE,
    MICRO,
    ONE_F_ONE_B,
    STEPS,
    WIDTH,
    Pipe,
    formula_bubble,
    peak_stash,
)


def stage_module(pipe: Pipe, stage: int) -> nn.Module:
    """Stage ``stage`` of ``pipe.p``: a linear layer, and tanh on every stage but the last."""
    p = pipe.p
    fan_in = FEATURES if stage == 0 else WIDTH
    layer = nn.Linear(fan_in, CLASSES if stage == p - 1 else WIDTH, dtype=torch.float64)
    start = pipe.start_weights(stage)  # the same start on the rank and in the checker
    with torch.no_grad():
        for param, value in zip(layer.parameters(), start, strict=True):
            param.copy_(torch.from_numpy(value))
    return layer if stage == p - 1 else nn.Sequential(layer, nn.Tanh())


def inputs(pipe: Pipe) -> torch.Tensor:
    """The batch's m x MICRO samples' features (stage 0's); micro-batch i is rows i*MICRO...
    The same batch every step, so the steps' losses show the descent."""
    return torch.from_numpy(pipe.batch_features())


def targets(pipe: Pipe) -> torch.Tensor:
    """The batch's classes (the last stage's)."""
    return torch.tensor(pipe.labels(), dtype=torch.int64)


class Stage:
    """One rank's stage of the pipeline, as the learner's schedule drives it.

    ``index``, ``count`` (p), ``micro_batches`` (m), ``input_shape`` and ``output_shape`` (the
    activation received from stage index-1 and sent to index+1, float64), ``module`` (the torch
    layers, whose .grad the step must leave as the batch's gradient)."""

    def __init__(self, comm: Any, pipe: Pipe, step: int, module: nn.Module) -> None:
        self.index, self.count, self.micro_batches = comm.Get_rank(), pipe.p, pipe.m
        self.input_shape = (MICRO, FEATURES if self.index == 0 else WIDTH)
        self.output_shape = (MICRO, WIDTH) if self.index < self.count - 1 else ()
        self.module = module
        self._comm, self._pipe = comm, pipe
        self._x = inputs(pipe) if self.index == 0 else None
        self._labels = targets(pipe) if self.index == self.count - 1 else None
        self._stash: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # micro -> (input, output)
        self.losses: dict[int, float] = {}

    def _micro(self, call: str, micro: Any) -> int:
        if not isinstance(micro, (int, np.integer)) or not 0 <= micro < self.micro_batches:
            raise ValueError(f"stage {self.index}: {call}({micro!r}, ...): micro-batches are numbered 0 to "
                             f"m - 1 = {self.micro_batches - 1}")
        return int(micro)

    def forward(self, micro: int, x: Any = None) -> Any:
        """Runs micro-batch ``micro`` through this stage and stashes what its backward needs.

        ``x``: the activation stage index-1 sent (ignored on stage 0, which reads its own samples).
        Returns the activation to send on (a float64 array of ``output_shape``), or on the last
        stage the micro-batch's mean loss (a float)."""
        i = self._micro("forward", micro)
        rows = slice(i * MICRO, (i + 1) * MICRO)
        if self.index == 0:
            inp = self._x[rows]
        else:
            inp = torch.from_numpy(np.array(x, dtype=np.float64).reshape(self.input_shape)).requires_grad_()
        out = self.module(inp)
        if self.index == self.count - 1:
            out = F.cross_entropy(out, self._labels[rows])
            self.losses[i] = out.item()
        self._stash[i] = (inp, out)
        self._comm.compute(seconds=self._pipe.forward_s[self.index], label=f"forward {i}")
        return out.item() if self.index == self.count - 1 else out.detach().numpy().copy()

    def backward(self, micro: int, grad: Any) -> Any:
        """Backpropagates micro-batch ``micro`` from its stashed activation, adding into .grad.

        ``grad``: the gradient of the batch's loss with respect to this stage's output for that
        micro-batch, as stage index+1 sent it; on the last stage, the weight of the micro-batch's
        loss in the batch's loss (a number). Returns the gradient to send to stage index-1 (None on
        stage 0). The stashed activation is freed."""
        i = self._micro("backward", micro)
        if i not in self._stash:
            raise ValueError(f"stage {self.index}: backward({i}, ...) with no stashed activation of micro-batch {i} "
                             "(its forward has not run on this stage, or its backward already ran)")
        inp, out = self._stash.pop(i)
        if self.index == self.count - 1:
            out.backward(torch.tensor(float(grad), dtype=torch.float64))
        else:
            out.backward(torch.from_numpy(np.array(grad, dtype=np.float64).reshape(self.output_shape)))
        self._comm.compute(seconds=self._pipe.backward_s[self.index], label=f"backward {i}")
        return None if self.index == 0 else inp.grad.numpy().copy()


def grads_of(module: nn.Module) -> dict[str, Any]:
    """Every parameter's .grad as an array, or why there is none."""
    return {name: param.grad.detach().numpy().copy() if param.grad is not None else f"{name}.grad is None"
            for name, param in module.named_parameters()}


def sgd(module: nn.Module) -> None:
    """Plain SGD by hand (torch.optim's first use imports torch._dynamo, seconds per rank)."""
    with torch.no_grad():
        for param in module.parameters():
            if param.grad is not None:
                param -= LEARNING_RATE * param.grad
            param.grad = None


def schedule_of(solution: Any, pipe: Pipe) -> Any:
    return solution.gpipe if pipe.schedule == GPIPE else solution.one_f_one_b


def train(comm: Any, solution: Any, pipe: Pipe, number: int) -> dict[str, Any]:
    """STEPS steps of the learner's schedule, SGD between them; a phase mark around each step.

    Returns this stage's gradients per step and (last stage) the micro-batches' losses per step."""
    module = stage_module(pipe, comm.Get_rank())
    grads, losses = [], []
    for step in range(STEPS):
        stage = Stage(comm, pipe, step, module)
        comm.Barrier()  # every stage starts the step together
        comm.mark(f"case {number} step {step}")
        schedule_of(solution, pipe)(comm, stage)
        comm.mark("between")
        grads.append(grads_of(module))
        losses.append([stage.losses.get(i) for i in range(pipe.m)])
        sgd(module)
    return {"grads": grads, "losses": losses}


def run_cases(comm: Any, solution: Any, pipes: list[Pipe]) -> list[dict[str, Any]]:
    torch.set_num_threads(1)  # the ranks share the cores, as torchrun's OMP_NUM_THREADS=1
    return [train(comm, solution, pipe, number) for number, pipe in enumerate(pipes)]


# == the free run ===================================================================================


def free_pipe(ranks: int, schedule: str, m: str, forward_ms: str) -> Pipe:
    f = float(forward_ms) * 1e-3
    return Pipe(schedule, int(m), (f,) * ranks, (2 * f,) * ranks, seed=12)


class Timed(Stage):
    """A Stage that notes its operations' order and its busy time on the online clock."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.order: list[int] = []  # micro + 1 for a forward, -(micro + 1) for a backward
        self.first, self.last, self.busy = float("inf"), 0.0, 0.0

    def _timed(self, sign: int, run: Any, micro: int, arg: Any) -> Any:
        begin = self._comm.now()
        out = run(micro, arg)
        end = self._comm.now()
        self.order.append(sign * (int(micro) + 1))
        self.first, self.last, self.busy = min(self.first, begin), max(self.last, end), self.busy + end - begin
        return out

    def forward(self, micro: int, x: Any = None) -> Any:
        return self._timed(1, super().forward, micro, x)

    def backward(self, micro: int, grad: Any) -> Any:
        return self._timed(-1, super().backward, micro, grad)


def order_text(codes: Any) -> str:
    return " ".join(f"F{c - 1}" if c > 0 else f"B{-c - 1}" for c in (int(x) for x in codes) if c)


def main(comm, solution, m="8", schedule="both", forward_ms="1"):
    """One step of GPipe, then one of 1F1B (or the ``schedule`` given), on equal stages (forward
    ``forward_ms``, backward twice that). Rank 0 returns each schedule's bubble and peak stash
    beside the formula, and every stage's order of operations, which `distlab report 12` replays
    to draw the two schedules:

        distlab tune 12 --param m=1,2,4,8,16,32 --metric bubble_1f1b"""
    torch.set_num_threads(1)
    rank, p = comm.Get_rank(), comm.Get_size()
    summary: dict[str, Any] = {"p": p, "m": int(m), "forward_ms": float(forward_ms),
                               "formula": round(formula_bubble(p, int(m)), 4)}
    for name in [GPIPE, ONE_F_ONE_B] if schedule == "both" else [schedule]:
        pipe = free_pipe(p, name, m, forward_ms)
        stage = Timed(comm, pipe, 0, stage_module(pipe, rank))
        comm.Barrier()
        comm.mark(name)
        schedule_of(solution, pipe)(comm, stage)
        codes = np.zeros(4 * pipe.m, dtype=np.int64)
        codes[:min(len(stage.order), codes.size)] = stage.order[:codes.size]
        times = np.array([stage.first, stage.last, stage.busy])
        every_code = np.zeros((p, codes.size), dtype=np.int64) if rank == 0 else None
        every_time = np.zeros((p, 3)) if rank == 0 else None
        comm.Gather(codes, every_code, root=0)
        comm.Gather(times, every_time, root=0)
        if rank == 0:
            span = every_time[:, 1].max() - every_time[:, 0].min()
            orders = [order_text(row) for row in every_code]
            summary[f"bubble_{name}"] = round(float(1 - every_time[:, 2].sum() / (p * span)), 4) if span > 0 else 1.0
            summary[f"stash_{name}"] = max(peak_stash([(op[0], 0) for op in o.split()]) for o in orders)
            summary[f"order_{name}"] = orders
    comm.mark("done")
    if rank != 0:
        return None
    if schedule != "both":
        summary["bubble"] = summary[f"bubble_{schedule}"]
    return summary


def bounds(platform, ranks, m="8", schedule="both", forward_ms="1"):
    """The formula (p-1)/(m+p-1) for every bubble; m and min(p, m) for the peak stashes."""
    formula = formula_bubble(ranks, int(m))
    return {"bubble": formula, "bubble_gpipe": formula, "bubble_1f1b": formula,
            "stash_gpipe": int(m), "stash_1f1b": min(ranks, int(m))}


def figure(summary: dict) -> str:
    """GPipe beside 1F1B, one row per stage: each forward and backward, the idle gaps, the bubble
    and the peak stash beside the formula (drawn in the checker from rank 0's numbers)."""
    from .judging import schedule_svg  # the checker's module: the ranks never import it

    return schedule_svg(summary)
