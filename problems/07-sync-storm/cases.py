"""Problem 07's cases: the click-through-rate model (per feature field a float32 embedding table, a float64 wide
weight vector and int64 hit counts: hundreds of small gradient tensors per step), whose gradients the ranks and
the checker compute alike from seeded generators; a ``Case`` (one model on p ranks with one threshold, and its
budgets) and a ``Plan`` (every case of a session: the hidden variants).

A rank is handed ``Case.for_rank(rank)``: the model's shared key (its initial parameters, the teacher: what every
rank holds anyway) and its own training batches, materialized, never the seed nor a key they come from. So no rank
can compute another rank's gradients, nor hand another rank a few bytes from which it could: the sums it ends with
must have come through its collectives (which the checker reads from the agents' records)."""

import functools
import math
import zlib
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from distlab.grading import Widener

BATCH = 64  # examples per rank per step
LEARNING_RATE = 1.0
FINGERPRINT_BITS = 54  # int64 fingerprints above 2^53: no float64 holds them exactly
DTYPE_ORDER = ("float32", "float64", "int64")
STEPS = 2  # training steps per case: the second one reuses the fusion after a flush()


# -- the model: a wide-and-embedding CTR model with one small tensor per field and dtype ----------


@dataclass(frozen=True)
class ModelSpec:
    """The model and data of one case; the same numbers in every rank and in the checker. float64 brings the
    wide weights and loss statistics, int64 the per-row hit counts and data fingerprints."""

    seed: int  # the checker's; -1 in a rank's view, which holds its own batches instead
    vocab: tuple[int, ...]  # rows of each field's tables
    dim: int  # embedding width
    dtypes: tuple[str, ...]  # dtypes a step's gradients carry; float32 always
    own: "tuple[int, int, OwnBatches] | None" = None  # a rank's view: (its rank, the shared key, its batches)

    @property
    def shared(self) -> int:
        """The key every rank shares (initial parameters, teacher)."""
        return data_keys(self.seed, 0)[0] if self.own is None else self.own[1]

    def for_rank(self, rank: int, steps: int = STEPS) -> "ModelSpec":
        """What rank ``rank``'s process is handed: the shared key and its own training batches of ``steps`` steps,
        drawn here (by make_batch, from the seed): no key of its data, none of another rank's."""
        if self.own is not None:  # already a view: its own rank's only
            if rank != self.own[0]:
                raise ValueError(f"rank {self.own[0]}'s view of the case holds no data of rank {rank}")
            if steps > len(self.own[2].steps):
                raise ValueError(f"rank {rank}'s view of the case holds {len(self.own[2].steps)} steps' batches, "
                                 f"not {steps}")
            return self
        batches = OwnBatches(tuple(make_batch(self, 0, step, rank) for step in range(steps)))
        return replace(self, seed=-1, own=(rank, self.shared, batches))


@dataclass(frozen=True, eq=False)
class OwnBatches:
    """One rank's training batches, (ids, labels) per step, as make_batch drew them: arrays, no key they came
    from. Compared and hashed by value (a view's spec keys step_shapes' cache)."""

    steps: tuple[tuple[np.ndarray, np.ndarray], ...]

    def __post_init__(self) -> None:
        for arrays in self.steps:
            for a in arrays:
                a.flags.writeable = False

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        ids, labels = self.steps[step]
        return ids.copy(), labels.copy()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OwnBatches):
            return NotImplemented
        return len(self.steps) == len(other.steps) and all(
            a.dtype == b.dtype and np.array_equal(a, b)
            for mine, theirs in zip(self.steps, other.steps) for a, b in zip(mine, theirs))

    def __hash__(self) -> int:
        return digest([a for arrays in self.steps for a in arrays])


def data_keys(seed: int, rank: int) -> tuple[int, int]:
    """The key every rank shares and the key of ``rank``'s batches, both drawn from the case's seed, which never
    reaches a rank; nor does a batch key (a rank's view holds its batches, drawn here)."""
    shared = int(np.random.default_rng([seed, 7, 0]).integers(2**62))
    return shared, int(np.random.default_rng([seed, 7, 2, rank]).integers(2**62))


def init_params(spec: ModelSpec) -> dict[str, Any]:
    rng = np.random.default_rng([spec.shared, 0])
    return {
        "emb": [(0.1 * rng.standard_normal((v, spec.dim)) / math.sqrt(len(spec.vocab))).astype(np.float32)
                for v in spec.vocab],
        "wide": [np.zeros(v, dtype=np.float64) for v in spec.vocab] if "float64" in spec.dtypes else [],
        "proj": (rng.standard_normal(spec.dim) / math.sqrt(spec.dim)).astype(np.float32),
        "bias": np.zeros(1, dtype=np.float32),
    }


def make_batch(spec: ModelSpec, stream: int, step: int, rank: int, n: int = BATCH) -> tuple[np.ndarray, np.ndarray]:
    """Feature ids (n, fields), skewed towards low ids as real traffic is, and 0/1 labels drawn from a hidden
    teacher. ``stream`` 0 is training data, 1 held-out data. A rank's view holds only its own training batches."""
    if spec.own is not None:
        mine, _, batches = spec.own
        if rank != mine:
            raise ValueError(f"rank {mine}'s view of the case holds no data of rank {rank}")
        if stream != 0 or n != BATCH or not 0 <= step < len(batches.steps):
            raise ValueError(f"rank {mine}'s view of the case holds only its training batches of steps "
                             f"0-{len(batches.steps) - 1} (stream 0, {BATCH} examples), not stream {stream}, "
                             f"step {step}, {n} examples")
        return batches.batch(step)
    shared, own = data_keys(spec.seed, rank)
    rng = np.random.default_rng([own, stream, step])
    vocab = np.array(spec.vocab)
    ids = (vocab * rng.random((n, len(vocab))) ** 2).astype(np.int64)
    teacher = np.random.default_rng([shared, 1])
    weights = [teacher.standard_normal(v) for v in spec.vocab]
    logit = sum(w[ids[:, f]] for f, w in enumerate(weights)) * (2.0 / math.sqrt(len(vocab)))
    return ids, (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float64)


def logits(spec: ModelSpec, params: dict[str, Any], ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    """Per field, the sum of a 54-bit hash of the ids this rank consumed: summed over the ranks, it proves that
    every shard was read once. Sums stay below 2^63 for p <= 8 and 64 examples."""
    x = (ids.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(29)
    x += np.arange(ids.shape[1], dtype=np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
    x &= np.uint64((1 << FINGERPRINT_BITS) - 1)
    return x.astype(np.int64).sum(axis=0)


def gradients(spec: ModelSpec, params: dict[str, Any], ids: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
    """This rank's gradient tensors of the summed logistic loss, by name, in add order."""
    wide, counts = "float64" in spec.dtypes, "int64" in spec.dtypes
    z, emb_sum = logits(spec, params, ids)
    prob = sigmoid(z)
    g = prob - labels
    g_proj = (g[:, None] * params["proj"][None, :]).astype(np.float32)
    out: dict[str, np.ndarray] = {}
    for f, v in enumerate(spec.vocab):
        out[f"emb[{f}]"] = np.zeros((v, spec.dim), dtype=np.float32)
        np.add.at(out[f"emb[{f}]"], ids[:, f], g_proj)
        if wide:
            # copy=False: bincount's own array, no freed twin left in the heap (the memory check reads it)
            out[f"wide[{f}]"] = np.bincount(ids[:, f], weights=g, minlength=v).astype(np.float64, copy=False)
        if counts:
            out[f"hits[{f}]"] = np.bincount(ids[:, f], minlength=v).astype(np.int64, copy=False)
    out["proj"] = (g[:, None] * emb_sum).sum(axis=0).astype(np.float32)
    out["bias"] = np.array([g.sum()], dtype=np.float32)
    if wide:
        loss = -(labels * np.log(prob + 1e-12) + (1 - labels) * np.log(1 - prob + 1e-12)).sum()
        out["loss_stats"] = np.array([loss, float(((prob > 0.5) == (labels > 0.5)).sum())])
    if counts:
        out["fingerprints"] = fingerprints(ids)
    return out


def apply_update(spec: ModelSpec, params: dict[str, Any], sums: dict[str, np.ndarray], p: int) -> None:
    """SGD on the summed gradients: embedding and wide rows take the mean gradient of the examples that hit them
    (the int64 hit counts, summed over every rank, else the expected hits), the rest the global mean."""
    n = BATCH * p
    lr = LEARNING_RATE / len(spec.vocab)  # every field moves a logit: keep the sum of moves steady
    for f, v in enumerate(spec.vocab):
        hits = np.maximum(sums[f"hits[{f}]"], 1) if "int64" in spec.dtypes else np.full(v, max(n / v, 1.0))
        params["emb"][f] -= (lr * sums[f"emb[{f}]"] / hits[:, None]).astype(np.float32)
        if "float64" in spec.dtypes:
            params["wide"][f] -= lr * sums[f"wide[{f}]"] / hits
    params["proj"] -= (LEARNING_RATE * sums["proj"] / n).astype(np.float32)
    params["bias"] -= (LEARNING_RATE * sums["bias"] / n).astype(np.float32)


def flat_params(params: dict[str, Any]) -> list[np.ndarray]:
    return [*params["emb"], *params["wide"], params["proj"], params["bias"]]


def digest(arrays: list[np.ndarray]) -> int:
    return zlib.crc32(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays))


@functools.lru_cache(maxsize=64)
def step_shapes(spec: ModelSpec) -> dict[str, tuple[str, int]]:
    """name -> (dtype, bytes) of each tensor of a step, in add order (every step has these)."""
    wide, counts = "float64" in spec.dtypes, "int64" in spec.dtypes  # as gradients() makes them, uncomputed
    shapes: dict[str, tuple[str, int]] = {}
    for f, v in enumerate(spec.vocab):
        shapes[f"emb[{f}]"] = ("float32", v * spec.dim * 4)
        if wide:
            shapes[f"wide[{f}]"] = ("float64", v * 8)
        if counts:
            shapes[f"hits[{f}]"] = ("int64", v * 8)
    shapes.update(proj=("float32", spec.dim * 4), bias=("float32", 4))
    if wide:
        shapes["loss_stats"] = ("float64", 16)
    if counts:
        shapes["fingerprints"] = ("int64", len(spec.vocab) * 8)
    return shapes


# -- the cases and their budgets --------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    p: int
    spec: ModelSpec
    threshold: int
    steps: int = STEPS

    def for_rank(self, rank: int) -> "Case":
        """Rank ``rank``'s view: its own data only (with every rank's, one process could sum alone)."""
        return replace(self, spec=self.spec.for_rank(rank, self.steps))

    @functools.lru_cache(maxsize=64)  # noqa: B019 (a handful of frozen cases per session)
    def label(self) -> str:
        tables = sum(n > self.threshold for name, (_, n) in step_shapes(self.spec).items() if name[:3] == "emb")
        big = f" with {'one table' if tables == 1 else f'{tables} tables'} larger than the threshold" if tables else ""
        return (f"p = {self.p}, {self.tensors} tensors ({'/'.join(self.spec.dtypes)}{big}), "
                f"threshold {self.threshold} B")

    @property
    def tensors(self) -> int:
        return len(step_shapes(self.spec))

    def nbytes_by_dtype(self) -> dict[str, int]:
        shapes = step_shapes(self.spec).values()
        return {dtype: sum(n for d, n in shapes if d == dtype) for dtype in dict.fromkeys(d for d, _ in shapes)}

    def largest(self, dtype: str | None = None) -> int:
        """Bytes of the largest tensor of a step (of ``dtype`` if given)."""
        return max(n for d, n in step_shapes(self.spec).values() if dtype in (None, d))

    def collective_budget(self) -> int:
        """ceil(bytes / threshold) + dtypes: every buffer but the last of a dtype holds the threshold."""
        by_dtype = self.nbytes_by_dtype()
        return math.ceil(sum(by_dtype.values()) / max(self.threshold, 1)) + len(by_dtype)


@dataclass(frozen=True)
class Timed:
    """One step of ``case``, timed: the learner's fusion (``fused``) or one Allreduce per tensor."""

    case: Case
    fused: bool

    def for_rank(self, rank: int) -> "Timed":
        return replace(self, case=self.case.for_rank(rank))


def field_bytes(v: int, dim: int, dtypes: tuple[str, ...]) -> int:
    """A field's gradient bytes: its embedding table, and its wide weights and hit counts where carried."""
    return v * dim * 4 + v * 8 * (("float64" in dtypes) + ("int64" in dtypes))


def make_case(p: int, rng: np.random.Generator, widen: Widener, dtypes: tuple[str, ...], big_table: bool,
              step_bytes: int = 0) -> Case:
    """A case of 70-110 fields; with ``step_bytes``, as many more large tables, drawn as the one of
    ``big_table``, at places drawn among the fields, as make a step of that size, at the threshold the
    70-110 gave (the memory case: a few hundred tensors, of the sizes the others have)."""
    fields = int(rng.integers(70, 111))
    dim = int(rng.choice([8, 16]))
    vocab = [int(v) for v in rng.integers(8, 65, size=fields)]
    if big_table:
        # One field with a large vocabulary: its table alone is more than the threshold (below).
        vocab[int(rng.integers(fields))] = int(rng.integers(1536, 2049))
    case = Case(p, ModelSpec(widen(int(rng.integers(1 << 31))), tuple(vocab), dim, dtypes), 1)
    small = case.nbytes_by_dtype()["float32"] - (case.largest("float32") if big_table else 0)
    # 4-7 buffers' worth of the ordinary float32 tensors: fusion has room to work, and a buffer that
    # swallows all of them is far above threshold + one tensor.
    threshold = int(small / rng.uniform(4.0, 7.0)) // 8 * 8
    total = sum(case.nbytes_by_dtype().values())
    while total < step_bytes:
        v = int(rng.integers(1536, 2049))
        vocab.insert(int(rng.integers(len(vocab) + 1)), v)
        total += field_bytes(v, dim, dtypes)
    spec = replace(case.spec, vocab=tuple(vocab)) if step_bytes else case.spec
    return Case(p, spec, threshold)


@dataclass(frozen=True)
class Plan:
    cases: tuple[Case, ...]
    perf: tuple[Case, ...]  # cases timed against one Allreduce per tensor (its replay is slow)
    beta: float  # seconds per byte of the 50-us cluster
    # A training case like the others but of 12-16 MiB a step, where a fusion that holds the whole step
    # holds well past its budget as the agents read it (memory_case)
    memory: Case

    @property
    def world(self) -> int:
        return max(c.p for c in self.cases + self.perf + (self.memory,))


def plan_for(seed: int) -> Plan:
    """The hidden variants: the same for every check of a session (one launch serves them all)."""
    rng, widen = np.random.default_rng([seed, 7]), Widener(seed, 7)
    hidden_p = int(rng.choice([3, 5]))
    some = [DTYPE_ORDER, ("float32", "int64"), ("float32", "float64")][int(rng.integers(3))]
    cases = (make_case(1, rng, widen, DTYPE_ORDER, big_table=False), make_case(2, rng, widen, some, big_table=False),
             make_case(4, rng, widen, DTYPE_ORDER, big_table=True),
             make_case(hidden_p, rng, widen, DTYPE_ORDER, big_table=bool(rng.integers(2))))
    return Plan(cases, (cases[2],), 1.0 / (rng.uniform(10.0, 25.0) * 1e9), memory_case(seed))  # 10-25 GB/s


def memory_case(seed: int) -> Case:
    """The case memory is graded on: drawn as the training cases are (their dtypes, tables, threshold of
    tens of KiB, data and sums), with thousands of fields. An earlier probe of its own (2-3 MiB thresholds,
    constant tensors) was told apart by its threshold, and a fusion honest only there passed."""
    rng, widen = np.random.default_rng([seed, 77]), Widener(seed, 77)
    dtypes = [DTYPE_ORDER, ("float32", "int64"), ("float32", "float64")][int(rng.choice([0, 0, 1, 2]))]
    return make_case(2, rng, widen, dtypes, big_table=bool(rng.integers(2)),
                     step_bytes=int(rng.uniform(12, 16) * (1 << 20)))
