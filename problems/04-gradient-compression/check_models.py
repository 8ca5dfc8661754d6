"""Problem 04's models: what the checks compare the ranks against, computed in the supervisor.

The click model and its synthetic data (from a seed), plain Adam and the float32 training that
is the AUC baseline; the codec, the three reducers and 1-bit Adam simulated in one process, with
the mistakes people make as variants of that simulation; and the bytes each method may put on
the wire. Nothing here runs learner code: check.py and check_cases.py use these to build the
expected values, and the rank programs (check_programs.py) reuse the model and the byte count.
"""

from __future__ import annotations

import numpy as np

from distlab.grading import CommStats

# -- the click model's numbers --------------------------------------------------------------------

FEATURES, HIDDEN = 32, 32  # the ranking model: 32 dense features, one tanh layer of 32 units
N_PARAMS = FEATURES * HIDDEN + HIDDEN + HIDDEN + 1  # 1089
BATCH = 32  # examples per rank and step
LR = 0.003
BETAS = (0.9, 0.999)
EPS = 1e-8
TEST_SIZE = 8000  # held-out clicks
TEST_PART = 10_000  # the "rank" the held-out set is drawn for
SCALE_BYTES = 8  # allowed per message besides the signs: a float32 scale and byte padding


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
