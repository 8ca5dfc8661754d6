"""What runs on the ranks of problem 10: the harness's workers and mailbox around the learner's
server, one case per task, and the free run (main, bounds, figure).

Rank 0 is the server, ranks 1 .. W the workers. The workers are the harness's: worker j reads the
model at clock c (its c-th read), computes its gradient for the declared time of its step (a
straggler's is 2-5x longer), and pushes it with a request for its next read. The mailbox hands
the server these messages in the order they leave on the virtual clock: each worker announces
when its next push will leave as soon as it has its model, so the mailbox always knows which
message comes first without waiting for the later ones. Each rank is handed only its part of the
case (``Case.for_rank``). The ranks judge nothing: the checks read the trace and the messages every
rank sent, as its agent recorded them, never what a rank returns alone."""

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import cases
from .cases import ANNOUNCE, MODEL, PUSH, Case, ServerView, WorkerView


@dataclass(frozen=True)
class Push:
    """One message of a worker: its clock (gradients pushed so far, this one included), the gradient
    of its step clock - 1 (None in its first message, which only asks for the model of step 0),
    and whether it is its last (then it wants no more reads)."""

    worker: int
    clock: int
    gradient: np.ndarray | None
    last: bool


class Stuck(RuntimeError):
    """Every worker left waits for a read, so no message can come: the server would wait forever."""


class Mailbox:
    """The server's side of the harness: ``next()`` gives the next Push in the order the pushes leave
    on the virtual clock (None once every worker has sent its last); ``reply(worker, weights)``
    sends a waiting worker the model, which answers its read."""

    def __init__(self, comm: Any, workers: list[int], features: int, staleness: int = 0) -> None:
        self._comm, self._workers, self._features, self._s = comm, list(workers), features, staleness
        self._leaves: dict[int, float] = {w: 0.0 for w in workers}  # every first message leaves at 0
        self._active = set(workers)  # computing: a push will come
        self._waiting: dict[int, int] = {}  # worker -> the clock of its read
        self._clock: dict[int, int] = {w: 0 for w in workers}  # worker -> the clock of its latest push
        self._done: list[int] = []  # the workers that sent their last push, in order
        self._done_at_ask = 0  # how many had when the latest read came in

    def next(self) -> Push | None:
        if not self._active:
            if self._waiting:
                # The agent records the mark: a server that catches the Stuck and then answers the read
                # (as its last push should have) leaves a trace as correct as the reference's.
                self._comm.mark(cases.STUCK_MARK)
                raise Stuck("the server asked for the next push, but no worker can send one: "
                            + ", ".join(f"rank {w} (reading at clock {c})" for w, c in sorted(self._waiting.items()))
                            + " wait for a read, and " + self._why_stuck())
            return None
        for w in sorted(self._active - set(self._leaves)):  # every active worker's next push: when it leaves
            note = np.empty(1)
            self._comm.Recv(note, source=w, tag=ANNOUNCE)
            self._leaves[w] = float(note[0])
        worker = min(self._active, key=lambda w: (self._leaves[w], w))
        message = np.empty(2 + self._features)
        self._comm.Recv(message, source=worker, tag=PUSH)
        del self._leaves[worker]
        self._active.discard(worker)
        clock, last = int(message[0]), bool(message[1])
        self._clock[worker] = clock
        if last:
            self._done.append(worker)
        else:
            self._waiting[worker] = clock
            self._done_at_ask = len(self._done)
        return Push(worker, clock, message[2:].copy() if clock > 0 else None, last)

    def _frees(self, table: dict[int, float]) -> bool:
        """Whether the rule, with this clock table, frees a waiting read."""
        return any(min(table.values()) >= c - self._s for c in self._waiting.values())

    def _table(self, done: list[int]) -> dict[int, float]:
        """The clock table when the workers ``done`` had finished (at infinity) and the others had
        sent every push but their last, if they have sent it since."""
        return {w: math.inf if w in done else self._clock[w] - (w in self._done) for w in self._workers}

    def _why_stuck(self) -> str:
        """Every worker waits or is done. With the finished at infinity the rule always frees the lowest
        waiting read; which mistake kept it: a server that keeps a finished worker's last clock answers
        what that table frees, and one that re-checks on every push but the last answered what the
        rule freed at the latest push that asked for a read (no read came in since)."""
        if not self._done:
            return "no worker has finished"
        done = ", ".join(f"rank {w}" for w in sorted(self._done))
        kept_rules_out = self._frees({w: float(self._clock[w]) for w in self._workers})  # it would have answered
        ask = self._done_at_ask  # the latest push that asked for a read came after this many finished
        recheck_rules_out = self._frees(self._table(self._done[:ask]))  # freed already then: no last push needed
        freed_by = next((w for n, w in enumerate(self._done[ask:], ask + 1)
                         if self._frees(self._table(self._done[:n]))), self._done[-1])
        if recheck_rules_out and kept_rules_out:
            return (f"{done} sent its last push; the rule allows a waiting read (the finished count as infinitely "
                    "far ahead): after every push answer every kept read the rule allows")
        if recheck_rules_out:
            return f"{done} sent its last push. A worker that has finished will never push again: {cases.KEPT_CLOCK}"
        if kept_rules_out:
            return f"{done} sent its last push: after the last push of worker rank {freed_by} {cases.NOT_RECHECKED}"
        return (f"{done} sent its last push. Two mistakes leave these reads waiting: a finished worker's last clock "
                f"still counted as the slowest (count it as infinitely far ahead), or no re-check after the last "
                f"push of worker rank {freed_by}, which frees them (re-check the waiting reads on every push, the "
                "last one too)")

    def unfinished(self) -> str:
        """The workers that have not sent their last push yet, in words ("" when all have)."""
        left = sorted(set(self._workers) - set(self._done))
        return ", ".join(f"rank {w}" + (f" (its read at clock {self._waiting[w]} unanswered)" if w in self._waiting
                                        else "") for w in left)

    def reply(self, worker: int, weights: Any) -> None:
        if worker not in self._waiting:
            raise ValueError(f"box.reply({worker}, ...): worker {worker} has no read waiting (its reads: one "
                             "per Push that is not its last, answered once)")
        model = np.array(weights, dtype=np.float64).reshape(-1)
        if model.shape != (self._features,):
            raise ValueError(f"box.reply: the model has {model.size} weights, expected {self._features}")
        self._comm.Send(model, dest=worker, tag=MODEL)
        del self._waiting[worker]
        self._active.add(worker)


def work(comm: Any, case: WorkerView) -> list[np.ndarray]:
    """Worker ``case.index`` (rank index + 1): every step, read, compute, push; returns the models it
    read. The checks hold every worker to this order, these sizes and these contents."""
    steps, reads = case.steps, []
    comm.Send(np.zeros(2 + cases.FEATURES), dest=0, tag=PUSH)  # clock 0: the read of step 0
    for step in range(steps):
        w = np.empty(cases.FEATURES)
        comm.Recv(w, source=0, tag=MODEL)
        reads.append(w.copy())
        seconds = case.compute_s(step)
        comm.Send(np.array([comm.now() + seconds]), dest=0, tag=ANNOUNCE)  # when the push will leave
        grad = cases.gradient(w, *case.batches[step], case.workers)
        comm.compute(seconds=seconds, label="gradient")
        comm.Send(np.concatenate([[step + 1, step + 1 == steps], grad]), dest=0, tag=PUSH)
    return reads


def run_case(comm: Any, solution: Any, case: ServerView | WorkerView) -> Any:
    """One case, as this rank's view of it (``Case.for_rank``): the server returns its final model
    (or, in words, what it returned instead); a worker the models it read."""
    workers = list(range(1, case.workers + 1))
    comm.mark(case.what)
    if isinstance(case, WorkerView):
        return work(comm, case)
    box = Mailbox(comm, workers, cases.FEATURES, case.staleness)
    out = solution.server(comm, box, workers, case.weights.copy(), case.staleness, case.lr)
    if left := box.unfinished():  # the workers would wait for ever: say so now
        raise Stuck(f"the server returned before every worker was done: {left}. Serve until box.next() "
                    "returns None")
    try:
        return np.array(out, dtype=np.float64).reshape(cases.FEATURES)
    except Exception:  # noqa: BLE001 - any shape of mistake becomes a message
        return f"{type(out).__name__} {repr(out)[:60]}"


# -- the free run: one staleness, or the sweep 0 .. 8, under the card's stragglers --------------------


def free_case(workers: int, staleness: int, steps: int, seed: int) -> Case:
    rng = np.random.default_rng([seed, 20])
    return Case(f"free run, s = {staleness}", staleness, cases.rounds(rng, workers, steps), 1.5, seed)


def main(comm, solution, staleness="sweep", steps="24", seed="1"):
    """One server and p - 1 workers under the card's stragglers. ``staleness=3`` runs one bound and
    returns its throughput (samples per virtual second), its held-out loss and the synchronous
    ones; ``sweep`` (the default, what `distlab report 10` draws) runs s = 0 .. 8 one after the
    other. `distlab tune 10 --param staleness=0,1,2,3,4,5,6,7,8 --metric samples_per_s --beside loss`."""
    if comm.Get_size() < 2:
        raise ValueError("problem 10 needs a server and at least one worker: --ranks 2 or more")
    bounds_ = list(range(9)) if staleness == "sweep" else [int(staleness)]
    summary: dict[str, Any] = {"staleness": bounds_, "samples_per_s": [], "loss": []}
    for s in bounds_:
        case = free_case(comm.Get_size() - 1, s, int(steps), int(seed))
        comm.Barrier()  # not the learner's: every run starts together
        start = comm.now()
        model = run_case(comm, solution, case.for_rank(comm.Get_rank()))
        comm.Barrier()
        if comm.Get_rank() == 0:
            samples = sum(case.steps) * cases.BATCH
            summary["samples_per_s"].append(round(samples / max(comm.now() - start, 1e-12), 1))
            summary["loss"].append(round(cases.loss(case, model), 5) if isinstance(model, np.ndarray) else float("nan"))
    if comm.Get_rank():
        return None
    sync = free_case(comm.Get_size() - 1, 0, int(steps), int(seed))
    summary["sync_samples_per_s"] = round(sum(sync.steps) * cases.BATCH / cases.simulate(sync).makespan, 1)
    summary["sync_loss"] = round(cases.loss(sync, cases.synchronous(sync)[-1]), 5)
    if staleness != "sweep":
        summary = {k: (v[0] if isinstance(v, list) else v) for k, v in summary.items()}
    return summary


def bounds(platform, ranks, staleness="sweep", steps="24", seed="1"):
    """The most a server with this bound can reach: the card's server simulated, messages free."""
    if staleness == "sweep":
        return {}
    case = free_case(ranks - 1, int(staleness), int(steps), int(seed))
    return {"samples_per_s": sum(case.steps) * cases.BATCH / cases.simulate(case).makespan}


def figure(summary: dict) -> str:
    """Throughput and held-out loss against s, in one picture: `distlab report 10` draws it from the
    free run's sweep (numbers this module checks, never markup from a rank)."""
    try:
        xs = [int(s) for s in summary["staleness"]]
        speed = [float(v) for v in summary["samples_per_s"]]
        loss = [float(v) for v in summary["loss"]]
        sync_speed, sync_loss = float(summary["sync_samples_per_s"]), float(summary["sync_loss"])
    except (KeyError, TypeError, ValueError):
        return ""
    if len(xs) < 2 or len(speed) != len(xs) or len(loss) != len(xs):
        return ""
    width, height, left, right, top, bottom = 640, 300, 70, 70, 30, 45

    def x_of(s: float) -> float:
        return left + (s - min(xs)) / (max(xs) - min(xs)) * (width - left - right)

    def scale(values: list[float], headroom: float) -> tuple[float, float]:
        finite = [v for v in values if np.isfinite(v)]
        return 0.0, max(finite) * headroom if finite and max(finite) > 0 else 1.0

    def y_of(v: float, lo: float, hi: float) -> float:
        return top + (1 - (v - lo) / (hi - lo)) * (height - top - bottom)

    s_lo, s_hi = scale(speed + [sync_speed], 1.1)
    l_lo, l_hi = scale(loss + [sync_loss], 1.6)  # the loss below the speed curve
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             'font-size="12">',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#444"/>']
    for s in xs:
        parts.append(f'<text x="{x_of(s):.1f}" y="{height - bottom + 16}" text-anchor="middle">{s}</text>')
    parts.append(f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">staleness bound s</text>')
    for values, sync, lo, hi, colour, name, anchor, at in (
            (speed, sync_speed, s_lo, s_hi, "#1f77b4", "samples per virtual second", "start", 8),
            (loss, sync_loss, l_lo, l_hi, "#d62728", "held-out loss, equal samples", "end", width - 8)):
        points = " ".join(f"{x_of(s):.1f},{y_of(v, lo, hi):.1f}" for s, v in zip(xs, values) if np.isfinite(v))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts += [f'<circle cx="{x_of(s):.1f}" cy="{y_of(v, lo, hi):.1f}" r="3" fill="{colour}"/>'
                  for s, v in zip(xs, values) if np.isfinite(v)]
        y = y_of(sync, lo, hi)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="{colour}" '
                     'stroke-dasharray="5,4" opacity="0.6"/>')
        parts.append(f'<text x="{at}" y="{top - 10}" text-anchor="{anchor}" fill="{colour}">{name}</text>')
        for frac in (0.0, 0.5, 1.0):
            v = lo + frac * (hi - lo)
            label = f"{v:,.0f}" if colour == "#1f77b4" else f"{v:.3f}"
            parts.append(f'<text x="{at}" y="{y_of(v, lo, hi) + 4:.1f}" text-anchor="{anchor}" fill="{colour}">'
                         f'{label}</text>')
    parts.append(f'<text x="{width - right}" y="{height - bottom - 6}" text-anchor="end" fill="#666">dashed: '
                 'synchronous training under the same stragglers</text></svg>')
    return "".join(parts)
