"""Problem 07's rank programs: what runs on every rank, and what each rank reports back.

``run_task`` is the program of every task of the checks' one launch: it trains a case with the
learner's ``Fusion`` (``train_case``) or times one step, fused or one Allreduce per tensor
(``sync_step``). The ranks report plain records (``StepRecord``, ``CaseResult``): what was summed,
what each step sent, read through ``RecordingComm`` rather than trusted to the solution, and what
it allocated. Nothing here judges: the checker does, outside the ranks.
"""

from __future__ import annotations

import tracemalloc
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distlab import IN_PLACE, SUM
from distlab.grading import check_part

model = check_part(__file__, "model")


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
    params = model.init_params(case.spec)
    recorder = RecordingComm(comm)
    fusion = solution.Fusion(recorder, case.threshold)
    result = CaseResult([], None, 0)
    for step in range(case.steps):
        comm.mark("step")
        grads = model.gradients(case.spec, params, *model.make_batch(case.spec, 0, step, rank))
        result.steps.append(fused_step(comm, recorder, fusion, grads, measure_memory))
        if step == 0:
            result.first_sums = [g.copy() for g in grads]
        model.apply_update(case.spec, params, grads, case.p)
    result.final = model.flat_params(params) if rank == 0 else None
    result.final_digest = model.digest(model.flat_params(params))
    return result


def sync_step(comm, solution, case, mode):
    """One step's gradients reduced once, by the learner's fusion or by one Allreduce per tensor
    (the baseline this file runs itself); the replay of this task is the step's virtual time."""
    batch = model.make_batch(case.spec, 0, 0, comm.Get_rank())
    grads = model.gradients(case.spec, model.init_params(case.spec), *batch)
    if mode == "fusion":
        fusion = solution.Fusion(comm, case.threshold)
        for g in grads:
            fusion.add(g)
        fusion.flush()
    else:
        for g in grads:
            comm.Allreduce(IN_PLACE, g, SUM)
    return [g[: min(len(g), 4)].copy() for g in grads]  # a sample, to make sure it was right
