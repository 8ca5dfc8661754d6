"""What runs on every rank of problem 08: the training job with the learner's probes, then their
diagnose(). Its marks "step", "sync" and "trained" bracket exactly the phases the probes wrap, so
the replay can tell the truth; only plain data (RankResult) comes back to the supervisor.

A rank is handed its Part of the variant (cases.Variant.for_rank): its own compute and the job's
shape. Which rank straggles and which cable is slow stay with the checker: the agents apply them
as faults, so this process (the learner's too) can only measure them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from distlab import Request

from .cases import Part, Variant, compute_table


@dataclass
class RankResult:
    report: Any  # rank 0: what diagnose() returned, as plain data; other ranks: None
    trace_json: str | None = None  # rank 0: the report's "trace" through json.dumps, as a file holds it
    trace_error: str = ""  # why json.dumps failed, if it did


class Unprobed:
    """The twin's probes, which do nothing: the baseline of what the learner's probes cost."""

    start = stop = staticmethod(lambda phase: None)


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


def run_variant(comm: Any, solution: Any, v: Part) -> RankResult:
    """One variant, as this rank's Part of it: steps of compute and gradient exchange with the
    learner's probes around each phase, then their diagnose() (collective)."""
    rank = comm.Get_rank()
    if v.rank != rank:
        raise ValueError(f"rank {rank} was handed rank {v.rank}'s part of the variant")
    grad = np.zeros(v.grad_elems, dtype=np.float32)
    probes = solution.Probes(comm) if v.probed else Unprobed()
    for step in range(v.steps):
        comm.mark("step")
        grad[:] = 1.0 / (rank + step + 1)  # this step's gradient (its values do not matter here)
        probes.start("compute")
        comm.compute(seconds=v.compute[step], label="forward+backward")
        probes.stop("compute")
        comm.mark("sync")
        probes.start("sync")
        (ring_allreduce if v.exchange == "ring" else direct_allreduce)(comm, grad)
        probes.stop("sync")
    comm.mark("trained")  # the checks count the training's calls up to here
    report = plain(solution.diagnose(comm, probes)) if v.probed else None
    result = RankResult(report if rank == 0 else None)
    if isinstance(result.report, dict) and "trace" in result.report:
        try:
            result.trace_json = json.dumps(result.report.pop("trace"))
        except (TypeError, ValueError) as exc:
            result.trace_error = f"{type(exc).__name__}: {exc}"
    return result


def main(comm: Any, solution: Any, steps: str = "12", straggler: str = "-1", factor: str = "2.0",
         grad_kib: str = "1024", compute_ms: str = "1.0") -> Any:
    """A free run (distlab run 08): one job with probes, then diagnose(); rank 0 sums it up.
    The gradients go around a ring here (the checks use a direct exchange on their mesh).

    straggler=R factor=F make rank R declare F times more compute (a straggler); a slow link comes
    from a fault plan (--faults), e.g. a `bandwidth` fault with groups = [[2], [3]]."""
    p, rank = comm.Get_size(), comm.Get_rank()
    base, _ = compute_table(p, int(steps), float(compute_ms) * 1e-3, np.random.default_rng(8))
    table = tuple(tuple(float(factor) * x for x in row) if r == int(straggler) else row
                  for r, row in enumerate(base))
    free = Variant("free run", p, int(steps), int(grad_kib) * 256, table, exchange="ring")
    result = run_variant(comm, solution, free.for_rank(rank))
    if rank != 0:
        return None
    report = result.report if isinstance(result.report, dict) else {}
    ratio = report.get("sync_compute_ratio")
    ratio_text = f"{ratio:.3f}" if isinstance(ratio, (int, float)) else repr(ratio)
    return (f"stragglers {report.get('stragglers')} · slow links {report.get('slow_links')} · "
            f"sync/compute {ratio_text} over the {steps} training steps (p = {p}; the run's figures "
            "below also count diagnose()'s gather and pings)")
