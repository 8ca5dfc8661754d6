"""The cases of problem 13, drawn from the seed, and the values they must reach: plain data-parallel
Adam in float64, and the ZeRO paper's memory per rank.

Both sides rebuild a training case from its seed: the teacher, every rank's batches, the initial
weights of an MLP (one hidden tanh layer, one output) of about 10^6 parameters, large enough that
the memory each rank's agent reads while it trains tells a shard of the moments from whole ones by
megabytes. Hidden variants: the layer sizes (so the parameter count never divides by the rank
count), the rank count, lr, betas and eps, and the model sizes and rank counts the memory
calculator is asked about."""

from dataclasses import dataclass
from math import ceil

import numpy as np

from distlab.grading import Widener

STEPS = 10  # Adam steps of every training case
# A training model's parameters: whole moments are 3.6 MB (p = 2) to 5.4 MB (p = 4) more than a
# shard's, and what a rank sends in 10 steps (its whole gradient and its shard, 4 (N + N / p) bytes
# a step) stays under what its agent keeps a copy of (64 MiB).
PARAMS = (900_000, 990_000)
TARGET_SHIFT = 1.5  # the targets' mean: the output bias moves by about lr every step
GB = 1e9  # the ZeRO paper's gigabytes
# Mixed-precision Adam, bytes per parameter: fp16 weights, fp16 gradients, and fp32 master weights,
# momentum and variance (the optimizer states, K = 12).
FP16_WEIGHTS, FP16_GRADS, OPTIMIZER_STATES = 2, 2, 12


@dataclass(frozen=True)
class Training:
    """An MLP of ``inputs`` -> ``hidden`` (tanh) -> 1, trained by ``p`` ranks on ``batch`` samples each."""

    p: int
    inputs: int
    hidden: int
    batch: int
    lr: float
    beta1: float
    beta2: float
    eps: float
    seed: int
    steps: int = STEPS

    @property
    def size(self) -> int:  # the parameters, flattened as W1, b1, W2, b2: the output bias is last
        return self.inputs * self.hidden + 2 * self.hidden + 1

    def shard_bytes(self) -> int:
        """The moments of one shard of ceil(N / p) parameters, float32: what a sharded Adam keeps."""
        return 2 * ceil(self.size / self.p) * 4

    def harness_bytes(self) -> int:
        """What a rank's view holds when its optimizer is about to be made: the weights, float32,
        and its batches, float64."""
        return 4 * self.size + 8 * self.steps * self.batch * (self.inputs + 1)

    def label(self) -> str:
        return (f"p = {self.p}, {self.size:,} parameters ({self.inputs}-{self.hidden}-1 MLP, N % {self.p} = "
                f"{self.size % self.p}), lr {self.lr:g}, betas ({self.beta1:g}, {self.beta2:g}), eps {self.eps:g}")

    def for_rank(self, rank: int) -> "RankData":
        return RankData(self.p, self.inputs, self.hidden, self.lr, self.beta1, self.beta2, self.eps, self.steps,
                        initial_weights(self), tuple(batch(self, rank, step) for step in range(self.steps)))


@dataclass(frozen=True)
class RankData:
    """What one rank of a training case is handed: the model's shape, Adam's hyperparameters, the initial
    weights and its own batch of each step. Never the case's seed, which would give it every rank's
    batches: the mean gradient must reach it through the ranks' messages."""

    p: int
    inputs: int
    hidden: int
    lr: float
    beta1: float
    beta2: float
    eps: float
    steps: int
    weights: np.ndarray  # the initial weights, float32, the same on every rank
    batches: tuple[tuple[np.ndarray, np.ndarray], ...]  # (inputs, targets) of each step

    @property
    def size(self) -> int:
        return self.inputs * self.hidden + 2 * self.hidden + 1

    @property
    def batch(self) -> int:  # samples per step
        return len(self.batches[0][1])


@dataclass(frozen=True)
class Baseline:
    """Plain data parallel on the same model and ranks: one allreduce of the whole gradient a step."""

    training: "Training | RankData"  # a rank holds its RankData

    def label(self) -> str:
        return f"data parallel, {self.training.label()}"

    def for_rank(self, rank: int) -> "Baseline":
        return Baseline(self.training.for_rank(rank)) if isinstance(self.training, Training) else self


@dataclass(frozen=True)
class Memory:
    """The calculator's question: GB per rank for ``params`` parameters on ``ranks`` ranks at ``stage``."""

    params: float
    ranks: int
    stage: int

    def label(self) -> str:
        return f"{self.params / 1e9:g}B parameters on {self.ranks} ranks, stage {self.stage}"


# -- the data and the model, rebuilt on both sides ----------------------------------------------------


def initial_weights(case: Training) -> np.ndarray:
    rng = np.random.default_rng([case.seed, 1])
    w1 = rng.normal(0, 1 / np.sqrt(case.inputs), (case.inputs, case.hidden))
    w2 = rng.normal(0, 1, (case.hidden, 1))  # the output is the hidden units' mean: loss_and_gradient
    return np.concatenate([w1.ravel(), np.zeros(case.hidden), w2.ravel(), np.zeros(1)]).astype(np.float32)


def batch(case: Training, rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s samples of step ``step``: inputs, and targets from a hidden teacher."""
    teacher = np.random.default_rng([case.seed, 2]).normal(0, 1, case.inputs)
    x = np.random.default_rng([case.seed, 3, rank, step]).normal(0, 1, (case.batch, case.inputs))
    return x, np.sin(x @ teacher / np.sqrt(case.inputs)) + TARGET_SHIFT


def loss_and_gradient(case: "Training | RankData", weights: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """The mean squared error over the samples, and its gradient, flattened like the weights (float64).
    The output is the mean of the hidden units' contributions: Adam moves every weight by about lr a
    step, and a plain sum over thousands of units would move the output by thousands of lr."""
    w = np.asarray(weights, dtype=np.float64)
    n, h = case.inputs, case.hidden
    w1, b1, w2, b2 = w[: n * h].reshape(n, h), w[n * h : n * h + h], w[n * h + h : n * h + 2 * h], w[-1]
    hidden = np.tanh(x @ w1 + b1)
    error = hidden @ w2 / h + b2 - y
    d_out = 2 * error / len(y)
    d_hidden = np.outer(d_out, w2 / h) * (1 - hidden**2)
    grad = np.concatenate([(x.T @ d_hidden).ravel(), d_hidden.sum(0), hidden.T @ d_out / h, [d_out.sum()]])
    return float(np.mean(error**2)), grad


def local_gradient(case: Training, weights: np.ndarray, rank: int, step: int) -> tuple[float, np.ndarray]:
    """What a rank's backward pass gives: the gradient of ITS batch's mean loss, float32."""
    loss, grad = loss_and_gradient(case, weights, *batch(case, rank, step))
    return loss, grad.astype(np.float32)


def held_out_loss(case: Training, weights: np.ndarray) -> float:
    return loss_and_gradient(case, weights, *batch(case, 99, 0))[0]


# -- the hidden variants ------------------------------------------------------------------------------


def training_case(rng: np.random.Generator, widen: Widener, p: int) -> Training:
    inputs = int(rng.integers(240, 321))
    hidden = int(rng.integers(*PARAMS)) // (inputs + 2)
    while (inputs * hidden + 2 * hidden + 1) % p == 0:  # never divisible: the shards need padding
        hidden += 1
    return Training(p, inputs, hidden, int(rng.integers(8, 17)), round(float(rng.uniform(2e-3, 2e-2)), 5),
                    round(float(rng.uniform(0.85, 0.95)), 3), round(float(rng.uniform(0.99, 0.9995)), 4),
                    float(f"{rng.uniform(1e-7, 1e-6):.2g}"), widen(int(rng.integers(1 << 31))))


def trainings(seed: int) -> tuple[Training, Training]:
    """Two training cases: 4 ranks, and 2 or 3. Their data's seeds 63 bits wide:
    from 31, a rank could find one from its own batch, and so every rank's (distlab.grading.seeds)."""
    rng, widen = np.random.default_rng([seed, 13]), Widener(seed, 13)
    return training_case(rng, widen, 4), training_case(rng, widen, int(rng.integers(2, 4)))


CLASSIC = (Memory(7.5e9, 64, 0), Memory(7.5e9, 64, 1), Memory(7.5e9, 64, 2), Memory(7.5e9, 64, 3))


def memory_cases(seed: int) -> list[Memory]:
    """The paper's 7.5B on 64 ranks at every stage, then 12 hidden sizes and rank counts."""
    rng = np.random.default_rng([seed, 31])
    hidden = [Memory(float(f"{10 ** rng.uniform(8, 11.3):.3g}"), int(2 ** rng.integers(1, 11)), stage)
              for _ in range(3) for stage in range(4)]
    return list(CLASSIC) + hidden


def shard_of(size: int, p: int, rank: int) -> tuple[int, int]:
    """The card's suggestion: rank r owns [r * ceil(N / p), (r + 1) * ceil(N / p)), cut at N."""
    per = ceil(size / p)
    return min(rank * per, size), min((rank + 1) * per, size)
