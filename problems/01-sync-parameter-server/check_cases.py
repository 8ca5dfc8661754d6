"""The scenario of problem 01 in numbers: the cases, their data, and the hidden variants.

A case is one run of the parameter server: S servers, W workers, D keys, each worker's batch, K
steps, the learning rate and a seed. The seed alone makes the case's data (impressions with hashed
features, and clicks) and its initial weights, so the supervisor and every rank build the same
arrays without sending them. ``sweep_cases`` draws every case of a session from the session seed,
in a fixed order: the same seed, the same variants, bit for bit.

The thresholds the checks hold a solution to are here too, beside the numbers they judge.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from distlab.grading import CheckContext, parse_fault_plan

ITEMSIZE = 8  # the model, gradients and pulls are float64
FIELDS = 8  # categorical fields per impression: user segment, ad category, hour, device, ...
CARDINALITY = 100  # values per field before hashing
RTOL, ATOL = 1e-6, 1e-9  # float64 and the same arithmetic: only the summation order may differ
BYTES_TOLERANCE = 0.05  # bytes per worker per step within 5% of one pull + one push of the model
BALANCE_LIMIT = 1.1  # largest shard at most 1.1x the smallest
LATE_S = 0.05  # the late worker's messages leave 50 ms late, in real time and on the virtual clock
TIME_LIMIT = 1.10  # virtual time per step at most 10% above the bound


# -- the data: impressions with hashed features, and clicks ----------------------------------------


@dataclass(frozen=True)
class Case:
    servers: int  # S
    workers: int  # W
    keys: int  # D, the model's length (hash buckets)
    batches: tuple[int, ...]  # examples held by each worker
    steps: int  # K
    lr: float
    seed: int
    what: str  # which edge the case probes
    late: int | None = None  # the worker rank whose messages are held back (a fault plan)

    def label(self) -> str:
        sizes = ", ".join(str(n) for n in self.batches)
        return (f"S = {self.servers}, W = {self.workers} ({self.what}), {self.keys} keys, "
                f"batches of {sizes}, {self.steps} steps")

    @property
    def server_ranks(self) -> list[int]:
        return list(range(self.servers))

    @property
    def worker_ranks(self) -> list[int]:
        return list(range(self.servers, self.servers + self.workers))


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # the logistic function, without overflow warnings


def hashed(fields: np.ndarray, values: np.ndarray, keys: int) -> tuple[np.ndarray, np.ndarray]:
    """The hashing trick: (field, value) -> a bucket in [0, keys) and a sign (+1 or -1)."""
    h = fields.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    h ^= values.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
    h ^= h >> np.uint64(29)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(32)
    return (h % np.uint64(keys)).astype(np.int64), np.where(h >> np.uint64(63), -1.0, 1.0)


def impressions(seed: int, stream: int, n: int, keys: int) -> tuple[np.ndarray, np.ndarray]:
    """n impressions of one stream (a worker's log, or held-out data): X (n, keys), y (n,)."""
    teacher = np.random.default_rng([seed, 1]).normal(0.0, 0.9, size=(FIELDS, CARDINALITY))
    rng = np.random.default_rng([seed, 2, stream])
    values = (CARDINALITY * rng.random((n, FIELDS)) ** 2).astype(np.int64)  # popular values first
    fields = np.broadcast_to(np.arange(FIELDS), values.shape)
    logits = -1.2 + teacher[fields, values].sum(axis=1)
    y = (rng.random(n) < sigmoid(logits)).astype(np.float64)
    X = np.zeros((n, keys))
    bucket, sign = hashed(fields, values, keys)
    np.add.at(X, (np.repeat(np.arange(n), FIELDS), bucket.ravel()), sign.ravel())
    bias_bucket, _ = hashed(np.array([FIELDS]), np.array([0]), keys)
    X[:, bias_bucket[0]] += 1.0  # the bias is one more hashed feature, present in every row
    return X, y


def initial_weights(case: Case) -> np.ndarray:
    return np.random.default_rng([case.seed, 3]).normal(0.0, 0.05, size=case.keys)


def worker_data(case: Case, index: int) -> tuple[np.ndarray, np.ndarray]:
    return impressions(case.seed, 10 + index, case.batches[index], case.keys)


# -- building the cases ---------------------------------------------------------------------------


def make_case(rng: np.random.Generator, S: int, W: int, what: str, steps: int | None = None,
              equal: bool = False) -> Case:
    keys = int(rng.integers(1200, 3600))
    while S > 1 and keys % S == 0:
        keys += 1  # never a multiple of S: the shards cannot all be the same size
    batches = [int(rng.integers(24, 129)) for _ in range(W)]
    if equal:
        batches = [batches[0]] * W  # the timed case: every worker computes for the same time
    while not equal and W > 1 and len(set(batches)) == 1:
        batches[-1] += 7  # never all equal: averaging over workers must differ from over examples
    k = steps if steps is not None else int(rng.integers(5, 10))
    lr = float(rng.uniform(0.5, 1.5))
    return Case(S, W, keys, tuple(batches), k, round(lr, 4), int(rng.integers(1 << 31)), what)


def sweep_cases(t: CheckContext) -> list[Case]:
    """Every case of the session, run by one launch: the main case, the edges and a hidden pair,
    the timed case, and last the late-worker case (the only one with a fault plan)."""
    rng = np.random.default_rng([t.seed, 1])  # the same cases for every check that reads them
    S, W = int(rng.integers(2, 4)), int(rng.integers(2, 5))
    big_s = int(rng.integers(2, 5))
    cases = [
        make_case(rng, S, W, "the main case"),
        make_case(rng, 1, 1, "one server, one worker"),
        make_case(rng, 1, int(rng.integers(2, 5)), "one server"),
        make_case(rng, int(rng.integers(2, 5)), 1, "one worker"),
        make_case(rng, big_s, 8 - big_s, "eight ranks"),
        make_case(rng, int(rng.integers(1, 3)), 4, "the timed case", equal=True),
        make_case(rng, 2, 3, "one worker late", steps=4),
    ]
    late = cases[-1]
    cases[-1] = replace(late, late=late.servers + int(rng.integers(late.workers)))
    return cases


def late_plan(case: Case, seed: int) -> Any:
    return parse_fault_plan({"format_version": 1, "seed": seed, "fault": [
        {"kind": "delay", "src": case.late, "latency_s": LATE_S, "wall": True,
         "note": "a worker on a congested host: its pushes reach the servers after the others' next ones"},
    ]}, where="the 01 late-worker case")

