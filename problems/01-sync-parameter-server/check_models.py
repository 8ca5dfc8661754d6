"""What problem 01's answers should be, computed in the supervisor: formulas and cost models.

The expected model is plain gradient descent on the concatenated global batch, as one process
would run it; the averaging mistakes a parameter server makes are the same descent with other
weights on each worker's gradient, so a wrong model can be named rather than only described. The
step bound is the virtual time of one synchronous step on the platform, at best. All of it is pure
given a case (and a platform), and none of it runs next to learner code.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from distlab.grading import check_part

cases = check_part(__file__, "cases")


# -- the expected model, and the mistakes it is compared with (in the supervisor) -----------------


@lru_cache(maxsize=16)
def global_batch(case: cases.Case) -> tuple[np.ndarray, np.ndarray]:
    """Every worker's examples, concatenated in worker order (as one process would hold them)."""
    data = [cases.worker_data(case, w) for w in range(case.workers)]
    return np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])


def trajectory(case: cases.Case, steps: int, weights: np.ndarray | None = None) -> list[np.ndarray]:
    """The model after 0, 1, ..., steps steps of gradient descent on the global batch.

    ``weights``: the weight of each worker's summed gradient; None means 1/B for every worker
    (B = all examples), the mean over the global batch. Other weightings model the averaging
    mistakes a parameter server makes."""
    X, y = global_batch(case)
    per_worker = np.full(case.workers, 1.0 / len(y)) if weights is None else weights
    per_example = np.repeat(per_worker, case.batches)
    models = [cases.initial_weights(case)]
    for _ in range(steps):
        w = models[-1]
        models.append(w - case.lr * (X.T @ (per_example * (cases.sigmoid(X @ w) - y))))
    return models


def sgd(case: cases.Case, weights: np.ndarray | None = None) -> np.ndarray:
    """The model after the case's K steps: what the servers must hold at the end."""
    return trajectory(case, case.steps, weights)[-1]


def averaging_mistakes(case: cases.Case) -> list[tuple[str, np.ndarray]]:
    """(what went wrong, the weight of each worker's summed gradient), most likely first."""
    n = np.array(case.batches, dtype=np.float64)
    B, W, S = n.sum(), case.workers, case.servers
    sizes = ", ".join(str(int(k)) for k in n)
    equal_workers = (f"each worker's MEAN gradient was averaged over the W = {W} workers, so each "
                     f"worker counts the same although they hold {sizes} examples: sum the "
                     f"gradients and divide by the total number of examples, {int(B)}")
    return [
        (equal_workers, 1.0 / (W * n)),
        (("the workers' mean gradients were added up but not averaged (divide the summed "
          f"gradient by the {int(B)} examples of the global batch)"), 1.0 / n),
        ((f"the summed gradient was divided by the number of workers W = {W}, not by the "
          f"number of examples B = {int(B)}"), np.full(W, 1.0 / W)),
        ((f"the summed gradient was divided by the number of servers S = {S}, not by the "
          f"number of examples B = {int(B)}"), np.full(W, 1.0 / S)),
        (f"the summed gradient was applied without dividing by the number of examples B = {int(B)}",
         np.ones(W)),
        (f"the update was divided by the number of workers W = {W} on top of the example count",
         np.full(W, 1.0 / (B * W))),
        (f"the update was divided by the number of servers S = {S} on top of the example count",
         np.full(W, 1.0 / (B * S))),
        (f"each worker's mean gradient was divided by the number of servers S = {S}",
         1.0 / (S * n)),
    ]


def close(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and bool(np.allclose(got, want,
                                                        rtol=cases.RTOL, atol=cases.ATOL))


def diagnose_model(case: cases.Case, got: np.ndarray,
                   layout: list[tuple[int, int]]) -> tuple[str, bool]:
    """What went wrong with a final model that is not the expected one, and whether that is a
    named mistake (True) or only a description of the difference (False)."""
    head = f"{case.label()}: the model after {case.steps} steps"
    want = sgd(case)
    if close(got, cases.initial_weights(case)):
        return (f"{head} is still the initial weights on every key: no update was applied (each "
                "step: pull the shards, compute the gradient, push one slice to each server, "
                "which applies lr * summed gradient / examples)"), True
    for k, model in enumerate(trajectory(case, case.steps + 2)):
        if k != case.steps and close(got, model):
            return f"{head} equals gradient descent after {k} steps, not {case.steps}", True
    for what, weights in averaging_mistakes(case):
        if close(got, sgd(case, weights=weights)):
            return f"{head} is wrong: {what}", True
    wrong = [s for s, (lo, hi) in enumerate(layout) if not close(got[lo:hi], want[lo:hi])]
    bad = np.flatnonzero(~np.isclose(got, want, rtol=cases.RTOL, atol=cases.ATOL))
    first = int(bad[0]) if bad.size else 0
    where = ""
    if 0 < len(wrong) < case.servers:
        where = (f"; only server(s) {', '.join(map(str, wrong))} hold wrong keys "
                 f"({', '.join(f'{layout[s][0]}..{layout[s][1] - 1}' for s in wrong)})")
    return (f"{head} differs from gradient descent on the global batch in {bad.size} of "
            f"{case.keys} keys; key {first}: expected {want[first]:.9g}, saw {got[first]:.9g}"
            f"{where}"), False


# -- the time of one step, at best ----------------------------------------------------------------


@dataclass(frozen=True)
class StepBound:
    """The virtual time of one synchronous step, at best, and what a check allows."""

    alpha: float  # one-way latency between a server and a worker
    wire: float  # one pull (or one push): alpha + max(W * m, M) * beta
    compute: float  # the busiest worker's gradient
    compute_sum: float  # all workers' gradients one after the other
    latency_slack: float  # (S + W) * alpha: messages posted one at a time are fine

    @property
    def bound(self) -> float:
        return 2 * self.wire + self.compute

    @property
    def limit(self) -> float:
        return cases.TIME_LIMIT * self.bound + self.latency_slack


def step_bound(case: cases.Case, platform: Any) -> StepBound:
    """One step of a synchronous parameter server on the platform (pure, given the platform):

    pull:    alpha + max(W * m, M) * beta   each server's port sends W shards of m bytes, and
                                            each worker's port takes in the model, M bytes;
    compute: 4 * n * D flops of the busiest worker (batch.gradient's declared work);
    push:    alpha + max(W * m, M) * beta   the same bytes, the other way.
    """
    pairs = [(s, w) for s in case.server_ranks for w in case.worker_ranks]
    routes = [platform.route(s, w) for s, w in pairs] + [platform.route(w, s) for s, w in pairs]
    alpha = min(r.alpha_s for r in routes)
    beta = min(r.beta_s_per_byte for r in routes)
    shard = -(-case.keys // case.servers) * cases.ITEMSIZE
    model = case.keys * cases.ITEMSIZE
    flops = [platform.device_of(w).flops for w in case.worker_ranks]
    work = [4.0 * n * case.keys / f for n, f in zip(case.batches, flops)]
    return StepBound(alpha, alpha + max(case.workers * shard, model) * beta, max(work), sum(work),
                     (case.servers + case.workers) * alpha)


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


# -- the free run's report ------------------------------------------------------------------------


def auc(y: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a click outranks a non-click (ties count half)."""
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    for value in np.unique(score):  # average ranks over ties
        tie = score == value
        ranks[tie] = ranks[tie].mean()
    pos = y > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
