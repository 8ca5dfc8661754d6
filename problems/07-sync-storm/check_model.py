"""Problem 07's model: a wide-and-embedding click-through-rate model, its data and its gradients.

The ranks compute their gradients with this code and the checker recomputes the very same ones
outside the ranks, so it lives in one place, used by both. The parameters and the data are drawn
from generators seeded by the ``ModelSpec`` (and the step, the rank), never from global state.
``step_shapes`` lists the tensors ``gradients`` makes without computing them: the budgets are drawn
from it. The free run's held-out loss and AUC measure the model too, so they are here.
"""

from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

BATCH = 64  # examples per rank per step
LEARNING_RATE = 1.0
FINGERPRINT_BITS = 54  # int64 fingerprints above 2^53: no float64 holds them exactly
DTYPE_ORDER = ("float32", "float64", "int64")


# -- the model: a wide-and-embedding CTR model with one small tensor per field and dtype ----------


@dataclass(frozen=True)
class ModelSpec:
    """The model and data of one case; the same numbers in every rank and in the checker."""

    seed: int
    vocab: tuple[int, ...]  # rows of each field's tables
    dim: int  # embedding width
    dtypes: tuple[str, ...]  # dtypes a step's gradients carry; float32 always
    batch: int = BATCH

    @property
    def wide(self) -> bool:  # float64 wide weights and loss statistics
        return "float64" in self.dtypes

    @property
    def counts(self) -> bool:  # int64 per-row hit counts and data fingerprints
        return "int64" in self.dtypes


@functools.lru_cache(maxsize=64)
def tensor_names(spec: ModelSpec) -> list[str]:
    """The gradient tensors of one step, in the order they are handed to Fusion.add."""
    names = []
    for f in range(len(spec.vocab)):
        names.append(f"emb[{f}]")
        if spec.wide:
            names.append(f"wide[{f}]")
        if spec.counts:
            names.append(f"hits[{f}]")
    names += ["proj", "bias"]
    if spec.wide:
        names.append("loss_stats")
    if spec.counts:
        names.append("fingerprints")
    return names


@functools.lru_cache(maxsize=64)
def step_shapes(spec: ModelSpec) -> list[tuple[str, int]]:
    """(dtype, bytes) of each tensor of a step, in add order."""
    shapes = []
    for v in spec.vocab:
        shapes.append(("float32", v * spec.dim * 4))
        if spec.wide:
            shapes.append(("float64", v * 8))
        if spec.counts:
            shapes.append(("int64", v * 8))
    shapes += [("float32", spec.dim * 4), ("float32", 4)]
    if spec.wide:
        shapes.append(("float64", 16))
    if spec.counts:
        shapes.append(("int64", len(spec.vocab) * 8))
    return shapes


def init_params(spec: ModelSpec) -> dict[str, Any]:
    rng = np.random.default_rng([spec.seed, 0])
    return {
        "emb": [(0.1 * rng.standard_normal((v, spec.dim)) / math.sqrt(len(spec.vocab)))
                .astype(np.float32) for v in spec.vocab],
        "wide": [np.zeros(v, dtype=np.float64) for v in spec.vocab] if spec.wide else [],
        "proj": (rng.standard_normal(spec.dim) / math.sqrt(spec.dim)).astype(np.float32),
        "bias": np.zeros(1, dtype=np.float32),
    }


def make_batch(spec: ModelSpec, stream: int, step: int, rank: int, n: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """Feature ids (n, fields), skewed towards low ids as real traffic is, and 0/1 labels drawn
    from a hidden teacher. ``stream`` 0 is training data, 1 held-out data."""
    n = n or spec.batch
    rng = np.random.default_rng([spec.seed, 2, stream, step, rank])
    vocab = np.array(spec.vocab)
    ids = (vocab * rng.random((n, len(vocab))) ** 2).astype(np.int64)
    teacher = np.random.default_rng([spec.seed, 1])
    weights = [teacher.standard_normal(v) for v in spec.vocab]
    logit = sum(w[ids[:, f]] for f, w in enumerate(weights)) * (2.0 / math.sqrt(len(vocab)))
    labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float64)
    return ids, labels


def logits(spec: ModelSpec, params: dict[str, Any], ids: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """(z, summed embeddings) for a batch of ids; z in float64."""
    emb_sum = np.zeros((ids.shape[0], spec.dim), dtype=np.float32)
    for f, table in enumerate(params["emb"]):
        emb_sum += table[ids[:, f]]
    z = emb_sum.astype(np.float64) @ params["proj"].astype(np.float64) + float(params["bias"][0])
    for f, w in enumerate(params["wide"]):
        z += w[ids[:, f]]
    return z, emb_sum


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow for large |z|


def fingerprints(ids: np.ndarray) -> np.ndarray:
    """Per field, the sum of a 54-bit hash of the ids this rank consumed: summed over the ranks,
    it proves that every shard was read once. Sums stay below 2^63 for p <= 8 and 64 examples."""
    x = (ids.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(29)
    x += np.arange(ids.shape[1], dtype=np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
    x &= np.uint64((1 << FINGERPRINT_BITS) - 1)
    return x.astype(np.int64).sum(axis=0)


def gradients(spec: ModelSpec, params: dict[str, Any], ids: np.ndarray, labels: np.ndarray
              ) -> list[np.ndarray]:
    """This rank's gradient tensors of the summed logistic loss, in ``tensor_names`` order."""
    z, emb_sum = logits(spec, params, ids)
    prob = sigmoid(z)
    g = prob - labels
    g_proj = (g[:, None] * params["proj"][None, :]).astype(np.float32)
    out: list[np.ndarray] = []
    for f, v in enumerate(spec.vocab):
        d_emb = np.zeros((v, spec.dim), dtype=np.float32)
        np.add.at(d_emb, ids[:, f], g_proj)
        out.append(d_emb)
        if spec.wide:
            out.append(np.bincount(ids[:, f], weights=g, minlength=v).astype(np.float64))
        if spec.counts:
            out.append(np.bincount(ids[:, f], minlength=v).astype(np.int64))
    out.append((g[:, None] * emb_sum).sum(axis=0).astype(np.float32))
    out.append(np.array([g.sum()], dtype=np.float32))
    if spec.wide:
        eps = 1e-12
        loss = -(labels * np.log(prob + eps) + (1 - labels) * np.log(1 - prob + eps)).sum()
        out.append(np.array([loss, float(((prob > 0.5) == (labels > 0.5)).sum())]))
    if spec.counts:
        out.append(fingerprints(ids))
    return out


def apply_update(spec: ModelSpec, params: dict[str, Any], sums: list[np.ndarray], p: int) -> None:
    """SGD on the summed gradients: embedding and wide rows take the mean gradient of the examples
    that hit them (the int64 hit counts, summed over every rank), the rest the global mean."""
    n = spec.batch * p
    lr = LEARNING_RATE / len(spec.vocab)  # every field moves a logit: keep the sum of moves steady
    k = 0
    for f in range(len(spec.vocab)):
        d_emb = sums[k]
        d_wide = sums[k + 1] if spec.wide else None
        k += 1 + spec.wide
        if spec.counts:
            hits = np.maximum(sums[k], 1)
            k += 1
        else:
            hits = np.full(spec.vocab[f], max(n / spec.vocab[f], 1.0))  # the expected hits
        params["emb"][f] -= (lr * d_emb / hits[:, None]).astype(np.float32)
        if d_wide is not None:
            params["wide"][f] -= lr * d_wide / hits
    params["proj"] -= (LEARNING_RATE * sums[k] / n).astype(np.float32)
    params["bias"] -= (LEARNING_RATE * sums[k + 1] / n).astype(np.float32)


def flat_params(params: dict[str, Any]) -> list[np.ndarray]:
    return [*params["emb"], *params["wide"], params["proj"], params["bias"]]


def digest(arrays: list[np.ndarray]) -> int:
    crc = 0
    for a in arrays:
        crc = zlib.crc32(np.ascontiguousarray(a).tobytes(), crc)
    return crc


# -- how well the model predicts (the free run) ---------------------------------------------------


def free_run_spec(fields: int, seed: int) -> ModelSpec:
    rng = np.random.default_rng([seed, 70])
    vocab = tuple(int(v) for v in rng.integers(8, 65, size=fields))
    return ModelSpec(seed, vocab, 16, DTYPE_ORDER)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a positive outranks a negative (ties count half),
    from the rank-sum (Mann-Whitney) statistic."""
    _, where, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[where]  # 1-based, ties get their mean rank
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return 0.5
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def heldout(spec: ModelSpec, params: dict[str, Any]) -> tuple[float, float]:
    ids, labels = make_batch(spec, 1, 0, 0, n=4096)
    z, _ = logits(spec, params, ids)
    prob = np.clip(sigmoid(z), 1e-12, 1 - 1e-12)
    loss = float(-(labels * np.log(prob) + (1 - labels) * np.log(1 - prob)).mean())
    return loss, auc(z, labels)
