"""What runs on every rank of problem 07, and the free run (``main``).

The ranks report plain records: what a step summed, what it sent (read through ``RecordingComm`` rather
than trusted to the solution) and what it allocated. Nothing here judges.
"""

from __future__ import annotations

import os
import tracemalloc
from dataclasses import dataclass
from typing import Any

import numpy as np

from distlab import IN_PLACE, MAX, SUM

from . import cases as model
from .cases import Case, Timed


class RecordingComm:
    """The rank's comm, passed through, with the dtype and size of each Allreduce noted: the checker reads
    what each fusion buffer held without trusting the solution to report it."""

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


@dataclass
class StepRecord:
    collectives: dict[str, int]  # collective calls of the step, by name
    p2p_messages: int
    allreduces: list[tuple[str, int]]  # (dtype, bytes) of each Allreduce, in order
    peak_bytes: int  # tracemalloc's peak over add() ... flush(); -1: not measured (gloo)
    sync_s: float = 0.0  # the step's add() ... flush() on the online clock (the free run's figure)


@dataclass
class CaseResult:
    first_sums: list[np.ndarray]  # the tensors after step 0's flush
    final: list[np.ndarray] | None  # rank 0: the parameters after the last step
    final_digest: int
    steps: list[StepRecord]


def run_task(comm, solution, case: Case | Timed):
    """Every task's program (one launch runs them all, so the ranks start once): trains a case, or reduces
    one step's gradients once, by the learner's fusion or by one Allreduce per tensor (the baseline)."""
    if isinstance(case, Case):
        params, steps, first = train(comm, solution, case)
        final = model.flat_params(params)
        return CaseResult(first, final if comm.Get_rank() == 0 else None, model.digest(final), steps)
    spec = case.case.spec
    grads = model.gradients(spec, model.init_params(spec), *model.make_batch(spec, 0, 0, comm.Get_rank()))
    if case.fused:
        add_all(solution.Fusion(comm, case.case.threshold), grads.values())
    else:
        for g in grads.values():
            comm.Allreduce(IN_PLACE, g, SUM)
    return [g[:4].copy() for g in grads.values()]  # a sample, to make sure it was right


def train(comm, solution, case: Case) -> tuple[dict[str, Any], list[StepRecord], list[np.ndarray]]:
    """Trains the case's model with the learner's Fusion: returns the parameters, what every step sent,
    and the summed gradients of step 0."""
    params = model.init_params(case.spec)
    recorder = RecordingComm(comm)
    fusion = solution.Fusion(recorder, case.threshold)
    records, first = [], []
    for step in range(case.steps):
        comm.mark("step")
        grads = model.gradients(case.spec, params, *model.make_batch(case.spec, 0, step, comm.Get_rank()))
        records.append(fused_step(comm, recorder, fusion, list(grads.values()), case.probe))
        if step == 0:
            first = [g.copy() for g in grads.values()]
        model.apply_update(case.spec, params, grads, case.p)
    return params, records, first


def add_all(fusion: Any, grads: Any) -> None:
    """One cycle of the fusion: every tensor added, then flush()."""
    for g in grads:
        fusion.add(g)
    fusion.flush()


def fused_step(comm: Any, recorder: RecordingComm, fusion: Any, grads: list[np.ndarray], probe: bool
               ) -> StepRecord:
    """One cycle, with what it sent, what it allocated (``probe``) and how long it took."""
    before, start = comm.stats.snapshot(), comm.now()
    recorder.allreduces.clear()
    if probe:
        tracemalloc.start()
    try:
        add_all(fusion, grads)
        peak = tracemalloc.get_traced_memory()[1] if probe else -1
    finally:
        if probe:
            tracemalloc.stop()
    delta = comm.stats.since(before)
    used = {op: delta.calls[op] for op in delta.collectives_used()}
    return StepRecord(used, delta.messages_sent, list(recorder.allreduces), peak, comm.now() - start)


# -- the free run (distlab run 07) ------------------------------------------------------------------------


DEFAULT_SWEEP = "0,1024,4096,16384,65536,262144,1048576,4194304"


def parse_bytes(text: str) -> int:
    """'65536', '64K', '64KiB', '1M' -> bytes (K and M are binary)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if scale > 1 else t) * scale)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a positive outranks a negative (ties count half), from
    the rank-sum (Mann-Whitney) statistic."""
    _, where, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[where]  # 1-based, ties get their mean rank
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return 0.5
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def heldout(spec: model.ModelSpec, params: dict[str, Any]) -> tuple[float, float]:
    """Loss and AUC on 4096 held-out examples."""
    ids, labels = model.make_batch(spec, 1, 0, 0, n=4096)
    z, _ = model.logits(spec, params, ids)
    prob = np.clip(model.sigmoid(z), 1e-12, 1 - 1e-12)
    return float(-(labels * np.log(prob) + (1 - labels) * np.log(1 - prob)).mean()), auc(z, labels)


def main(comm, solution, sweep="0", thresholds=DEFAULT_SWEEP, out="", threshold="65536", steps="30",
         fields="120", seed="7"):
    """The free run (distlab run 07). Two modes:

    * training (default): ``steps`` steps with Fusion(comm, threshold); rank 0 reports held-out loss and
      AUC before and after, collectives per step and the virtual sync time per step (comm.now()).
    * ``sweep=1``: the Tune step. One step's gradients reduced once per threshold in ``thresholds`` (bytes,
      K/M allowed; 0: one Allreduce per tensor), timed on the slowest rank's comm.now(); rank 0 writes
      the CSV rows ``threshold_bytes,virtual_step_s`` to ``out`` when given.

        distlab run 07 --solution reference --param sweep=1 --param out=sweep.csv
        distlab run 07 --param sweep=1 --param thresholds=0,4K,64K,1M --platform my-cluster.toml
    """
    rank, p = comm.Get_rank(), comm.Get_size()
    vocab = np.random.default_rng([int(seed), 70]).integers(8, 65, size=int(fields))
    spec = model.ModelSpec(int(seed), tuple(int(v) for v in vocab), 16, model.DTYPE_ORDER)
    shapes = model.step_shapes(spec)
    size = f"{len(shapes)} tensors ({sum(nbytes for _, nbytes in shapes.values()) / 1024:.1f} KiB"
    if sweep not in ("", "0"):
        values = [parse_bytes(v) for v in thresholds.split(",") if v.strip()]
        grads = model.gradients(spec, model.init_params(spec), *model.make_batch(spec, 0, 0, rank))
        recorder = RecordingComm(comm)
        times = np.array([fused_step(comm, recorder, solution.Fusion(recorder, t),
                                     [g.copy() for g in grads.values()], False).sync_s for t in values])
        comm.Allreduce(IN_PLACE, times, MAX)  # the step ends when its slowest rank is done
        if rank != 0:
            return None
        written = ""
        if out:
            path = os.path.abspath(out)
            with open(path, "w") as f:
                f.write("threshold_bytes,virtual_step_s\n")
                f.writelines(f"{t},{float(s)!r}\n" for t, s in zip(values, times))
            written = f"; wrote {path}"
        curve = ", ".join(f"{t}: {s * 1e3:.3f} ms" for t, s in zip(values, times))
        fastest = values[int(np.argmin(times))]
        return f"sweep over {size}, 3 dtypes), p = {p}: {curve}; fastest at {fastest} B{written}"
    before = heldout(spec, model.init_params(spec)) if rank == 0 else None
    params, records, _ = train(comm, solution, Case(p, spec, parse_bytes(threshold), int(steps)))
    if rank != 0:
        return None
    after, n = heldout(spec, params), max(int(steps), 1)
    collectives = sum(sum(r.collectives.values()) for r in records)
    return (f"{steps} steps on {p} ranks: held-out loss {before[0]:.3f} -> {after[0]:.3f}, AUC "
            f"{before[1]:.3f} -> {after[1]:.3f}; {size}) in {collectives / n:.1f} collectives per step; "
            f"sync {sum(r.sync_s for r in records) / n * 1e3:.3f} ms per step (virtual)")
