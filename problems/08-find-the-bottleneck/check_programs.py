"""Problem 08's rank programs: the training job with the learner's probes, then their diagnose().

run_variant is the program of the checks' launch (one task per hidden variant, and the twin
without probes); check.py's main, the free run, calls it too. The job declares its compute and
exchanges the gradient with a direct reduce-scatter and allgather over every cable (the checks)
or around a ring (the free run), marking "step", "sync" and "trained" so the supervisor's replay
brackets exactly the phases the probes wrap. What comes back is plain data (RankResult), never the
learner's objects; nothing is judged here (see check_judging.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from distlab import Request
from distlab.grading import CommStats, check_part

scenario = check_part(__file__, "scenario")  # Variant, the task args


# -- what runs on every rank ----------------------------------------------------------------------


@dataclass
class RankResult:
    report: Any  # rank 0: what diagnose() returned, as plain data; other ranks: None
    trace_json: str | None  # rank 0: the report's "trace" through json.dumps, as a file holds it
    trace_error: str  # why json.dumps failed, if it did
    trained: CommStats  # this rank's counters for the training phase alone


def ring_allreduce(comm: Any, buf: np.ndarray) -> None:
    """Ring reduce-scatter then ring allgather, one Sendrecv per step (the free run's exchange:
    on a platform with one port per rank, such as the laptop, its flows never share a link, so
    the probes' online clock and the replay agree)."""
    p, rank = comm.Get_size(), comm.Get_rank()
    if p == 1:
        return
    bounds = np.linspace(0, buf.size, p + 1).astype(int)
    right, left = (rank + 1) % p, (rank - 1) % p
    incoming = np.empty(int(np.max(np.diff(bounds))), dtype=buf.dtype)

    def chunk(i: int) -> np.ndarray:
        return buf[bounds[i % p] : bounds[i % p + 1]]

    for step in range(p - 1):
        mine = chunk(rank - step - 1)
        comm.Sendrecv(chunk(rank - step), dest=right, recvbuf=incoming[: mine.size], source=left)
        mine += incoming[: mine.size]
    for step in range(p - 1):
        comm.Sendrecv(chunk(rank + 1 - step), dest=right, recvbuf=chunk(rank - step), source=left)


def direct_allreduce(comm: Any, buf: np.ndarray) -> None:
    """Direct reduce-scatter then allgather: every rank sends chunk j to rank j at once, sums
    what arrives for its own chunk, then sends its summed chunk to everyone. On a mesh each
    pair has its own cable, so both phases take one message time: a slow cable slows them."""
    p, rank = comm.Get_size(), comm.Get_rank()
    if p == 1:
        return
    bounds = np.linspace(0, buf.size, p + 1).astype(int)
    chunks = [buf[bounds[i] : bounds[i + 1]] for i in range(p)]
    mine = chunks[rank]
    inbox = np.empty((p, mine.size), dtype=buf.dtype)
    peers = [r for r in range(p) if r != rank]
    requests = [comm.Irecv(inbox[r], source=r, tag=11) for r in peers]
    requests += [comm.Isend(chunks[r], dest=r, tag=11) for r in peers]
    Request.Waitall(requests)
    for r in peers:
        mine += inbox[r]
    requests = [comm.Irecv(chunks[r], source=r, tag=12) for r in peers]
    requests += [comm.Isend(mine, dest=r, tag=12) for r in peers]
    Request.Waitall(requests)


def plain(value: Any, depth: int = 0) -> Any:
    """The learner's answer as data the checker can unpickle (their classes stay on the rank)."""
    if depth > 20:
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.copy() if value.dtype.kind in "biuf" else plain(value.tolist(), depth + 1)
    if isinstance(value, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(plain(v, depth + 1) for v in value)
    if isinstance(value, (list, set, frozenset)):
        return [plain(v, depth + 1) for v in value]
    try:  # a torch tensor
        return np.asarray(value.detach().cpu().numpy()).copy()
    except AttributeError:
        return repr(value)


def run_training(comm: Any, solution: Any, v: scenario.Variant) -> Any:
    """The job: steps of compute and gradient exchange, the learner's probes around each phase."""
    rank = comm.Get_rank()
    grad = np.zeros(v.grad_elems, dtype=np.float32)
    probes = solution.Probes(comm) if v.probed else None
    for step in range(v.steps):
        comm.mark("step")
        grad[:] = 1.0 / (rank + step + 1)  # this step's gradient (its values do not matter here)
        if probes is not None:
            probes.start("compute")
        comm.compute(seconds=v.compute[rank][step], label="forward+backward")
        if probes is not None:
            probes.stop("compute")
        comm.mark("sync")
        if probes is not None:
            probes.start("sync")
        (ring_allreduce if v.exchange == "ring" else direct_allreduce)(comm, grad)
        if probes is not None:
            probes.stop("sync")
    comm.mark("trained")
    return probes, comm.stats.snapshot()


def run_variant(comm: Any, solution: Any, v: scenario.Variant) -> RankResult:
    """One variant: train with probes, then the learner's diagnose() (collective)."""
    probes, trained = run_training(comm, solution, v)
    if probes is None:
        return RankResult(None, None, "", trained)
    report = plain(solution.diagnose(comm, probes))
    if comm.Get_rank() != 0:
        return RankResult(None, None, "", trained)
    trace_json, trace_error = None, ""
    if isinstance(report, dict) and "trace" in report:
        try:
            trace_json = json.dumps(report.pop("trace"))
        except (TypeError, ValueError) as exc:
            trace_error = f"{type(exc).__name__}: {exc}"
    return RankResult(report, trace_json, trace_error, trained)
