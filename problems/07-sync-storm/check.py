"""Checks for problem 07, the gradient sync storm: tensor fusion.

The story: a click-through-rate model with a hundred-odd feature fields has three or four gradient
tensors per field (a float32 embedding table, a float64 wide weight vector, int64 per-row hit
counts) plus a few more: several hundred small tensors per step, in three dtypes. The learner's
``Fusion`` reduces them across the ranks for two training steps on 1 to 5 ranks. Here, outside
the ranks, the same gradients are regenerated and summed tensor by tensor, which is what one
Allreduce per tensor would give; the learner's sums must equal them, and training must follow the
same path as single-process training on the global batch. The same run is then read for how it
got there: the number of collectives per step (at most ceil(bytes / threshold) + dtypes), the size
of every buffer sent (at most threshold + one tensor) and the memory the fusion allocated while it
worked. Last, on a cluster where a collective costs 50 us of latency per hop, one step of the
learner's fusion must be at least 10x faster than one Allreduce per tensor run by this file.

Hidden variants (from the seed): the number of fields (70-110, so 140-340 tensors), table sizes,
embedding width, which dtypes a step carries, one table larger than the threshold, the threshold,
the rank counts (1, 2, 4 and one of 3, 5) and the bandwidth of the 50-us cluster.

One launch runs everything (the training cases, then the timed steps) on ``uniform(p, 50 us,
beta)``; the memory probe is tracemalloc around add() ... flush() on MPI (on gloo it crashes the
rank, so there only the size of every buffer is judged).

``main`` is the free run (``distlab run 07``): real training of the model with fusion, or, with
``--param sweep=1``, the Tune step's sweep of step time against the threshold, as CSV rows
``threshold_bytes,virtual_step_s`` (see ``main``'s docstring).
"""

from __future__ import annotations

import functools
import math
import os
import tracemalloc
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distlab import IN_PLACE, MAX, SUM
from distlab.grading import CheckContext, Checklist, Task
from distlab.platforms import uniform

ALPHA_S = 50e-6  # per-hop latency of the cluster the speed-up is graded on
SPEEDUP = 10.0  # the fused step must be at least this much faster than one Allreduce per tensor
STEPS = 2  # training steps per case: the second one reuses the fusion after a flush()
BATCH = 64  # examples per rank per step
MEMORY_SLACK = 32 * 1024  # bytes the proxy's own bookkeeping may allocate during a step
SLACK_PER_CALL = 1024  # ... plus this per collective (its trace event and counters)
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


# -- what runs on every rank ----------------------------------------------------------------------


class RecordingComm:
    """The rank's comm, passed through, with the dtype and size of each Allreduce noted: the
    checker reads what each fusion buffer held without trusting the solution to report it."""

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self.allreduces: list[tuple[str, int]] = []

    def _note(self, buf: Any) -> None:
        self.allreduces.append((str(buf.dtype).replace("torch.", ""), int(buf.nbytes)))

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> Any:
        self._note(recvbuf)
        return self._comm.Allreduce(sendbuf, recvbuf, op)

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> Any:
        self._note(recvbuf)
        return self._comm.Iallreduce(sendbuf, recvbuf, op)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)


@dataclass(frozen=True)
class Case:
    p: int
    spec: ModelSpec
    threshold: int
    steps: int = STEPS

    @functools.lru_cache(maxsize=64)  # noqa: B019 (a handful of frozen cases per session)
    def label(self) -> str:
        n = len(tensor_names(self.spec))
        big = largest(self)[1] > self.threshold
        big_text = " with one table larger than the threshold" if big else ""
        return (f"p = {self.p}, {n} tensors ({'/'.join(self.spec.dtypes)}{big_text}), "
                f"threshold {self.threshold} B")


@dataclass
class StepRecord:
    collectives: dict[str, int]  # collective calls of the step, by name
    p2p_messages: int
    allreduces: list[tuple[str, int]]  # (dtype, bytes) of each Allreduce, in order
    peak_bytes: int  # tracemalloc's peak over add() ... flush(); -1: not measured (gloo)


@dataclass
class CaseResult:
    first_sums: list[np.ndarray]  # the tensors after step 0's flush
    final: list[np.ndarray] | None  # rank 0: the parameters after the last step
    final_digest: int
    steps: list[StepRecord] = field(default_factory=list)


def fused_step(comm: Any, recorder: RecordingComm, fusion: Any, grads: list[np.ndarray],
               measure_memory: bool) -> StepRecord:
    """One cycle: every tensor added, then flush(); counts what it sent and allocated."""
    before = comm.stats.snapshot()
    recorder.allreduces.clear()
    if measure_memory:
        tracemalloc.start()
    try:
        for g in grads:
            fusion.add(g)
        fusion.flush()
        peak = tracemalloc.get_traced_memory()[1] if measure_memory else -1
    finally:
        if measure_memory:
            tracemalloc.stop()
    delta = comm.stats.since(before)
    used = {op: delta.calls[op] for op in delta.collectives_used()}
    return StepRecord(used, delta.messages_sent, list(recorder.allreduces), peak)


def run_task(comm, solution, kind, case, measure_memory=True):
    """The program of every task: ``train`` a case, or one timed ``fusion`` or ``per-tensor``
    step (one launch runs them all, so the ranks start once)."""
    if kind == "train":
        return train_case(comm, solution, case, measure_memory)
    return sync_step(comm, solution, case, kind)


def train_case(comm, solution, case, measure_memory=True):
    """Trains the case's model for a few steps with the learner's Fusion; returns the summed
    gradients of the first step, what every step sent, and the final parameters."""
    rank = comm.Get_rank()
    params = init_params(case.spec)
    recorder = RecordingComm(comm)
    fusion = solution.Fusion(recorder, case.threshold)
    result = CaseResult([], None, 0)
    for step in range(case.steps):
        comm.mark("step")
        grads = gradients(case.spec, params, *make_batch(case.spec, 0, step, rank))
        result.steps.append(fused_step(comm, recorder, fusion, grads, measure_memory))
        if step == 0:
            result.first_sums = [g.copy() for g in grads]
        apply_update(case.spec, params, grads, case.p)
    result.final = flat_params(params) if rank == 0 else None
    result.final_digest = digest(flat_params(params))
    return result


def sync_step(comm, solution, case, mode):
    """One step's gradients reduced once, by the learner's fusion or by one Allreduce per tensor
    (the baseline this file runs itself); the replay of this task is the step's virtual time."""
    batch = make_batch(case.spec, 0, 0, comm.Get_rank())
    grads = gradients(case.spec, init_params(case.spec), *batch)
    if mode == "fusion":
        fusion = solution.Fusion(comm, case.threshold)
        for g in grads:
            fusion.add(g)
        fusion.flush()
    else:
        for g in grads:
            comm.Allreduce(IN_PLACE, g, SUM)
    return [g[: min(len(g), 4)].copy() for g in grads]  # a sample, to make sure it was right


# -- the free run -------------------------------------------------------------------------------


DEFAULT_SWEEP = "0,1024,4096,16384,65536,262144,1048576,4194304"


def parse_bytes(text: str) -> int:
    """'65536', '64K', '64KiB', '1M' -> bytes (K and M are binary)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if scale > 1 else t) * scale)


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


def main(comm, solution, sweep="0", thresholds=DEFAULT_SWEEP, out="", threshold="65536",
         steps="30", fields="120", seed="7"):
    """The free run (distlab run 07). Two modes:

    * training (default): trains the CTR model for ``steps`` steps with Fusion(comm, threshold) on
      every rank; rank 0 reports held-out loss and AUC before and after, the collectives per step
      and the virtual time of the gradient sync per step (comm.now(), the online clock).
    * ``sweep=1``: the Tune step. One step's gradients are reduced once per threshold in
      ``thresholds`` (bytes, comma-separated, K/M suffixes allowed; 0 sends every tensor alone,
      i.e. one Allreduce per tensor); the virtual step time is the slowest rank's comm.now()
      difference around add()...flush(). Rank 0 writes CSV rows ``threshold_bytes,virtual_step_s``
      (with that header) to ``out`` when given, and returns a one-line summary.

        distlab run 07 --solution reference --param sweep=1 --param out=sweep.csv
        distlab run 07 --param sweep=1 --param thresholds=0,4K,64K,1M --platform my-cluster.toml
    """
    rank, p = comm.Get_rank(), comm.Get_size()
    spec = free_run_spec(int(fields), int(seed))
    names = tensor_names(spec)
    if sweep not in ("", "0"):
        values = [parse_bytes(v) for v in thresholds.split(",") if v.strip()]
        grads0 = gradients(spec, init_params(spec), *make_batch(spec, 0, 0, rank))
        total = sum(g.nbytes for g in grads0)
        times = np.zeros(len(values))
        for i, t in enumerate(values):
            grads = [g.copy() for g in grads0]
            fusion = solution.Fusion(comm, t)
            start = comm.now()
            for g in grads:
                fusion.add(g)
            fusion.flush()
            times[i] = comm.now() - start
        comm.Allreduce(IN_PLACE, times, MAX)  # the step ends when its slowest rank is done
        if rank != 0:
            return None
        rows = [f"{t},{float(s)!r}" for t, s in zip(values, times)]
        written = ""
        if out:
            path = os.path.abspath(out)
            with open(path, "w") as f:
                f.write("threshold_bytes,virtual_step_s\n" + "\n".join(rows) + "\n")
            written = f"; wrote {path}"
        best = int(np.argmin(times))
        curve = ", ".join(f"{t}: {s * 1e3:.3f} ms" for t, s in zip(values, times))
        return (f"sweep over {len(names)} tensors ({total / 1024:.1f} KiB, 3 dtypes), p = {p}: "
                f"{curve}; fastest at {values[best]} B{written}")

    params = init_params(spec)
    before = heldout(spec, params) if rank == 0 else None
    fusion = solution.Fusion(comm, parse_bytes(threshold))
    sync_s, collectives = 0.0, 0
    for step in range(int(steps)):
        comm.mark("step")
        grads = gradients(spec, params, *make_batch(spec, 0, step, rank))
        calls = comm.stats.snapshot()
        start = comm.now()
        for g in grads:
            fusion.add(g)
        fusion.flush()
        sync_s += comm.now() - start
        delta = comm.stats.since(calls)
        collectives += sum(delta.calls[op] for op in delta.collectives_used())
        apply_update(spec, params, grads, p)
    if rank != 0:
        return None
    after = heldout(spec, params)
    n = max(int(steps), 1)
    total = sum(nbytes for _, nbytes in step_shapes(spec))
    return (f"{steps} steps on {p} ranks: held-out loss {before[0]:.3f} -> {after[0]:.3f}, "
            f"AUC {before[1]:.3f} -> {after[1]:.3f}; {len(names)} tensors ({total / 1024:.1f} KiB) "
            f"in {collectives / n:.1f} collectives per step; sync {sync_s / n * 1e3:.3f} ms per "
            f"step (virtual)")


# -- building the cases -------------------------------------------------------------------------


def nbytes_by_dtype(case: Case) -> dict[str, int]:
    """Bytes of one step's tensors per dtype (every step has the same shapes)."""
    out: dict[str, int] = {}
    for g in step_shapes(case.spec):
        out[g[0]] = out.get(g[0], 0) + g[1]
    return out


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


def largest(case: Case, dtype: str | None = None) -> tuple[str, int]:
    """(dtype, bytes) of the largest tensor of a step (of ``dtype`` if given)."""
    shapes = [s for s in step_shapes(case.spec) if dtype is None or s[0] == dtype]
    return max(shapes, key=lambda s: s[1])


def collective_budget(case: Case) -> int:
    """ceil(bytes / threshold) + the number of dtypes: each buffer but the last of its dtype is
    sent once it holds at least the threshold."""
    by_dtype = nbytes_by_dtype(case)
    return math.ceil(sum(by_dtype.values()) / max(case.threshold, 1)) + len(by_dtype)


def memory_budget(case: Case, collectives: int) -> int:
    """One buffer per dtype of at most threshold + its largest tensor (never more than that
    dtype's bytes), one receive copy of the largest such buffer, and the proxy's bookkeeping."""
    by_dtype = nbytes_by_dtype(case)
    buffers = [min(b, case.threshold + largest(case, d)[1]) for d, b in by_dtype.items()]
    return sum(buffers) + max(buffers) + MEMORY_SLACK + SLACK_PER_CALL * collectives


def make_spec(rng: np.random.Generator, dtypes: tuple[str, ...], big_table: bool) -> ModelSpec:
    fields = int(rng.integers(70, 111))
    dim = int(rng.choice([8, 16]))
    vocab = [int(v) for v in rng.integers(8, 65, size=fields)]
    if big_table:
        # One field with a large vocabulary: its table alone is more than the threshold (below).
        vocab[int(rng.integers(fields))] = int(rng.integers(1536, 2049))
    return ModelSpec(int(rng.integers(1 << 31)), tuple(vocab), dim, dtypes)


def make_case(p: int, rng: np.random.Generator, dtypes: tuple[str, ...], big_table: bool) -> Case:
    spec = make_spec(rng, dtypes, big_table)
    case = Case(p, spec, 1)
    by_dtype = nbytes_by_dtype(case)
    small = by_dtype["float32"] - (largest(case, "float32")[1] if big_table else 0)
    # 4-7 buffers' worth of the ordinary float32 tensors: fusion has room to work, and a buffer
    # that swallows all of them is far above threshold + one tensor.
    threshold = int(small / rng.uniform(4.0, 7.0)) // 8 * 8
    return Case(p, spec, threshold)


@dataclass(frozen=True)
class Plan:
    cases: tuple[Case, ...]
    perf: tuple[Case, ...]  # cases timed against one Allreduce per tensor (its replay is slow)
    beta: float  # seconds per byte of the 50-us cluster

    @property
    def world(self) -> int:
        return max(c.p for c in self.cases + self.perf)


def plan_for(t: CheckContext) -> Plan:
    """The hidden variants; the same for every check of a session (so one launch serves all)."""
    rng = np.random.default_rng([t.seed, 7])
    hidden_p = int(rng.choice([3, 5]))
    some = [DTYPE_ORDER, ("float32", "int64"), ("float32", "float64")][int(rng.integers(3))]
    cases = (
        make_case(1, rng, DTYPE_ORDER, big_table=False),
        make_case(2, rng, some, big_table=False),
        make_case(4, rng, DTYPE_ORDER, big_table=True),
        make_case(hidden_p, rng, DTYPE_ORDER, big_table=bool(rng.integers(2))),
    )
    perf = (cases[2],)
    beta = 1.0 / (rng.uniform(10.0, 25.0) * 1e9)  # 10-25 GB/s per port
    return Plan(cases, perf, beta)


def launch_all(t: CheckContext) -> tuple[Plan, list[Any], list[Any]]:
    """One launch on the 50-us cluster: the training cases, then the timed steps (the learner's
    fused step and this file's per-tensor baseline for each timed case). Cached: every check
    reads the same run. Returns (plan, training task runs, timed task runs)."""
    plan = plan_for(t)
    # tracemalloc in a rank whose gloo threads free tensors crashes the process (torch 2.x):
    # the allocation probe runs on MPI only; the size of every buffer is read on both engines.
    probe = t.backend == "mpi"
    tasks = [Task(ranks=c.p, args=("train", c, probe), label=f"training with {c.label()}")
             for c in plan.cases]
    for c in plan.perf:
        tasks.append(Task(ranks=c.p, args=("fusion", c), label=f"the timed fused step, p = {c.p}"))
        tasks.append(Task(ranks=c.p, args=("per-tensor", c),
                          label=f"the timed per-tensor baseline, p = {c.p}"))
    run = t.launch(run_task, tasks, platform=uniform(plan.world, ALPHA_S, plan.beta))
    n = len(plan.cases)
    return plan, run.tasks[:n], run.tasks[n:]


# -- the expected values, computed here --------------------------------------------------------


def rank_gradients(case: Case, params: dict[str, Any], step: int) -> list[list[np.ndarray]]:
    return [gradients(case.spec, params, *make_batch(case.spec, 0, step, r)) for r in range(case.p)]


def per_tensor_sums(per_rank: list[list[np.ndarray]]) -> list[np.ndarray]:
    """What one Allreduce(SUM) per tensor gives: each tensor summed over the ranks."""
    sums = [g.copy() for g in per_rank[0]]
    for grads in per_rank[1:]:
        for s, g in zip(sums, grads):
            s += g
    return sums


def single_process_training(case: Case) -> list[np.ndarray]:
    params = init_params(case.spec)
    for step in range(case.steps):
        apply_update(case.spec, params, per_tensor_sums(rank_gradients(case, params, step)), case.p)
    return flat_params(params)


def close(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Element-wise: ints exact; floats up to summation order (float64 far tighter than float32)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return np.zeros(want.shape, dtype=bool)
    if want.dtype.kind in "iu" or np.array_equal(got, want):
        return got == want
    rtol = 1e-5 if want.dtype == np.float32 else 1e-12
    scale = float(np.abs(want).max(initial=0.0)) or 1.0
    return np.isclose(got, want, rtol=rtol, atol=rtol * scale)


def describe(names: list[str], grads: list[np.ndarray], i: int) -> str:
    g = grads[i]
    return f"tensor #{i} {names[i]} ({g.dtype}, shape {g.shape})"


def diagnose_sums(case: Case, rank: int, got: list[np.ndarray], want: list[np.ndarray],
                  own: list[np.ndarray], step: StepRecord) -> str | None:
    """None if rank's sums are right; else what is wrong, named the way a reviewer would."""
    names = tensor_names(case.spec)
    head = f"{case.label()}: after step 0's flush(), rank {rank}"
    if len(got) != len(want):
        return f"{head} holds {len(got)} tensors, expected {len(want)}"
    wrong = [i for i in range(len(want)) if not close(got[i], want[i]).all()]
    if not wrong:
        return None
    unchanged = [i for i in wrong if np.array_equal(got[i], own[i])]
    if len(unchanged) == len(wrong):
        if len(wrong) == len(want) or not step.collectives:
            sent = "no collective at all" if not step.collectives else \
                f"{sum(step.collectives.values())} collective(s)"
            return (f"{head}: every tensor still holds this rank's own gradient ({sent} in the "
                    "step): add() and flush() must reduce every tensor across the ranks")
        tails = _unsent_tails(names, got, wrong)
        if tails:
            return (f"{head}: the last {tails} tensors added still hold this rank's own gradient: "
                    "the last partial buffer was never sent; flush() must send every buffer "
                    "that is not empty")
        shown = ", ".join(describe(names, got, i) for i in wrong[:3])
        return f"{head}: {len(wrong)} tensors were never reduced, e.g. {shown}"
    for i in wrong:
        g, w = got[i], want[i]
        if w.dtype == np.float64 and g.shape == w.shape and np.allclose(g, w, rtol=1e-6, atol=1e-6):
            rel = float(np.max(np.abs(g - w) / np.maximum(np.abs(w), 1e-30)))
            return (f"{head}: {describe(names, got, i)} equals the per-tensor sum only to float32 "
                    f"precision (relative error up to {rel:.1e}): it went through a float32 "
                    "buffer; pack each dtype in a buffer of its own")
        if w.dtype == np.int64 and g.shape == w.shape:
            off = int(np.max(np.abs(g.astype(object) - w.astype(object))))
            return (f"{head}: {describe(names, got, i)} is off by up to {off} (values up to "
                    f"2^{int(np.log2(max(int(np.abs(w).max()), 1)))}): its integers went through "
                    "a floating-point buffer, which cannot hold 64-bit integers exactly; pack each "
                    "dtype in a buffer of its own")
    i = wrong[0]
    g, w = got[i], want[i]
    if g.shape == w.shape and case.p > 1 and w.dtype.kind == "f":
        averaged = "the sum divided by p: Fusion sums (SUM); averaging is the caller's business"
        for factor, what in ((1.0 / case.p, averaged),
                             (float(case.p), "p times the sum: was a buffer reduced twice?")):
            if np.allclose(g, w * factor, rtol=1e-4, atol=1e-6):
                return f"{head}: {describe(names, got, i)} holds {what}"
    if g.shape != w.shape or g.dtype != w.dtype:
        return f"{head}: {describe(names, got, i)} came back as {g.dtype} {g.shape}"
    ok = close(g, w)
    j = int(np.argmin(ok.reshape(-1)))
    return (f"{head}: {describe(names, got, i)}, element {j}: expected "
            f"{w.reshape(-1)[j].item()!r}, saw {g.reshape(-1)[j].item()!r} ({len(wrong)} of "
            f"{len(want)} tensors wrong)")


def _unsent_tails(names: list[str], got: list[np.ndarray], wrong: list[int]) -> str:
    """'3 float32 and 1 int64' when the never-reduced tensors are, per dtype, exactly the last
    ones of that dtype in add order (a partial buffer left behind); '' otherwise."""
    by_dtype: dict[str, list[int]] = {}
    for i, g in enumerate(got):
        by_dtype.setdefault(str(g.dtype), []).append(i)
    parts = []
    for dtype, indices in by_dtype.items():
        mine = [i for i in wrong if i in set(indices)]
        if mine and mine != indices[len(indices) - len(mine):]:
            return ""
        if mine:
            parts.append(f"{len(mine)} {dtype}")
    return " and ".join(parts)


@functools.lru_cache(maxsize=16)
def first_step(case: Case) -> tuple[list[list[np.ndarray]], list[np.ndarray]]:
    """Every rank's gradients of step 0, and their per-tensor sums (computed once per case)."""
    per_rank = rank_gradients(case, init_params(case.spec), 0)
    return per_rank, per_tensor_sums(per_rank)


_VERDICTS: dict[int, str | None] = {}


def first_wrong(plan: Plan, train: list[Any]) -> str | None:
    """The first wrong sum of any case (the results check's message), or None; judged once per
    run (every check asks)."""
    key = id(train[0])
    if key not in _VERDICTS:
        _VERDICTS[key] = _first_wrong(plan, train)
    return _VERDICTS[key]


def _first_wrong(plan: Plan, train: list[Any]) -> str | None:
    for case, task_run in zip(plan.cases, train):
        per_rank, want = first_step(case)
        for rank, result in enumerate(task_run.values):
            message = diagnose_sums(case, rank, result.first_sums, want, per_rank[rank],
                                    result.steps[0])
            if message:
                return message
    return None


def require_right_sums(t: CheckContext, plan: Plan, train: list[Any]) -> None:
    message = first_wrong(plan, train)
    if message:
        t.fail("not graded until the sums are right: see the first check")


def human(nbytes: float) -> str:
    return f"{nbytes / 1024:.1f} KiB" if nbytes >= 1024 else f"{int(nbytes)} B"


# -- the checks -----------------------------------------------------------------------------------


CHECKS = Checklist()


@CHECKS.check("results equal one Allreduce per tensor", points=4)
def results_match(t: CheckContext) -> None:
    plan, train, _ = launch_all(t)
    t.say("; ".join(c.label() for c in plan.cases))
    message = first_wrong(plan, train)
    if message:
        t.fail(message)
    tensors = sum(len(tensor_names(c.spec)) * c.p for c in plan.cases)
    t.metric("tensors_checked", tensors)
    t.say(f"every tensor of step 0 equals its per-tensor sum on every rank ({tensors} in all)")


@CHECKS.check("training with fusion equals single-process training", points=2)
def training_matches(t: CheckContext) -> None:
    plan, train, _ = launch_all(t)
    require_right_sums(t, plan, train)
    for case, task_run in zip(plan.cases, train):
        want = single_process_training(case)
        results: list[CaseResult] = task_run.values
        digests = {r.final_digest for r in results}
        t.expect(len(digests) == 1, "identical parameters on every rank",
                 f"{case.label()}: the ranks end {STEPS} steps with {len(digests)} different sets "
                 "of parameters: did a later step reduce different tensors on different ranks?")
        got = results[0].final
        assert got is not None
        for i, (g, w) in enumerate(zip(got, want)):
            if not np.allclose(g, w, rtol=1e-4, atol=1e-6):
                t.fail(f"{case.label()}: after {STEPS} steps parameter #{i} differs from "
                       f"single-process training on the global batch (max difference "
                       f"{float(np.abs(g - w).max()):.2e}): steps after the first were not "
                       "reduced right; does flush() leave the fusion empty for the next step?")
    t.say(f"{STEPS} steps of training land on the single-process parameters in every case")


@CHECKS.check("collectives per step at most ceil(bytes / threshold) + dtypes", points=2)
def collectives_per_step(t: CheckContext) -> None:
    plan, train, _ = launch_all(t)
    require_right_sums(t, plan, train)
    worst = 0.0
    for case, task_run in zip(plan.cases, train):
        budget = collective_budget(case)
        by_dtype = nbytes_by_dtype(case)
        total, n = sum(by_dtype.values()), len(tensor_names(case.spec))
        for rank, result in enumerate(task_run.values):
            for s, step in enumerate(result.steps):
                count = sum(step.collectives.values())
                calls = ", ".join(f"{k} x{v}" for k, v in sorted(step.collectives.items()))
                why = (": one collective per tensor; pack tensors into a buffer and reduce it once"
                       if count >= n else ": is each buffer sent as soon as it holds threshold "
                       "bytes (not sooner)?")
                t.expect(count <= budget,
                         f"at most {budget} collectives per step (ceil({total} / {case.threshold}) "
                         f"= {budget - len(by_dtype)} + {len(by_dtype)} dtypes)",
                         f"{case.label()}, step {s}: rank {rank} made {count} ({calls}){why}")
                t.expect(step.p2p_messages == 0 or case.p == 1, "collectives only",
                         f"{case.label()}, step {s}: rank {rank} sent {step.p2p_messages} "
                         "point-to-point messages besides its collectives")
                worst = max(worst, count / budget)
        t.say(f"p = {case.p}: {sum(task_run.values[0].steps[0].collectives.values())} "
              f"collectives per step for {n} tensors ({human(total)}), budget {budget}")
    t.metric("worst_collectives_over_budget", round(worst, 3))


@CHECKS.check("step at least 10x faster than one Allreduce per tensor at 50 us latency", points=3)
def fused_step_is_faster(t: CheckContext) -> None:
    plan, train, timed = launch_all(t)
    require_right_sums(t, plan, train)
    worst = math.inf
    for k, case in enumerate(plan.perf):
        fused_run, base_run = timed[2 * k], timed[2 * k + 1]
        want = first_step(case)[1]
        for rank, sample in enumerate(fused_run.values):
            for i, (g, w) in enumerate(zip(sample, want)):
                t.expect(bool(close(g, w[: len(g)]).all()),
                         "a correct result before its time is graded",
                         f"{case.label()}: rank {rank}'s tensor #{i} is wrong in the timed step")
        fused, base = t.measured_time(fused_run), t.measured_time(base_run)
        n = len(tensor_names(case.spec))
        ratio = base / fused if fused > 0 else math.inf
        t.say(f"p = {case.p}, {n} tensors, alpha 50 us, {1 / plan.beta / 1e9:.1f} GB/s: "
              f"per-tensor {base * 1e3:.2f} ms, fused {fused * 1e3:.3f} ms ({ratio:.1f}x) "
              f"{t.clock}")
        if ratio < worst:
            worst = ratio
            t.performance(fused, base / SPEEDUP, fused_run)
        hint = (": about as slow as one Allreduce per tensor; are the tensors fused at all?"
                if ratio < 2 else ": fewer, larger buffers pay the latency fewer times")
        t.expect(ratio >= SPEEDUP,
                 f"the fused step at most {base / SPEEDUP * 1e3:.3f} ms (10x faster than the "
                 f"per-tensor {base * 1e3:.2f} ms)",
                 f"{fused * 1e3:.3f} ms for {case.label()}, {ratio:.1f}x{hint}")
    t.metric("worst_speedup", round(worst, 2))


@CHECKS.check("buffer memory bounded: threshold + one tensor", points=2)
def memory_bounded(t: CheckContext) -> None:
    plan, train, _ = launch_all(t)
    require_right_sums(t, plan, train)
    worst = 0.0
    for case, task_run in zip(plan.cases, train):
        by_dtype = nbytes_by_dtype(case)
        for rank, result in enumerate(task_run.values):
            for s, step in enumerate(result.steps):
                budget = memory_budget(case, sum(step.collectives.values()))
                for dtype, nbytes in step.allreduces:
                    limit = case.threshold + largest(case, dtype)[1] if dtype in by_dtype else 0
                    if nbytes <= limit:
                        continue
                    if nbytes >= 0.9 * by_dtype.get(dtype, 0):
                        why = (f"one buffer of all {by_dtype[dtype]} {dtype} bytes of the step: "
                               "the threshold was ignored until flush(); send a buffer as soon "
                               "as it holds threshold_bytes")
                    elif dtype in by_dtype and nbytes > 1.5 * limit:
                        why = (f"{nbytes / case.threshold:.1f}x the threshold: is the threshold "
                               "compared with a number of elements instead of bytes?")
                    else:
                        why = "the buffer grew past the threshold before it was sent"
                    t.fail(f"{case.label()}, step {s}: rank {rank} reduced a {dtype} buffer of "
                           f"{nbytes} bytes in one Allreduce; a buffer may hold at most threshold "
                           f"+ its largest tensor = {limit} bytes: {why}")
                if step.peak_bytes < 0:
                    continue  # not measured on this engine
                t.expect(step.peak_bytes <= budget,
                         f"at most {budget} bytes allocated while add() ... flush() ran (one "
                         "buffer per dtype of threshold + one tensor, one receive copy, "
                         f"{MEMORY_SLACK // 1024} KiB + {SLACK_PER_CALL} B per collective of "
                         "bookkeeping)",
                         f"{case.label()}, step {s}: rank {rank} allocated up to "
                         f"{step.peak_bytes} bytes at once (the step's tensors are "
                         f"{sum(by_dtype.values())} bytes): are tensors copied long before "
                         "their buffer is due, or buffers allocated larger than they need?")
                worst = max(worst, step.peak_bytes / budget)
        first = task_run.values[0].steps[0]
        peak = max(s.peak_bytes for r in task_run.values for s in r.steps)
        budget = memory_budget(case, sum(first.collectives.values()))
        measured = (f"peak allocation {human(peak)} (budget {human(budget)})" if peak >= 0
                    else "allocations not probed on this engine")
        t.say(f"p = {case.p}: largest buffer {max((n for _, n in first.allreduces), default=0)} B "
              f"(threshold {case.threshold} B), {measured}")
    t.metric("worst_memory_over_budget", round(worst, 3))
