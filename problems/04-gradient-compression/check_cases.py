"""Problem 04's cases: the scenario's numbers, and every hidden variant derived from the seed.

What one session launches (Plan, from plan_for(seed)): the compressor unit cases, the reducers on
4 and a hidden 2 or 3 ranks, 1-bit Adam on known gradients with a slow worker, the training runs
and the timed allreduces; the inputs both sides regenerate from a case's seed (wire_input,
adam_gradients); what the rank programs send back; and the scenario's network. The order of the
random draws in plan_for and codec_case is what makes --seed replay a session: keep it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distlab.grading import CommStats, check_part, uniform

models = check_part(__file__, "models")

# -- the scenario's numbers -----------------------------------------------------------------------

STEPS = 300  # training steps of each run
WARMUP_FRACTIONS = (0.15, 0.2, 0.25)
AUC_FP16 = 0.005  # catalog: FP16 within 0.005 of FP32
AUC_ONEBIT = 0.01  # catalog: 1-bit Adam within 0.01 of FP32

SLOW_ALPHA_S, SLOW_BETA = 50e-6, 8e-9  # the workers' link: 50 us, 1 Gb/s
TIMED_N = 1 << 20  # elements of the timed allreduces (4 MiB of float32)
TIME_SLACK = 1.25  # the 1-bit allreduce within 25% of its bound
FP16_TOLERANCE = 0.02  # FP16 bytes within 2% of half of FP32's
VOLUME_TOLERANCE = 0.05  # 1-bit Adam's total volume within 5% of w + (1-w)/32 of FP32's
TOPK_KEEPS = (0.1, 0.01)  # keep fractions of the top-k check (90% and 99% compression)
SWEEP_KEEPS = (0.5, 0.2, 0.1, 0.01, 0.001)  # the Tune sweep: 50 / 80 / 90 / 99 / 99.9 %
SLOW_WORKER_DELAY_S = 0.005


# -- the cases, and what comes back -------------------------------------------------------------


@dataclass(frozen=True)
class CodecCase:
    """Compressor unit cases, run on one rank. The supervisor makes every input."""

    vectors: tuple[tuple[np.ndarray, int, str], ...]  # (x, chunks, what it probes)
    given: tuple[np.ndarray, np.ndarray, int]  # (signs, scales, n) for decompress alone
    feedback: tuple[np.ndarray, np.ndarray, int]  # (x, initial error, chunks), compressed 3 times


@dataclass
class CodecResult:
    compressed: list[Any] = field(default_factory=list)  # (signs, scales) or a description
    roundtrip: list[Any] = field(default_factory=list)  # decompress(compress(x))
    decompressed: Any = None  # decompress(given)
    feedback: list[Any] = field(default_factory=list)  # (decompressed, error) after each call


@dataclass(frozen=True)
class WireCase:
    """Each reducer on p ranks, on inputs that both sides regenerate from the seed."""

    p: int
    n: int
    seed: int
    keeps: tuple[float, ...] = TOPK_KEEPS


@dataclass
class OpResult:
    value: Any  # what the reducer left in the buffer (or a description)
    state: tuple[Any, ...] = ()  # the arguments after the buffer, after the call
    stats: CommStats | None = None


@dataclass(frozen=True)
class AdamCase:
    p: int
    n: int
    seed: int
    steps: int
    warmup: int
    lr: float = 0.01


@dataclass(frozen=True)
class TrainCase:
    p: int
    seed: int
    steps: int
    warmup: int

    def label(self) -> str:
        return (f"p = {self.p}, {self.steps} steps of {models.BATCH} clicks per rank, warmup "
                f"{self.warmup} steps (w = {self.warmup / self.steps:.2f}), seed {self.seed}")


@dataclass
class TrainResult:
    fp16_params: Any
    onebit_params: Any
    fp16_bytes: list[float]  # wire bytes of each step
    onebit_bytes: list[float]


@dataclass(frozen=True)
class TimedCase:
    p: int
    n: int
    method: str  # "fp16" or "onebit"
    seed: int


def wire_input(seed: int, rank: int, n: int, what: str) -> np.ndarray:
    """A rank's input vector for one reducer call (float32)."""
    rng = np.random.default_rng([seed, rank, sum(map(ord, what))])
    x = rng.standard_normal(n) * np.exp(rng.uniform(-3, 1, n))  # magnitudes over 2 decades
    if what == "fp16 large":
        # Same-signed values near 30000 in the first 16 elements: their float16 sum over p ranks
        # passes 65504 unless each rank divides by p first.
        x[:16] = 30000 + rng.uniform(0, 1000, 16)
    return x.astype(np.float32)


def adam_gradients(case: AdamCase) -> list[list[np.ndarray]]:
    """grads[t][r]: a drift shared by the ranks plus rank noise, with per-element scales."""
    rng = np.random.default_rng([case.seed, 7])
    scale = np.exp(rng.uniform(-4, 0, case.n)).astype(np.float32)
    drift = rng.standard_normal(case.n).astype(np.float32)
    return [[((drift + rng.standard_normal(case.n)) * scale).astype(np.float32)
             for _ in range(case.p)] for _ in range(case.steps)]


# -- building the cases -------------------------------------------------------------------------


def codec_case(rng: np.random.Generator) -> CodecCase:
    def vector(n: int, magnitudes: list[float]) -> np.ndarray:
        bounds = models.chunk_bounds(n, len(magnitudes))
        x = rng.standard_normal(n)
        for c, m in enumerate(magnitudes):
            x[bounds[c] : bounds[c + 1]] *= m
        return x.astype(np.float32)

    n1 = 8 * int(rng.integers(40, 80)) + int(rng.integers(1, 8))  # not a multiple of 8
    n2 = int(rng.integers(13, 40))
    vectors = (
        (vector(n1, [1e-3, 10.0, 0.1, 1.0]), 4, f"n = {n1}, 4 chunks of very different sizes"),
        (vector(n2, [1.0, 50.0, 1.0]), 3, f"n = {n2}, 3 chunks, not multiples of 8"),
        (vector(64, [1.0]), 1, "n = 64, one chunk"),
    )
    given_x = vector(n1, [0.5, 2.0, 8.0, 1e-2])
    signs, scales = models.sim_compress(given_x, 4)
    scales = (scales * rng.uniform(0.5, 2.0, 4)).astype(np.float32)
    fb_n = int(rng.integers(100, 300))
    feedback = (vector(fb_n, [1.0, 0.01]), (rng.standard_normal(fb_n) * 0.3).astype(np.float32), 2)
    return CodecCase(vectors, (signs, scales, n1), feedback)


@dataclass(frozen=True)
class Plan:
    """Everything one session launches, derived from the seed."""

    codec: CodecCase
    wires: tuple[WireCase, ...]
    adam: AdamCase
    slow_worker: int
    train: TrainCase
    timed: tuple[TimedCase, ...]


def plan_for(seed: int) -> Plan:
    rng = np.random.default_rng([seed, 4])
    wires = tuple(WireCase(p, int(rng.integers(20_000, 40_000)), int(rng.integers(1 << 31)))
                  for p in (4, int(rng.choice([2, 3]))))
    adam = AdamCase(p=4, n=int(rng.integers(600, 900)), seed=int(rng.integers(1 << 31)), steps=8,
                    warmup=int(rng.integers(2, 4)))
    steps = STEPS
    warmup = round(float(rng.choice(WARMUP_FRACTIONS)) * steps)
    train = TrainCase(4, int(rng.integers(1 << 31)), steps, warmup)
    timed_n = TIMED_N + int(rng.integers(0, 4096))
    timed = tuple(TimedCase(4, timed_n, method, int(rng.integers(1 << 31)))
                  for method in ("fp16", "onebit"))
    return Plan(codec_case(rng), wires, adam, int(rng.integers(4)), train, timed)


def slow_link(p: int) -> Any:
    """The scenario's network: every worker on one switch, 50 us and 1 Gb/s per route."""
    return uniform(p, SLOW_ALPHA_S, SLOW_BETA)
