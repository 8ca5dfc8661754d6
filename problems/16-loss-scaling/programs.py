"""What runs on the ranks of problem 16: the learner's train_step and LossScaler on a small model
trained for real, with the harness's faults written into one rank's gradient; and the free run
(main) with its picture (figure). The ranks return what they saw and did; they judge nothing."""

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from . import cases
from .cases import PARAMS, Case, Injection, Policy


class Model:
    """The learner's view of the model: ``weights``, this rank's float32 master copy of all
    PARAMS weights (train_step updates it in place), and ``gradients()``, the gradient of this
    rank's batch loss at those weights, float32 and unscaled."""

    def __init__(self, comm: Any, case: Case) -> None:
        self.weights = np.zeros(PARAMS, dtype=np.float32)
        self._comm, self._case, self._rank, self.step = comm, case, comm.Get_rank(), 0
        self.losses: dict[int, float] = {}  # step -> the batch loss at its first backward

    def gradients(self) -> np.ndarray:
        """The backward pass: dL/dw of the mean squared error of this rank's batch (float32).
        At the case's hidden steps, the harness writes inf or nan into one rank's result here."""
        loss, grad = cases.loss_and_gradient(self._case, self._rank, self.step, self.weights)
        self.losses.setdefault(self.step, loss)
        self._comm.compute(flops=4.0 * cases.BATCH * PARAMS, label="forward+backward")
        return cases.injected(self._case, self._rank, self.step, grad)


@dataclass(frozen=True)
class Steps:
    """One rank's training, step by step: what its train_step returned, its scale afterwards,
    its weights afterwards, its batch loss before the step, and whether it asked for gradients."""

    applied: list[Any]
    scales: list[float]
    weights: list[np.ndarray]
    losses: list[float]
    asked: list[bool]


def run_training(comm: Any, solution: Any, case: Case) -> Steps:
    policy = case.policy
    model = Model(comm, case)
    scaler = solution.LossScaler(init_scale=policy.init_scale, growth_factor=policy.growth_factor,
                                 backoff_factor=policy.backoff_factor, growth_interval=policy.growth_interval)
    applied: list[Any] = []
    scales: list[float] = []
    weights: list[np.ndarray] = []
    for step in range(case.steps):
        model.step = step
        comm.mark("step")
        with np.errstate(all="ignore"):  # an overflow is the point here, not a warning
            done = solution.train_step(comm, model, scaler, case.lr)
        applied.append(bool(done) if isinstance(done, (bool, np.bool_)) else repr(done))
        scales.append(float(scaler.scale))
        weights.append(np.array(model.weights, dtype=np.float32))
    comm.mark("done")
    return Steps(applied, scales, weights, [model.losses.get(s, float("nan")) for s in range(case.steps)],
                 [s in model.losses for s in range(case.steps)])


# -- the free run: distlab run 16, distlab tune 16, distlab report 16 --------------------------------


FREE_SEED = 5  # the free run's data: a loss that starts high enough to show the training


def free_case(ranks: int, init_scale: str, growth_interval: str, growth_factor: str, backoff_factor: str,
              steps: str, faults: str) -> Case:
    if PARAMS % ranks:
        raise ValueError(f"the model's {PARAMS} weights split into equal shards over 1, 2, 3, 4, 6 ... ranks; "
                         f"got {ranks}")
    policy = Policy(float(init_scale), float(growth_factor), float(backoff_factor), int(growth_interval))
    n = int(steps)
    rng = np.random.default_rng(16)
    at = sorted(int(s) for s in rng.choice(np.arange(1, n), size=min(int(faults), n - 1), replace=False))
    kinds = ["inf", "nan", "-inf"]
    injections = tuple(Injection(s, int(rng.integers(ranks)), int(rng.integers(PARAMS)), kinds[i % 3])
                       for i, s in enumerate(at))
    return replace(Case(ranks, FREE_SEED, policy, injections), steps=n)


def main(comm, solution, init_scale="1024", growth_interval="4", growth_factor="2", backoff_factor="0.5",
         steps="48", faults="4"):
    """A free run: ``steps`` steps of the model with ``faults`` faults injected (inf, nan, -inf in
    turn, at fixed steps of a fixed seed). Rank 0 returns the steps skipped (by any rank), the
    final loss, and every rank's scale after each step, which the report draws:

        distlab tune 16 --param growth_interval=1,2,4,8,16 --metric skipped --beside loss"""
    case = free_case(comm.Get_size(), init_scale, growth_interval, growth_factor, backoff_factor, steps, faults)
    mine = run_training(comm, solution, case)
    record = np.array([mine.scales, [1.0 if a is True else 0.0 for a in mine.applied], mine.losses], dtype=np.float64)
    every = np.zeros((comm.Get_size(),) + record.shape)
    comm.Allgather(record, every)
    if comm.Get_rank() != 0:
        return None
    skipped = sorted({s for r in range(case.p) for s in range(case.steps) if every[r, 1, s] == 0})
    agree = all(np.array_equal(every[r, :2], every[0, :2]) for r in range(case.p))
    return {"skipped": len(skipped), "loss_first": round(float(np.mean(every[:, 2, 0])), 4),
            "loss": round(float(np.mean(every[:, 2, -1])), 4), "final_scale": float(every[0, 0, -1]),
            "ok": agree, "ranks": "agree on every skip and scale" if agree else "DIFFER in their skips or scales",
            "skipped_steps": skipped, "injected_steps": [i.step for i in case.injections],
            "scales_log2": [[round(float(np.log2(x)), 3) if x > 0 else None for x in every[r, 0]] for r in range(case.p)],
            "policy": case.policy.label()}


def figure(summary: dict) -> str:
    """Each rank's scale after every step on a log axis, the injected steps marked by red lines and
    the skipped ones by grey dots: the sawtooth of dynamic loss scaling. Drawn in the checker from
    rank 0's numbers (each one checked here), never from markup."""
    rows, injected = summary.get("scales_log2"), summary.get("injected_steps", [])
    if not (isinstance(rows, list) and rows and all(isinstance(row, list) and row for row in rows)):
        return ""
    if not all(isinstance(v, (int, float)) and -200 < v < 200 for row in rows for v in row):
        return ""
    scales = [[2.0 ** v for v in row] for row in rows]
    values = [v for row in scales for v in row]
    steps, lo, hi = len(scales[0]), np.log2(min(values)) - 1, np.log2(max(values)) + 1
    width, height, left, top = 760, 300, 60, 20

    def x(step: float) -> float:
        return left + (step + 0.5) * (width - left - 20) / steps

    def y(scale: float) -> float:
        return top + (hi - np.log2(scale)) * (height - top - 40) / (hi - lo)

    colours = ["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#9d755d", "#e45756"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="12">',
             f'<text x="{left}" y="14">loss scale after each step (log2), {summary.get("policy", "")}</text>']
    for e in range(int(np.ceil(lo)), int(hi) + 1):
        parts.append(f'<text x="8" y="{y(2.0**e) + 4:.1f}">2^{e}</text><line x1="{left}" x2="{width - 20}" '
                     f'y1="{y(2.0**e):.1f}" y2="{y(2.0**e):.1f}" stroke="#eee"/>')
    for k, s in enumerate(injected if isinstance(injected, list) else []):
        if isinstance(s, int) and 0 <= s < steps:  # the step's number under its line, two rows apart
            parts.append(f'<line x1="{x(s):.1f}" x2="{x(s):.1f}" y1="{top}" y2="{height - 40}" stroke="#cf222e" '
                         f'stroke-dasharray="4 3"/><text x="{x(s) - 6:.1f}" y="{height - 28 + 11 * (k % 2)}" '
                         f'fill="#cf222e" font-size="10">{s}</text>')
    for r, row in enumerate(scales):
        points = " ".join(f"{x(s):.1f},{y(float(v)) + 2 * r:.1f}" for s, v in enumerate(row))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colours[r % 6]}" stroke-width="2"/>'
                     f'<text x="{width - 150}" y="{top + 16 + 14 * r}" fill="{colours[r % 6]}">rank {r}</text>')
    for s in summary.get("skipped_steps", []):
        if isinstance(s, int) and 0 <= s < steps:
            parts.append(f'<circle cx="{x(s):.1f}" cy="{height - 48}" r="3" fill="#888"/>')
    parts.append(f'<text x="{left}" y="{height - 2}">grey dots: skipped steps; dashed red: the injected faults, '
                 'with their steps</text>')
    return "".join(parts) + "</svg>"
