"""How problem 01 reads a run: the model the shards make, the mistake behind a wrong one, a server's
order of pulls and pushes, a worker's bytes, the latencies, and the time of one step at best."""

import math
from collections import namedtuple
from typing import Any

import numpy as np

from distlab.grading import (
    COLLECTIVE,
    CaseRun,
    CheckContext,
    Counts,
    TaskRun,
    first_mismatch,
)

from . import cases
from .cases import Case

ITEMSIZE = 8  # the model, gradients and pulls are float64
BYTES_TOLERANCE = 0.02  # bytes per worker per step within 2% of one pull + one push (an extra pull: 5.6% or more)
TIME_LIMIT = 1.10  # virtual time per step at most 10% above the bound
# what a right model's missing evidence says: the workers did not train it, whatever a late worker did
EVIDENCE = ("differs from the harness's", "cannot have come from")
IN_STEP = ("answer the pull of step k only after applying step k - 1, and count a push only in the step it "
           "is tagged with")


def close(got: np.ndarray, want: np.ndarray) -> bool:
    return first_mismatch(got, want, rtol=cases.RTOL, atol=cases.ATOL) is None


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def tiling_problem(keys: int, layout: list[tuple[int, int]]) -> str | None:
    """None if the ranges cover 0 .. keys-1 exactly once, else what is wrong."""
    covered = 0
    for s, (lo, hi) in sorted(enumerate(layout), key=lambda server: server[1]):
        if lo < 0 or hi > keys:
            return f"server {s} holds keys {lo}..{hi - 1}, outside the model's 0..{keys - 1}"
        if lo > covered:
            return f"keys {covered}..{lo - 1} are held by no server"
        if lo < covered and hi > lo:
            return f"server {s} holds keys {lo}..{hi - 1}, some of which another server holds too"
        covered = max(covered, hi)
    return f"keys {covered}..{keys - 1} are held by no server" if covered < keys else None


def shard_layout(case: Case, values: list[Any]) -> tuple[list[tuple[int, int]], str | None]:
    """Each server's key range [lo, hi), and what is wrong with them (None when they tile the keys)."""
    for s in range(case.servers):
        returned = values[s] if s < len(values) else None
        if not isinstance(returned, str) and not well_formed(returned):  # run_ps is in the learner's process
            returned = f"{type(returned).__name__} {repr(returned)[:60]}"
        if isinstance(returned, str):  # what programs.run_ps makes of a return that broke the contract
            return [], (f"{case.label()}: server {s} returned {returned}; expected (lo, weights): its first key "
                        "and the final values of its keys")
    layout = [(int(lo), int(lo) + len(shard)) for lo, shard in values[: case.servers]]
    problem = tiling_problem(case.keys, layout)
    return layout, None if problem is None else f"{case.label()}: {problem}"


def well_formed(returned: Any) -> bool:
    """Whether a server's value is what programs.run_ps hands back: (an int, a 1-d float64 array)."""
    if not (isinstance(returned, tuple) and len(returned) == 2):
        return False
    lo, shard = returned
    return (isinstance(lo, (int, np.integer)) and not isinstance(lo, bool) and isinstance(shard, np.ndarray)
            and shard.ndim == 1 and shard.dtype == np.float64)


def balance(sizes: list[int]) -> float:
    return max(sizes) / min(sizes) if min(sizes) > 0 else float("inf")


def averaging_mistakes(case: Case) -> list[tuple[str, np.ndarray]]:
    """(what went wrong, the weight of each worker's summed gradient), most likely first."""
    n = np.array(case.batches, dtype=np.float64)
    B, W, S = int(n.sum()), case.workers, case.servers
    by = [(f"workers W = {W}", W), (f"servers S = {S}", S)]  # the two counts a mistake divides by
    return [
        (f"each worker's MEAN gradient was averaged over the W = {W} workers, so each worker counts the same "
         f"although they hold {', '.join(map(str, case.batches))} examples: sum the gradients and divide by "
         f"the total number of examples, {B}", 1.0 / (W * n)),
        (f"the workers' mean gradients were added up but not averaged (divide the summed gradient by the {B} "
         "examples of the global batch)", 1.0 / n),
        *[(f"the summed gradient was divided by the number of {who}, not by the number of examples B = {B}",
           np.full(W, 1.0 / k)) for who, k in by],
        (f"the summed gradient was applied without dividing by the number of examples B = {B}", np.ones(W)),
        *[(f"the update was divided by the number of {who} on top of the example count",
           np.full(W, 1.0 / (B * k))) for who, k in by],
        (f"each worker's mean gradient was divided by the number of servers S = {S}", 1.0 / (S * n)),
    ]


def diagnose_model(case: Case, got: np.ndarray, layout: list[tuple[int, int]]) -> tuple[str, bool]:
    """What went wrong with a wrong final model, and whether that is a named mistake or only described."""
    head, models = f"{case.label()}: the model after {case.steps} steps", cases.trajectory(case, case.steps + 2)
    named = [("is still the initial weights on every key: no update was applied (each step: pull the shards, "
              "compute the gradient, push one slice to each server, which applies lr * summed gradient / "
              "examples)", models[0])]
    named += [(f"equals gradient descent after {k} steps, not {case.steps}", model)
              for k, model in enumerate(models) if k != case.steps]
    named += [(f"is wrong: {what}", cases.sgd(case, weights)) for what, weights in averaging_mistakes(case)]
    named += [(f"is wrong: the servers' sums of the pushes{also} were never reset between steps, so step k "
               "applied the gradients of steps 0 .. k added up: set them to zero at the start of every step",
               cases.sgd(case, carried=carried)) for carried, also in (("counts too", " and counts"), ("sums", ""))]
    for what, model in named:
        if close(got, model):
            return f"{head} {what}", True
    want = models[case.steps]
    wrong = [s for s, (lo, hi) in enumerate(layout) if not close(got[lo:hi], want[lo:hi])]
    where = ""
    if 0 < len(wrong) < case.servers:
        where = (f"; only server(s) {', '.join(map(str, wrong))} hold wrong keys "
                 f"({', '.join(f'{layout[s][0]}..{layout[s][1] - 1}' for s in wrong)})")
    bad = first_mismatch(got, want, rtol=cases.RTOL, atol=cases.ATOL)
    return (f"{head} differs from gradient descent on the global batch in {bad.wrong} of {case.keys} keys; "
            f"key {bad.index}: expected {bad.expected:.9g}, saw {bad.seen:.9g}{where}"), False


def model_problem(run: CaseRun, platform: Any, learner_faults: bool = False) -> str | None:
    """None if the servers' shards make up the expected model and the agents' record shows it came from
    the workers' gradients (pushed to the servers, computed by batch.gradient), else what is wrong."""
    case = run.case
    layout, problem = shard_layout(case, run.values)
    if problem is not None:
        return problem
    got = np.concatenate([shard for _, shard in sorted(run.values[: case.servers], key=lambda v: v[0])])
    if close(got, cases.sgd(case)):
        # The shards are the learner's word; what the agents recorded is the evidence behind them.
        return (gradients_problem(run, layout) or compute_problem(run, platform, learner_faults)
                or carried_problem(run, layout))
    message, named = diagnose_model(case, got, layout)
    if named:
        return message
    for s in range(case.servers):  # no known mistake: did a server mix two steps?
        found = first_out_of_step(server_timeline(run.task, case, s), case.worker_ranks)
        if found is not None:
            return f"{message}; server {s} {found}: it mixed two steps; {IN_STEP}"
    for w in case.worker_ranks:  # the servers kept in step: did a worker read a pull before it landed?
        if (found := stale_read(run.task.timeline(), w, case.servers)) is not None:
            return f"{message}; {found}"
    return message


def gradients_problem(run: CaseRun, layout: list[tuple[int, int]]) -> str | None:
    """None if every server received, from every worker, at least K slices of its keys' gradient (the
    bytes its agent counted), else what is missing: a right model with no gradients pushed was not
    trained by the workers."""
    case = run.case
    for s, (lo, hi) in enumerate(layout):
        want, received = case.steps * (hi - lo) * ITEMSIZE, run.task.counts(s).recv_bytes
        for w in case.worker_ranks:
            if (got := int(received.get(w, 0))) < want:
                return (f"{case.label()}: server {s} received {got:,} bytes from worker rank {w} in {case.steps} "
                        f"steps, less than {case.steps} pushes of the gradient slice of its {hi - lo} keys "
                        f"({want:,} bytes): its shard cannot have come from the workers' gradients; each step, "
                        "every worker pushes each server the slice of the server's keys")
    return None


def compute_problem(run: CaseRun, platform: Any, learner_faults: bool = False) -> str | None:
    """None if each worker declared exactly the harness's work: one batch.gradient per step, 4 n D flops
    on its device; else how it differs. Declared compute comes from the learner's process, so a span
    the harness would not have declared (or none where it would) is forged. Under the learner's own
    fault plan (a slowed rank) only the spans' number and labels are compared."""
    case, timeline = run.case, run.task.timeline()
    for n, w in zip(case.batches, case.worker_ranks):
        want, spans = 4.0 * n * case.keys / platform.device_of(w).flops, timeline.events(w, "compute")
        names = sorted({span.name for span in spans})
        if (len(spans) == case.steps and names in ([], ["gradient"])
                and (learner_faults or all(math.isclose(span.seconds, want, rel_tol=1e-6, abs_tol=1e-12)
                                           for span in spans))):
            continue
        labels = ", ".join(repr(name[:30]) for name in names[:4]) or "none"
        return (f"{case.label()}: the declared compute differs from the harness's: worker rank {w} declared "
                f"{len(spans)} compute span(s) of {fmt(sum(span.seconds for span in spans))} in all (labels: "
                f"{labels}), where batch.gradient declares {case.steps}, one per step, of {fmt(want)} each "
                f"('gradient': 4 x {n} examples x {case.keys} keys flops); call batch.gradient(w) once per "
                "step: only the harness declares compute")
    return None


# -- what the messages carried (Task(record_sent=True): each rank's agent copies every buffer it sends) --
#
# Byte counts and declared spans say nothing of what travelled: a server that trained alone on examples
# the workers shipped it, with pushes of zeros and batch.gradient called on a dummy model, passed them;
# so did workers that computed their gradients undeclared and called batch.gradient while idle. So a
# right model is held to the checker's own synchronous SGD too: each step k, each server's messages to
# each worker carry its shard of model k; each worker's to each server, the slice of its batch's
# gradient at model k (times one factor: a mean and its count are as good as the sum); and the worker's
# k-th declared gradient sits, in its trace, after that pull arrived and before that push left.

CARRIED_RTOL = 1e-6  # of the slice's largest value; the same float64 sums in another order are 1e-15 off


def holds(data: np.ndarray, want: np.ndarray, scaled: bool) -> bool:
    """Whether ``data`` holds ``want`` (``scaled``: c * want, one c != 0) as a run of consecutive values."""
    if data.dtype.kind != "f":
        if data.nbytes % ITEMSIZE:
            return False
        data = data.view(np.float64)  # a float64 message sent as bytes
    data, m = data.astype(np.float64, copy=False), len(want)
    if not 0 < m <= len(data):
        return m == 0
    tol, order = CARRIED_RTOL * float(np.max(np.abs(want))), np.argsort(-np.abs(want))
    if tol == 0:  # a slice no example touches: zeros, whatever the factor
        return bool(np.any(np.all(np.lib.stride_tricks.sliding_window_view(data, m) == 0, axis=1)))
    a, b, starts = order[0], order[min(1, m - 1)], np.arange(len(data) - m + 1)  # anchors pick the offsets
    factor = data[starts + a] / want[a] if scaled else np.ones(len(starts))
    near = np.abs(data[starts + b] - factor * want[b]) <= tol * np.abs(factor)
    return any(np.all(np.abs(data[o:o + m] - factor[o] * want) <= tol * abs(factor[o]))
               for o in starts[near & (factor != 0)])


def sends(timeline: Any, task_run: TaskRun, rank: int) -> dict[int, list[tuple[np.ndarray, Any, int]]] | str:
    """Each peer's messages from ``rank`` in call order, (values, message key, place among the rank's calls):
    its agent's copies matched to its trace's sends; why not, in words, where the two disagree."""
    log = task_run.sent(rank)
    traced = [(i, span) for i, span in enumerate(timeline.events(rank)) if span.kind == "send" and span.peer != rank]
    copied = [item for item in log.items if item.peer not in (COLLECTIVE, rank)]
    if log.overflowed or [span.peer for _, span in traced] != [item.peer for item in copied]:
        return (f"rank {rank}'s copy of what it sent does not match its trace's sends: what its messages carried "
                "is unknown, and a model no message is known to have carried cannot have come from the workers")
    out: dict[int, list[tuple[np.ndarray, Any, int]]] = {}
    for (i, span), item in zip(traced, copied):
        out.setdefault(span.peer, []).append((item.data, span.message, i))
    return out


def carried_problem(run: CaseRun, layout: list[tuple[int, int]]) -> str | None:
    """None if the servers' messages carried synchronous SGD's shards, the workers' their batches' gradients
    at those models, and each worker declared its gradient between the two; else the first that did not."""
    case, timeline, K = run.case, run.task.timeline(), run.case.steps
    models, ranks = cases.trajectory(case, K), range(case.servers + case.workers)
    out = {rank: sends(timeline, run.task, rank) for rank in ranks}
    if bad := next((text for text in out.values() if isinstance(text, str)), None):
        return f"{case.label()}: {bad}"
    for i, w in enumerate(case.worker_ranks):
        (X, y), events = cases.worker_data(case, i), timeline.events(w)
        arrived = {key: j for j, span in enumerate(events) if span.kind == "wait" for key in span.received}
        pulled, pushed = [[] for _ in range(K)], [[] for _ in range(K)]  # (server, place among w's calls)
        for s, (lo, hi) in enumerate(layout):
            pulls, pushes, at_pull, at_push = out[s].get(w, []), out[w].get(s, []), 0, 0
            for k in range(K if hi > lo else 0):
                at_pull = next((j for j in range(at_pull, len(pulls)) if holds(pulls[j][0], models[k][lo:hi], False)),
                               None)
                if at_pull is None:
                    return (f"{case.label()}: server {s} sent worker rank {w} no message carrying its shard (keys "
                            f"{lo}..{hi - 1}) of the model of step {k}, as synchronous gradient descent has it: the "
                            "workers' gradients cannot have come from the servers' model; each step, send every "
                            "worker your shard")
                gradient = X[:, lo:hi].T @ (cases.sigmoid(X @ models[k]) - y)
                at_push = next((j for j in range(at_push, len(pushes)) if holds(pushes[j][0], gradient, True)), None)
                if at_push is None:
                    return (f"{case.label()}: worker rank {w} sent server {s} no message carrying the gradient of its "
                            f"batch at the model of step {k} for keys {lo}..{hi - 1} (summed, or times one factor): "
                            "the servers' model cannot have come from the workers' gradients; each step, push each "
                            "server the slice of batch.gradient(w) for its keys, at the w you pulled")
                pulled[k].append((s, arrived.get(pulls[at_pull][1], len(events))))
                pushed[k].append((s, pushes[at_push][2]))
                at_pull, at_push = at_pull + 1, at_push + 1
        for k, at in enumerate([j for j, span in enumerate(events) if span.kind == "compute"][:K]):
            early, late = [s for s, j in pulled[k] if j > at], [s for s, j in pushed[k] if j < at]
            if early or late:
                where = (f"before the pull of step {k} from server {early[0]} had arrived" if early else
                         f"after its push of step {k} to server {late[0]} had left")
                return (f"{case.label()}: worker rank {w} declared its gradient of step {k} {where}: the gradient it "
                        "pushed cannot have come from the compute it declared, so the replay charges compute where "
                        "none ran; call batch.gradient(w) on the model you pulled, between the pull and the push")
    return None


def stale_read(timeline: Any, worker: int, servers: int) -> str | None:
    """In words, the first gradient a worker began with receives from the servers still pending."""
    pending, step = 0, 0
    for span in timeline.events(worker):
        if span.kind == "recv" and span.peer is not None and span.peer < servers:
            pending += 1
        elif span.kind == "wait":
            pending -= sum(1 for key in span.received if key[1] < servers)
        elif span.kind == "compute":
            if pending > 0:
                return (f"worker rank {worker} began its gradient of step {step} with {pending} receive(s) from "
                        "the servers posted and not yet waited: it read the model out of buffers those receives "
                        "had not filled (a stale read); Wait for every pull before batch.gradient reads w")
            step += 1
    return None


def server_timeline(task_run: TaskRun, case: Case, server: int) -> list[tuple[str, int]]:
    """What ``server`` did with the workers, in its program order: ("pull", w) when it sent worker
    rank w its shard, ("push", w) when it took a push from w."""
    timeline, workers = task_run.timeline(), set(case.worker_ranks)
    # A push is sized by the worker's matching send: a receive buffer may be larger than its message.
    sizes = {s.message: s.nbytes for w in workers for s in timeline.events(w, "send") if s.peer == server}
    events = []
    for span in timeline.events(server):
        if span.kind == "send" and span.peer in workers:
            events.append(("pull", span.peer, span.nbytes))
        elif span.kind == "wait":  # a message key is (communicator, source, destination, tag, k)
            events += [("push", key[1], sizes.get(key, 0)) for key in span.received if key[1] in workers]
    # Only the largest messages of each kind count: not the small control messages (pull requests).
    largest = {kind: max((n for what, _, n in events if what == kind), default=0) for kind in ("pull", "push")}
    return [(kind, w) for kind, w, n in events if n > 0 and n >= largest[kind] / 2]


def first_out_of_step(timeline: list[tuple[str, int]], workers: list[int]) -> str | None:
    """The first thing a server did out of step, in words; None if it kept in step."""
    # In synchronous training a server may send the shard of step j, and take a push of step j, only
    # once it holds the push of step j-1 from every worker.
    done = {"pull": dict.fromkeys(workers, 0), "push": dict.fromkeys(workers, 0)}
    for kind, w in timeline:
        step = done[kind][w]
        missing = [other for other in workers if done["push"][other] < step]
        if missing and kind == "pull":
            return (f"sent worker rank {w} its shard for step {step} before the push of step {step - 1} "
                    f"from worker rank {missing[0]} had arrived (a stale pull)")
        if missing:
            return (f"took the push of step {step} from worker rank {w} while the push of step {step - 1} "
                    f"from worker rank {missing[0]} had not arrived")
        done[kind][w] += 1
    return None


def worker_bytes_problem(case: Case, worker: int, counts: Counts) -> tuple[float, str | None]:
    """A worker's bytes per step over one pull + one push of the model, and what is wrong if off by 2%."""
    model, moved = case.keys * ITEMSIZE, (counts.bytes_sent + counts.bytes_received) / case.steps
    ratio = moved / (2 * model)
    if abs(ratio - 1.0) <= BYTES_TOLERANCE:
        return ratio, None
    head = (f"{case.label()}: worker rank {case.servers + worker} moved {moved:,.0f} bytes per step, "
            f"{ratio:.2f}x one pull + one push of the model ({2 * model:,} bytes)")
    pushed = [counts.sent_bytes.get(s, 0) / case.steps for s in range(case.servers)]
    pulled = [counts.recv_bytes.get(s, 0) / case.steps for s in range(case.servers)]
    if moved == 0:
        return ratio, f"{head}: it neither pulled nor pushed"
    if case.servers > 1 and min(pushed) >= 0.95 * model:
        return ratio, (f"{head}: it pushes the whole gradient to every server ({min(pushed):,.0f} bytes or "
                       "more to each); each server needs only the slice of its own keys")
    if case.servers > 1 and min(pulled) >= 0.95 * model:
        return ratio, f"{head}: it pulls the whole model from every server; each server should send only its own shard"
    return ratio, (f"{head}: {sum(pushed):,.0f} bytes pushed and {sum(pulled):,.0f} pulled per step, where "
                   f"one pull and one push are {model:,} bytes each (one of each per step, no extra pull after "
                   "the last step)")


def latencies(t: CheckContext, run: CaseRun) -> str:
    """Records the workers' pull and push latencies and sync/compute ratio; returns them in words."""
    # On the virtual clock: a pull from the worker's last push delivered to its next compute, a push
    # from the end of its compute to its last slice delivered; sync is the time blocked in messages.
    timeline, workers, pulls, pushes = run.task.timeline(), run.case.worker_ranks, [], []
    for w in workers:
        spans = timeline.events(w, "compute")
        out = [m for m in timeline.messages if m.src == w and m.dst < run.case.servers]
        ready = 0.0  # when the worker's previous push was delivered
        for span, until in zip(spans, [s.begin for s in spans[1:]] + [float("inf")]):
            pulls.append(span.begin - ready)
            delivered = [m.end for m in out if span.end <= m.posted <= until]
            ready = max(delivered, default=span.end)
            if delivered:
                pushes.append(ready - span.end)
    compute = sum(timeline.compute_s.get(w, 0.0) for w in workers)
    sync = sum(timeline.comm_s.get(w, 0.0) for w in workers) / compute if compute > 0 else float("inf")
    t.metric("pull_p50_s", float(np.percentile(pulls, 50)) if pulls else None)
    t.metric("push_p50_s", float(np.percentile(pushes, 50)) if pushes else None)
    t.metric("sync_compute_ratio", round(sync, 4) if np.isfinite(sync) else None)
    if not pulls:
        return "no declared compute (call batch.gradient): latencies unavailable"
    return (f"pull P50 {fmt(np.percentile(pulls, 50))}, max {fmt(max(pulls))}; "
            f"push P50 {fmt(np.percentile(pushes, 50)) if pushes else 'n/a'}; sync/compute {sync:.2f}")


# wire: one pull (or push); compute: the busiest worker's gradient; compute_sum: all workers' in turn;
# serial: one worker at a time, each pulling its shards, computing and pushing while the others wait
StepBound = namedtuple("StepBound", "wire compute compute_sum bound limit serial")


def step_bound(case: Case, platform: Any, slowest: bool = False) -> StepBound:
    """One step at best: pull + compute + push, and what the check allows (10% more, plus one latency
    per rank: messages posted one at a time are fine). ``slowest``: on the slowest server-worker route
    (off the card's platform, where routes differ: across data centres, sockets)."""
    # A pull (or push) is alpha + max(W * m, M) * beta: each server's port sends W shards of m bytes,
    # and each worker's port takes in the model, M bytes.
    routes = [platform.route(*way) for s in range(case.servers) for w in case.worker_ranks for way in ((s, w), (w, s))]
    pick = max if slowest else min
    alpha, beta = pick(r.alpha_s for r in routes), pick(r.beta_s_per_byte for r in routes)
    shard = -(-case.keys // case.servers) * ITEMSIZE
    wire = alpha + max(case.workers * shard, case.keys * ITEMSIZE) * beta
    work = [4.0 * n * case.keys / platform.device_of(w).flops  # batch.gradient declares 4 n D flops
            for n, w in zip(case.batches, case.worker_ranks)]
    bound = 2 * wire + max(work)
    serial = sum(2 * (alpha + shard * beta) + w for w in work)
    return StepBound(wire, max(work), sum(work), bound, TIME_LIMIT * bound + (case.servers + case.workers) * alpha,
                     serial)
