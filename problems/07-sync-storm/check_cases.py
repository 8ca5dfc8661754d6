"""Problem 07's cases: the hidden variants drawn from the seed, and the budgets they are judged by.

A ``Case`` is one model on p ranks with one threshold; a ``Plan`` is every case of a session and
the bandwidth of the 50-us cluster, a pure function of the seed, so that one launch serves every
check and ``--seed`` replays a failure. The budgets (collectives and memory per step) are computed
from the tensors' shapes alone, in the supervisor.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from distlab.grading import CheckContext, check_part

model = check_part(__file__, "model")

STEPS = 2  # training steps per case: the second one reuses the fusion after a flush()
MEMORY_SLACK = 32 * 1024  # bytes the proxy's own bookkeeping may allocate during a step
SLACK_PER_CALL = 1024  # ... plus this per collective (its trace event and counters)


@dataclass(frozen=True)
class Case:
    p: int
    spec: model.ModelSpec
    threshold: int
    steps: int = STEPS

    @functools.lru_cache(maxsize=64)  # noqa: B019 (a handful of frozen cases per session)
    def label(self) -> str:
        n = len(model.tensor_names(self.spec))
        big = largest(self)[1] > self.threshold
        big_text = " with one table larger than the threshold" if big else ""
        return (f"p = {self.p}, {n} tensors ({'/'.join(self.spec.dtypes)}{big_text}), "
                f"threshold {self.threshold} B")


def nbytes_by_dtype(case: Case) -> dict[str, int]:
    """Bytes of one step's tensors per dtype (every step has the same shapes)."""
    out: dict[str, int] = {}
    for g in model.step_shapes(case.spec):
        out[g[0]] = out.get(g[0], 0) + g[1]
    return out


def largest(case: Case, dtype: str | None = None) -> tuple[str, int]:
    """(dtype, bytes) of the largest tensor of a step (of ``dtype`` if given)."""
    shapes = [s for s in model.step_shapes(case.spec) if dtype is None or s[0] == dtype]
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


def make_spec(rng: np.random.Generator, dtypes: tuple[str, ...], big_table: bool
              ) -> model.ModelSpec:
    fields = int(rng.integers(70, 111))
    dim = int(rng.choice([8, 16]))
    vocab = [int(v) for v in rng.integers(8, 65, size=fields)]
    if big_table:
        # One field with a large vocabulary: its table alone is more than the threshold (below).
        vocab[int(rng.integers(fields))] = int(rng.integers(1536, 2049))
    return model.ModelSpec(int(rng.integers(1 << 31)), tuple(vocab), dim, dtypes)


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
    some = [model.DTYPE_ORDER, ("float32", "int64"), ("float32", "float64")][int(rng.integers(3))]
    cases = (
        make_case(1, rng, model.DTYPE_ORDER, big_table=False),
        make_case(2, rng, some, big_table=False),
        make_case(4, rng, model.DTYPE_ORDER, big_table=True),
        make_case(hidden_p, rng, model.DTYPE_ORDER, big_table=bool(rng.integers(2))),
    )
    perf = (cases[2],)
    beta = 1.0 / (rng.uniform(10.0, 25.0) * 1e9)  # 10-25 GB/s per port
    return Plan(cases, perf, beta)
