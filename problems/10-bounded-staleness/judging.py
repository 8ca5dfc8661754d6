"""What the checks of problem 10 need to read a run: the staleness of every read, taken from the
server's own trace; the workers held to the harness's worker (its calls in its order, its step
times, its messages' sizes and contents) and the models the server sent, from the copies the
agents kept (record_sent); a simulation of the parameter server on the checker's side (the
synchronous time to beat, the time a stale-synchronous server can reach, and the models it
trains); the messages that name a mistake."""

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import cases
from .cases import MODEL, PUSH, Case, Read

# -- the staleness of every read, from what the server's proxy recorded ------------------------------


def reads_in_trace(events: Iterable[tuple[str, int | None, int | None]], case: Case, server: int,
                   workers: list[int]) -> list[Read]:
    """Every model the server sent a worker, with its staleness, from the server's calls in program
    order, (kind, peer, tag) each as its proxy recorded them: a receive with tag PUSH from worker k
    is k's next message (its first asks for the model of step 0, each later one carries a gradient);
    a worker whose last message is in counts as infinitely far ahead; the m-th model sent to worker
    j answers its read at clock m. Staleness = m minus the fewest gradients any worker had in."""
    index = {rank: k for k, rank in enumerate(workers)}
    received, replies, reads = [0] * len(workers), [0] * len(workers), []
    for kind, peer, tag in events:
        if peer not in index:
            continue
        k = index[peer]
        if kind == "recv" and tag == PUSH:
            received[k] += 1
        elif kind == "send" and tag == MODEL:
            pushes = [math.inf if n > case.steps[i] else max(n - 1, 0) for i, n in enumerate(received)]
            reads.append(Read(k, replies[k], replies[k] - min(pushes), tuple(max(n - 1, 0) for n in received)))
            replies[k] += 1
    return reads


@dataclass(frozen=True)
class Held:
    """A read the rule allowed after a push that the server answered only after it took another."""

    worker: int  # index 0 .. W-1
    clock: int
    pusher: int  # whose push allowed it
    last: bool  # that push was the pusher's last
    received: tuple[int, ...]  # the messages in from each worker then (steps + 1: it had finished)


def held_reads(events: Iterable[tuple[str, int | None, int | None]], case: Case, workers: list[int],
               staleness: int) -> list[Held]:
    """Every read that the rule with bound ``staleness`` (a finished worker at infinity) allowed after a
    push but the server had not answered when it took the next one, from the same trace as the
    staleness: after each receive of a push, the clock table and the reads waiting (a push that is
    not a worker's last asks for its next model). A read held on is listed again at each push."""
    index = {rank: k for k, rank in enumerate(workers)}
    received, replies = [0] * len(workers), [0] * len(workers)
    due: list[int] = []  # the workers whose reads the rule allowed after the latest push
    pusher, out = -1, []
    for kind, peer, tag in events:
        if peer not in index:
            continue
        k = index[peer]
        if kind == "send" and tag == MODEL:
            replies[k] += 1
            continue
        if kind != "recv" or tag != PUSH:
            continue
        out += [Held(j, received[j] - 1, pusher, received[pusher] > case.steps[pusher], tuple(received))
                for j in due if replies[j] < received[j]]
        received[k] += 1
        pusher = k
        table = [math.inf if n > case.steps[i] else max(n - 1, 0) for i, n in enumerate(received)]
        due = [j for j in range(len(workers)) if replies[j] < received[j] <= case.steps[j]
               and min(table) >= received[j] - 1 - staleness]
    return out


def late_read(events: Iterable[tuple[str, int | None, int | None]], case: Case, workers: list[int],
              last_only: bool = False) -> str | None:
    """The first read answered later than the rule allows, in words, or None: a read the rule allows
    after a push must be answered before the server takes the next one (``last_only``: a read that a
    worker's last push freed)."""
    held = [h for h in held_reads(events, case, workers, case.staleness) if h.last or not last_only]
    return _late(case, workers, held[0].worker, held[0].clock, held[0].pusher, list(held[0].received)) \
        if held else None


KEPT_AFTER_FINISH = "the finished worker's last clock held it back"
CAUGHT_STUCK = "the server caught the harness's Stuck and went on"


def caught_stuck(task: Any, server: int = 0) -> str | None:
    """The mailbox's Stuck, marked in the server's trace before it was raised, where the server went on:
    a server that catches it and only then answers a read the rule had freed at an earlier push leaves
    an order of messages like the correct one's, but it would have waited for ever."""
    if any(name == cases.STUCK_MARK for name, _at in task.timeline().marks(server)):
        return (f"{CAUGHT_STUCK} (every worker left waited for a read, so no push could come), answering the reads "
                "it kept only then. A read is answered at the push that frees it, a worker's last push too, never "
                "because nothing else can happen")
    return None


def late_after_finish(events: Iterable[tuple[str, int | None, int | None]], case: Case,
                      workers: list[int]) -> str | None:
    """The first read freed after a worker had finished that the server held past the next push, in
    words, or None; freed by the rule the server kept until the first worker finished: synchronous
    training's (min(clock) >= c) when every read before then was exactly synchronous, else the bound.
    What a finish changes is this check's (the throughput check grades the rest): a server that keeps
    a finished worker's last clock in the table and answers the reads it holds only when every worker
    left waits neither deadlocks nor goes past s, but it runs in lockstep, with no bound to use."""
    events = list(events)
    before = [r for r in reads_in_trace(events, case, 0, workers) if all(n < k for n, k in zip(r.pushes, case.steps))]
    synchronous = all(r.staleness <= 0 for r in before) and \
        all(_finished(case, h) for h in held_reads(events, case, workers, 0))
    s = 0 if synchronous else case.staleness
    held = held_reads(events, case, workers, s)
    late = [h for h in held if _finished(case, h)]
    if not late:
        return None
    h, done, prompt = late[0], _finished(case, late[0]), len(late) == len(held)
    kept = min(max(n - 1, 0) for n in h.received)  # the slowest clock, the finished at their last
    text = (f"{case.label()}: worker rank {workers[h.worker]}'s read at clock {h.clock} was allowed once rank "
            f"{workers[h.pusher]}'s push was in ({', '.join(f'rank {workers[j]}' for j in done)} had finished, "
            "infinitely far ahead), but the server took another push before answering it")
    if prompt and kept < h.clock - s:
        rule = "synchronous training" if synchronous else "the bound"
        return (text + f"; until a worker finished it answered every read as soon as {rule} allowed: "
                f"{KEPT_AFTER_FINISH} ({kept}, below c - s = {h.clock - s}). A worker that has finished "
                "never pushes again: count it as infinitely far ahead (math.inf), not at its last clock")
    return text + ": after every push, answer every kept read the rule now allows"


def _finished(case: Case, h: Held) -> list[int]:
    return [j for j, n in enumerate(h.received) if n > case.steps[j]]


def _late(case: Case, workers: list[int], j: int, clock: int, pusher: int, received: list[int]) -> str:
    text = (f"{case.label()}: worker rank {workers[j]}'s read at clock {clock} was allowed once rank "
            f"{workers[pusher]}'s push was in, but the server took another push before answering it")
    if received[pusher] > case.steps[pusher]:  # that push was the pusher's last
        return text + f": after the last push of worker rank {workers[pusher]} {cases.NOT_RECHECKED}"
    return text + ": after every push, answer every kept read the rule now allows"


def worst(reads: list[Read]) -> Read | None:
    return max(reads, key=lambda r: r.staleness, default=None)


def over_bound(case: Case, reads: list[Read], workers: list[int]) -> str | None:
    """The worst read of a case over its bound, in words, or None."""
    if (w := worst(reads)) is None or w.staleness <= case.staleness:
        return None
    return (f"{case.label()}: worker rank {workers[w.worker]} read the model at clock {w.clock} while the slowest "
            f"worker had pushed only {w.clock - w.staleness:g} gradients: staleness {w.staleness:g}, expected at most "
            f"s = {case.staleness} ({sum(r.staleness > case.staleness for r in reads)} of {len(reads)} reads over)")


OFF_BY_ONE = "the bound is off by one"
RULE_BY_S = "the rule must not change with s"
SSP_S = cases.SSP_STALENESS
NOT_THE_SLOWEST = "did the read wait for the slowest worker"


def staleness_cause(excess: list[float]) -> str:
    """Why reads broke the bound, from every case's largest staleness minus its s (s = 0, s = 3, the
    long straggler). Over with s = 3 alone: the rule changes with s (an outside tester's server was
    synchronous below 3 and unbounded from it). Over by exactly one wherever it is over, with the
    long-straggler case among them (a gate that ignores the others goes far past it there): the bound
    is off by one. Further over: the read did not wait for the slowest."""
    over = [e for e in excess if e > 0]
    if excess[1] > 0 and excess[0] <= 0 and excess[-1] <= 0:
        return (f"; the bound held with s = 0 and under the long straggler, and broke only with s = {SSP_S}: "
                f"{RULE_BY_S} (a read at clock c waits until min(clock) >= c - s, whatever s is)")
    if over and all(e == 1 for e in over) and excess[-1] == 1:
        return (f"; every read over the bound is over by exactly one, in every case: {OFF_BY_ONE} (a worker at "
                "clock c may read once the slowest worker is at c - s, not c - s - 1)")
    return (f"; {NOT_THE_SLOWEST} (the minimum of the clock table), or only look at the reader's own clock?"
            if max(over, default=0) > 1 else "")


def applied_problem(case: Case, reads: list[Read], read_models: list[list[np.ndarray]], final: np.ndarray,
                    workers: list[int]) -> str | None:
    """Whether every model the server sent, and its final one, is the initial model minus lr times
    exactly the gradients it had received by then (pushes apply at once, each once). The gradients
    are recomputed here from the models the server sent (its agent's copies); the trace says which were in."""
    W = case.workers
    for r in reads:  # a trace the workers' steps cannot explain (a push after a worker's last): no index past them
        if r.clock >= len(read_models[r.worker]) or any(n > case.steps[k] for k, n in enumerate(r.pushes)):
            return (f"{case.label()}: the server's trace does not fit the workers' steps: worker rank "
                    f"{workers[r.worker]}'s read at clock {r.clock} came after "
                    f"{', '.join(f'{n} gradients from rank {workers[k]}' for k, n in enumerate(r.pushes))}, and the "
                    f"workers have {', '.join(map(str, case.steps))} steps (one read a step)")
    sums = []  # sums[k][n]: the sum of worker k's first n gradients
    for k in range(W):
        grads = [cases.gradient(read_models[k][c], *cases.batch(case, k, c), W) for c in range(case.steps[k])]
        sums.append(np.cumsum([np.zeros(cases.FEATURES)] + grads, axis=0))
    w0 = cases.initial_weights(case)
    for r in reads:
        want = w0 - case.lr * sum(sums[k][n] for k, n in enumerate(r.pushes))
        got = read_models[r.worker][r.clock]
        if not np.allclose(got, want, rtol=cases.RTOL, atol=1e-9):
            return (f"{case.label()}: worker rank {workers[r.worker]} read at clock {r.clock} a model that is not the "
                    f"initial one minus lr x the {sum(r.pushes)} gradients the server had received by then "
                    f"({', '.join(f'{n} from rank {workers[k]}' for k, n in enumerate(r.pushes))}): largest "
                    f"difference {float(np.max(np.abs(got - want))):.3g}. Does every push apply at once, and once?")
    want = w0 - case.lr * sum(s[-1] for s in sums)
    if not np.allclose(final, want, rtol=cases.RTOL, atol=1e-9):
        return (f"{case.label()}: the server's final model is not the initial one minus lr x all "
                f"{sum(case.steps)} gradients: largest difference {float(np.max(np.abs(final - want))):.3g}")
    return None


# -- reading a run -----------------------------------------------------------------------------------


def fmt_s(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.3f} s"


def server_events(task: Any, server: int = 0) -> list[tuple[str, int | None, int | None]]:
    """The server's point-to-point calls in program order, (kind, peer, tag), from its trace: a
    receive as matched (a wait's received messages name their source and tag), a send as posted."""
    out: list[tuple[str, int | None, int | None]] = []
    for span in task.timeline().events(server):
        if span.kind == "send":
            out.append(("send", span.peer, span.tag))
        elif span.kind == "wait":
            out += [("recv", src, tag) for _ctx, src, _dst, tag, _k in span.received]
    return out


def declared_problem(run: Any) -> str | None:
    """The compute the harness's workers declared, against the case's own step times, and where
    they declared it, or None. The workers run next to the learner's code, which could rewrite
    what they declare (remove the stragglers a server must cope with) or where (push before the
    compute, so that the compute overlaps the server's wait): the checker holds both."""
    case, timeline = run.case, run.task.timeline()
    for j, rank in enumerate(worker_ranks(case)):
        got = [span.seconds for span in timeline.events(rank, "compute")]
        want = [case.compute_s(j, step) for step in range(case.steps[j])]
        wrong = [k for k, (g, w) in enumerate(zip(got, want)) if abs(g - w) > 1e-6 * w]
        if len(got) != len(want) or wrong:
            at = wrong[0] if wrong else min(len(got), len(want))
            said = f"{got[at] * 1e3:.6g} ms at step {at}" if at < len(got) else f"{len(got)} steps"
            meant = f"{want[at] * 1e3:.6g} ms" if at < len(want) else f"{len(want)} steps"
            return (f"{case.label()}: worker rank {rank} declared {said} of compute where the harness's worker "
                    f"declares {meant}: the workers and their stragglers are the card's, and the solution "
                    "changed what they declare")
    for j, rank in enumerate(worker_ranks(case)):
        if problem := order_problem(run, j, rank):
            return problem
    return None


# -- the workers' messages and the server's models, as the agents recorded them ----------------------

PUSH_BYTES, ANNOUNCE_BYTES, MODEL_BYTES = 8 * (2 + cases.FEATURES), 8, 8 * cases.FEATURES
WORKER_CALLS = {("send", PUSH): "pushes", ("recv", MODEL): "receives its model",
                ("send", cases.ANNOUNCE): "announces when its push leaves", ("compute", None): "declares its compute"}
REORDERED = "the solution reordered the harness's worker"
NOT_HARNESS = "not the harness's worker's messages"
AFTER_LAST = "sent a push after its last"
NOT_ITS_GRADIENT = "not the gradient of its own batch"
TAGS = {PUSH: "PUSH", cases.ANNOUNCE: "ANNOUNCE", MODEL: "MODEL"}


@dataclass(frozen=True)
class Call:
    """One call of a rank in program order: a send (its message), a message a wait received, a
    compute, or any other call by its span's kind."""

    kind: str
    peer: int | None
    tag: int | None
    nbytes: int
    key: tuple | None
    end: float


def calls(task: Any, rank: int) -> list[Call]:
    """The rank's calls from its trace; marks, receives posted and waits that received nothing left out."""
    out: list[Call] = []
    for span in task.timeline().events(rank):
        if span.kind == "send":
            out.append(Call("send", span.peer, span.tag, span.nbytes, span.message, span.end))
        elif span.kind == "wait":
            out += [Call("recv", key[1], key[3], 0, key, span.end) for key in span.received]
        elif span.kind == "compute":
            out.append(Call("compute", None, None, 0, None, span.end))
        elif span.kind not in ("mark", "recv"):
            out.append(Call(span.kind, span.peer, span.tag, span.nbytes, None, span.end))
    return out


def order_problem(run: Any, j: int, rank: int) -> str | None:
    """Whether worker ``j`` made the harness's worker's calls in its order, every step: receive the
    model, announce when the push leaves (the compute's end, said before it), compute, push."""
    case, steps = run.case, run.case.steps[j]
    made = [c for c in calls(run.task, rank) if c.kind in ("send", "recv", "compute")]
    got = [(c.kind, c.tag if c.kind != "compute" else None) for c in made]
    want = [("send", PUSH)] + [("recv", MODEL), ("send", cases.ANNOUNCE), ("compute", None), ("send", PUSH)] * steps
    if got != want:
        at = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
        did = WORKER_CALLS.get(got[at], "makes another call") if at < len(got) else "stops"
        does = WORKER_CALLS.get(want[at], "") if at < len(want) else "has stopped"
        return (f"{run.case.label()}: worker rank {rank} {did} at its step {max(at - 1, 0) // 4} where the harness's "
                f"worker {does} (each step: receive the model, announce, declare the compute, push): {REORDERED}, "
                "and the compute no longer sits before its push")
    announces = [item.data for item, c in zip(run.task.sent(rank).items, [c for c in made if c.kind == "send"])
                 if c.tag == cases.ANNOUNCE]
    for step, (said, compute) in enumerate(zip(announces, made[3::4])):
        if abs(float(said[0]) - compute.end) > 1e-2 * case.compute_s(j, step):  # its clock: the replay's, +- a send
            return (f"{case.label()}: worker rank {rank} announced its push of step {step} for {fmt_s(float(said[0]))} "
                    f"where its compute ends at {fmt_s(compute.end)}: {REORDERED}'s announcements")
    return None


@dataclass
class Messages:
    """What travelled in one case: models[j][c], the model the server sent worker j for its read at
    clock c; pushes[j][c], worker j's message at clock c (its clock, whether it is its last, and the
    gradient of its step c - 1 at the model of its read c - 1; zeros at clock 0)."""

    models: list[list[np.ndarray]]
    pushes: list[list[np.ndarray]]
    problem: str | None = None


def messages(run: Any) -> Messages:
    """Every worker's messages and every model the server sent, from the agents' copies, with the
    first way they are not the harness's protocol (``problem``): a worker's calls (counts, peers,
    tags, sizes) before the server's, then the contents, each push checked against the gradient of
    the worker's own batch at the model it had received."""
    case, task, ranks = run.case, run.task, worker_ranks(run.case)
    out = Messages([[] for _ in ranks], [[] for _ in ranks])

    def fail(text: str) -> Messages:
        out.problem = f"{case.label()}: {text}"
        return out

    sends: dict[int, list[tuple[Call, np.ndarray]]] = {}
    for rank in [*ranks, 0]:
        made, log = [c for c in calls(task, rank) if c.kind == "send"], task.sent(rank)
        if log.overflowed or len(log.items) != len(made) or any(i.peer != c.peer for i, c in zip(log.items, made)):
            return fail(f"rank {rank}'s record of what it sent does not match its trace: missing evidence")
        sends[rank] = [(c, i.data) for c, i in zip(made, log.items)]
    for j, rank in enumerate(ranks):
        made, steps = calls(task, rank), case.steps[j]
        pushes = sum(c.kind == "send" and c.tag == PUSH for c in made)
        if pushes > steps + 1:
            return fail(f"worker rank {rank} {AFTER_LAST}: {pushes} messages tagged PUSH for its {steps} steps, where "
                        f"the harness's worker sends {steps + 1} (one that asks for the first model, one a step)")
        for c in made:
            want = {("send", 0, PUSH): PUSH_BYTES, ("send", 0, cases.ANNOUNCE): ANNOUNCE_BYTES,
                    ("recv", 0, MODEL): c.nbytes, ("compute", None, None): 0}.get((c.kind, c.peer, c.tag))
            if want is None or c.nbytes != want:
                what = (f"sent rank {c.peer} {c.nbytes} bytes tagged {TAGS.get(c.tag, c.tag)}" if c.kind == "send" else
                        f"received from rank {c.peer} (tag {TAGS.get(c.tag, c.tag)})" if c.kind == "recv" else
                        f"made a call of kind {c.kind}")
                return fail(f"worker rank {rank} {what}, where the harness's worker sends the server, every step, a "
                            f"PUSH of {PUSH_BYTES} bytes (its clock, whether it is its last, its gradient) and an "
                            f"ANNOUNCE of {ANNOUNCE_BYTES}, and receives its MODEL: {NOT_HARNESS}")
        if pushes != steps + 1 or sum(c.kind == "recv" for c in made) != steps:
            return fail(f"worker rank {rank} sent {pushes} pushes and received "
                        f"{sum(c.kind == 'recv' for c in made)} models for its {steps} steps: {NOT_HARNESS}")
    models: dict[Any, np.ndarray] = {}
    for c, data in sends[0]:
        if c.peer not in ranks or c.tag != MODEL or c.nbytes != MODEL_BYTES or data.dtype != np.float64:
            return fail(f"the server sent rank {c.peer} {c.nbytes} bytes tagged {TAGS.get(c.tag, c.tag)}, where the "
                        f"harness's mailbox sends only MODELs, {MODEL_BYTES} bytes of float64, to the workers (box.reply)")
        models[c.key] = data
    replies = [sum(c.peer == rank for c, _ in sends[0]) for rank in ranks]  # a model not read would be the next case's
    if (j := next((j for j in range(len(ranks)) if replies[j] != case.steps[j]), None)) is not None:
        return fail(f"the server sent worker rank {ranks[j]} {replies[j]} models for its {case.steps[j]} reads: one "
                    "reply per read, sent with box.reply")
    taken = [sum(c.kind == "recv" and c.peer == rank and c.tag == PUSH for c in calls(task, 0)) for rank in ranks]
    if (j := next((j for j in range(len(ranks)) if taken[j] != case.steps[j] + 1), None)) is not None:
        return fail(f"the server took {taken[j]} of worker rank {ranks[j]}'s {case.steps[j] + 1} pushes: serve until "
                    "box.next() returns None, and take every push through it")
    for j, rank in enumerate(ranks):
        out.models[j] = [models.get(c.key, np.zeros(0)) for c in calls(task, rank) if c.kind == "recv"]
        out.pushes[j] = [data for c, data in sends[rank] if c.tag == PUSH]
        if any(m.shape != (cases.FEATURES,) for m in out.models[j]):
            return fail(f"a model worker rank {rank} received is not in the server's record: missing evidence")
        for clock, data in enumerate(out.pushes[j]):
            want = np.zeros(2 + cases.FEATURES)
            if clock:
                want[:2] = clock, clock == case.steps[j]
                want[2:] = cases.gradient(out.models[j][clock - 1], *cases.batch(case, j, clock - 1), case.workers)
            if data.dtype != np.float64 or not np.allclose(data, want, rtol=cases.RTOL, atol=1e-12):
                said = (f"{NOT_ITS_GRADIENT} of step {clock - 1} at the model it received for that step (and its "
                        "clock, and whether it is its last)" if clock else "not the harness's first push (zeros)")
                return fail(f"worker rank {rank}'s push at clock {clock} is {said}: the solution changed what the "
                            "harness's workers push")
    return out


def reads_of(run: Any) -> list[Read]:
    """The reads of one case (a CaseRun), from its server's trace."""
    return reads_in_trace(server_events(run.task), run.case, 0, worker_ranks(run.case))


def answer_problem(run: Any) -> str | None:
    """What the server returned, when it is not a model of the right length."""
    got = run.values[0]
    if isinstance(got, np.ndarray) and got.shape == (cases.FEATURES,) and got.dtype.kind == "f":
        return None
    seen = f"an array of shape {got.shape} and {got.dtype}" if isinstance(got, np.ndarray) else repr(got)[:80]
    return (f"{run.case.label()}: the server returned {seen}, expected the final model "
            f"({cases.FEATURES} float weights)")


TIMING = "with s = 0 a read at clock c must wait until every worker has pushed c gradients"
PRECISION = "keep the model in float64"
SCALED = "the step is scaled"


def sync_read_problem(case: Case, rank: int, c: int, got: np.ndarray, models: list[np.ndarray], wrong: str) -> str:
    """The earliest read of the s = 0 case that is not synchronous training's model at its clock
    (every earlier one was: the gradients before it are synchronous training's). A cause is named
    only where the model says it: synchronous training's at another step, or with a part of a
    step's gradients (timing); the right one to float32 precision; the right update times a factor."""
    text = (f"{case.label()}: worker rank {rank} read at clock {c} a model that is not synchronous training's "
            f"after {c} step{'s' * (c != 1)}: {wrong}")
    got = np.asarray(got, dtype=np.float64)
    if (timing := _timing_of(case, got, models)) is not None:
        return text + f"; it is {timing}: {TIMING}, and see all of them applied (and none of a later step)"
    want = models[c]
    error = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-300)))
    if error < 1e-5:
        single = bool(np.all(got.astype(np.float32).astype(np.float64) == got))
        return text + (f"; every weight within a relative {error:.1g} of the right one"
                       + " and a float32 number" * single
                       + f": the model is kept in {'float32' if single else 'too low a'} precision ({PRECISION})")
    if c > 0:
        step, right = got - models[c - 1], models[c] - models[c - 1]
        factor = float(step @ right / (right @ right))
        if abs(factor - 1) > 1e-3 and np.allclose(step, factor * right, rtol=1e-6, atol=1e-12):
            return text + (f"; its last step is {factor:.4g} times synchronous training's: {SCALED} (each push "
                           "applies as model -= lr * gradient: the gradient already carries its share of the batch)")
    return text


def _timing_of(case: Case, got: np.ndarray, models: list[np.ndarray]) -> str | None:
    """Which synchronous model the read is, in words: after k steps, or after k steps and a part of
    step k's gradients (as the workers computed them, on the model after k steps); None if neither."""
    for k in range(len(models) - 1):
        grads = [cases.gradient(models[k], *cases.batch(case, j, k), case.workers) for j in range(case.workers)]
        for mask in range((1 << case.workers) - 1):  # all of them: the model after k + 1 steps
            part = [j for j in range(case.workers) if mask >> j & 1]
            want = models[k] - case.lr * sum((grads[j] for j in part), np.zeros(cases.FEATURES))
            if np.allclose(got, want, rtol=cases.RTOL, atol=1e-12):
                return (f"the model after {k} step{'s' * (k != 1)}" if not part else
                        f"the model after {k} step{'s' * (k != 1)} and {len(part)} of step {k}'s "
                        f"{case.workers} gradients")
    if np.allclose(got, models[-1], rtol=cases.RTOL, atol=1e-12):
        return f"the model after {len(models) - 1} steps"
    return None


def reads_count_problem(case: Case, reads: list[Read], workers: list[int]) -> str | None:
    got = [sum(r.worker == j for r in reads) for j in range(case.workers)]
    if got == list(case.steps):
        return None
    j = next(j for j in range(case.workers) if got[j] != case.steps[j])
    return (f"{case.label()}: the server sent worker rank {workers[j]} {got[j]} models for its {case.steps[j]} reads: "
            "one reply per read, sent with box.reply")


def slow_reason(case: Case, worst_read: Read | None) -> str:
    if worst_read is not None and worst_read.staleness == 0:
        return (f"; no read saw any staleness at s = {case.staleness}: every read waited for every worker, as in "
                "synchronous training. A read at clock c needs the slowest at c - s, not at c")
    return "; a read that the bound allows should be answered at once, when the push that allows it arrives"


def loss_reason(got: float, start: float) -> str:
    if abs(got - start) < 1e-9:
        return ": the model never moved (are the pushes applied?)"
    return ""


def worker_ranks(case: Case) -> list[int]:
    return list(range(1, case.workers + 1))
