"""The cases of problem 01 and the model each must end with: gradient descent on the global batch.
A case's seed alone makes its data and initial weights, so the checker and every rank's agent build
the same arrays; a rank's program is handed only its own part of them (Case.for_rank), never the seed."""

from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from distlab.grading import Widener

FIELDS = 8  # categorical fields per impression: user segment, ad category, hour, device, ...
CARDINALITY = 100  # values per field before hashing
RTOL, ATOL = 1e-6, 1e-9  # float64 and the same arithmetic: only the summation order may differ


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
    # a rank's view (seed -1): (its rank, the initial weights for a server, a worker's X and y), made by
    # its agent; nothing another rank holds, nothing the other ranks' data could be drawn from
    own: tuple | None = field(default=None, compare=False, repr=False)

    def label(self) -> str:
        return (f"S = {self.servers}, W = {self.workers} ({self.what}), {self.keys} keys, "
                f"batches of {', '.join(map(str, self.batches))}, {self.steps} steps")

    @property
    def worker_ranks(self) -> list[int]:
        return list(range(self.servers, self.servers + self.workers))

    def for_rank(self, rank: int) -> "Case":
        """What rank ``rank``'s program is handed: a server the initial weights, a worker its own
        examples, and neither the seed. With the seed (or every worker's examples) one process could
        train the whole model alone and return the servers' shards with no gradient ever pushed. Nor
        what marks a case for the checks: a plain Case, no late worker, no batch sizes (equal only in
        the timed case). The late case's K = 4 still shows; no check rests on a rank not knowing."""
        view = Case(self.servers, self.workers, self.keys, (), self.steps, self.lr, -1, "a rank's view")
        if rank < self.servers:
            return replace(view, own=(rank, initial_weights(self), None, None))
        return replace(view, own=(rank, None, *worker_data(self, rank - self.servers)))

    def mine(self, what: str, rank: int) -> tuple:
        """The view's own arrays, for ``what`` of ``rank``; raises if they are another rank's."""
        assert self.own is not None
        held = self.own[1:2] if what == "initial weights" else self.own[2:]
        if rank != self.own[0] or any(a is None for a in held):
            role = "server" if self.own[0] < self.servers else "worker"
            raise ValueError(f"{role} rank {self.own[0]}'s view of the case holds no {what} of rank {rank}: a "
                             "server is handed the initial weights, a worker its own examples; everything "
                             "else reaches a rank in messages only")
        return tuple(a.copy() for a in held)


class Timed(Case):
    """The case whose virtual time is graded: every worker holds as many examples."""


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # the logistic function, without overflow warnings


def hashed(fields: np.ndarray, values: np.ndarray, keys: int) -> tuple[np.ndarray, np.ndarray]:
    """The hashing trick: (field, value) -> a bucket in [0, keys) and a sign (+1 or -1)."""
    h = fields.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    h ^= values.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
    h = (h ^ h >> np.uint64(29)) * np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(32)
    return (h % np.uint64(keys)).astype(np.int64), np.where(h >> np.uint64(63), -1.0, 1.0)


def impressions(seed: int, stream: int, n: int, keys: int) -> tuple[np.ndarray, np.ndarray]:
    """n impressions of one stream (a worker's log, or held-out data): X (n, keys), y (n,)."""
    teacher = np.random.default_rng([seed, 1]).normal(0.0, 0.9, size=(FIELDS, CARDINALITY))
    rng = np.random.default_rng([seed, 2, stream])
    values = (CARDINALITY * rng.random((n, FIELDS)) ** 2).astype(np.int64)  # popular values first
    fields = np.broadcast_to(np.arange(FIELDS), values.shape)
    y = (rng.random(n) < sigmoid(-1.2 + teacher[fields, values].sum(axis=1))).astype(np.float64)  # the clicks
    X = np.zeros((n, keys))
    bucket, sign = hashed(fields, values, keys)
    np.add.at(X, (np.repeat(np.arange(n), FIELDS), bucket.ravel()), sign.ravel())
    bias_bucket, _ = hashed(np.array([FIELDS]), np.array([0]), keys)
    X[:, bias_bucket[0]] += 1.0  # the bias is one more hashed feature, present in every row
    return X, y


def initial_weights(case: Case) -> np.ndarray:
    if case.own is not None:  # a rank's view: a server's own copy
        return case.mine("initial weights", case.own[0])[0]
    return np.random.default_rng([case.seed, 3]).normal(0.0, 0.05, size=case.keys)


def worker_data(case: Case, index: int) -> tuple[np.ndarray, np.ndarray]:
    if case.own is not None:  # a rank's view: only a worker's own examples
        X, y = case.mine("examples", case.servers + index)
        return X, y
    return impressions(case.seed, 10 + index, case.batches[index], case.keys)


def make_case(rng: np.random.Generator, widen: Widener, S: int, W: int, what: str, steps: int = 0,
              equal: bool = False):
    keys = int(rng.integers(1200, 3600))
    while S > 1 and keys % S == 0:
        keys += 1  # never a multiple of S: the shards cannot all be the same size
    batches = [int(rng.integers(24, 129)) for _ in range(W)]
    if equal:
        # the timed case: every worker computes for the same time, and long enough (28 examples or
        # more) that a server serving one worker at a time stands 2x the check's allowance off
        batches = [max(batches[0], 28)] * W
    elif W > 1 and len(set(batches)) == 1:
        batches[-1] += 7  # never all equal: averaging over workers must differ from over examples
    k, lr = steps or int(rng.integers(5, 10)), round(float(rng.uniform(0.5, 1.5)), 4)
    # The data's seed 63 bits wide: from 31, a worker could find it from its own examples, and so
    # every worker's (distlab.grading.seeds).
    return (Timed if equal else Case)(S, W, keys, tuple(batches), k, lr, widen(int(rng.integers(1 << 31))), what)


def sweep(seed: int) -> list[Case]:
    """Every case of a session, in the order the checks read them; the late worker's is last."""
    rng, widen = np.random.default_rng([seed, 1]), Widener(seed, 1)
    S, W, big_s = int(rng.integers(2, 4)), int(rng.integers(2, 5)), int(rng.integers(2, 5))
    *cases, late = [
        make_case(rng, widen, S, W, "the main case"),
        make_case(rng, widen, 1, 1, "one server, one worker"),
        make_case(rng, widen, 1, int(rng.integers(2, 5)), "one server"),
        make_case(rng, widen, int(rng.integers(2, 5)), 1, "one worker"),
        make_case(rng, widen, big_s, 8 - big_s, "eight ranks"),
        make_case(rng, widen, int(rng.integers(1, 3)), 4, "the timed case", equal=True),
        make_case(rng, widen, 2, 3, "one worker late", steps=4),
    ]
    return cases + [replace(late, late=late.servers + int(rng.integers(late.workers)))]


@lru_cache(maxsize=16)
def global_batch(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Every worker's examples, concatenated in worker order (as one process would hold them)."""
    X, y = zip(*(worker_data(case, w) for w in range(case.workers)))
    return np.concatenate(X), np.concatenate(y)


def trajectory(case: Case, steps: int, weights: np.ndarray | None = None, carried: str = "") -> list[np.ndarray]:
    """The models after 0 .. steps steps of gradient descent on the global batch, each worker's summed
    gradient weighted by ``weights`` (by default 1/B: the mean over all B examples). ``carried``, a
    server whose sums are never reset: "sums" (step k applies the gradients of steps 0 .. k) or
    "counts too" (over the examples of k + 1 steps)."""
    X, y = global_batch(case)
    per_example = np.repeat(np.full(case.workers, 1.0 / len(y)) if weights is None else weights, case.batches)
    models, summed = [initial_weights(case)], np.zeros(case.keys)
    for k in range(steps):
        gradient = X.T @ (per_example * (sigmoid(X @ models[-1]) - y))
        summed = summed + gradient if carried else gradient
        models.append(models[-1] - case.lr * summed / (k + 1 if carried == "counts too" else 1))
    return models


def sgd(case: Case, weights: np.ndarray | None = None, carried: str = "") -> np.ndarray:
    return trajectory(case, case.steps, weights, carried)[-1]  # what the servers must hold at the end
