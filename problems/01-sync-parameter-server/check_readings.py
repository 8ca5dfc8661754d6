"""Reading a finished run of problem 01: what the ranks handed back, and what their traces show.

The servers' shards must tile the keys and add up to the expected model (check_models.py); a
worker's byte counters must come to one pull and one push of the model per step; the traces give
the order in which each server served pulls and took pushes (a server that mixes two steps shows
there), and the replay on the virtual clock gives pull and push latencies. Each reader returns a
verdict in words, naming the case and the symptom, for the checks in check.py to pass or fail on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from distlab.grading import CommStats, check_part

if TYPE_CHECKING:
    from distlab.grading import TaskRun

cases = check_part(__file__, "cases")
models = check_part(__file__, "models")
programs = check_part(__file__, "programs")




# -- reading a run: shards, bytes, the order of pushes, latencies ---------------------------------


def shard_layout(case: cases.Case, results: list[programs.RankResult],
                 ) -> tuple[list[tuple[int, int]], str | None]:
    """Each server's key range [lo, hi), and what is wrong with them (None when they tile the keys)."""
    layout: list[tuple[int, int]] = []
    for s, result in enumerate(results[: case.servers]):
        if result.lo is None or result.shard is None:
            return [], (f"{case.label()}: server {s} returned {result.returned}; expected "
                        "(lo, weights): its first key and the final values of its keys")
        layout.append((result.lo, result.lo + len(result.shard)))
    return layout, tiling_problem(case.keys, layout)


def tiling_problem(keys: int, layout: list[tuple[int, int]]) -> str | None:
    """None if the ranges cover 0 .. keys-1 exactly once, else what is wrong (pure)."""
    order = sorted(range(len(layout)), key=lambda s: (layout[s][0], layout[s][1]))
    covered = 0
    for s in order:
        lo, hi = layout[s]
        if lo < 0 or hi > keys:
            return f"server {s} holds keys {lo}..{hi - 1}, outside the model's 0..{keys - 1}"
        if lo > covered:
            return f"keys {covered}..{lo - 1} are held by no server"
        if lo < covered and hi > lo:
            return f"server {s} holds keys {lo}..{hi - 1}, some of which another server holds too"
        covered = max(covered, hi)
    if covered < keys:
        return f"keys {covered}..{keys - 1} are held by no server"
    return None


def assemble(keys: int, layout: list[tuple[int, int]],
             results: list[programs.RankResult]) -> np.ndarray:
    model = np.empty(keys)
    for (lo, hi), result in zip(layout, results):
        assert result.shard is not None
        model[lo:hi] = result.shard
    return model


def balance(sizes: list[int]) -> float:
    """Largest shard over smallest (inf when a server holds no key) (pure)."""
    return max(sizes) / min(sizes) if min(sizes) > 0 else float("inf")


def model_bytes_per_step(case: cases.Case) -> int:
    """One pull and one push of the whole model: what each worker moves per step."""
    return 2 * case.keys * cases.ITEMSIZE


def worker_bytes_problem(case: cases.Case, worker: int,
                         stats: CommStats) -> tuple[float, str | None]:
    """A worker's bytes per step over the model's pull + push, and a message if off by over 5%."""
    want = model_bytes_per_step(case)
    moved = (stats.bytes_sent + stats.bytes_received) / case.steps
    ratio = moved / want
    if abs(ratio - 1.0) <= cases.BYTES_TOLERANCE:
        return ratio, None
    rank = case.servers + worker
    head = (f"{case.label()}: worker rank {rank} moved {moved:,.0f} bytes per step, "
            f"{ratio:.2f}x one pull + one push of the model ({want:,} bytes)")
    model = case.keys * cases.ITEMSIZE
    to_servers = [stats.sent_bytes.get(s, 0) / case.steps for s in range(case.servers)]
    from_servers = [stats.recv_bytes.get(s, 0) / case.steps for s in range(case.servers)]
    if moved == 0:
        return ratio, f"{head}: it neither pulled nor pushed"
    if case.servers > 1 and min(to_servers) >= 0.95 * model:
        return ratio, (f"{head}: it pushes the whole gradient to every server ({min(to_servers):,.0f} "
                       "bytes or more to each); each server needs only the slice of its own keys")
    if case.servers > 1 and min(from_servers) >= 0.95 * model:
        return ratio, (f"{head}: it pulls the whole model from every server; each server "
                       "should send only its own shard")
    sent, got = sum(to_servers), sum(from_servers)
    return ratio, (f"{head}: {sent:,.0f} bytes pushed and {got:,.0f} pulled per step, where one "
                   f"pull and one push are {model:,} bytes each (one of each per step, no extra "
                   "pull after the last step)")


def server_timeline(task_run: TaskRun, case: cases.Case, server: int) -> list[tuple[str, int]]:
    """What server ``server`` did with the workers, in its program order: ("push", w) when it
    took a push from worker rank w, ("pull", w) when it sent w its shard.

    Read from the traces. A push is one of the largest messages the server received from the
    workers, sized by the matching send in the worker's trace (a receive buffer may be larger
    than its message); a pull is one of the largest it sent them (not a small control message).
    Events: ("send", req, ctx, dst, tag, k, nbytes, ...), ("wait", reqs, {req: (ctx, src, tag,
    k)}, ...)."""
    traces = task_run.traces
    workers = set(case.worker_ranks)
    sizes: dict[tuple[Any, ...], int] = {}
    for w in workers:
        for e in traces.get(w, []):
            if e[0] == "send" and e[3] == server:
                sizes[(e[2], w, e[4], e[5])] = int(e[6])
    events: list[tuple[str, int, int]] = []
    for e in traces.get(server, []):
        if e[0] == "send" and e[3] in workers:
            events.append(("pull", e[3], int(e[6])))
        elif e[0] == "wait":
            for ctx, src, tag, k in e[2].values():
                if src in workers:
                    events.append(("push", src, sizes.get((ctx, src, tag, k), 0)))
    largest = {kind: max((n for what, _, n in events if what == kind), default=0)
               for kind in ("pull", "push")}
    return [(kind, w) for kind, w, n in events if n > 0 and n >= largest[kind] / 2]


def first_out_of_step(timeline: list[tuple[str, int]], workers: list[int]) -> str | None:
    """The first thing a server did out of step, in words; None if it kept in step (pure).

    In synchronous training the server may send the shard of step j, and take a push of step j,
    only once it holds the push of step j-1 from every worker."""
    pushes = {w: 0 for w in workers}
    pulls = {w: 0 for w in workers}
    for kind, w in timeline:
        step = pulls[w] if kind == "pull" else pushes[w]
        missing = [other for other in workers if pushes[other] < step]
        if missing:
            if kind == "pull":
                return (f"sent worker rank {w} its shard for step {step} before the push of step "
                        f"{step - 1} from worker rank {missing[0]} had arrived (a stale pull)")
            return (f"took the push of step {step} from worker rank {w} while the push of step "
                    f"{step - 1} from worker rank {missing[0]} had not arrived")
        (pulls if kind == "pull" else pushes)[w] += 1
    return None


@dataclass(frozen=True)
class Latencies:
    pull_s: list[float]  # per worker step: from its last push delivered to its next compute
    push_s: list[float]  # per worker step: from the end of its compute to its last push delivered
    sync_compute: float  # workers' blocked time over their declared compute

    def describe(self) -> str:
        if not self.pull_s:
            return "no declared compute (call batch.gradient): latencies unavailable"
        return (f"pull P50 {models.fmt(np.percentile(self.pull_s, 50))}, "
                f"max {models.fmt(max(self.pull_s))}; "
                f"push P50 {models.fmt(np.percentile(self.push_s, 50)) if self.push_s else 'n/a'}; "
                f"sync/compute {self.sync_compute:.2f}")


def latencies(task_run: TaskRun, case: cases.Case) -> Latencies:
    """Push and pull latency of each worker step on the virtual clock (the replay)."""
    replay = task_run.replay()
    pulls: list[float] = []
    pushes: list[float] = []
    compute = comm = 0.0
    for w in case.worker_ranks:
        events, spans = task_run.traces.get(w, []), replay.spans.get(w, ())
        computes = [spans[i] for i, e in enumerate(events) if e[0] == "compute"]
        out = [f for f in replay.flows if f.src == w and f.dst < case.servers]
        ready = 0.0  # when the worker's previous push was delivered
        for j, (begin, end) in enumerate(computes):
            pulls.append(begin - ready)
            until = computes[j + 1][0] if j + 1 < len(computes) else float("inf")
            delivered = [f.end for f in out if end <= f.posted <= until]
            if delivered:
                pushes.append(max(delivered) - end)
            ready = max(delivered) if delivered else end
        compute += replay.compute_s.get(w, 0.0)
        comm += replay.comm_s.get(w, 0.0)
    return Latencies(pulls, pushes, comm / compute if compute > 0 else float("inf"))


# -- the verdict on the final model ---------------------------------------------------------------


def mixed_steps(task_run: TaskRun, case: cases.Case) -> str | None:
    """Names the first push a server took into the wrong step, as the traces show it."""
    for s in case.server_ranks:
        found = first_out_of_step(server_timeline(task_run, case, s), case.worker_ranks)
        if found is not None:
            return (f"server {s} {found}: it mixed two steps; answer the pull of step k only "
                    "after applying step k - 1, and count a push only in the step it is tagged "
                    "with")
    return None


def model_problem(task_run: TaskRun) -> str | None:
    """None if the servers' shards make up the expected model, else what is wrong."""
    case: cases.Case = task_run.task.args[0]
    layout, problem = shard_layout(case, task_run.values)
    if problem is not None:
        return problem if not layout else f"{case.label()}: {problem}"
    got = assemble(case.keys, layout, task_run.values)
    if models.close(got, models.sgd(case)):
        return None
    message, named = models.diagnose_model(case, got, layout)
    mixed = None if named else mixed_steps(task_run, case)
    return f"{message}; {mixed}" if mixed else message
