"""What runs on every rank of problem 07, and the free run (``main``). The ranks report plain records (what a
step summed, the dtype and size of each Allreduce); each training step is a "step" phase of the task, whose
counters the checks read, and what the process holds while add() runs is read by each rank's agent (marks
"fuse" and "added"). Nothing here judges, and nothing here is taken on trust: this runs in the learner's
process, so the checker verifies what it returns against what the agents recorded (the collectives and their
bytes) and what it recomputes (the sums, from every rank's data, which no rank holds)."""

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distlab import IN_PLACE, MAX, SUM
from distlab.grading import return_freed_memory

from . import cases as model
from .cases import Case, Timed


class RecordingComm:
    """The rank's comm, passed through, noting the dtype and size of each Allreduce: what each buffer held."""

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self.allreduces: list[tuple[str, int]] = []

    def _note(self, buf: Any) -> Any:
        self.allreduces.append((str(buf.dtype).replace("torch.", ""), int(buf.nbytes)))
        return buf

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> Any:
        return self._comm.Allreduce(sendbuf, self._note(recvbuf), op)

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> Any:
        return self._comm.Iallreduce(sendbuf, self._note(recvbuf), op)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)


@dataclass
class CaseResult:
    first_sums: list[np.ndarray] = field(default_factory=list)  # the tensors after step 0's flush
    allreduces: list[list[tuple[str, int]]] = field(default_factory=list)  # per step: (dtype, bytes) of each
    sync_s: float = 0.0  # add() ... flush() of every step on the online clock (the free run's figure)
    final: list[np.ndarray] | None = None  # rank 0: the parameters after the last step
    final_digest: int = 0


def run_task(comm, solution, case: Case | Timed):
    """Every task's program (one launch runs them all, so the ranks start once): trains a case, or reduces one
    step's gradients once, by the learner's fusion or by one Allreduce per tensor (the baseline)."""
    if isinstance(case, Case):
        params, done = train(comm, solution, case)
        final = model.flat_params(params)
        done.final, done.final_digest = final if comm.Get_rank() == 0 else None, model.digest(final)
        return done
    spec = case.case.spec
    grads = model.gradients(spec, model.init_params(spec), *model.make_batch(spec, 0, 0, comm.Get_rank()))
    if case.fused:
        add_all(solution.Fusion(comm, case.case.threshold), grads.values())
    else:
        for g in grads.values():
            comm.Allreduce(IN_PLACE, g, SUM)
    return [g[:4].copy() for g in grads.values()]  # a sample, to make sure it was right


def train(comm, solution, case: Case) -> tuple[dict[str, Any], CaseResult]:
    """Trains the case's model with the learner's Fusion, each step a "step" phase: returns the parameters and
    what every step summed and sent."""
    params, recorder, done = model.init_params(case.spec), RecordingComm(comm), CaseResult()
    fusion = solution.Fusion(recorder, case.threshold)
    for step in range(case.steps):
        comm.mark("step")
        grads = model.gradients(case.spec, params, *model.make_batch(case.spec, 0, step, comm.Get_rank()))
        tensors, start = list(grads.values()), comm.now()
        recorder.allreduces.clear()
        # The agent reads what the process holds here (the last step's tensors gone, the heap's freed pages
        # returned) and samples it while add() runs, until "added" (Task(memory=True)): the memory check
        # grades the growth.
        return_freed_memory()
        comm.mark("fuse")
        for g in tensors:
            fusion.add(g)
        comm.mark("added")
        fusion.flush()
        done.sync_s += comm.now() - start
        done.allreduces.append(list(recorder.allreduces))
        if step == 0:
            done.first_sums = [g.copy() for g in tensors]
        model.apply_update(case.spec, params, grads, case.p)
        grads = tensors = None  # freed before the next step's gradients, which reuse their memory
    return params, done


def add_all(fusion: Any, grads: Any) -> None:
    """One cycle of the fusion: every tensor added, then flush()."""
    for g in grads:
        fusion.add(g)
    fusion.flush()


# -- the free run (distlab run 07, distlab tune 07) ------------------------------------------------------


def parse_bytes(text: str) -> int:
    """'65536', '64K', '64KiB', '1M' -> bytes (K and M are binary)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if scale > 1 else t) * scale)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a positive outranks a negative (ties count half)."""
    pos, neg = scores[labels > 0.5, None], scores[labels <= 0.5]
    return float(((pos > neg) + 0.5 * (pos == neg)).mean()) if pos.size and neg.size else 0.5


def heldout(spec: model.ModelSpec, params: dict[str, Any]) -> tuple[float, float]:
    """Loss and AUC on 4096 held-out examples."""
    ids, labels = model.make_batch(spec, 1, 0, 0, n=4096)
    z, _ = model.logits(spec, params, ids)
    prob = np.clip(model.sigmoid(z), 1e-12, 1 - 1e-12)
    return float(-(labels * np.log(prob) + (1 - labels) * np.log(1 - prob)).mean()), auc(z, labels)


def main(comm, solution, threshold="65536", steps="30", fields="120", seed="7"):
    """The free run: ``steps`` steps with Fusion(comm, threshold) (bytes, K/M allowed; 0: one Allreduce per
    tensor); rank 0 returns the held-out loss and AUC before and after, the Allreduces per step and the
    virtual sync time per step (comm.now(), the slowest rank's), which the Tune step sweeps:

        distlab tune 07 --param threshold=0,4K,64K,1M --fixed steps=1 --metric sync_s"""
    rank, p, n = comm.Get_rank(), comm.Get_size(), max(int(steps), 1)
    vocab = np.random.default_rng([int(seed), 70]).integers(8, 65, size=int(fields))
    spec = model.ModelSpec(int(seed), tuple(int(v) for v in vocab), 16, model.DTYPE_ORDER)
    before = heldout(spec, model.init_params(spec)) if rank == 0 else None
    params, done = train(comm, solution, Case(p, spec, parse_bytes(threshold), int(steps)))
    sync = np.array([done.sync_s / n])
    comm.Allreduce(IN_PLACE, sync, MAX)  # a step ends when its slowest rank is done
    if rank != 0:
        return None
    after = heldout(spec, params)
    return {"tensors": len(model.step_shapes(spec)), "loss_before": round(before[0], 4), "loss": round(after[0], 4),
            "auc_before": round(before[1], 4), "auc": round(after[1], 4),
            "allreduces_per_step": sum(map(len, done.allreduces)) / n, "sync_s": float(sync[0])}
