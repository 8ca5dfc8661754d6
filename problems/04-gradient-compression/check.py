"""Checks for problem 04, gradient compression: FP16, 1-bit compression, 1-bit Adam, top-k.

The story: one launch of real ranks on a modelled 1 Gb/s link runs everything. First the codec
alone on one rank: signs packed 8 per byte, one mean-|x| scale per chunk, an error that carries what
each compression lost. Then each reducer on p ranks (4, and a hidden 2 or 3): its values against a
single-process simulation computed here, and its bytes on the wire against float32's. Then 1-bit
Adam for a few steps on known gradients, with one worker slowed down: its parameters must be what
1-bit Adam computes, step by step. Then real training of a small click-through-rate model on 4
ranks, FP16 and 1-bit Adam, judged by the AUC of the held-out clicks against float32 Adam
simulated here, and by the volume the whole run sent. Last, the virtual clock: the 1-bit allreduce
of a 4 MiB vector within 25% of its alpha-beta bound.

Bytes on the wire are comm.stats' point-to-point bytes plus, for a built-in collective, the bytes
its ring algorithm sends per rank (an Allreduce of n bytes: 2(p-1)/p n), which is also what the
virtual clock charges for it.

Hidden variants: the data, the model's initial weights and the reducers' inputs come from the
seed, and so do the extra rank count (2 or 3), the vector lengths, the warmup fraction (15, 20 or
25% of the steps) and the slow worker.
"""

from __future__ import annotations

import csv
import math
import os
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distlab.grading import CheckContext, Checklist, Task, parse_fault_plan, uniform
from distlab.runtime.stats import CommStats

# -- the scenario's numbers -----------------------------------------------------------------------

FEATURES, HIDDEN = 32, 32  # the ranking model: 32 dense features, one tanh layer of 32 units
N_PARAMS = FEATURES * HIDDEN + HIDDEN + HIDDEN + 1  # 1089
BATCH = 32  # examples per rank and step
STEPS = 300  # training steps of each run
LR = 0.003
BETAS = (0.9, 0.999)
EPS = 1e-8
TEST_SIZE = 8000  # held-out clicks
TEST_PART = 10_000  # the "rank" the held-out set is drawn for
WARMUP_FRACTIONS = (0.15, 0.2, 0.25)
AUC_FP16 = 0.005  # catalog: FP16 within 0.005 of FP32
AUC_ONEBIT = 0.01  # catalog: 1-bit Adam within 0.01 of FP32

SLOW_ALPHA_S, SLOW_BETA = 50e-6, 8e-9  # the workers' link: 50 us, 1 Gb/s
TIMED_N = 1 << 20  # elements of the timed allreduces (4 MiB of float32)
TIME_SLACK = 1.25  # the 1-bit allreduce within 25% of its bound
FP16_TOLERANCE = 0.02  # FP16 bytes within 2% of half of FP32's
SCALE_BYTES = 8  # allowed per message besides the signs: a float32 scale and byte padding
VOLUME_TOLERANCE = 0.05  # 1-bit Adam's total volume within 5% of w + (1-w)/32 of FP32's
TOPK_KEEPS = (0.1, 0.01)  # keep fractions of the top-k check (90% and 99% compression)
SWEEP_KEEPS = (0.5, 0.2, 0.1, 0.01, 0.001)  # the Tune sweep: 50 / 80 / 90 / 99 / 99.9 %
SLOW_WORKER_DELAY_S = 0.005


# -- helpers the learner's file also has (duplicated here: never trust the ranks' copy) ----------


def chunk_bounds(n: int, p: int) -> list[int]:
    base, extra = divmod(n, p)
    bounds = [0]
    for i in range(p):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return bounds


def topk_count(n: int, keep_fraction: float) -> int:
    return min(n, max(1, round(keep_fraction * n))) if n else 0


def packed_size(length: int) -> int:
    return (length + 7) // 8


# -- the data: synthetic clicks, from a seed ------------------------------------------------------


def teacher(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The hidden click model: a small tanh network, and the scale of each feature (0.1 to 5:
    features in very different units, as raw CTR features are)."""
    rng = np.random.default_rng([seed, 0])
    w_hidden = rng.standard_normal((FEATURES, 16)) / np.sqrt(FEATURES) * 2.0
    w_out = rng.standard_normal(16)
    scales = np.exp(rng.uniform(np.log(0.1), np.log(5.0), FEATURES))
    return w_hidden, w_out, scales


def examples(seed: int, part: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` examples (features, clicks) of shard ``part``: a rank's, or TEST_PART's."""
    w_hidden, w_out, scales = teacher(seed)
    rng = np.random.default_rng([seed, 1, part])
    z = rng.standard_normal((count, FEATURES))
    logit = np.tanh(z @ w_hidden) @ w_out - 1.0
    clicks = (rng.random(count) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return (z * scales).astype(np.float32), clicks


def init_params(seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 2])
    theta = np.zeros(N_PARAMS, dtype=np.float32)
    w1 = FEATURES * HIDDEN
    theta[:w1] = rng.standard_normal(w1) / np.sqrt(FEATURES)
    theta[w1 + HIDDEN : w1 + 2 * HIDDEN] = rng.standard_normal(HIDDEN) / np.sqrt(HIDDEN)
    return theta


def _layers(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    w1 = FEATURES * HIDDEN
    return (theta[:w1].reshape(FEATURES, HIDDEN), theta[w1 : w1 + HIDDEN],
            theta[w1 + HIDDEN : w1 + 2 * HIDDEN], theta[-1:])


def predict(theta: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Click scores (logits) of the model for the rows of x."""
    w1, b1, w2, b2 = _layers(theta)
    return np.tanh(x @ w1 + b1) @ w2 + b2[0]


def gradient(theta: np.ndarray, x: np.ndarray, clicks: np.ndarray) -> np.ndarray:
    """Gradient of the mean log-loss over the batch, flat like theta (float32)."""
    w1, b1, w2, b2 = _layers(theta)
    h = np.tanh(x @ w1 + b1)
    z = np.clip(h @ w2 + b2[0], -30, 30)
    dz = (1 / (1 + np.exp(-z)) - clicks) / len(clicks)
    dh = np.outer(dz, w2) * (1 - h * h)
    return np.concatenate([(x.T @ dh).ravel(), dh.sum(0), h.T @ dz, [dz.sum()]]).astype(np.float32)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a click outranks a non-click (ties count half)."""
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]  # 1-based, ties averaged
    positive = labels == 1
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return 0.5
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def held_out_auc(seed: int, theta: np.ndarray) -> float:
    x, clicks = examples(seed, TEST_PART, TEST_SIZE)
    theta = np.asarray(theta, dtype=np.float64)
    if theta.shape != (N_PARAMS,) or not np.isfinite(theta).all():
        return float("nan")
    return auc(predict(theta, x), clicks)


class Adam:
    """Plain Adam (torch.optim.Adam's update), on a flat float32 vector, in place."""

    def __init__(self, params: np.ndarray, lr: float) -> None:
        self.params, self.lr, self.t = params, lr, 0
        self.m = np.zeros_like(params)
        self.v = np.zeros_like(params)

    def step(self, grad: np.ndarray) -> None:
        b1, b2 = BETAS
        self.t += 1
        self.m = b1 * self.m + (1 - b1) * grad
        self.v = b2 * self.v + (1 - b2) * grad * grad
        m_hat, v_hat = self.m / (1 - b1**self.t), self.v / (1 - b2**self.t)
        self.params -= (self.lr * m_hat / (np.sqrt(v_hat) + EPS)).astype(np.float32)


def simulate_fp32_training(seed: int, p: int, steps: int) -> np.ndarray:
    """The baseline: float32 Adam on the mean gradient of the p shards, in one process."""
    shards = [examples(seed, r, steps * BATCH) for r in range(p)]
    theta = init_params(seed)
    adam = Adam(theta, LR)
    for t in range(steps):
        batch = slice(t * BATCH, (t + 1) * BATCH)
        grads = [gradient(theta, x[batch], y[batch]) for x, y in shards]
        adam.step(np.sum(grads, axis=0) / p)
    return theta


# -- the reducers, simulated in one process (float32, as the ranks compute) -----------------------


def sim_compress(x: np.ndarray, chunks: int) -> tuple[np.ndarray, np.ndarray]:
    bounds = chunk_bounds(x.size, chunks)
    signs = [np.packbits(x[bounds[c] : bounds[c + 1]] >= 0) for c in range(chunks)]
    scales = np.array([np.abs(x[bounds[c] : bounds[c + 1]]).mean() if bounds[c + 1] > bounds[c]
                       else 0.0 for c in range(chunks)], dtype=np.float32)
    return np.concatenate(signs).astype(np.uint8), scales


def sim_decompress(signs: np.ndarray, scales: np.ndarray, n: int) -> np.ndarray:
    bounds = chunk_bounds(n, scales.size)
    out = np.empty(n, dtype=np.float32)
    offset = 0
    for c in range(scales.size):
        length = bounds[c + 1] - bounds[c]
        bits = np.unpackbits(signs[offset : offset + packed_size(length)], count=length)
        out[bounds[c] : bounds[c + 1]] = np.where(bits == 1, scales[c], -scales[c])
        offset += packed_size(length)
    return out


def sim_feedback(x: np.ndarray, error: np.ndarray | None, chunks: int) -> np.ndarray:
    """Compress-decompress of x + error; error (in place) keeps what was lost. None: no feedback."""
    corrected = (x + error).astype(np.float32) if error is not None else x.astype(np.float32)
    out = sim_decompress(*sim_compress(corrected, chunks), corrected.size)
    if error is not None:
        error[:] = corrected - out
    return out


def sim_onebit_allreduce(xs: list[np.ndarray], worker_errors: list[np.ndarray] | None,
                         server_errors: list[np.ndarray] | None) -> np.ndarray:
    """DeepSpeed's compressed allreduce of the p ranks' xs; the errors are updated in place
    (None: that side has no error feedback). Returns the result every rank gets."""
    p, n = len(xs), xs[0].size
    bounds = chunk_bounds(n, p)
    sent = [sim_feedback(xs[i], worker_errors[i] if worker_errors else None, p) for i in range(p)]
    out = np.empty(n, dtype=np.float32)
    for j in range(p):
        part = slice(bounds[j], bounds[j + 1])
        average = (np.sum([s[part] for s in sent], axis=0) / p).astype(np.float32)
        out[part] = sim_feedback(average, server_errors[j] if server_errors else None, 1)
    return out


def sim_topk(grads: list[np.ndarray], errors: list[np.ndarray] | None, keep: float) -> np.ndarray:
    p, n = len(grads), grads[0].size
    k = topk_count(n, keep)
    total = np.zeros(n, dtype=np.float64)
    for i in range(p):
        corrected = grads[i] + errors[i] if errors is not None else grads[i].copy()
        index = np.argpartition(np.abs(corrected), n - k)[n - k :]
        total[index] += corrected[index]
        if errors is not None:
            errors[i][:] = corrected
            errors[i][index] = 0
    return (total / p).astype(np.float32)


# 1-bit Adam and the mistakes people make with it, as variants of one simulation. The check names
# the variant a wrong solution matches.
ADAM_VARIANTS = {
    "correct": "",
    "variance not frozen": "the variance keeps being updated after the warmup (with each rank's "
                           "own gradient): freeze it at the end of the warmup",
    "no error feedback": "1-bit Adam without error feedback on either side: add what each "
                         "compression lost to the next vector",
    "no worker error feedback": "the worker side has no error feedback (worker_error unused)",
    "no server error feedback": "the server side has no error feedback (server_error unused)",
    "gradient compressed": "the gradient is compressed and averaged instead of the momentum: "
                           "update the momentum with the local gradient, then average the momentum",
    "warmup one step short": "compression starts one step early: steps 1..warmup_steps are "
                             "plain Adam",
    "warmup one step long": "compression starts one step late: step warmup_steps + 1 is compressed",
    "no bias correction": "the update lacks Adam's bias correction m / (1 - b1^t), v / (1 - b2^t)",
    "never compresses": "the momentum is never compressed: after the warmup only the 1-bit "
                        "allreduce of the momentum may travel",
}


def sim_onebit_adam(params0: np.ndarray, grads: list[list[np.ndarray]], lr: float, warmup: int,
                    variant: str = "correct") -> list[list[np.ndarray]]:
    """1-bit Adam on p ranks; grads[t][r] is rank r's gradient at step t+1. Returns the
    parameters of every rank after every step: out[t][r]."""
    b1, b2 = BETAS
    p, n = len(grads[0]), params0.size
    bounds = chunk_bounds(n, p)
    params = [params0.astype(np.float32).copy() for _ in range(p)]
    m = [np.zeros(n, np.float32) for _ in range(p)]
    v = [np.zeros(n, np.float32) for _ in range(p)]
    v_hat = [np.zeros(n, np.float32) for _ in range(p)]
    werr = [np.zeros(n, np.float32) for _ in range(p)]
    serr = [np.zeros(bounds[j + 1] - bounds[j], np.float32) for j in range(p)]
    last_warm = warmup + {"warmup one step short": -1, "warmup one step long": 1}.get(variant, 0)
    if variant == "never compresses":
        last_warm = len(grads)
    out = []
    for t, step_grads in enumerate(grads, start=1):
        if t <= last_warm:
            g = (np.sum(step_grads, axis=0) / p).astype(np.float32)
            for r in range(p):
                m[r] = b1 * m[r] + (1 - b1) * g
                v[r] = b2 * v[r] + (1 - b2) * g * g
                v_hat[r] = v[r] / (1 - b2**t)
        elif variant == "gradient compressed":
            g = sim_onebit_allreduce([x.copy() for x in step_grads], werr, serr)
            for r in range(p):
                m[r] = (b1 * m[r] + (1 - b1) * g).astype(np.float32)
        else:
            local = [(b1 * m[r] + (1 - b1) * step_grads[r]).astype(np.float32) for r in range(p)]
            if variant == "variance not frozen":
                for r in range(p):
                    v[r] = b2 * v[r] + (1 - b2) * step_grads[r] * step_grads[r]
                    v_hat[r] = v[r] / (1 - b2**t)
            worker = None if variant in ("no error feedback", "no worker error feedback") else werr
            server = None if variant in ("no error feedback", "no server error feedback") else serr
            avg = sim_onebit_allreduce(local, worker, server)
            m = [avg.copy() for _ in range(p)]
        for r in range(p):
            if variant == "no bias correction":
                update = lr * m[r] / (np.sqrt(v[r]) + EPS)
            else:
                update = lr * (m[r] / (1 - b1**t)) / (np.sqrt(v_hat[r]) + EPS)
            params[r] = params[r] - update.astype(np.float32)
        out.append([x.copy() for x in params])
    return out


# -- bytes on the wire -------------------------------------------------------------------------

# Per rank and per byte of the caller's buffer: what the built-in collective's algorithm sends.
COLLECTIVE_SHARE = {
    "Allreduce": lambda p: 2 * (p - 1) / p,  # ring: reduce-scatter + allgather
    "Iallreduce": lambda p: 2 * (p - 1) / p,
    "Reduce_scatter": lambda p: (p - 1) / p,
    "Reduce_scatter_block": lambda p: (p - 1) / p,
    "Allgather": lambda p: p - 1,  # the buffer is one rank's block
    "Bcast": lambda p: (p - 1) / p,  # a binomial tree, averaged over the ranks
    "Reduce": lambda p: (p - 1) / p,
}


def wire_bytes(stats: CommStats, p: int) -> float:
    """Bytes this rank put on the wire: its point-to-point bytes plus its collectives' share."""
    total = float(stats.bytes_sent)
    for op, nbytes in stats.op_bytes.items():
        if op in COLLECTIVE_SHARE and stats.calls.get(op):
            total += nbytes * COLLECTIVE_SHARE[op](p)
    return total


def fp32_ring_bytes(n: int, p: int) -> float:
    """What a float32 ring allreduce of n elements sends per rank: 2(p-1)/p * 4n."""
    return 2 * (p - 1) / p * 4 * n


def onebit_bytes_bound(n: int, p: int) -> float:
    """The catalog's bound for the 1-bit stage: 1/30 of float32, plus a scale per message."""
    return fp32_ring_bytes(n, p) / 30 + 2 * (p - 1) * SCALE_BYTES


def volume_ratio(warmup_fraction: float) -> float:
    """Bytes of 1-bit Adam over bytes of float32 Adam: w + (1-w)/32. Its inverse is the speed-up
    of a bandwidth-bound gradient sync (4.4x at w = 0.2)."""
    return warmup_fraction + (1 - warmup_fraction) / 32


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
        return (f"p = {self.p}, {self.steps} steps of {BATCH} clicks per rank, warmup "
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


# -- what runs on every rank ----------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A learner's return value as plain data: a NumPy array copy if it is array-like."""
    try:
        array = np.array(value)
    except Exception:  # noqa: BLE001 - anything the learner returns must come back
        return f"a {type(value).__name__}"
    return array if array.dtype != object else f"a {type(value).__name__}"


def _pair(value: Any) -> Any:
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return (_plain(value[0]), _plain(value[1]))
    length = f" of length {len(value)}" if isinstance(value, (tuple, list)) else ""
    return f"a {type(value).__name__}{length}"


@dataclass(frozen=True)
class Raised:
    """A codec call that raised: the codec is pure, so one failing call need not end the run."""

    what: str  # "ValueError: ... (file.py, line 12, in decompress)"

    def __str__(self) -> str:
        return f"raised {self.what}"


def _attempt(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported to the learner with its line
        frames = traceback.extract_tb(exc.__traceback__)
        last = frames[-1] if frames else None
        where = (f" ({os.path.basename(last.filename)}, line {last.lineno}, in {last.name})"
                 if last else "")
        return Raised(f"{type(exc).__name__}: {exc}{where}")


def run_codec(solution: Any, case: CodecCase) -> CodecResult:
    result = CodecResult()
    for x, chunks, _ in case.vectors:
        packed = _attempt(solution.compress, x.copy(), chunks)
        result.compressed.append(packed if isinstance(packed, Raised) else _pair(packed))
        if isinstance(packed, (tuple, list)) and len(packed) == 2:
            rebuilt = _attempt(solution.decompress, packed[0], packed[1], x.size)
            result.roundtrip.append(rebuilt if isinstance(rebuilt, Raised) else _plain(rebuilt))
        else:
            result.roundtrip.append(None)
    signs, scales, n = case.given
    rebuilt = _attempt(solution.decompress, signs.copy(), scales.copy(), n)
    result.decompressed = rebuilt if isinstance(rebuilt, Raised) else _plain(rebuilt)
    x, error0, chunks = case.feedback
    error = error0.copy()
    for _ in range(3):
        packed = _attempt(solution.compress_with_feedback, x.copy(), error, chunks)
        rebuilt = packed if isinstance(packed, Raised) else None
        if isinstance(packed, (tuple, list)) and len(packed) == 2:
            rebuilt = _attempt(solution.decompress, packed[0], packed[1], x.size)
            rebuilt = rebuilt if isinstance(rebuilt, Raised) else _plain(rebuilt)
        result.feedback.append((rebuilt, error.copy()))
    return result


def run_wire(comm: Any, solution: Any, case: WireCase) -> dict[str, OpResult]:
    rank, p, n = comm.Get_rank(), comm.Get_size(), case.n
    results: dict[str, OpResult] = {}

    def measured(name: str, reducer: Any, buf: np.ndarray, *state: Any) -> None:
        """Runs one reducer call on buf; keeps the result, the state after it, and its bytes."""
        before = comm.stats.snapshot()
        reducer(comm, buf, *state)
        kept = tuple(s.copy() if isinstance(s, np.ndarray) else s for s in state)
        results[name] = OpResult(buf.copy(), kept, comm.stats.since(before))

    for what in ("fp16", "fp16 large"):
        measured(what, solution.fp16_allreduce, wire_input(case.seed, rank, n, what))

    bounds = chunk_bounds(n, p)
    werr = np.zeros(n, np.float32)
    serr = np.zeros(bounds[rank + 1] - bounds[rank], np.float32)
    for round_ in (1, 2):
        measured(f"onebit {round_}", solution.onebit_allreduce,
                 wire_input(case.seed, rank, n, f"onebit {round_}"), werr, serr)

    for keep in case.keeps:
        error = np.zeros(n, np.float32)
        for round_ in (1, 2):
            measured(f"topk {keep} ef {round_}", solution.topk_allreduce,
                     wire_input(case.seed, rank, n, f"topk {keep} {round_}"), keep, error)
        measured(f"topk {keep} plain", solution.topk_allreduce,
                 wire_input(case.seed, rank, n, f"topk {keep} 1"), keep, None)
    return results


def run_adam(comm: Any, solution: Any, case: AdamCase) -> list[Any]:
    rank = comm.Get_rank()
    grads = adam_gradients(case)
    params = np.random.default_rng([case.seed, 8]).standard_normal(case.n).astype(np.float32)
    optimizer = solution.OneBitAdam(params, lr=case.lr, warmup_steps=case.warmup)
    trajectory = []
    for t in range(case.steps):
        comm.mark("step")
        optimizer.step(comm, grads[t][rank].copy())
        trajectory.append(_plain(optimizer.params))
    return trajectory


def _step_bytes(comm: Any, before: CommStats) -> float:
    return wire_bytes(comm.stats.since(before), comm.Get_size())


def run_training(comm: Any, solution: Any, case: TrainCase) -> TrainResult:
    """FP16 Adam, then 1-bit Adam, each from the same start on this rank's shard."""
    rank = comm.Get_rank()
    x, clicks = examples(case.seed, rank, case.steps * BATCH)

    theta = init_params(case.seed)
    adam, fp16_bytes = Adam(theta, LR), []
    for t in range(case.steps):
        batch = slice(t * BATCH, (t + 1) * BATCH)
        grad = gradient(theta, x[batch], clicks[batch])
        before = comm.stats.snapshot()
        solution.fp16_allreduce(comm, grad)
        fp16_bytes.append(_step_bytes(comm, before))
        adam.step(grad)
    fp16_params = theta.copy()

    theta = init_params(case.seed)
    optimizer = solution.OneBitAdam(theta, lr=LR, warmup_steps=case.warmup)
    onebit_bytes = []
    for t in range(case.steps):
        batch = slice(t * BATCH, (t + 1) * BATCH)
        grad = gradient(optimizer.params, x[batch], clicks[batch])
        before = comm.stats.snapshot()
        optimizer.step(comm, grad)
        onebit_bytes.append(_step_bytes(comm, before))
    return TrainResult(fp16_params, _plain(optimizer.params), fp16_bytes, onebit_bytes)


def run_timed(comm: Any, solution: Any, case: TimedCase) -> Any:
    rank = comm.Get_rank()
    buf = wire_input(case.seed, rank, case.n, "timed")
    if case.method == "fp16":
        solution.fp16_allreduce(comm, buf)
    else:
        bounds = chunk_bounds(case.n, case.p)
        solution.onebit_allreduce(comm, buf, np.zeros(case.n, np.float32),
                                  np.zeros(bounds[rank + 1] - bounds[rank], np.float32))
    return buf[:: max(1, case.n // 4096)].copy()


def run_case(comm: Any, solution: Any, case: Any) -> Any:
    """The one program of the checks' launch: runs one case of any kind."""
    if isinstance(case, CodecCase):
        return run_codec(solution, case)
    if isinstance(case, WireCase):
        return run_wire(comm, solution, case)
    if isinstance(case, AdamCase):
        return run_adam(comm, solution, case)
    if isinstance(case, TrainCase):
        return run_training(comm, solution, case)
    return run_timed(comm, solution, case)


# -- the free run -------------------------------------------------------------------------------


def _begin_step(comm: Any) -> None:
    """Marks a training step and declares its forward and backward pass to the virtual clock
    (about 6 flops per parameter and example), so the free run shows sync against compute."""
    comm.mark("step")
    try:
        comm.compute(flops=6 * BATCH * N_PARAMS, label="forward+backward")
    except ValueError:  # a platform without device profiles: no compute on its clock
        pass


def _train_with(comm: Any, solution: Any, seed: int, steps: int, how: str, keep: float = 1.0,
                feedback: bool = True, warmup: int = 0) -> tuple[np.ndarray, float]:
    """Trains on this rank's shard; returns the parameters and the wire bytes this rank sent."""
    rank, p = comm.Get_rank(), comm.Get_size()
    x, clicks = examples(seed, rank, steps * BATCH)
    theta = init_params(seed)
    start = comm.stats.snapshot()
    if how == "onebit":
        optimizer = solution.OneBitAdam(theta, lr=LR, warmup_steps=warmup)
        for t in range(steps):
            _begin_step(comm)
            batch = slice(t * BATCH, (t + 1) * BATCH)
            optimizer.step(comm, gradient(optimizer.params, x[batch], clicks[batch]))
        return optimizer.params, wire_bytes(comm.stats.since(start), p)
    if how == "topk":
        # Momentum SGD, as Deep Gradient Compression trains with top-k: Adam's per-element
        # normalisation would blow up the rare large values that error feedback releases.
        error = np.zeros(N_PARAMS, np.float32) if feedback else None
        velocity = np.zeros(N_PARAMS, np.float32)
        for t in range(steps):
            _begin_step(comm)
            batch = slice(t * BATCH, (t + 1) * BATCH)
            grad = gradient(theta, x[batch], clicks[batch])
            if keep < 1:
                solution.topk_allreduce(comm, grad, keep, error)
            else:
                solution.fp32_allreduce(comm, grad)
            velocity = 0.9 * velocity + grad
            theta -= (SWEEP_LR * velocity).astype(np.float32)
        return theta, wire_bytes(comm.stats.since(start), p)
    adam = Adam(theta, LR)
    reduce = solution.fp16_allreduce if how == "fp16" else solution.fp32_allreduce
    for t in range(steps):
        _begin_step(comm)
        batch = slice(t * BATCH, (t + 1) * BATCH)
        grad = gradient(theta, x[batch], clicks[batch])
        reduce(comm, grad)
        adam.step(grad)
    return theta, wire_bytes(comm.stats.since(start), p)


SWEEP_LR = 0.05


def main(comm: Any, solution: Any, sweep: str = "0", out: str = "04-sweep.csv", keep: str = "",
         feedback: str = "1", seed: str = "1", steps: str = str(STEPS),
         warmup: str = "0.2") -> Any:
    """The free run (distlab run 04, mpirun, torchrun). Three modes:

    * default: trains the ranking model with FP32, FP16 and 1-bit Adam (warmup fraction
      ``warmup``), and reports each one's held-out AUC and bytes as a fraction of FP32's, plus
      the virtual time (comm.now(), the online clock) of one 4 MiB allreduce per method;
    * ``sweep=1``: the Tune step: top-k at 50 / 80 / 90 / 99 / 99.9 % compression, with and
      without error feedback, plus the dense baseline; rank 0 writes CSV rows
      ``keep_fraction,error_feedback,auc`` to ``out``;
    * ``keep=F``: one top-k run at keep fraction F (``feedback=0`` turns error feedback off);
      returns a dict with ``auc``, for ``distlab tune``.

        distlab run 04 --solution reference
        distlab run 04 --solution reference --param sweep=1 --param out=sweep.csv
        distlab tune 04 --param keep=0.5,0.2,0.1,0.01,0.001 --fixed feedback=0 --metric auc
    """
    rank, p = comm.Get_rank(), comm.Get_size()
    seed_, steps_ = int(seed), int(steps)
    if keep:
        fraction, with_feedback = float(keep), feedback not in ("0", "no", "false")
        theta, sent = _train_with(comm, solution, seed_, steps_, "topk", fraction, with_feedback)
        if rank != 0:
            return None
        return {"auc": held_out_auc(seed_, theta), "keep_fraction": fraction,
                "error_feedback": int(with_feedback), "bytes_per_step": sent / steps_}
    if sweep not in ("", "0"):
        rows = []
        dense, _ = _train_with(comm, solution, seed_, steps_, "topk", keep=1.0)
        rows.append((1.0, "none", held_out_auc(seed_, dense) if rank == 0 else 0.0))
        for fraction in SWEEP_KEEPS:
            for with_feedback in (True, False):
                theta, _ = _train_with(comm, solution, seed_, steps_, "topk", fraction,
                                       with_feedback)
                if rank == 0:
                    label = "yes" if with_feedback else "no"
                    rows.append((fraction, label, held_out_auc(seed_, theta)))
        if rank != 0:
            return None
        path = os.path.abspath(out)
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["keep_fraction", "error_feedback", "auc"])
            for fraction, fb, value in rows:
                writer.writerow([fraction, fb, f"{value:.4f}"])
        worst = {fb: min(v for k, f, v in rows if f == fb and k >= 0.01) for fb in ("yes", "no")}
        return (f"wrote {len(rows)} rows to {path}: dense AUC {rows[0][2]:.4f}; down to keep 1%, "
                f"the worst AUC is {worst['yes']:.4f} with error feedback, "
                f"{worst['no']:.4f} without")

    w = round(float(warmup) * steps_)
    results = {}
    for how in ("fp32", "fp16", "onebit"):
        theta, sent = _train_with(comm, solution, seed_, steps_, how, warmup=w)
        results[how] = (held_out_auc(seed_, theta) if rank == 0 else 0.0, sent)
    timed = {}
    bounds = chunk_bounds(TIMED_N, p)
    for how in ("fp32", "fp16", "onebit"):
        buf = wire_input(seed_, rank, TIMED_N, "timed")
        comm.Barrier()
        start = comm.now()
        if how == "onebit":
            solution.onebit_allreduce(comm, buf, np.zeros(TIMED_N, np.float32),
                                      np.zeros(bounds[rank + 1] - bounds[rank], np.float32))
        else:
            getattr(solution, f"{how}_allreduce")(comm, buf)
        timed[how] = comm.now() - start
    if rank != 0:
        return None
    base = results["fp32"][1] or 1.0
    parts = [f"{how} AUC {a:.4f} ({b / base:.3f} of fp32's bytes)"
             for how, (a, b) in results.items()]
    times = (", ".join(f"{how} {t * 1e3:.2f} ms" for how, t in timed.items())
             if any(timed.values()) else "n/a (no virtual clock in this run)")
    return (f"{'; '.join(parts)}; w = {w / steps_:.2f}: volume formula w + (1-w)/32 = "
            f"{volume_ratio(w / steps_):.3f}. One 4 MiB allreduce, virtual: {times}")


# -- building the cases -------------------------------------------------------------------------


def codec_case(rng: np.random.Generator) -> CodecCase:
    def vector(n: int, magnitudes: list[float]) -> np.ndarray:
        bounds = chunk_bounds(n, len(magnitudes))
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
    signs, scales = sim_compress(given_x, 4)
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


def launch_all(t: CheckContext) -> tuple[Plan, Any]:
    """One launch for every check (identical launches are cached): the tasks, in order."""
    plan = plan_for(t.seed)
    slow = parse_fault_plan({"format_version": 1, "seed": t.seed, "fault": [
        {"kind": "delay", "src": plan.slow_worker, "latency_s": SLOW_WORKER_DELAY_S, "wall": True,
         "note": "a straggling worker: its sends leave 5 ms late"},
    ]}, where="04 slow-worker case")
    tasks = [Task(ranks=1, args=(plan.codec,), label="the compressor unit cases")]
    tasks += [Task(ranks=w.p, args=(w,), label=f"the reducers with p = {w.p}, n = {w.n}")
              for w in plan.wires]
    tasks.append(Task(ranks=plan.adam.p, args=(plan.adam,), faults=slow,
                      label=f"1-bit Adam on known gradients (rank {plan.slow_worker} slow)"))
    tasks.append(Task(ranks=plan.train.p, args=(plan.train,), label="the training runs"))
    tasks += [Task(ranks=c.p, args=(c,), label=f"the timed {c.method} allreduce")
              for c in plan.timed]
    world = max(task.ranks for task in tasks)
    run = t.launch(run_case, tasks, platform=slow_link(world))
    return plan, run


# -- judging ------------------------------------------------------------------------------------


def _array(value: Any) -> np.ndarray | None:
    return value if isinstance(value, np.ndarray) and value.dtype != object else None


def _close(got: Any, want: np.ndarray, rtol: float = 1e-4, atol: float = 1e-7,
           share: float = 1.0) -> bool:
    """got matches want element-wise, on at least ``share`` of the elements (a sign decided by a
    value within rounding of zero may flip between two correct programs)."""
    got = _array(got)
    if got is None or got.shape != want.shape or not np.isfinite(got).all():
        return False
    if want.size == 0:
        return True
    ok = np.isclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)
    return bool(ok.mean() >= share)


def _describe(value: Any, want: np.ndarray) -> str:
    """What a learner's array holds, against what was expected, in one phrase."""
    if isinstance(value, Raised):
        return str(value)
    got = _array(value)
    if got is None:
        return f"{value}" if isinstance(value, str) else f"a {type(value).__name__}"
    if got.shape != want.shape:
        return f"an array of shape {got.shape} (expected {want.shape})"
    finite = np.isfinite(got)
    if not finite.all():
        return (f"{int((~finite).sum())} non-finite values (inf or nan), the first at element "
                f"{int(np.argmin(finite))}")
    i = int(np.argmax(np.abs(got.astype(np.float64) - want)))
    wrong = int((~np.isclose(got, want, rtol=1e-4, atol=1e-7)).sum())
    return (f"element {i} = {got.flat[i]:.6g} where {want.flat[i]:.6g} was expected "
            f"({wrong} of {want.size} elements differ)")


def _bytes_line(sent: float, want: float) -> str:
    return f"{sent:.0f} bytes ({sent / want:.3f}x the expected {want:.0f})"


def _numbers(values: Any) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in np.asarray(values).ravel()) + "]"


def _ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def _runs_of(run: Any, kind: type) -> list[Any]:
    return [task_run for task_run in run.tasks if isinstance(task_run.task.args[0], kind)]


CHECKS = Checklist()


def _judge_compress(t: CheckContext, x: np.ndarray, chunks: int, what: str, packed: Any,
                    roundtrip: Any) -> None:
    head = f"compress(x, {chunks}) with {what}"
    want_signs, want_scales = sim_compress(x, chunks)
    if isinstance(packed, Raised):
        t.fail(f"{head} {packed}")
    if isinstance(packed, str):
        t.fail(f"{head} returned {packed}; expected a pair (signs, scales)")
    signs, scales = _array(packed[0]), _array(packed[1])
    if signs is None or signs.size == 0:
        t.fail(f"{head}: signs is {packed[0] if signs is None else 'empty'}; expected "
               f"{want_signs.size} bytes, each chunk's signs packed 8 per byte (np.packbits)")
    if signs.size == x.size and want_signs.size != x.size:
        t.fail(f"{head}: signs take {signs.size} bytes, one per element, 8x the "
               f"{want_signs.size} bytes of signs packed 8 per byte: use np.packbits")
    if signs.dtype != np.uint8 or signs.shape != want_signs.shape:
        t.fail(f"{head}: expected signs as {want_signs.size} uint8 bytes (each chunk packed on "
               f"its own: ceil(len/8) bytes per chunk); saw {signs.size} of {signs.dtype}")
    if not np.array_equal(signs, want_signs):
        byte = int(np.argmax(signs != want_signs))
        t.fail(f"{head}: sign byte {byte} is {signs[byte]}, expected {want_signs[byte]} "
               "(bit 1 where x >= 0, np.packbits of each chunk, chunk after chunk)")
    got = None if scales is None else scales.astype(np.float64).ravel()
    if got is None or got.size != chunks:
        t.fail(f"{head}: expected {chunks} scales, one per chunk; saw "
               f"{'none' if got is None else got.size}: without a scale per chunk the "
               "magnitudes cannot be rebuilt")
    if not np.allclose(got, want_scales, rtol=1e-4, atol=1e-12):
        bounds = chunk_bounds(x.size, chunks)
        parts = [x[bounds[c] : bounds[c + 1]].astype(np.float64) for c in range(chunks)]
        whole = float(np.abs(x).mean())
        if chunks > 1 and np.allclose(got, whole, rtol=1e-4):
            t.fail(f"{head}: every chunk got the scale {whole:.4g}, the mean |x| of the whole "
                   f"vector; expected one scale per chunk, {_numbers(want_scales)}: a global "
                   "scale gives small chunks huge magnitudes and big ones tiny ones")
        if np.allclose(got, [np.sqrt(np.mean(part**2)) for part in parts], rtol=1e-4):
            t.fail(f"{head}: the scales are each chunk's RMS (DeepSpeed's choice); this problem "
                   "asks for the mean |x| of each chunk, the scale that makes scale * sign(x) "
                   "closest to x")
        if np.allclose(got, 1.0):
            t.fail(f"{head}: every scale is 1: the magnitudes are lost; expected the mean |x| "
                   f"of each chunk, {_numbers(want_scales)}")
        t.fail(f"{head}: scales {_numbers(got)}, expected the mean |x| of each chunk, "
               f"{_numbers(want_scales)}")
    want = sim_decompress(want_signs, want_scales, x.size)
    if not _close(roundtrip, want, rtol=1e-5):
        t.fail(f"decompress(compress(x, {chunks})) with {what}: {_describe(roundtrip, want)}; "
               "expected +scale where the bit is 1 and -scale where it is 0")


@CHECKS.check("compressor: signs packed 8 per byte, a mean-|x| scale per chunk, error feedback",
              points=3)
def codec_round_trip(t: CheckContext) -> None:
    plan, run = launch_all(t)
    case, result = plan.codec, _runs_of(run, CodecCase)[0].values[0]
    t.say("compress / decompress on 3 vectors (chunks of very different magnitudes, lengths not "
          "multiples of 8), decompress alone, 3 calls of compress_with_feedback")
    for (x, chunks, what), packed, roundtrip in zip(case.vectors, result.compressed,
                                                     result.roundtrip):
        _judge_compress(t, x, chunks, what, packed, roundtrip)
    signs, scales, n = case.given
    want = sim_decompress(signs, scales, n)
    if not _close(result.decompressed, want, rtol=1e-6):
        t.fail(f"decompress(signs, scales, {n}) with 4 given chunks: "
               f"{_describe(result.decompressed, want)}")

    x, error0, chunks = case.feedback
    error = error0.copy()
    for call, (rebuilt, got_error) in enumerate(result.feedback, start=1):
        before = error.copy()
        want_out = sim_feedback(x, error, chunks)  # moves `error` on, as the learner's should
        head = f"compress_with_feedback(x, error, {chunks}), call {call} of 3 on the same x"
        if not _close(rebuilt, want_out, rtol=1e-5):
            if _close(rebuilt, sim_decompress(*sim_compress(x, chunks), x.size), rtol=1e-5):
                t.fail(f"{head}: what it sent is compress(x), without the error: compress "
                       "x + error, so that what earlier calls lost is sent now")
            t.fail(f"{head}: decompressing what it returned gives {_describe(rebuilt, want_out)}")
        got_error = _array(got_error)
        if got_error is not None and np.array_equal(got_error, before):
            t.fail(f"{head}: error feedback does not carry the residual: error is unchanged by "
                   "the call; it must become (x + error) - decompress(compressed), in place")
        if not _close(got_error, error, rtol=1e-4, atol=1e-6):
            t.fail(f"{head}: the error after the call holds {_describe(got_error, error)}; "
                   "expected (x + error) - decompress(compressed)")
    t.say("signs, scales, round trips and the carried error all as expected")


@CHECKS.check("FP16 allreduce: the mean within float16 precision, half the bytes of FP32 (2%)",
              points=2)
def fp16_allreduce(t: CheckContext) -> None:
    _, run = launch_all(t)
    for task_run in _runs_of(run, WireCase):
        case: WireCase = task_run.task.args[0]
        p, n = case.p, case.n
        for what in ("fp16", "fp16 large"):
            inputs = [wire_input(case.seed, r, n, what).astype(np.float64) for r in range(p)]
            mean = np.sum(inputs, axis=0) / p
            # Each value rounded to float16 (2^-11 relative), then p - 1 float16 additions.
            tol = 2.0**-10 * (p + 1) * np.sum(np.abs(inputs), axis=0) / p + 2.0**-23 * p
            label = f"p = {p}, n = {n}" + (", values near 30000 on every rank"
                                           if what == "fp16 large" else "")
            for rank, results in enumerate(task_run.values):
                got = _array(results[what].value)
                if got is None or got.shape != mean.shape:
                    t.fail(f"fp16_allreduce, {label}: rank {rank} holds "
                           f"{_describe(results[what].value, mean)}")
                if np.array_equal(got, inputs[rank].astype(np.float32)):
                    t.fail(f"fp16_allreduce, {label}: rank {rank} still holds its own gradient: "
                           "no reduction happened")
                if not np.isfinite(got).all():
                    t.fail(f"fp16_allreduce, {label}: rank {rank} holds inf where the float16 "
                           "sum of the ranks' values passes 65504, float16's largest: divide by "
                           "p before casting (PyTorch's fp16 compression hook does)")
                if not (np.abs(got - mean) <= tol).all():
                    t.fail(f"fp16_allreduce, {label}: rank {rank} holds {_describe(got, mean)}; "
                           "expected the mean over the ranks within float16 precision")
        half = fp32_ring_bytes(n, p) / 2
        sent = [wire_bytes(results["fp16"].stats, p) for results in task_run.values]
        for rank, nbytes in enumerate(sent):
            if abs(nbytes / half - 2) <= 2 * FP16_TOLERANCE:
                t.fail(f"fp16_allreduce, p = {p}, n = {n}: rank {rank} sent "
                       f"{_bytes_line(nbytes, half)}: float32 went on the wire; cast the "
                       "buffer to float16 before the allreduce")
            t.expect(abs(nbytes / half - 1) <= FP16_TOLERANCE,
                     f"about {half:.0f} bytes per rank, half of a float32 ring allreduce "
                     f"2(p-1)/p * 4n (within {FP16_TOLERANCE:.0%})",
                     f"fp16_allreduce, p = {p}, n = {n}: rank {rank} sent "
                     f"{_bytes_line(nbytes, half)}")
        ratio = max(sent) / fp32_ring_bytes(n, p)
        t.say(f"p = {p}, n = {n}: the mean within float16 precision, also with values near "
              f"30000; {max(sent):.0f} bytes per rank = {ratio:.3f} of FP32")
        t.metric(f"fp16_over_fp32_p{p}", round(ratio, 4))


def _onebit_expected(case: WireCase) -> list[tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]]:
    """Result, worker errors and server errors after each of the two calls."""
    p, n = case.p, case.n
    bounds = chunk_bounds(n, p)
    werr = [np.zeros(n, np.float32) for _ in range(p)]
    serr = [np.zeros(bounds[j + 1] - bounds[j], np.float32) for j in range(p)]
    calls = []
    for call in (1, 2):
        xs = [wire_input(case.seed, r, n, f"onebit {call}") for r in range(p)]
        out = sim_onebit_allreduce(xs, werr, serr)
        calls.append((out, [e.copy() for e in werr], [e.copy() for e in serr]))
    return calls


def _onebit_symptom(case: WireCase, call: int, got: np.ndarray | None) -> str:
    """Names what a wrong result matches, if anything we know."""
    p, n = case.p, case.n
    xs = [wire_input(case.seed, r, n, f"onebit {call}") for r in range(p)]
    mean = np.sum(xs, axis=0) / p
    if _close(got, mean, rtol=1e-4):
        return ": it is the exact mean, nothing was compressed"
    if got is not None and got.shape == mean.shape and np.allclose(np.abs(got), 1):
        return ": every value is +1 or -1: the scales are missing"
    if call == 2:
        if _close(got, sim_onebit_allreduce(xs, None, None), share=0.999):
            return (": it matches a compressed allreduce without error feedback (call 1 was "
                    "right): add worker_error and server_error, and update both in place")
        return ""
    bounds = chunk_bounds(n, p)
    workers = [sim_feedback(x, None, p) for x in xs]
    if _close(got, np.sum(workers, axis=0) / p, share=0.999):
        return (": it is the average of the workers' compressed vectors: the server side, "
                "compressing its averaged chunk once more before the allgather, is missing")
    one_scale = [sim_feedback(x, None, 1) for x in xs]
    out = np.empty(n, np.float32)
    for j in range(p):
        part = slice(bounds[j], bounds[j + 1])
        out[part] = sim_feedback(np.sum([s[part] for s in one_scale], axis=0) / p, None, 1)
    if _close(got, out, share=0.999):
        return (": it matches workers that compress with one scale for the whole vector; use "
                "one scale per server chunk (compress(x, p))")
    return ""


def _onebit_bytes_symptom(ratio: float, p: int) -> str:
    if 6 / 32 <= ratio <= 10 / 32:
        return ": about 8x the packed size: are the signs sent one per byte?"
    if abs(ratio - p / 64) <= 0.1 * p / 64:
        return (": an allgather of every rank's whole compressed vector sends (p-1) n/8 bytes; "
                "let rank j serve chunk j (scatter, then allgather) to send 2(p-1)/p n/8")
    if ratio >= 0.9:
        return ": as much as float32: is anything compressed on the wire?"
    return ""


@CHECKS.check("1-bit allreduce: DeepSpeed's exchange, within 1/30 of FP32's bytes plus scales",
              points=3)
def onebit_allreduce(t: CheckContext) -> None:
    _, run = launch_all(t)
    for task_run in _runs_of(run, WireCase):
        case: WireCase = task_run.task.args[0]
        p, n = case.p, case.n
        for call, (want, werr, serr) in enumerate(_onebit_expected(case), start=1):
            name = f"onebit {call}"
            head = f"onebit_allreduce, p = {p}, n = {n}, call {call} of 2"
            values = [results[name].value for results in task_run.values]
            for rank, got in enumerate(values):
                mine = wire_input(case.seed, rank, n, name)
                if _array(got) is not None and np.array_equal(got, mine):
                    t.fail(f"{head}: rank {rank} still holds its own input: no reduction happened")
                if not _close(got, want, share=0.999):
                    right = [r for r in range(p)
                             if r != rank and _close(values[r], want, share=0.999)]
                    hint = (f" (ranks {right} are right: the allgather of the servers' chunks "
                            "went wrong)" if right else _onebit_symptom(case, call, _array(got)))
                    t.fail(f"{head}: rank {rank} holds {_describe(got, want)}{hint}")
            for rank, results in enumerate(task_run.values):
                state = results[name].state
                got_w, got_s = state if len(state) == 2 else (None, None)
                for side, got_e in (("worker_error", got_w), ("server_error", got_s)):
                    array = _array(got_e)
                    if array is not None and array.size and not array.any():
                        t.fail(f"{head}: rank {rank}'s {side} is still all zeros: without error "
                               "feedback what each compression loses is gone for good; keep it "
                               "in the error (in place) and add it to the next vector")
                if not _close(got_w, werr[rank], rtol=1e-3, atol=1e-5, share=0.999):
                    t.fail(f"{head}: rank {rank}'s worker_error holds "
                           f"{_describe(got_w, werr[rank])}; expected (x + worker_error) - what "
                           "the worker sent, in place")
                if not _close(got_s, serr[rank], rtol=1e-3, atol=1e-5, share=0.999):
                    t.fail(f"{head}: rank {rank}'s server_error holds "
                           f"{_describe(got_s, serr[rank])}; expected (average + server_error) "
                           "- what the server sent, in place")
        bound, fp32 = onebit_bytes_bound(n, p), fp32_ring_bytes(n, p)
        sent = [wire_bytes(results["onebit 1"].stats, p) for results in task_run.values]
        for rank, nbytes in enumerate(sent):
            if nbytes > bound:
                t.fail(f"onebit_allreduce, p = {p}, n = {n}: rank {rank} sent {nbytes:.0f} bytes, "
                       f"{nbytes / fp32:.4f} of a float32 ring allreduce ({fp32:.0f}); expected at "
                       f"most {bound:.0f} (1/30 of it plus {SCALE_BYTES} bytes of scale per "
                       f"message){_onebit_bytes_symptom(nbytes / fp32, p)}")
        t.say(f"p = {p}, n = {n}: equal to the simulation in both calls, errors carried; "
              f"{max(sent):.0f} bytes per rank = 1/{fp32 / max(max(sent), 1):.1f} of FP32")
        t.metric(f"onebit_over_fp32_p{p}", round(max(sent) / fp32, 5))


def _judge_topk(t: CheckContext, task_run: Any, case: WireCase, keep: float) -> None:
    p, n, k = case.p, case.n, topk_count(case.n, keep)
    errors = [np.zeros(n, np.float32) for _ in range(p)]  # the simulation's, moved on per call
    calls = [(f"topk {keep} ef 1", "with error feedback, call 1 of 2", errors, "1"),
             (f"topk {keep} ef 2", "with error feedback, call 2 of 2", errors, "2"),
             (f"topk {keep} plain", "without error feedback (error=None)", None, "1")]
    for name, what, errs, call in calls:
        grads = [wire_input(case.seed, r, n, f"topk {keep} {call}") for r in range(p)]
        before = [e.copy() for e in errs] if errs is not None else []
        want = sim_topk(grads, errs, keep)
        head = f"topk_allreduce, p = {p}, n = {n}, keep {keep:g} (k = {k}), {what}"
        for rank, results in enumerate(task_run.values):
            got = results[name].value
            if _array(got) is not None and np.array_equal(got, grads[rank]):
                t.fail(f"{head}: rank {rank} still holds its own gradient: no reduction happened")
            if not _close(got, want, rtol=1e-4, atol=1e-6):
                hint = ""
                if call == "2" and errs is not None and _close(got, sim_topk(grads, None, keep),
                                                               rtol=1e-4, atol=1e-6):
                    hint = (": it matches top-k of the gradient alone: select from gradient + "
                            "error, so the residual gets its turn")
                t.fail(f"{head}: rank {rank} holds {_describe(got, want)}{hint}")
            if errs is None:
                continue
            state = results[name].state
            got_error = _array(state[1]) if len(state) == 2 else None
            if got_error is not None and np.array_equal(got_error, before[rank]):
                t.fail(f"{head}: rank {rank}'s error is unchanged: error feedback must keep what "
                       "was not sent, (gradient + error) off the top k")
            if not _close(got_error, errs[rank], rtol=1e-4, atol=1e-6):
                t.fail(f"{head}: rank {rank}'s error holds {_describe(got_error, errs[rank])}")
    bound = (p - 1) * k * 8 + 16 * (p - 1)
    for rank, results in enumerate(task_run.values):
        nbytes = wire_bytes(results[f"topk {keep} ef 1"].stats, p)
        if nbytes > bound:
            why = ""
            if nbytes >= 0.9 * fp32_ring_bytes(n, p):
                why = ": as much as the dense float32 allreduce; send only the k pairs"
            elif abs(nbytes / ((p - 1) * k * 12) - 1) < 0.05:
                why = ": 12 bytes per kept value; send int32 indices, not int64"
            t.fail(f"topk_allreduce, p = {p}, n = {n}, keep {keep:g}: rank {rank} sent "
                   f"{nbytes:.0f} bytes; expected at most {bound:.0f}, (p-1) k (4 + 4) for "
                   f"k = {k} int32 indices and float32 values from every rank{why}")


@CHECKS.check("top-k allreduce: the k largest of gradient + error, 8 bytes per kept value",
              points=2)
def topk_allreduce(t: CheckContext) -> None:
    _, run = launch_all(t)
    for task_run in _runs_of(run, WireCase):
        case: WireCase = task_run.task.args[0]
        for keep in case.keeps:
            _judge_topk(t, task_run, case, keep)
        t.say(f"p = {case.p}, n = {case.n}: keep {', '.join(f'{k:g}' for k in case.keeps)} with "
              "and without error feedback equal the simulation; bytes within (p-1) k 8")


@CHECKS.check("1-bit Adam: warmup, frozen variance, compressed momentum (a slow worker too)",
              points=3)
def onebit_adam_updates(t: CheckContext) -> None:
    plan, run = launch_all(t)
    case, task_run = plan.adam, _runs_of(run, AdamCase)[0]
    grads = adam_gradients(case)
    params0 = np.random.default_rng([case.seed, 8]).standard_normal(case.n).astype(np.float32)
    t.say(f"p = {case.p}, n = {case.n}, {case.steps} steps, warmup_steps = {case.warmup}, "
          f"lr = {case.lr}; every send of rank {plan.slow_worker} leaves 5 ms late")
    want = sim_onebit_adam(params0, grads, case.lr, case.warmup)
    trajectories = [[_array(x) for x in traj] for traj in task_run.values]

    def agrees(got: Any, expected: np.ndarray) -> bool:
        return _close(got, expected, rtol=1e-4, atol=1e-6, share=0.995)

    for step in range(case.steps):
        stage = ("warmup (plain Adam)" if step < case.warmup
                 else f"the {_ordinal(step - case.warmup + 1)} compressed step")
        for rank, traj in enumerate(trajectories):
            if len(traj) <= step:
                t.fail(f"rank {rank} returned no parameters for step {step + 1}")
            if agrees(traj[step], want[step][rank]):
                continue
            head = (f"1-bit Adam, warmup_steps = {case.warmup}: rank {rank}'s parameters after "
                    f"step {step + 1}, {stage}, hold "
                    f"{_describe(task_run.values[rank][step], want[step][rank])}")
            if all(x is not None and np.array_equal(x, params0) for x in traj):
                t.fail(f"{head}: the parameters never changed: step() must update params in place")
            for variant, advice in ADAM_VARIANTS.items():
                if variant == "correct":
                    continue
                other = sim_onebit_adam(params0, grads, case.lr, case.warmup, variant)
                if all(agrees(traj[s], other[s][rank]) for s in range(step + 1)):
                    t.fail(f"{head}: they match 1-bit Adam with this mistake: {advice}")
            right = [r for r in range(case.p)
                     if r != rank and agrees(trajectories[r][step], want[step][r])]
            t.fail(head + (f" (ranks {right} are right)" if right else ""))
    final = [traj[-1] for traj in trajectories if traj[-1] is not None]
    spread = max(float(np.max(np.abs(f - final[0]))) for f in final)
    t.metric("max_param_spread", spread)
    t.say(f"every step on every rank equals the simulation; ranks agree within {spread:.1e}")


@CHECKS.check("trained AUC: FP16 within 0.005 of FP32, 1-bit Adam within 0.01", points=3)
def trained_auc(t: CheckContext) -> None:
    plan, run = launch_all(t)
    case, task_run = plan.train, _runs_of(run, TrainCase)[0]
    t.say(f"a {N_PARAMS}-parameter click model: {case.label()}")
    baseline = held_out_auc(case.seed, simulate_fp32_training(case.seed, case.p, case.steps))
    untrained = held_out_auc(case.seed, init_params(case.seed))
    results: list[TrainResult] = task_run.values
    for what, key, limit in (("FP16", "fp16", AUC_FP16), ("1-bit Adam", "onebit", AUC_ONEBIT)):
        params: list[np.ndarray] = []
        for rank, result in enumerate(results):
            theta = _array(getattr(result, f"{key}_params"))
            if theta is None or theta.shape != (N_PARAMS,):
                t.fail(f"{what}: rank {rank} ended with "
                       f"{_describe(getattr(result, f'{key}_params'), init_params(0))}")
            params.append(theta)
            gap = float(np.abs(theta.astype(np.float64) - params[0]).max())
            if gap > 1e-4 * (1 + float(np.abs(params[0]).max())):
                lonely = key == "fp16" and sum(results[rank].fp16_bytes) == 0
                t.fail(f"{what} ({case.label()}): rank {rank}'s weights differ from rank 0's by "
                       f"up to {gap:.3g}: every rank must apply the same update"
                       + (" (fp16_allreduce sent nothing: each rank trained on its own clicks)"
                          if lonely else ""))
        got = held_out_auc(case.seed, params[0])
        t.metric(f"auc_{key}", round(got, 4))
        t.say(f"{what}: held-out AUC {got:.4f} (FP32 Adam {baseline:.4f}, "
              f"untrained {untrained:.4f})")
        if not baseline - got <= limit:
            why = ""
            if np.array_equal(params[0], init_params(case.seed)):
                why = ": the weights never moved"
            elif key == "onebit":
                why = (": 1-bit compression costs quality here; error feedback on both sides and "
                       "one scale per chunk are what keep it")
            shown = "nan (non-finite weights)" if math.isnan(got) else f"{got:.4f}"
            t.fail(f"{what} ({case.label()}): held-out AUC {shown}, {baseline - got:.4f} below "
                   f"FP32 Adam's {baseline:.4f}; expected within {limit}{why}")
    t.metric("auc_fp32", round(baseline, 4))


@CHECKS.check("1-bit Adam's volume: w + (1-w)/32 of FP32's (within 5%)", points=2)
def onebit_adam_volume(t: CheckContext) -> None:
    plan, run = launch_all(t)
    case, task_run = plan.train, _runs_of(run, TrainCase)[0]
    fp32, bound = fp32_ring_bytes(N_PARAMS, case.p), onebit_bytes_bound(N_PARAMS, case.p)
    w = case.warmup / case.steps
    want = volume_ratio(w)
    for rank, result in enumerate(task_run.values):
        steps = result.onebit_bytes
        for i, nbytes in enumerate(steps[: case.warmup]):
            if abs(nbytes / fp32 - 1) > FP16_TOLERANCE:
                t.fail(f"1-bit Adam ({case.label()}): rank {rank} sent "
                       f"{_bytes_line(nbytes, fp32)} in warmup step {i + 1}; expected the float32 "
                       "allreduce of the gradient, full precision while the variance settles")
        for i, nbytes in enumerate(steps[case.warmup :]):
            if nbytes > bound:
                t.fail(f"1-bit Adam ({case.label()}): rank {rank} sent {nbytes:.0f} bytes in step "
                       f"{case.warmup + i + 1}, after the warmup; expected at most {bound:.0f} "
                       f"(1/30 of float32's {fp32:.0f} plus the scales): only the 1-bit momentum "
                       "may travel once the variance is frozen")
        ratio = sum(steps) / (fp32 * case.steps)
        t.expect(abs(ratio / want - 1) <= VOLUME_TOLERANCE,
                 f"a volume of w + (1-w)/32 = {want:.4f} of float32 Adam's for w = {w:.2f} "
                 f"(within {VOLUME_TOLERANCE:.0%})",
                 f"{ratio:.4f} on rank {rank} ({case.label()})")
    ratio = sum(task_run.values[0].onebit_bytes) / (fp32 * case.steps)
    t.metric("volume_ratio", round(ratio, 4))
    t.metric("volume_formula", round(want, 4))
    t.say(f"w = {w:.2f}: volume {ratio:.4f} of FP32 (formula {want:.4f}): {1 / ratio:.2f}x less "
          f"traffic, {1 / want:.2f}x by the formula 1/(w + (1-w)/32)")


@CHECKS.check("on the 1 Gb/s link: 1-bit allreduce within 25% of its alpha-beta cost", points=2)
def onebit_time(t: CheckContext) -> None:
    _, run = launch_all(t)
    timed = {r.task.args[0].method: r for r in _runs_of(run, TimedCase)}
    case: TimedCase = timed["onebit"].task.args[0]
    p, n, a, b = case.p, case.n, SLOW_ALPHA_S, SLOW_BETA
    bounds = chunk_bounds(n, p)
    want = sim_onebit_allreduce([wire_input(case.seed, r, n, "timed") for r in range(p)],
                                [np.zeros(n, np.float32) for _ in range(p)],
                                [np.zeros(bounds[j + 1] - bounds[j], np.float32) for j in range(p)])
    for rank, got in enumerate(timed["onebit"].values):
        if not _close(got, want[:: max(1, n // 4096)], share=0.999):
            t.fail(f"the timed 1-bit allreduce (p = {p}, n = {n}): rank {rank} holds a wrong "
                   "result (see the 1-bit allreduce check)")
    fp32_cost = 2 * (p - 1) * a + fp32_ring_bytes(n, p) * b
    fp16_cost = 2 * (p - 1) * a + fp32_ring_bytes(n, p) / 2 * b
    cost = 2 * (p - 1) * a + 2 * (p - 1) / p * (n / 8) * b
    fp16_time, measured = t.measured_time(timed["fp16"]), t.measured_time(timed["onebit"])
    t.say(f"p = {p}, n = {n} float32 on 50 us, 1 Gb/s routes ({t.clock} clock): FP32 ring "
          f"{fp32_cost * 1e3:.2f} ms; FP16 {fp16_time * 1e3:.2f} ms (cost {fp16_cost * 1e3:.2f}); "
          f"1-bit {measured * 1e3:.2f} ms (cost {cost * 1e3:.2f}): "
          f"{fp32_cost / max(measured, 1e-12):.1f}x faster than FP32")
    t.performance(measured, cost, timed["onebit"])
    t.metric("fp16_s", fp16_time)
    t.metric("speedup_over_fp32", round(fp32_cost / max(measured, 1e-12), 2))
    t.expect(measured <= TIME_SLACK * cost,
             f"at most {TIME_SLACK * cost * 1e3:.2f} ms, 25% over 2(p-1) alpha + 2(p-1)/p (n/8) "
             "beta",
             f"{measured * 1e3:.2f} ms ({measured / cost:.2f}x): are the p-1 exchanges of each "
             "phase one message each (signs and scale together), overlapped by Sendrecv or "
             "Isend/Irecv?")
