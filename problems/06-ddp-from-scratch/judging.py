"""How problem 06 judges: the expected weights (single-process SGD on the whole case, which no rank holds) and the
symptom that explains a difference; the collective counts of each step's phase (mark "backward" to mark "synced");
how much of one step's communication hid behind backward on the virtual clock. What the ranks returned is the learner
process's word: it is checked against what the agents recorded (bytes delivered, allreduce bytes per step, what each
allreduce carried, which must be the rank's own gradients, the marks, which must be exactly train()'s, each step's
requests, all completed before its mark "synced", and the declared compute, which must be exactly the harness model's
backward work, all of it declared before loss.backward() returned, each bucket after its layers' work).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from distlab.grading import COLLECTIVE, CaseRun, Counts, Span, Timeline, first_mismatch

from .cases import Case, Net, build_model, global_batch, layout, loss_of, shard
from .programs import flat_weights, sgd_step

RTOL, ATOL = 2e-4, 2e-5  # float32 SGD: summation order differs between p ranks and one process
# What an allreduce carried against the rank's own gradient, recomputed here at single-process SGD's weights (which
# an honest rank holds up to float32 rounding): max |difference| <= GRAD_RTOL * max |gradient| + GRAD_ATOL.
GRAD_RTOL, GRAD_ATOL = 1e-3, 1e-6
HARNESS_MARKS = ("step", "backward", "finish", "synced")  # train()'s marks, once per step in this order
HIDDEN_TARGET = 0.5  # the catalog's "at least half of the communication hidden"


def start_weights(case: Case) -> np.ndarray:
    return flat_weights(build_model(case, 0))


def single_process(case: Case, lr_scale: float = 1.0) -> np.ndarray:
    """Rank 0's model trained by one process on every step's global batch, with plain SGD: what
    every rank's weights must be (computed here, from the whole case, which no rank holds)."""
    torch.set_num_threads(1)
    model = build_model(case, 0)
    for step in range(case.steps):
        x, y = global_batch(case, step)
        model.zero_grad(set_to_none=True)
        loss_of(*model(x, use_side=case.uses_side(step)), y).backward()
        sgd_step(model, case.lr * lr_scale)
    return flat_weights(model)


# -- what the learner's process returned, and what the agents recorded ----------------------------


def malformed(result: CaseRun[Case]) -> str | None:
    """None if every rank returned a RankResult whose weights are finite vectors of the model's
    size; else what was wrong (the values come from the learner's process: evidence, not truth)."""
    size = sum(n for _, n, _ in layout(result.case))
    for rank, value in enumerate(result.values):
        for field in ("start", "final"):
            try:
                got = np.asarray(getattr(value, field), dtype=np.float64)
            except Exception as err:  # noqa: BLE001 - anything the learner's process sent
                return (f"{result.case.label}: rank {rank} returned no usable {field} weights "
                        f"({type(err).__name__}); train() returns a RankResult of flat weight vectors")
            if got.shape != (size,) or not np.all(np.isfinite(got)):
                return (f"{result.case.label}: rank {rank}'s {field} weights have shape {got.shape}"
                        f"{'' if got.shape != (size,) else ' and values that are not finite'}, where the model "
                        f"has {size} parameters")
    return None


def weights(value: object, field: str) -> np.ndarray:
    """A RankResult's weights as float64 (after ``malformed`` said they are usable)."""
    return np.asarray(getattr(value, field), dtype=np.float64)


def received_before_training(timeline: Timeline, rank: int) -> int:
    """Bytes the replay delivered to ``rank`` before its first mark (while DataParallel(...) ran)."""
    marks = timeline.marks(rank)
    first = marks[0][1] if marks else math.inf
    return sum(m.nbytes for m in timeline.messages if m.dst == rank and m.src != rank and m.end <= first + 1e-12)


def step_counts(task: Any, rank: int) -> list[Counts]:
    """Per step, ``rank``'s calls from mark "backward" to mark "synced": backward's phase and the sync's (from mark
    "finish") together, so a bucket counts wherever it was launched."""
    def summed(a: Counts, b: Counts) -> Counts:
        return Counts(**{f.name: {k: getattr(a, f.name).get(k, 0) + getattr(b, f.name).get(k, 0)
                                  for k in {*getattr(a, f.name), *getattr(b, f.name)}} for f in fields(Counts)})

    return [summed(a, b) for a, b in zip(task.phases(rank, "backward"), task.phases(rank, "finish"))]


def unexchanged(result: CaseRun[Case]) -> str | None:
    """None if every rank's allreduces carried all the gradients' bytes in every step; else the
    first step where one did not: right weights without them did not come from the ranks' gradients."""
    case, total = result.case, sum(result.case.backward_sizes())
    if case.p == 1:
        return None
    for rank in range(result.ranks):
        steps = step_counts(result.task, rank)
        if len(steps) < case.steps:
            return f"{case.label}: rank {rank} marked only {len(steps)} of the {case.steps} steps' backward"
        for step, count in enumerate(steps):
            carried = count.op_bytes.get("Allreduce", 0)
            if carried < total:
                return (f"{case.label}: rank {rank}'s allreduces carried {carried} of the {total} bytes of gradients in "
                        f"step {step}: the weights cannot have come from the gradients averaged over the ranks")
    return None


# -- what each rank's allreduces carried (Task(record_sent=True): its agent's copy of each contribution) ----------
# The counters say how many bytes went into the allreduces, not what they were: zeros of the right size, with the
# global gradient computed elsewhere, count the same. The record says what each rank contributed; it must be the
# rank's own gradients (its own shard, at the step's weights, each parameter once; whole, or already divided by p).


@lru_cache(maxsize=16)
def local_gradients(case: Case) -> tuple[tuple[tuple[np.ndarray, ...], ...], ...]:
    """[step][rank][i]: the gradient of the i-th parameter in backward order (reverse parameter order) on rank's own
    shard, at the weights of single-process SGD before that step (zeros where the step gives it no gradient)."""
    torch.set_num_threads(1)
    model = build_model(case, 0)
    params = list(model.parameters())[::-1]

    def grads(x: torch.Tensor, y: torch.Tensor, step: int) -> tuple[np.ndarray, ...]:
        model.zero_grad(set_to_none=True)
        loss_of(*model(x, use_side=case.uses_side(step)), y).backward()
        return tuple(np.zeros(q.numel()) if q.grad is None else q.grad.detach().numpy().astype(np.float64).ravel()
                     for q in params)

    out = []
    for step in range(case.steps):
        out.append(tuple(grads(*shard(case, rank, step), step) for rank in range(case.p)))
        grads(*global_batch(case, step), step)
        sgd_step(model, case.lr)
    return tuple(out)


def uncarried(result: CaseRun[Case]) -> str | None:
    """None if in every step each rank's allreduces between its marks "backward" and "synced", as its agent copied
    them, carried that rank's own gradient of every parameter once (``local_gradients``); else the first that did
    not. Judged where the weights are right (then every rank held single-process SGD's weights in every step)."""
    case = result.case
    if case.p == 1:
        return None
    want = local_gradients(case)
    for rank in range(result.ranks):
        log = result.task.sent(rank)
        if log.overflowed:
            return (f"{case.label}: the record of what rank {rank} sent overflowed (it keeps 64 MiB): no evidence "
                    "of what its allreduces carried")
        marks = [name for name, _ in result.task.outcomes[rank].marks]
        starts = [i + 1 for i, name in enumerate(marks) if name == "backward"][:case.steps]
        for step, start in enumerate(starts):  # in backward (after mark "backward") or in the sync (after "finish")
            items = [item.data for item in log.items
                     if item.after_marks in (start, start + 1) and item.op == "Allreduce" and item.peer == COLLECTIVE]
            wrong = carried_wrong(case, rank, step, items, want[step][rank])
            if wrong:
                return wrong
    return None


def carried_wrong(case: Case, rank: int, step: int, items: list[np.ndarray], grads: tuple[np.ndarray, ...]) -> \
        str | None:
    """None if ``items`` (rank's allreduce contributions in ``step``, in call order) are made of its gradients
    ``grads``, each parameter's once, whole (in any bucketing and order: other checks judge those)."""
    names = [name for name, _, _ in reversed(layout(case))]
    left = list(range(len(grads)))

    def carries(got: np.ndarray, grad: np.ndarray) -> bool:
        bound = GRAD_RTOL * float(np.max(np.abs(grad), initial=0.0)) + GRAD_ATOL
        return any(float(np.max(np.abs(got * scale - grad), initial=0.0)) <= bound for scale in (1, case.p))

    head = f"{case.label}, step {step}: rank {rank}'s allreduce"
    for k, data in enumerate(items):
        values, offset = np.asarray(data, dtype=np.float64).ravel(), 0
        while offset < values.size:
            hit = next((i for i in left if offset + grads[i].size <= values.size
                        and carries(values[offset:offset + grads[i].size], grads[i])), None)
            if hit is None:
                rest = values[offset:]
                seen = "all zeros" if not np.any(rest) else f"largest |value| {float(np.max(np.abs(rest))):.3g}"
                return (f"{head} {k} carried values that are not its own gradients: from value {offset} of its "
                        f"{values.size} on ({seen}) no gradient of its own shard at the step's weights matches, whole "
                        f"or divided by p = {case.p}; each bucket's allreduce must carry the gradients backward left "
                        "in p.grad on this rank, whose sum over the ranks is the global batch's gradient")
            left.remove(hit)
            offset += grads[hit].size
    if left:
        return (f"{head}s carried values that are not its own gradients: none of them held the gradient of "
                f"{names[left[0]]}; every parameter's gradient goes into its bucket's allreduce once per step")
    return None


# -- the marks and the requests: where each step's window really ends -----------------------------------------


def unsettled(traces: list[tuple[Any, ...]], rank: int, label: str, steps: int) -> str | None:
    """None if ``rank``'s marks, as its agent recorded them, are exactly train()'s (step, backward, synced in each
    step) and every nonblocking collective it posted had completed (a wait on its request) before the next mark
    "synced"; else what was not. The overlap window ends at mark "synced": a mark set elsewhere, or traffic still
    in flight past it, would cut the exposed wait out of the step."""
    marks = [e[1] for e in traces if e[0] == "mark"]
    if marks != list(HARNESS_MARKS) * steps:
        want = HARNESS_MARKS * steps
        n = next((i for i, (got, mark) in enumerate(zip(marks, want)) if got != mark), min(len(marks), len(want)))
        seen, wanted = (repr(m[n]) if n < len(m) else "none" for m in (marks, want))
        return (f"the marks differ from the harness's: {label}, rank {rank} recorded {len(marks)} mark(s), where "
                f"train() sets {len(want)} ({', '.join(HARNESS_MARKS)} in each of the {steps} steps); mark {n + 1} "
                f"is {seen} where train()'s is {wanted}: only the harness marks the steps (a DataParallel never "
                "calls comm.mark)")
    pending: dict[int, int] = {}  # request -> the step it was posted in
    step = 0
    for e in traces:
        if e[0] == "icoll":
            pending[e[1]] = step
        elif e[0] == "wait":
            for req in e[1]:
                pending.pop(req, None)
        elif e[0] == "mark" and e[1] == "synced":
            if pending:
                return (f"traffic still in flight at the end of the step: {label}, step {step}, rank {rank} had "
                        f"{len(pending)} allreduce(s) not yet waited for when finish_gradient_sync() returned; every "
                        "bucket's request completes (Request.Waitall) before it returns, so the step's window holds "
                        "its whole communication")
            step += 1
    return None


def declared_backward(case: Case, step: int) -> list[float]:
    """The backward work the harness's model declares in ``step`` (sorted): one span per layer it
    runs, twice the layer's forward, in proportion to its parameters (cases.run_model)."""
    net = Net(case.widths, case.side_after)
    layers = [getattr(net, f"fc{i}") for i in range(net.depth)] + ([net.side] if case.uses_side(step) else [])
    return sorted(2 * (case.forward_s_per_param * sum(p.numel() for p in layer.parameters())) for layer in layers)


def forged_compute(case: Case, rank: int, step: int, w: Window) -> str | None:
    """None if the compute declared in a step's window is exactly the harness's backward work (one
    span per layer, its seconds) and no bucket started before its layers' work; else how it differs.
    Declared compute comes from the learner's process, so a span the harness's model did not declare
    (or one it declared, changed or moved after the launches) is forged; and backward declares its work
    before loss.backward() returns (train's mark "finish", which the agent recorded between the spans):
    a span after it was held back, or stands in for one the model's was swapped for."""
    want, got = declared_backward(case, step), sorted(w.spans)
    if len(want) == len(got) and all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12) for a, b in zip(want, got)):
        if w.late:
            return (f"backward work declared after loss.backward() returned: {case.label}, step {step}, rank {rank} "
                    f"declared {len(w.late)} of the model's {len(want)} backward span(s) ({sum(w.late) * 1e6:.1f} us) "
                    "in finish_gradient_sync(), after train()'s mark \"finish\"; the model declares each layer's work "
                    "while backward reaches it, so they were held back (or forged in place of the model's)")
        return launched_before_gradients(case, rank, step, w)
    return (f"the declared compute differs from the harness's: {case.label}, step {step}, rank {rank} declared "
            f"{len(got)} compute span(s) of {sum(got) * 1e6:.1f} us between loss.backward() and the end of "
            f"finish_gradient_sync(), where the model's {len(want)} layer(s) declare {sum(want) * 1e6:.1f} us of "
            "backward work; only the harness declares compute (a DataParallel never calls comm.compute)")


def close(got: np.ndarray, want: np.ndarray, rtol: float = RTOL, atol: float = ATOL) -> bool:
    return first_mismatch(got, want, rtol=rtol, atol=atol) is None


def worst_parameter(case: Case, got: np.ndarray, want: np.ndarray) -> str:
    """Names the parameter with the largest difference."""
    offset, worst, name_of = 0, -1.0, ""
    for name, n, _ in layout(case):
        diff = float(np.max(np.abs(got[offset:offset + n] - want[offset:offset + n]))) if n else 0.0
        if diff > worst:
            worst, name_of = diff, name
        offset += n
    return f"largest difference {worst:.3g} in {name_of}"


def collectives(step: Counts) -> int:
    """Calls of built-in collectives (Allreduce, Iallreduce, Bcast, ...) in one step's phase."""
    return sum(step.calls[op] for op in step.collectives_used())


def diagnose_weights(result: CaseRun[Case]) -> str | None:
    """None if every rank's final weights are single-process SGD's (computed here, never on the
    ranks that run the learner's code); else the known mistake that explains the difference."""
    case, results, want = result.case, result.values, single_process(result.case)
    bad = [r for r, res in enumerate(results) if not close(weights(res, "final"), want)]
    if not bad:
        return None
    rank = bad[0]
    head = f"{case.label}, after {case.steps} steps of SGD (lr {case.lr}): rank {rank}'s weights"
    if all(collectives(s) == 0 for r in range(len(results)) for s in step_counts(result.task, r)):
        return (f"{head} are not those of one process training on the global batch: no collective "
                "ran in any step, so each rank followed its own shard's gradients only")
    start = start_weights(case)
    diverged = [r for r, res in enumerate(results) if not np.array_equal(weights(res, "start"), start)]
    if diverged:
        return (f"{head} are wrong: rank {diverged[0]} still held its own initial weights when "
                "DataParallel(...) returned; broadcast rank 0's weights to every rank first")
    got, total = weights(results[rank], "final"), sum(case.backward_sizes())
    for step, carried in enumerate(c.op_bytes.get("Allreduce", 0) for c in step_counts(result.task, rank)):
        if carried > total:
            return (f"{head} are wrong: its allreduces carried {carried} bytes in step {step}, more than the "
                    f"{total} bytes of gradients; a bucket reduced twice comes out summed over the ranks twice")
    if case.p > 1 and close(got, single_process(case, lr_scale=case.p)):
        return (f"{head} moved {case.p} times too far each step: the gradients were summed over "
                f"the ranks, not averaged (divide by the world size, p = {case.p})")
    seen = f"{head} differ from single-process SGD on the global batch ({worst_parameter(case, got, want)})"
    carried_over = launched_early(result, rank)
    return f"{seen}: {carried_over}" if carried_over else seen


def launched_early(result: CaseRun[Case], rank: int) -> str | None:
    """Per-step state carried over, in words: from a step on, every bucket of ``rank`` (all the bytes)
    was launched before backward reached the first layer, whose gradients the last bucket holds,
    though in step 0 the rank waited for them."""
    case, total = result.case, sum(result.case.backward_sizes())
    steps = zip(windows(result.task.timeline().events(rank)), step_counts(result.task, rank))

    def early(w: Window) -> bool:
        return bool(w.launches) and max(w.launches) < w.compute_end - 1e-12

    for step, (w, count) in enumerate(steps):
        if step == 0 and early(w):
            return None  # not carried over from an earlier step: some other launch rule
        if early(w) and len(w.launches) == len(case.buckets()) and count.op_bytes.get("Allreduce", 0) == total:
            return (f"in step {step} rank {rank} launched every bucket ({len(w.launches)}), the last "
                    f"{(w.compute_end - max(w.launches)) * 1e6:.1f} us before its backward ended, so before the first "
                    "layer's gradients it holds existed, where in step 0 it waited for them: per-step state (each "
                    "bucket's set of arrived gradients, a launch counter) was never reset and carried over from the "
                    "step before; reset it at the end of finish_gradient_sync")
    return None


def miscounted(where: str, buckets: int, total: int, rank: int, step: int, count: Counts) -> str | None:
    """None if ``rank`` made one allreduce per bucket in ``step``, carrying every gradient once."""
    made, carried = collectives(count), count.op_bytes.get("Allreduce", 0)
    if made == buckets and carried == total:
        return None
    calls = ', '.join(f'{op} x{n}' for op, n in sorted(count.calls.items())) or 'none'
    seen = (f"{where}, so {buckets} allreduce(s) per step; rank {rank} made {made} "
            f"collective call(s) in step {step} ({calls}), carrying {carried} bytes")
    if carried > total:
        return f"{seen}: more than the gradients hold, so a bucket was launched twice"
    if carried < total:
        return f"{seen}: fewer bytes than the gradients hold, so some gradients were never reduced"
    return (f"{seen}: the gradients are cut into buckets differently; walk the parameters in reverse order "
            "and start a new bucket only when the next gradient would take the current one past the cap")


# -- the overlap accounting, read from a rank's replayed events -----------------------------------


@dataclass(frozen=True)
class Window:
    """One rank's backward + gradient sync of one step, on the virtual clock."""

    begin: float  # mark "backward"
    end: float  # mark "synced"
    compute_s: float  # declared backward work inside
    compute_end: float  # when the last backward work ended
    spans: tuple[float, ...]  # the seconds of each compute span inside, whoever declared it
    compute_ends: tuple[float, ...]  # when each of them ended
    launches: tuple[float, ...]  # when each allreduce was called
    blocked_in_backward: float  # in waits and blocking Allreduces, before compute_end
    late: tuple[float, ...] = ()  # the seconds of each compute span after mark "finish" (loss.backward() returned)


def window(begin: float, end: float, inside: list[Span]) -> Window:
    """The window of the spans between a rank's marks "backward" (at ``begin``) and "synced"."""
    compute = [s for s in inside if s.kind == "compute"]
    compute_end = compute[-1].end if compute else begin
    allreduces = [s for s in inside if s.kind in ("coll", "icoll") and s.name == "Allreduce"]
    blocked = [s for s in inside if s.kind == "wait" or (s.kind == "coll" and s.name == "Allreduce")]
    finish = next((i for i, s in enumerate(inside) if s.kind == "mark" and s.name == "finish"), len(inside))
    return Window(begin, end, sum(s.seconds for s in compute), compute_end, tuple(s.seconds for s in compute),
                  tuple(s.end for s in compute),
                  tuple(s.begin for s in allreduces),
                  sum(max(0.0, min(s.end, compute_end) - s.begin) for s in blocked),
                  tuple(s.seconds for s in inside[finish:] if s.kind == "compute"))


def windows(events: list[Span]) -> list[Window]:
    """Per step, the window from mark "backward" to mark "synced" of one rank's replayed events."""
    found, opened = [], None
    for i, s in enumerate(events):
        if s.kind == "mark" and s.name == "backward":
            opened = i
        elif opened is not None and s.kind == "mark" and s.name == "synced":
            found.append(window(events[opened].begin, s.begin, events[opened + 1:i]))
            opened = None
    return found


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals."""
    total, end = 0.0, -math.inf
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def hidden_fraction(exposed_s: float, comm_s: float) -> float:
    """Share of the communication time that did not add to the step."""
    return min(max(1.0 - exposed_s / comm_s, 0.0), 1.0) if comm_s > 0 else 0.0


def too_little_hidden(head: str, rank0: Window, exposed: float, comm_s: float, hidden: float) -> str:
    """Why a step hid less than HIDDEN_TARGET of its communication, as rank 0's window shows it."""
    seen = (f"expected at least {HIDDEN_TARGET:.0%} hidden; saw {head}; the ranks sat {exposed * 1e6:.1f} us "
            f"in communication after or besides it, so only {hidden:.0%} of it was hidden")
    if not any(x < rank0.compute_end - 1e-12 for x in rank0.launches):
        return (f"{seen}: every allreduce started only after backward had ended. Backward produces "
                "the gradients of the last layer first: put them in the first bucket (reverse "
                "parameter order) and start each bucket as soon as it is full")
    if rank0.blocked_in_backward > 0.5 * comm_s:
        return (f"{seen}: the allreduces start during backward, but rank 0 waited "
                f"{rank0.blocked_in_backward * 1e6:.1f} us for them before backward ended (a blocking Allreduce, "
                "or a Wait right after each launch), so backward stood still. Start each bucket with "
                "comm.Iallreduce and wait for them all once, at the end of backward (finish_gradient_sync)")
    return seen


def launched_before_gradients(case: Case, rank: int, step: int, w: Window) -> str | None:
    """None if the step started one allreduce per bucket, each after the backward work of every layer whose
    gradients it holds (a layer declares its work just before its gradients exist); else the first
    that started earlier: its gradients did not exist yet, or the compute was declared out of place."""
    if len(w.launches) != len(case.buckets()):  # bucket by bucket: the count's own check names the mistake
        return (f"the overlap is judged bucket by bucket: {case.label}, step {step}, rank {rank} started "
                f"{len(w.launches)} allreduce(s) where the cap makes {len(case.buckets())} bucket(s)")
    names = [name.split(".")[0] for name, _, _ in reversed(layout(case))]
    layers: set[str] = set()
    for k, (bucket, launched) in enumerate(zip(case.buckets(), w.launches)):
        layers |= {names[i] for i in bucket}
        need = min(len(layers), len(w.compute_ends))
        if need and launched < w.compute_ends[need - 1] - 1e-12:
            return (f"an allreduce started before the gradients it carries existed: {case.label}, step {step}, "
                    f"rank {rank} started allreduce {k} at {(launched - w.begin) * 1e6:.1f} us into backward, before the "
                    f"backward work of the {len(layers)} layer(s) whose gradients bucket {k} holds had been declared "
                    f"({(w.compute_ends[need - 1] - w.begin) * 1e6:.1f} us): a bucket starts once its gradients exist")
    return None


def error_before_a_missing_gradient(case: Case, result: Any) -> str | None:
    """None when the launch's first failing rank failed in the gradient sync of a step without the
    side head (after that step's "backward" mark, as its agent recorded its marks), else where it
    failed instead. ``result``: the failed launch's LaunchResult."""
    rank = result.failing_rank
    outcome = result.outcomes.get(rank) if rank is not None else None
    marks = list(outcome.marks_at_error) if outcome is not None else []
    within = marks[:-1] if marks[-1:] == ["finish"] else marks  # in backward, or in finish_gradient_sync after it
    done, rest = divmod(len(within) - 2, len(HARNESS_MARKS))
    in_sync = (len(within) >= 2 and rest == 0 and within[-2:] == ["step", "backward"]
               and within[:-2] == list(HARNESS_MARKS) * done)
    if in_sync and not case.side_used[done]:
        return None
    where = (f"in the gradient sync of step {done}, in which the side head was used" if in_sync
             else f"after the marks {marks}" if marks else "before the first step began")
    return (f"{case.label}: rank {rank} raised its error {where}, not in a step whose side head got no gradient "
            f"(steps {[s for s, used in enumerate(case.side_used) if not used]}): raise it where a gradient is "
            "found missing, when it is")
