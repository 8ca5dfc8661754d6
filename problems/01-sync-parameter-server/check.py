"""Checks for problem 01, a synchronous parameter server.

The story: a click-through-rate model (logistic regression over hashed features) is trained by S
server ranks, which hold key-range shards of the weights, and W worker ranks, which hold the click
logs. Ranks 0 .. S-1 run the learner's ``server``, ranks S .. S+W-1 the learner's ``worker``. After
K steps the servers hand back their shards, and the model they add up to must be the one that
plain gradient descent reaches on the concatenated global batch, computed here in the supervisor.

The same runs are then read for what went over the wire (one pull and one push of the model per
worker per step, no more), for how the keys were split (about 1/S per server), and for every
(S, W) pair, S = 1 and W = 1 included. Last, one worker's messages are held back for real
(50 ms each), so that a server that answers pulls before its step is complete, or that takes
"the next W pushes" whatever their step, mixes two steps and ends with the wrong model.

Hidden variants: S and W of the main case and of two more pairs, the number of keys (never a
multiple of S), the workers' batch sizes (never all equal), the number of steps, the learning
rate, the data and the initial weights; the late worker. All from the session seed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from distlab.grading import CheckContext, Checklist, Task, parse_fault_plan
from distlab.runtime.stats import CommStats

if TYPE_CHECKING:
    from distlab.grading.api import TaskRun

ITEMSIZE = 8  # the model, gradients and pulls are float64
FIELDS = 8  # categorical fields per impression: user segment, ad category, hour, device, ...
CARDINALITY = 100  # values per field before hashing
RTOL, ATOL = 1e-6, 1e-9  # float64 and the same arithmetic: only the summation order may differ
BYTES_TOLERANCE = 0.05  # bytes per worker per step within 5% of one pull + one push of the model
BALANCE_LIMIT = 1.1  # largest shard at most 1.1x the smallest
LATE_S = 0.05  # the late worker's messages leave 50 ms late, in real time and on the virtual clock
TIME_LIMIT = 1.10  # virtual time per step at most 10% above the bound


# -- the data: impressions with hashed features, and clicks ----------------------------------------


@dataclass(frozen=True)
class Case:
    servers: int  # S
    workers: int  # W
    keys: int  # D, the model's length (hash buckets)
    batches: tuple[int, ...]  # examples held by each worker
    steps: int  # K
    lr: float
    seed: int
    what: str  # which edge the case probes
    late: int | None = None  # the worker rank whose messages are held back (a fault plan)

    def label(self) -> str:
        sizes = ", ".join(str(n) for n in self.batches)
        return (f"S = {self.servers}, W = {self.workers} ({self.what}), {self.keys} keys, "
                f"batches of {sizes}, {self.steps} steps")

    @property
    def server_ranks(self) -> list[int]:
        return list(range(self.servers))

    @property
    def worker_ranks(self) -> list[int]:
        return list(range(self.servers, self.servers + self.workers))


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # the logistic function, without overflow warnings


def hashed(fields: np.ndarray, values: np.ndarray, keys: int) -> tuple[np.ndarray, np.ndarray]:
    """The hashing trick: (field, value) -> a bucket in [0, keys) and a sign (+1 or -1)."""
    h = fields.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    h ^= values.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
    h ^= h >> np.uint64(29)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(32)
    return (h % np.uint64(keys)).astype(np.int64), np.where(h >> np.uint64(63), -1.0, 1.0)


def impressions(seed: int, stream: int, n: int, keys: int) -> tuple[np.ndarray, np.ndarray]:
    """n impressions of one stream (a worker's log, or held-out data): X (n, keys), y (n,)."""
    teacher = np.random.default_rng([seed, 1]).normal(0.0, 0.9, size=(FIELDS, CARDINALITY))
    rng = np.random.default_rng([seed, 2, stream])
    values = (CARDINALITY * rng.random((n, FIELDS)) ** 2).astype(np.int64)  # popular values first
    fields = np.broadcast_to(np.arange(FIELDS), values.shape)
    logits = -1.2 + teacher[fields, values].sum(axis=1)
    y = (rng.random(n) < sigmoid(logits)).astype(np.float64)
    X = np.zeros((n, keys))
    bucket, sign = hashed(fields, values, keys)
    np.add.at(X, (np.repeat(np.arange(n), FIELDS), bucket.ravel()), sign.ravel())
    bias_bucket, _ = hashed(np.array([FIELDS]), np.array([0]), keys)
    X[:, bias_bucket[0]] += 1.0  # the bias is one more hashed feature, present in every row
    return X, y


def initial_weights(case: Case) -> np.ndarray:
    return np.random.default_rng([case.seed, 3]).normal(0.0, 0.05, size=case.keys)


def worker_data(case: Case, index: int) -> tuple[np.ndarray, np.ndarray]:
    return impressions(case.seed, 10 + index, case.batches[index], case.keys)


class Batch:
    """One worker's share of the global batch: ``X`` (n x keys hashed features) and ``y`` (n
    clicks, 0 or 1). ``gradient(w)`` returns the SUM over the n examples of the log-loss gradient
    at the full model ``w``, and declares its work to the virtual clock."""

    def __init__(self, X: np.ndarray, y: np.ndarray, comm: Any = None) -> None:
        self.X, self.y = X, y
        self._comm = comm

    @property
    def size(self) -> int:
        return len(self.y)

    def __iter__(self) -> Any:  # so that ``X, y = batch`` works too
        return iter((self.X, self.y))

    def gradient(self, w: Any) -> np.ndarray:
        w = np.asarray(w, dtype=np.float64)
        if w.shape != (self.X.shape[1],):
            raise ValueError(f"gradient(w): w has shape {w.shape}, expected ({self.X.shape[1]},): "
                             "the whole model, one shard pulled from every server")
        if self._comm is not None and hasattr(self._comm, "compute"):
            self._comm.compute(flops=4.0 * self.X.size, label="gradient")  # two matrix-vector products
        return self.X.T @ (sigmoid(self.X @ w) - self.y)

    def loss(self, w: Any) -> float:
        """Mean log loss of the model w on this batch."""
        z = self.X @ np.asarray(w, dtype=np.float64)
        return float(np.mean(np.logaddexp(0.0, z) - self.y * z))


# -- what runs on every rank ----------------------------------------------------------------------


@dataclass
class RankResult:
    role: str  # "server" or "worker"
    lo: int | None  # a server's first key (None: the return value broke the contract)
    shard: np.ndarray | None  # a server's final weights of keys lo .. lo + len - 1
    returned: str  # what the server returned, when it broke the contract
    stats: CommStats


def _as_shard(out: Any) -> tuple[int | None, np.ndarray | None, str]:
    try:
        lo, values = out
        return int(lo), np.array(values, dtype=np.float64).reshape(-1), ""
    except Exception:  # noqa: BLE001 - any shape of mistake becomes a message
        return None, None, f"{type(out).__name__} {repr(out)[:60]}"


def run_ps(comm, solution, case: Case) -> RankResult:
    """Ranks 0 .. S-1 run the learner's server, the others its worker, for one case."""
    rank = comm.Get_rank()
    if rank < case.servers:
        weights = initial_weights(case)
        before = comm.stats.snapshot()
        out = solution.server(comm, case.server_ranks, case.worker_ranks, weights, case.steps,
                              case.lr)
        lo, shard, returned = _as_shard(out)
        return RankResult("server", lo, shard, returned, comm.stats.since(before))
    batch = Batch(*worker_data(case, rank - case.servers), comm=comm)
    before = comm.stats.snapshot()
    solution.worker(comm, case.server_ranks, case.worker_ranks, batch, case.steps)
    return RankResult("worker", None, None, "", comm.stats.since(before))


def main(comm, solution, servers="auto", keys="4096", batch="512", steps="30", lr="2.0", seed="1"):
    """A free run (distlab run, mpirun): S servers and p - S workers train the CTR model.

    Afterwards (outside the learner's code) the servers send their shards to rank 0, which
    reports the log loss before and after, the AUC on held-out impressions, and whether the model
    equals single-process gradient descent on the global batch."""
    p, rank = comm.Get_size(), comm.Get_rank()
    S = max(1, p // 2) if servers == "auto" else int(servers)
    if not 1 <= S < p:
        raise ValueError(f"need 1 <= servers < ranks; got servers={S} with {p} ranks")
    W, D, n = p - S, int(keys), int(batch)
    case = Case(S, W, D, (n,) * W, int(steps), float(lr), int(seed), "free run")
    result = run_ps(comm, solution, case)
    comm.mark("gather")  # not the learner's: collect the shards on rank 0 for the report
    if rank == 0:
        model = np.full(D, np.nan)
        shards = [(result.lo, result.shard)]
        for s in range(1, S):
            head = np.empty(2)
            comm.Recv(head, source=s, tag=90)
            values = np.empty(int(head[1]))
            comm.Recv(values, source=s, tag=91)
            shards.append((int(head[0]), values))
        for lo, values in shards:
            if lo is not None and values is not None:
                model[lo:lo + len(values)] = values
    elif rank < S:
        lo, values = result.lo or 0, result.shard if result.shard is not None else np.empty(0)
        comm.Send(np.array([lo, len(values)], dtype=np.float64), dest=0, tag=90)
        comm.Send(values, dest=0, tag=91)
    if rank != 0:
        return None
    train = Batch(*global_batch(case))
    held_out = Batch(*impressions(case.seed, 1, 4 * n, D))
    verdict = "equals" if np.allclose(model, sgd(case), rtol=RTOL, atol=ATOL) else "DIFFERS FROM"
    return (f"S={S} W={W} keys={D} batch={W}x{n} steps={case.steps}: train log loss "
            f"{train.loss(initial_weights(case)):.4f} -> {train.loss(np.nan_to_num(model)):.4f}, "
            f"held-out AUC {auc(held_out.y, held_out.X @ np.nan_to_num(model)):.3f}; the model "
            f"{verdict} single-process gradient descent")


# -- the expected model, and the mistakes it is compared with (in the supervisor) -----------------


@lru_cache(maxsize=16)
def global_batch(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Every worker's examples, concatenated in worker order (as one process would hold them)."""
    data = [worker_data(case, w) for w in range(case.workers)]
    return np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])


def trajectory(case: Case, steps: int, weights: np.ndarray | None = None) -> list[np.ndarray]:
    """The model after 0, 1, ..., steps steps of gradient descent on the global batch.

    ``weights``: the weight of each worker's summed gradient; None means 1/B for every worker
    (B = all examples), the mean over the global batch. Other weightings model the averaging
    mistakes a parameter server makes."""
    X, y = global_batch(case)
    per_worker = np.full(case.workers, 1.0 / len(y)) if weights is None else weights
    per_example = np.repeat(per_worker, case.batches)
    models = [initial_weights(case)]
    for _ in range(steps):
        w = models[-1]
        models.append(w - case.lr * (X.T @ (per_example * (sigmoid(X @ w) - y))))
    return models


def sgd(case: Case, weights: np.ndarray | None = None) -> np.ndarray:
    """The model after the case's K steps: what the servers must hold at the end."""
    return trajectory(case, case.steps, weights)[-1]


def averaging_mistakes(case: Case) -> list[tuple[str, np.ndarray]]:
    """(what went wrong, the weight of each worker's summed gradient), most likely first."""
    n = np.array(case.batches, dtype=np.float64)
    B, W, S = n.sum(), case.workers, case.servers
    sizes = ", ".join(str(int(k)) for k in n)
    equal_workers = (f"each worker's MEAN gradient was averaged over the W = {W} workers, so each "
                     f"worker counts the same although they hold {sizes} examples: sum the "
                     f"gradients and divide by the total number of examples, {int(B)}")
    return [
        (equal_workers, 1.0 / (W * n)),
        (("the workers' mean gradients were added up but not averaged (divide the summed "
          f"gradient by the {int(B)} examples of the global batch)"), 1.0 / n),
        ((f"the summed gradient was divided by the number of workers W = {W}, not by the "
          f"number of examples B = {int(B)}"), np.full(W, 1.0 / W)),
        ((f"the summed gradient was divided by the number of servers S = {S}, not by the "
          f"number of examples B = {int(B)}"), np.full(W, 1.0 / S)),
        (f"the summed gradient was applied without dividing by the number of examples B = {int(B)}",
         np.ones(W)),
        (f"the update was divided by the number of workers W = {W} on top of the example count",
         np.full(W, 1.0 / (B * W))),
        (f"the update was divided by the number of servers S = {S} on top of the example count",
         np.full(W, 1.0 / (B * S))),
        (f"each worker's mean gradient was divided by the number of servers S = {S}",
         1.0 / (S * n)),
    ]


def close(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=RTOL, atol=ATOL))


def diagnose_model(case: Case, got: np.ndarray, layout: list[tuple[int, int]]) -> tuple[str, bool]:
    """What went wrong with a final model that is not the expected one, and whether that is a
    named mistake (True) or only a description of the difference (False)."""
    head = f"{case.label()}: the model after {case.steps} steps"
    want = sgd(case)
    if close(got, initial_weights(case)):
        return (f"{head} is still the initial weights on every key: no update was applied (each "
                "step: pull the shards, compute the gradient, push one slice to each server, "
                "which applies lr * summed gradient / examples)"), True
    for k, model in enumerate(trajectory(case, case.steps + 2)):
        if k != case.steps and close(got, model):
            return f"{head} equals gradient descent after {k} steps, not {case.steps}", True
    for what, weights in averaging_mistakes(case):
        if close(got, sgd(case, weights=weights)):
            return f"{head} is wrong: {what}", True
    wrong = [s for s, (lo, hi) in enumerate(layout) if not close(got[lo:hi], want[lo:hi])]
    bad = np.flatnonzero(~np.isclose(got, want, rtol=RTOL, atol=ATOL))
    first = int(bad[0]) if bad.size else 0
    where = ""
    if 0 < len(wrong) < case.servers:
        where = (f"; only server(s) {', '.join(map(str, wrong))} hold wrong keys "
                 f"({', '.join(f'{layout[s][0]}..{layout[s][1] - 1}' for s in wrong)})")
    return (f"{head} differs from gradient descent on the global batch in {bad.size} of "
            f"{case.keys} keys; key {first}: expected {want[first]:.9g}, saw {got[first]:.9g}"
            f"{where}"), False


# -- reading a run: shards, bytes, the order of pushes, latencies ---------------------------------


def shard_layout(case: Case, results: list[RankResult]) -> tuple[list[tuple[int, int]], str | None]:
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


def assemble(keys: int, layout: list[tuple[int, int]], results: list[RankResult]) -> np.ndarray:
    model = np.empty(keys)
    for (lo, hi), result in zip(layout, results):
        assert result.shard is not None
        model[lo:hi] = result.shard
    return model


def balance(sizes: list[int]) -> float:
    """Largest shard over smallest (inf when a server holds no key) (pure)."""
    return max(sizes) / min(sizes) if min(sizes) > 0 else float("inf")


def model_bytes_per_step(case: Case) -> int:
    """One pull and one push of the whole model: what each worker moves per step."""
    return 2 * case.keys * ITEMSIZE


def worker_bytes_problem(case: Case, worker: int, stats: CommStats) -> tuple[float, str | None]:
    """A worker's bytes per step over the model's pull + push, and a message if off by over 5%."""
    want = model_bytes_per_step(case)
    moved = (stats.bytes_sent + stats.bytes_received) / case.steps
    ratio = moved / want
    if abs(ratio - 1.0) <= BYTES_TOLERANCE:
        return ratio, None
    rank = case.servers + worker
    head = (f"{case.label()}: worker rank {rank} moved {moved:,.0f} bytes per step, "
            f"{ratio:.2f}x one pull + one push of the model ({want:,} bytes)")
    model = case.keys * ITEMSIZE
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


def server_timeline(task_run: TaskRun, case: Case, server: int) -> list[tuple[str, int]]:
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
        return (f"pull P50 {fmt(np.percentile(self.pull_s, 50))}, max {fmt(max(self.pull_s))}; "
                f"push P50 {fmt(np.percentile(self.push_s, 50)) if self.push_s else 'n/a'}; "
                f"sync/compute {self.sync_compute:.2f}")


def latencies(task_run: TaskRun, case: Case) -> Latencies:
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


@dataclass(frozen=True)
class StepBound:
    """The virtual time of one synchronous step, at best, and what a check allows."""

    alpha: float  # one-way latency between a server and a worker
    wire: float  # one pull (or one push): alpha + max(W * m, M) * beta
    compute: float  # the busiest worker's gradient
    compute_sum: float  # all workers' gradients one after the other
    latency_slack: float  # (S + W) * alpha: messages posted one at a time are fine

    @property
    def bound(self) -> float:
        return 2 * self.wire + self.compute

    @property
    def limit(self) -> float:
        return TIME_LIMIT * self.bound + self.latency_slack


def step_bound(case: Case, platform: Any) -> StepBound:
    """One step of a synchronous parameter server on the platform (pure, given the platform):

    pull:    alpha + max(W * m, M) * beta   each server's port sends W shards of m bytes, and
                                            each worker's port takes in the model, M bytes;
    compute: 4 * n * D flops of the busiest worker (batch.gradient's declared work);
    push:    alpha + max(W * m, M) * beta   the same bytes, the other way.
    """
    pairs = [(s, w) for s in case.server_ranks for w in case.worker_ranks]
    routes = [platform.route(s, w) for s, w in pairs] + [platform.route(w, s) for s, w in pairs]
    alpha = min(r.alpha_s for r in routes)
    beta = min(r.beta_s_per_byte for r in routes)
    shard = -(-case.keys // case.servers) * ITEMSIZE
    model = case.keys * ITEMSIZE
    flops = [platform.device_of(w).flops for w in case.worker_ranks]
    work = [4.0 * n * case.keys / f for n, f in zip(case.batches, flops)]
    return StepBound(alpha, alpha + max(case.workers * shard, model) * beta, max(work), sum(work),
                     (case.servers + case.workers) * alpha)


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


# -- building the cases ---------------------------------------------------------------------------


def make_case(rng: np.random.Generator, S: int, W: int, what: str, steps: int | None = None,
              equal: bool = False) -> Case:
    keys = int(rng.integers(1200, 3600))
    while S > 1 and keys % S == 0:
        keys += 1  # never a multiple of S: the shards cannot all be the same size
    batches = [int(rng.integers(24, 129)) for _ in range(W)]
    if equal:
        batches = [batches[0]] * W  # the timed case: every worker computes for the same time
    while not equal and W > 1 and len(set(batches)) == 1:
        batches[-1] += 7  # never all equal: averaging over workers must differ from over examples
    k = steps if steps is not None else int(rng.integers(5, 10))
    lr = float(rng.uniform(0.5, 1.5))
    return Case(S, W, keys, tuple(batches), k, round(lr, 4), int(rng.integers(1 << 31)), what)


def sweep_cases(t: CheckContext) -> list[Case]:
    """Every case of the session, run by one launch: the main case, the edges and a hidden pair,
    the timed case, and last the late-worker case (the only one with a fault plan)."""
    rng = np.random.default_rng([t.seed, 1])  # the same cases for every check that reads them
    S, W = int(rng.integers(2, 4)), int(rng.integers(2, 5))
    big_s = int(rng.integers(2, 5))
    cases = [
        make_case(rng, S, W, "the main case"),
        make_case(rng, 1, 1, "one server, one worker"),
        make_case(rng, 1, int(rng.integers(2, 5)), "one server"),
        make_case(rng, int(rng.integers(2, 5)), 1, "one worker"),
        make_case(rng, big_s, 8 - big_s, "eight ranks"),
        make_case(rng, int(rng.integers(1, 3)), 4, "the timed case", equal=True),
        make_case(rng, 2, 3, "one worker late", steps=4),
    ]
    late = cases[-1]
    cases[-1] = replace(late, late=late.servers + int(rng.integers(late.workers)))
    return cases


def late_plan(case: Case, seed: int) -> Any:
    return parse_fault_plan({"format_version": 1, "seed": seed, "fault": [
        {"kind": "delay", "src": case.late, "latency_s": LATE_S, "wall": True,
         "note": "a worker on a congested host: its pushes reach the servers after the others' next ones"},
    ]}, where="the 01 late-worker case")


def sweep(t: CheckContext) -> list[TaskRun]:
    tasks = [Task(ranks=c.servers + c.workers, args=(c,), label=c.label(),
                  faults=late_plan(c, t.seed) if c.late is not None else None)
             for c in sweep_cases(t)]
    return t.launch(run_ps, tasks).tasks


def mixed_steps(task_run: TaskRun, case: Case) -> str | None:
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
    case: Case = task_run.task.args[0]
    layout, problem = shard_layout(case, task_run.values)
    if problem is not None:
        return problem if not layout else f"{case.label()}: {problem}"
    got = assemble(case.keys, layout, task_run.values)
    if close(got, sgd(case)):
        return None
    message, named = diagnose_model(case, got, layout)
    mixed = None if named else mixed_steps(task_run, case)
    return f"{message}; {mixed}" if mixed else message


# -- the checks -----------------------------------------------------------------------------------

CHECKS = Checklist()


@CHECKS.check("the model after K steps equals gradient descent on the global batch", points=4)
def model_matches(t: CheckContext) -> None:
    task_run = sweep(t)[0]
    case: Case = task_run.task.args[0]
    t.say(f"{case.label()}, lr {case.lr}")
    problem = model_problem(task_run)
    if problem is not None:
        t.fail(problem)
    lat = latencies(task_run, case)
    t.metric("pull_p50_s", float(np.percentile(lat.pull_s, 50)) if lat.pull_s else None)
    t.metric("push_p50_s", float(np.percentile(lat.push_s, 50)) if lat.push_s else None)
    t.metric("sync_compute_ratio", round(lat.sync_compute, 4) if np.isfinite(lat.sync_compute) else None)
    t.say(f"every key within rtol {RTOL:g} of single-process gradient descent; {lat.describe()}")


@CHECKS.check("works for every (S, W): one server, one worker, eight ranks", points=2)
def every_pair(t: CheckContext) -> None:
    runs = sweep(t)[1:-1]  # the edges, the hidden pair and the timed case
    t.say("(S, W) = " + ", ".join(f"({r.task.args[0].servers}, {r.task.args[0].workers})" for r in runs))
    for task_run in runs:
        problem = model_problem(task_run)
        if problem is not None:
            t.fail(problem)
    t.say(f"{len(runs)} more cases agree with single-process gradient descent")


@CHECKS.check("bytes per worker per step = one pull + one push of the model (within 5%)", points=2)
def bytes_per_worker(t: CheckContext) -> None:
    worst = 1.0
    per_server: dict[str, int] = {}
    for task_run in sweep(t):
        case: Case = task_run.task.args[0]
        for i, result in enumerate(task_run.values[case.servers:]):
            ratio, problem = worker_bytes_problem(case, i, result.stats)
            if problem is not None:
                t.fail(problem)
            worst = max(worst, ratio, key=lambda r: abs(r - 1.0))
        if case.what == "the main case":
            for s, result in enumerate(task_run.values[: case.servers]):
                per_server[str(s)] = result.stats.bytes_sent + result.stats.bytes_received
            t.say(f"{case.label()}: bytes per server " +
                  ", ".join(f"{s}: {n / case.steps:,.0f}/step" for s, n in per_server.items()))
    t.metric("worst_bytes_over_model", round(worst, 4))
    t.metric("bytes_per_server", per_server)
    t.say(f"every worker within {abs(worst - 1):.1%} of 2 x model bytes per step")


@CHECKS.check("shards balanced: each server holds about 1/S of the keys", points=1)
def shards_balanced(t: CheckContext) -> None:
    worst = 1.0
    for task_run in sweep(t):
        case: Case = task_run.task.args[0]
        layout, problem = shard_layout(case, task_run.values)
        if problem is not None:
            t.fail(problem if not layout else f"{case.label()}: {problem}")
        sizes = [hi - lo for lo, hi in layout]
        ratio = balance(sizes)
        if ratio > BALANCE_LIMIT:
            listed = ", ".join(f"server {s}: {n}" for s, n in enumerate(sizes))
            t.fail(f"{case.label()}: shards of {listed} keys; expected about D/S = "
                   f"{case.keys / case.servers:.0f} each (largest at most {BALANCE_LIMIT}x the "
                   "smallest): split the key range into S nearly equal parts")
        worst = max(worst, ratio)
    t.metric("worst_shard_ratio", round(worst, 4))
    t.say(f"largest shard at most {worst:.3f}x the smallest")


@CHECKS.check("a late worker does not make a server mix steps", points=3)
def late_worker(t: CheckContext) -> None:
    runs = sweep(t)
    task_run = runs[-1]
    case: Case = task_run.task.args[0]
    t.say(f"{case.label()}; every message of worker rank {case.late} leaves "
          f"{LATE_S * 1e3:.0f} ms late, in real time too")
    problem = model_problem(task_run)
    if problem is None:
        wall = max(o.wall_s for o in task_run.outcomes)
        t.metric("late_case_wall_s", round(wall, 3))
        t.say(f"the model is right with rank {case.late} late ({wall:.2f} s of wall time)")
        return
    if "mixed two steps" not in problem and all(model_problem(r) is None for r in runs[:-1]):
        problem += ("; the same code is right when no worker is late, so a server took a message "
                    "into the wrong step: answer the pull of step k only after applying step "
                    "k - 1, and count a push only in the step it is tagged with")
    t.fail(f"with worker rank {case.late} late: {problem}")


@CHECKS.check("virtual time per step near the bound: every worker computes at once", points=2)
def time_per_step(t: CheckContext) -> None:
    task_run = next(r for r in sweep(t) if r.task.args[0].what == "the timed case")
    case: Case = task_run.task.args[0]
    problem = model_problem(task_run)  # a right model before its time is graded
    if problem is not None:
        t.fail(problem)
    b = step_bound(case, t.platform)
    measured = t.measured_time(task_run) / case.steps
    t.performance(measured * case.steps, b.bound * case.steps, task_run)
    t.metric("bound_per_step_s", b.bound)
    t.say(f"{case.label()} on {t.platform.name}: {fmt(measured)} per step {t.clock}, bound "
          f"{fmt(b.bound)} ({measured / b.bound:.3f}x), allowed {fmt(b.limit)}")
    if measured <= b.limit:
        return
    seen = f"{fmt(measured)} per step, {measured / b.bound:.2f}x the bound {fmt(b.bound)}"
    if case.workers > 1 and measured >= 0.9 * b.compute_sum:
        t.fail(f"{case.label()}: {seen}, about the workers' compute times added up "
               f"({fmt(b.compute_sum)}) rather than the longest ({fmt(b.compute)}): the workers "
               "waited for each other's compute; does a server send its shard to one worker and "
               "wait for that worker's push before it serves the next?")
    t.fail(f"expected at most {fmt(b.limit)} per step (10% over the bound, plus one latency per "
           f"rank); saw {seen}: does each server send its W shards at once, and each worker push "
           "to every server at once?")


def auc(y: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a click outranks a non-click (ties count half)."""
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    for value in np.unique(score):  # average ranks over ties
        tie = score == value
        ranks[tie] = ranks[tie].mean()
    pos = y > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
