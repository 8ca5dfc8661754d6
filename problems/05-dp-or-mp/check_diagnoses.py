"""Problem 05's verdicts: the expected values, and the messages that name each symptom.

Computed in the supervisor, never in the ranks that run learner code. For the plan: what the rule
answers, what the learner's layout needs in memory, and which of the rule's usual misreadings gives
exactly the learner's answer. For the MLP: the same blocks as one plain torch module on one device
(single_device), each rank's shard of its gradients, and the diagnoses that compare the ranks'
results with it and recognise the usual mistakes (a bias added p times, a missing allreduce, one
too many). Each diagnose_* returns the message of the first difference, or None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from torch import nn

from distlab.grading import check_part

rule = check_part(__file__, "rule")
scenario = check_part(__file__, "scenario")
programs = check_part(__file__, "programs")

RTOL, ATOL = 1e-7, 1e-9  # float64 all through: only the order of the sums differs


# == the plan ====================================================================================


def show(layout: dict[str, int] | None) -> str:
    if layout is None:
        return "None (nothing fits)"
    return f"dp={layout['dp']} tp={layout['tp']} pp={layout['pp']}"


def gib(x: Fraction | float) -> str:
    return f"{float(x) / rule.GIB:.1f} GiB"


MISREADINGS: dict[str, tuple[dict[str, Any], str]] = {
    "4 bytes": ({"bytes_per_param": rule.STATE_WITHOUT_OPTIMIZER},
                ("the rule's answer at 4 bytes per parameter (fp16 weights and gradients only): the "
                 "optimizer state is missing (fp32 master weights and Adam's two moments, 12 more "
                 "bytes per parameter)")),
    "no activations": ({"activations": False},
                       "the rule's answer without activations: the activations are missing"),
    "PP first": ({"tp_first": False},
                 ("the rule's answer with PP tried before TP: for the same tp*pp the rule takes the "
                  "widest TP that fits (TP inside a node on fast links, PP's bubbles last)")),
}


def misreading_of(cases: list[scenario.PlanCase], answers: list[programs.PlanAnswer]) -> str | None:
    """The misreading whose answers the learner gave on every case, where one fits them all."""
    for name, (kwargs, _) in MISREADINGS.items():
        theirs = [rule.best_plan(c.model, c.devices, c.batch, **kwargs) for c in cases]
        ours = [rule.best_plan(c.model, c.devices, c.batch) for c in cases]
        if theirs != ours and all(a.error is None and a.other is None and a.layout == w
                                  for a, w in zip(answers, theirs)):
            return name
    return None


def diagnose_plan(case: scenario.PlanCase, answer: programs.PlanAnswer,
                  misreading: str | None = None) -> str | None:
    """None when the answer is the rule's; else what was expected, what was seen, and why.
    ``misreading``: the rule's misreading seen on every case (misreading_of), if any."""
    want = rule.best_plan(case.model, case.devices, case.batch)
    head = f"{case.describe()}: expected {show(want)}"
    if answer.error:
        return f"{head}; plan raised {answer.error}"
    if answer.other is not None:
        return f"{head}; plan returned {answer.other}, not a dict with keys dp, tp, pp (or None)"
    got = answer.layout
    if got == want:
        return None
    seen = f"; saw {show(got)}"
    if got is None:
        assert want is not None
        m = rule.memory_per_device(case.model, case.batch, want["dp"], want["tp"], want["pp"])
        return f"{head}{seen}, but {show(want)} fits: it needs {gib(m.total)} of {gib(case.devices['memory_bytes'])}"
    faults = rule.layout_faults(case.model, case.devices, case.batch, got)
    if faults:
        return f"{head}{seen}, which is not a legal layout: {'; '.join(faults)}"
    m = rule.memory_per_device(case.model, case.batch, got["dp"], got["tp"], got["pp"])
    limit = case.devices["memory_bytes"]
    need = (f"{show(got)} needs {gib(m.total)} per device ({gib(m.state)} of weights, gradients and "
            f"Adam state at 16 bytes per parameter, {gib(m.activations)} of activations) and a "
            f"device has {gib(limit)}")
    # The usual misreadings of the rule, recognised by giving exactly their answer: the one seen
    # on every case if there is one, else all those that match this case.
    names = [misreading] if misreading else [
        name for name, (kwargs, _) in MISREADINGS.items()
        if got == rule.best_plan(case.model, case.devices, case.batch, **kwargs)]
    if names:
        why = "; or ".join(MISREADINGS[name][1] for name in names)
        return f"{head}{seen}, {why}. {need}"
    if m.total > limit:
        return f"{head}{seen}, which does not fit: {need}"
    assert want is not None  # the learner's layout fits, so some layout does
    got_mp, want_mp = got["tp"] * got["pp"], want["tp"] * want["pp"]
    if got_mp > want_mp:
        return (f"{head}{seen}: it fits, but so does {show(want)} with less model parallelism "
                f"(tp*pp = {want_mp} < {got_mp}); model parallelism puts communication on the "
                "critical path of every layer, so use as little as memory allows")
    if got_mp == want_mp and got["tp"] < want["tp"]:
        return (f"{head}{seen}: same tp*pp = {got_mp}, but the rule takes the widest TP that fits: "
                "TP inside a node (fast links) before PP (bubbles)")
    return f"{head}{seen}"


def diagnose_all_dp(cases: list[scenario.PlanCase], answers: list[programs.PlanAnswer]) -> str | None:
    """The starter's placeholder, or a plan that never looks at memory."""
    all_dp = all(a.layout == {"dp": c.devices["count"], "tp": 1, "pp": 1} for c, a in zip(cases, answers))
    need_mp = sum(rule.best_plan(c.model, c.devices, c.batch) != {"dp": c.devices["count"], "tp": 1, "pp": 1}
                  for c in cases)
    if all_dp and need_mp:
        return (f"plan answered pure DP (dp = the device count) for all {len(cases)} cases, but "
                f"{need_mp} of them need model parallelism or cannot fit at all: apply the memory "
                "model (16 bytes per parameter plus activations) and the card's rule")
    return None


# == the tensor-parallel MLP ======================================================================


SPLIT = {  # what rank r of p keeps, for the messages
    "fc1.weight": "rank r keeps rows (output features) r*ffn/p .. (r+1)*ffn/p of W1",
    "fc1.bias": "rank r keeps entries r*ffn/p .. (r+1)*ffn/p of b1",
    "fc2.weight": "rank r keeps columns (input features) r*ffn/p .. (r+1)*ffn/p of W2",
    "fc2.bias": "every rank keeps the whole b2",
}


@dataclass
class Expected:
    out: np.ndarray
    x_grad: np.ndarray
    grads: list[dict[str, np.ndarray]] = field(default_factory=list)  # whole gradients per block
    weights: list[scenario.Weights] = field(default_factory=list)


def single_device(case: scenario.MlpCase) -> Expected:
    """The same blocks as one plain torch module on one device, forward and backward."""
    programs.one_thread()
    x0, gout, weights = scenario.mlp_inputs(case)
    layers: list[nn.Module] = []
    linears: list[tuple[nn.Linear, nn.Linear]] = []
    for w1, b1, w2, b2 in weights:
        fc1, fc2 = nn.Linear(case.hidden, case.ffn).double(), nn.Linear(case.ffn, case.hidden).double()
        with torch.no_grad():
            fc1.weight.copy_(torch.from_numpy(w1))
            fc1.bias.copy_(torch.from_numpy(b1))
            fc2.weight.copy_(torch.from_numpy(w2))
            fc2.bias.copy_(torch.from_numpy(b2))
        layers += [fc1, nn.GELU(), fc2]
        linears.append((fc1, fc2))
    model = nn.Sequential(*layers)
    x = torch.from_numpy(x0.copy()).requires_grad_(True)
    out = model(x)
    (out * torch.from_numpy(gout)).sum().backward()

    def grad(t: torch.Tensor) -> np.ndarray:
        assert t.grad is not None
        return t.grad.numpy()

    grads = [{"fc1.weight": grad(fc1.weight), "fc1.bias": grad(fc1.bias),
              "fc2.weight": grad(fc2.weight), "fc2.bias": grad(fc2.bias)} for fc1, fc2 in linears]
    return Expected(out.detach().numpy(), grad(x), grads, weights)


def shard(name: str, whole: np.ndarray, rank: int, p: int) -> np.ndarray:
    """Rank ``rank``'s part of a whole gradient, by the card's split."""
    if name == "fc2.bias":
        return whole  # replicated
    if name == "fc2.weight":
        size = whole.shape[1] // p
        return whole[:, rank * size:(rank + 1) * size]
    size = whole.shape[0] // p
    return whole[rank * size:(rank + 1) * size]


def close(got: np.ndarray | str, want: np.ndarray) -> bool:
    return (isinstance(got, np.ndarray) and got.shape == want.shape
            and bool(np.allclose(got, want, rtol=RTOL, atol=ATOL)))


def worst(got: np.ndarray, want: np.ndarray) -> str:
    i = np.unravel_index(int(np.argmax(np.abs(got - want))), want.shape)
    return f"at index {tuple(int(k) for k in i)} expected {want[i]:.6g}, saw {got[i]:.6g}"


def diagnose_output(case: scenario.MlpCase, results: list[programs.MlpResult],
                    want: Expected) -> str | None:
    for rank, r in enumerate(results):
        if isinstance(r.out, str):
            return f"{case.label()}: on rank {rank} {r.out}"
        if r.out.shape != want.out.shape:
            return f"{case.label()}: rank {rank}'s output has shape {r.out.shape}, expected {want.out.shape}"
    outs = [r.out for r in results if isinstance(r.out, np.ndarray)]  # all of them, checked above
    if all(close(out, want.out) for out in outs):
        return None
    head = f"{case.label()}: the output differs from the single-device module"
    b2 = want.weights[-1][3]
    total = np.sum(outs, axis=0)
    if case.blocks == 1:
        if all(close(out, want.out + (case.p - 1) * b2) for out in outs):
            return (f"{head} by exactly (p - 1) * b2 on every rank: the bias of the row-parallel layer "
                    "was added on every rank, so the allreduce counted it p times; add it once, after the sum")
        if close(total, want.out) or close(total - (case.p - 1) * b2, want.out):
            return (f"{head}, but the ranks' outputs add up to it: each rank holds only its own partial "
                    "sum; the row-parallel output must be allreduced in forward (g)")
    for rank, out in enumerate(outs):
        if not close(out, want.out):
            return f"{head} on rank {rank}, {worst(out, want.out)}"
    return head


def diagnose_input_grad(case: scenario.MlpCase, results: list[programs.MlpResult],
                        want: Expected) -> str | None:
    for rank, r in enumerate(results):
        if isinstance(r.x_grad, str):
            return (f"{case.label()}: on rank {rank} {r.x_grad}: no gradient reached the input; "
                    "does the forward keep the autograd graph (autograd.Function, not .detach())?")
        if r.x_grad.shape != want.x_grad.shape:
            return f"{case.label()}: rank {rank}'s x.grad has shape {r.x_grad.shape}, expected {want.x_grad.shape}"
    grads = [r.x_grad for r in results if isinstance(r.x_grad, np.ndarray)]  # all, checked above
    if all(close(g, want.x_grad) for g in grads):
        return None
    head = f"{case.label()}: the input gradient dL/dx differs from the single-device module"
    total = np.sum(grads, axis=0)
    if case.blocks == 1 and close(total, want.x_grad):
        return (f"{head}, but the ranks' input gradients add up to it: each rank holds only its own "
                "shard's part; f (in front of the column-parallel layer) must allreduce in backward")
    if all(close(g, case.p * want.x_grad) for g in grads):
        return (f"{head}: it is p = {case.p} times too large on every rank: a gradient that was "
                "already whole was allreduced again")
    for rank, g in enumerate(grads):
        if not close(g, want.x_grad):
            return f"{head} on rank {rank}, {worst(g, want.x_grad)}"
    return head


def diagnose_weight_grads(case: scenario.MlpCase, results: list[programs.MlpResult],
                          want: Expected) -> str | None:
    for block in range(case.blocks):
        for name in programs.GRAD_NAMES:
            whole = want.grads[block][name]
            for rank, r in enumerate(results):
                got = r.grads[block][name]
                mine = shard(name, whole, rank, case.p)
                where = f"{case.label()}: block {block}, rank {rank}, {name}.grad"
                if isinstance(got, str):
                    return f"{case.label()}: block {block}, rank {rank}: {got}"
                if got.shape != mine.shape:
                    return (f"{where} has shape {got.shape}, expected {mine.shape}: {SPLIT[name]}")
                if not close(got, mine):
                    if close(got, case.p * mine):
                        return (f"{where} is p = {case.p} times too large: a gradient that was already "
                                "whole was allreduced again")
                    return f"{where} differs from the single-device module's, {worst(got, mine)}"
    return None
