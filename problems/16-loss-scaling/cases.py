"""Problem 16's cases and the policy's own trace, computed here in the supervisor.

A case is one training run: p ranks fit a linear model (PARAMS float32 master weights) to their own
batches of synthetic data whose features span eight decades of scale, so that the gradients of the
small features fall below float16's smallest normal number (6.1e-5) unless they are scaled. The
loss-scale policy's parameters are drawn per case, and so are the faults: an inf, -inf or nan
written into one element of one rank's gradient at hidden steps.

``trace(case)`` replays the whole training as the card defines it: each rank's gradient times the
scale, cast to float16, summed over the ranks, an overflow wherever the sum holds inf or nan, the
update of the float32 master weights with the unscaled mean, and the policy. Natural overflows
(the scale grown past what the large gradients allow) are part of the trace. Whether a sum of
float16 values overflows can depend on the order of the additions, which the engine chooses: a
variant whose sums come within 3% of float16's largest value is drawn again, so that every
decision of the trace holds whatever the order (tests/test_problem16.py proves the margin).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from distlab.grading import Widener

PARAMS = 48  # divisible by 2, 3 and 4: each rank owns PARAMS // p of the master weights
BATCH = 16  # samples per rank and step
STEPS = 24
LR = 0.05
FP16_MAX = 65504.0
ROUNDS_TO_INF = 65520.0  # float16 rounds a value this large or larger to inf
MARGIN = 0.03  # a natural overflow decision must hold 3% either side of float16's limit
SMALLEST_NORMAL = 6.103515625e-05  # float16's


@dataclass(frozen=True)
class Policy:
    """Dynamic loss scaling: halve (backoff) on an overflow and skip the step; grow after
    ``growth_interval`` clean steps in a row."""

    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int

    def label(self) -> str:
        return (f"scale {self.init_scale:g}, x{self.growth_factor:g} after {self.growth_interval} clean steps, "
                f"x{self.backoff_factor:g} on overflow")


@dataclass(frozen=True)
class Injection:
    step: int
    rank: int
    index: int  # the element of the rank's gradient
    kind: str  # "inf", "-inf" or "nan"

    def value(self) -> float:
        return float(self.kind)

    def label(self, p: int) -> str:
        return (f"{self.kind} injected on rank {self.rank}, element {self.index} "
                f"(in rank {self.index // (PARAMS // p)}'s shard)")


@dataclass(frozen=True, eq=False)
class RankData:
    """One rank's data, materialized for its view: its features x (steps x BATCH x PARAMS, float32)
    and targets y (steps x BATCH, float32) at every step, exactly what ``batch`` draws for it. No
    key: nothing here is shorter than the data, and no other rank's data follows from it. (Compared
    and hashed by identity, so that a view stays hashable.)"""

    rank: int
    x: np.ndarray
    y: np.ndarray


@dataclass(frozen=True)
class Case:
    p: int
    seed: int  # the checker's; -1 in a rank's view, which holds its own data instead
    policy: Policy
    injections: tuple[Injection, ...]
    steps: int = STEPS
    lr: float = LR
    own: RankData | None = None  # a rank's view: its own batches, every step's

    def label(self) -> str:
        return f"p = {self.p}, {self.policy.label()}"  # not its seed, which gives every rank's data away (--seed replays it)

    def injected_at(self, step: int) -> list[Injection]:
        return [i for i in self.injections if i.step == step]

    def batch(self, rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        """``rank``'s samples at ``step``: drawn from the seed (the whole case), or read from the
        rank's own materialized data (its view), the same values either way."""
        if self.own is None:
            return batch(data_keys(self.seed, rank), step)
        if rank != self.own.rank:
            raise ValueError(f"rank {self.own.rank}'s view of the case holds no data of rank {rank}")
        return self.own.x[step], self.own.y[step]

    def for_rank(self, rank: int) -> Case:
        """What rank ``rank``'s process is handed: its own batches, materialized, and its own
        faults, none of another rank's and no key (with them, one process could compute the whole
        training alone; with a key of a few bytes, a rank could pass it to the others in a message)."""
        drawn = [self.batch(rank, step) for step in range(self.steps)]
        x = np.array([b[0] for b in drawn], np.float32).reshape(self.steps, BATCH, PARAMS)
        y = np.array([b[1] for b in drawn], np.float32).reshape(self.steps, BATCH)
        x.flags.writeable = y.flags.writeable = False
        return replace(self, seed=-1, injections=tuple(i for i in self.injections if i.rank == rank),
                       own=RankData(rank, x, y))


# -- the data: every rank's here, only its own in a rank ------------------------------------------


def data_keys(seed: int, rank: int) -> tuple[int, int]:
    """The key of what every rank shares (the features' scales, the teacher) and the key of
    ``rank``'s batches, both drawn from the case's seed. Neither reaches a rank: its view
    (Case.for_rank) holds the batches themselves, drawn here."""
    shared = int(np.random.default_rng([seed, 16, 0]).integers(2**62))
    return shared, int(np.random.default_rng([seed, 16, 2, rank]).integers(2**62))


@lru_cache(maxsize=64)
def feature_scales(shared: int) -> np.ndarray:
    """Each feature's scale, 1 down to 1e-8: the small ones give gradients float16 cannot hold."""
    rng = np.random.default_rng([shared, 0])
    return (10.0 ** -rng.uniform(0.0, 8.0, PARAMS)).astype(np.float32)


@lru_cache(maxsize=64)
def teacher_of(shared: int) -> np.ndarray:
    """The weights the targets come from (the same for every batch of a case)."""
    return np.random.default_rng([shared, 1]).standard_normal(PARAMS)


def batch(keys: tuple[int, int], step: int) -> tuple[np.ndarray, np.ndarray]:
    """The samples of the rank whose ``keys`` these are, at ``step``: features x (BATCH x
    PARAMS, float32) and targets y."""
    shared, own = keys
    teacher, rng = teacher_of(shared), np.random.default_rng([own, step])
    x = (rng.standard_normal((BATCH, PARAMS)) * feature_scales(shared)).astype(np.float32)
    y = (x.astype(np.float64) @ teacher * 3.0 + 0.1 * rng.standard_normal(BATCH)).astype(np.float32)
    return x, y


def loss_and_gradient(case: Case, rank: int, step: int, weights: np.ndarray) -> tuple[float, np.ndarray]:
    """The mean squared error of the rank's batch at ``weights`` (float32), and its gradient."""
    x, y = case.batch(rank, step)
    residual = x @ weights.astype(np.float32) - y
    return float(0.5 * np.mean(residual.astype(np.float64) ** 2)), (x.T @ residual / np.float32(BATCH)).astype(np.float32)


def injected(case: Case, rank: int, step: int, gradient: np.ndarray) -> np.ndarray:
    """The gradient as the harness hands it to the learner: with this step's faults written in."""
    out = gradient.copy()
    for fault in case.injected_at(step):
        if fault.rank == rank:
            out[fault.index] = fault.value()
    return out


# -- the policy and the trace ----------------------------------------------------------------------


def policy_scales(policy: Policy, overflows: list[bool], reset: bool = True) -> list[float]:
    """The scale after each step, given which steps overflowed: the policy, or (reset=False) the
    policy misread, its count of clean steps never restarted on an overflow."""
    scale, clean, after = policy.init_scale, 0, []
    for overflow in overflows:
        if overflow:
            scale, clean = scale * policy.backoff_factor, 0 if reset else clean
        else:
            clean += 1
            if clean == policy.growth_interval:
                scale, clean = scale * policy.growth_factor, 0
        after.append(scale)
    return after


@dataclass
class Trace:
    """The training as the card defines it, step by step."""

    scale_used: list[float] = field(default_factory=list)  # the scale each step multiplied by
    scale_after: list[float] = field(default_factory=list)
    overflow: list[bool] = field(default_factory=list)
    natural: list[bool] = field(default_factory=list)  # an overflow with no fault injected
    peak: list[float] = field(default_factory=list)  # the largest |float16 partial sum| of the step, any order
    weights: list[np.ndarray] = field(default_factory=list)  # after each step
    losses: list[list[float]] = field(default_factory=list)  # [step][rank], before the step
    path: np.ndarray = field(default_factory=lambda: np.zeros(PARAMS))  # sum of |update| per weight
    ambiguous: list[int] = field(default_factory=list)  # steps whose decision depends on the order
    sum_only: list[bool] = field(default_factory=list)  # a natural overflow of the sum, every rank's own cast finite


def in_order(contributions: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """The float16 sum of the ranks' contributions, added one by one in an order drawn per element."""
    parts = np.array(contributions)
    orders = np.argsort(rng.random(parts.shape), axis=0)  # a permutation of the ranks per element
    total = np.zeros(PARAMS, np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(len(contributions)):
            total = (total + np.take_along_axis(parts, orders[k:k + 1], 0)[0]).astype(np.float16)
    return total


def partial_sum_peak(scaled: np.ndarray) -> float:
    """The largest magnitude any partial sum of the ranks' scaled gradients (ranks x PARAMS) can
    reach, whatever the order of the additions: the sum of one sign's terms, per element. Below
    float16's largest value, no order overflows; past it with the whole sum, every order does."""
    return float(max(np.where(scaled > 0, scaled, 0).sum(0).max(), -np.where(scaled < 0, scaled, 0).sum(0).min()))


@dataclass
class Step:
    """One step at given weights and scale: the ranks' losses, their scaled float32 gradients
    (before any fault and cast), the float16 sum, and the update it makes (None: an overflow)."""

    losses: list[float]
    raw: np.ndarray
    summed: np.ndarray
    update: np.ndarray | None


def one_step(case: Case, step: int, weights: np.ndarray, scale: float, order: np.random.Generator | None = None,
             cast_first: bool = False, flag_own: bool = False) -> Step:
    """The card's step. The float16 sum is exact, rounded once, unless ``order`` draws an order of
    float16 additions per element as an engine may (the tests' noise model); ``cast_first`` casts
    before scaling, and ``flag_own`` decides the overflow on each rank's own float16 gradient
    instead of on the sum (an overflow of the sum alone is then applied): mistakes the checker
    recognises by them."""
    contributions, raw, losses = [], [], []
    for rank in range(case.p):
        loss, grad = loss_and_gradient(case, rank, step, weights)
        losses.append(loss)
        raw.append(grad.astype(np.float64) * scale)
        with np.errstate(over="ignore", invalid="ignore"):
            faulty = injected(case, rank, step, grad)
            contributions.append(faulty.astype(np.float16) * scale if cast_first
                                 else (faulty * np.float32(scale)).astype(np.float16))
    with np.errstate(over="ignore", invalid="ignore"):
        summed = np.array(contributions, np.float64).sum(0).astype(np.float16) if order is None \
            else in_order(contributions, order)
    own_overflow = not all(np.isfinite(c).all() for c in contributions)
    if own_overflow if flag_own else not np.isfinite(summed).all():
        return Step(losses, np.array(raw), summed, None)
    with np.errstate(over="ignore", invalid="ignore"):
        mean = summed.astype(np.float32) / np.float32(scale * case.p)  # unscaled in float32
    return Step(losses, np.array(raw), summed, np.float32(case.lr) * mean)


def trace(case: Case, order: np.random.Generator | None = None, cast_first: bool = False,
          flag_own: bool = False) -> Trace:
    """The card's training, step by step (``order``, ``cast_first`` and ``flag_own`` as in one_step)."""
    out, weights = Trace(), np.zeros(PARAMS, np.float32)
    scale, clean = case.policy.init_scale, 0
    for step in range(case.steps):
        with np.errstate(all="ignore"):  # flag_own: weights an overflowed sum made inf
            now = one_step(case, step, weights, scale, order, cast_first, flag_own)
        peak = partial_sum_peak(now.raw)
        certain = float(np.abs(now.raw.sum(0)).max()) >= ROUNDS_TO_INF * (1 + MARGIN)
        if not case.injected_at(step) and not certain and peak >= FP16_MAX * (1 - MARGIN):
            out.ambiguous.append(step)
        out.scale_used.append(scale)
        out.losses.append(now.losses)
        out.overflow.append(now.update is None)
        out.natural.append(now.update is None and not case.injected_at(step))
        out.sum_only.append(out.natural[-1] and float(np.abs(now.raw).max()) < FP16_MAX * (1 - MARGIN))
        out.peak.append(peak)
        if now.update is None:
            scale, clean = scale * case.policy.backoff_factor, 0
        else:
            out.path += np.abs(now.update)
            weights = (weights - now.update).astype(np.float32)
            clean += 1
            if clean == case.policy.growth_interval:
                scale, clean = scale * case.policy.growth_factor, 0
        out.scale_after.append(scale)
        out.weights.append(weights.copy())
    return out


# -- the hidden variants ---------------------------------------------------------------------------


def draw_case(rng: np.random.Generator, widen: Widener, p: int) -> Case:
    """A policy and faults at random, drawn again until the checks can read every decision."""
    while True:
        policy = Policy(float(2 ** int(rng.integers(10, 15))), float(rng.choice([2.0, 4.0])),
                        float(rng.choice([0.5, 0.25])), int(rng.integers(2, 6)))
        steps = sorted(int(s) for s in rng.choice(np.arange(1, STEPS - 2), size=3, replace=False))
        later = ["nan", str(rng.choice(["inf", "-inf", "nan"]))]
        rng.shuffle(later)
        kinds = [str(rng.choice(["inf", "-inf"]))] + later  # a nan after an inf: isinf alone shows
        faults = tuple(Injection(s, int(rng.integers(p)), int(rng.integers(PARAMS)), k) for s, k in zip(steps, kinds))
        case = Case(p, widen(int(rng.integers(1, 10**6))), policy, faults)
        if telling(case, trace(case)):
            return case


def telling(case: Case, replayed: Trace) -> bool:
    """A variant the checks can read: no decision depends on the order of the float16 additions;
    every fault falls on a step that would be clean without it (so only the owner of its shard
    sees it, and a nan is the only thing wrong with its step); a count of clean steps that is
    not restarted on an overflow would grow the scale at another step than the policy; and at
    least one step overflows in the sum alone, every rank's own float16 gradient finite (so a
    flag taken before the reduce-scatter, on the rank's own buffer, misses it); and the training
    visibly trains (its last six batch losses below its first six: the batches are noisy)."""
    quiet = all(replayed.peak[i.step] < FP16_MAX * (1 - MARGIN) for i in case.injections)
    unreset = policy_scales(case.policy, replayed.overflow, reset=False)
    trains = np.mean(replayed.losses[-6:]) < np.mean(replayed.losses[:6])
    return (not replayed.ambiguous and quiet and unreset != replayed.scale_after and any(replayed.sum_only)
            and bool(trains))


def hidden_cases(seed: int) -> list[Case]:
    """Two training runs: 4 ranks, and 2 or 3."""
    rng, widen = np.random.default_rng([seed, 16]), Widener(seed, 16)
    return [draw_case(rng, widen, 4), draw_case(rng, widen, int(rng.choice([2, 3])))]
