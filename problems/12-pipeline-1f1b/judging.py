"""Reading a pipeline's run for problem 12: its schedule, bubble and stash on the virtual clock,
its gradients against one process's, the symptoms of known mistakes, and the report's picture.

Everything here reads what the harness recorded: the compute spans the Stage declared ("forward i",
"backward i"), in each rank's program order, and the gradients the ranks hand back as evidence,
judged against the expected values of cases.py and one_process (here: the ranks never import this
module). The learner's process declares the spans and returns the gradients, so neither is taken
on its word: the spans must be the ones the harness's Stage declares for the case (its labels, its
stage times, one forward and one backward per micro-batch), each in an order the messages allow
(a forward after its activation came in, a backward after its gradient did), and the gradients,
which no stage can compute without the others' data, must come with the messages that carried it.
Nothing a rank returns or declares may crash a check: what cannot be read is a failed check."""

import re
from dataclasses import dataclass
from functools import lru_cache
from html import escape
from typing import Any

import numpy as np
import torch.nn.functional as F

from distlab.grading import first_mismatch

from . import programs
from .cases import (
    MICRO,
    NAMES,
    STEPS,
    WIDTH,
    Pipe,
    formula_bubble,
    operations,
    peak_stash,
)
from .cases import replay as cases_replay

RTOL, ATOL = 1e-9, 1e-12  # float64 sums in another order: about 1e-15 apart

# == the schedule, read from the replay =============================================================


def program_marks(cases_in_task: int) -> list[str]:
    """The marks programs.train sets on every rank of a task of ``cases_in_task`` pipelines, in
    order: "case <number> step <k>" as each step starts, "between" as it ends."""
    return [name for number in range(cases_in_task) for k in range(STEPS)
            for name in (f"case {number} step {k}", "between")]


def task_marks(cases_in_task: int) -> tuple[str, ...]:
    """The names of those marks, for Task(marks=...): a step's window runs from one of them to the
    next, and a mark the learner's code sets of another name cuts nothing."""
    return tuple(sorted(set(program_marks(cases_in_task))))


def marks_message(task: Any) -> str | None:
    """None if every rank set exactly the program's marks, in its order; else the first rank that
    set one more, one fewer or another in its place (the learner's code calling comm.mark with a
    name the program uses: it would end a step's window early and hide what followed)."""
    if head := task.marks_differ(program_marks(len(task.spec.cases)), "stage"):
        return (f"{head}: the harness marks each step's start and end itself, and a step is read from one of its "
                "marks to the next (your own marks may have other names)")
    return None


def window(timeline: Any, rank: int, number: int, step: int,
           names: Any = ()) -> tuple[float, list[Any], tuple[int, int]]:
    """The rank's mark of case ``number``'s step ``step`` (its virtual time), its calls up to its
    next mark of the program's (``names``; any mark where none are given: the learner's own, of
    other names, end nothing), and the range of how many marks the rank had made at a call of the
    window (what its sent log's ``after_marks`` says of a send in the window: the learner's own
    marks inside it count there too)."""
    events, name = timeline.events(rank), f"case {number} step {step}"

    def program(e: Any) -> bool:
        return e.kind == "mark" and (not names or e.name in names)

    starts = [k for k, e in enumerate(events) if program(e) and e.name == name]
    if not starts:
        raise ValueError(f"rank {rank}: no mark {name!r} in the trace")
    after = events[starts[0] + 1:]
    end = next((k for k, e in enumerate(after) if program(e)), len(after))
    marks = sum(1 for e in events[:starts[0] + 1] if e.kind == "mark")
    return events[starts[0]].begin, after[:end], (marks, marks + sum(1 for e in after[:end] if e.kind == "mark"))


LABEL = re.compile(r"(forward|backward) (0|[1-9][0-9]{0,8})")
MESSAGE_BYTES = MICRO * WIDTH * 8  # one micro-batch's activation or gradient between stages, float64


def parse_label(name: Any) -> tuple[str, int] | None:
    """("F" or "B", micro-batch) of a label the Stage declares ("forward 3"), None for any other."""
    found = LABEL.fullmatch(name) if isinstance(name, str) else None
    return None if found is None else ("F" if found[1] == "forward" else "B", int(found[2]))


def declared_operations(spans: list[Any]) -> list[tuple[str, int]]:
    """("F" or "B", micro-batch) of each forward and backward the Stage declared, in program order."""
    return [op for span in spans if span.kind == "compute" and (op := parse_label(span.name)) is not None]


class Step:
    """One step of one case on the virtual clock: every stage's operations and compute spans."""

    def __init__(self, task: Any, number: int, step: int, p: int) -> None:
        timeline, names = task.timeline(), getattr(getattr(task, "spec", None), "marks", ())
        windows = [window(timeline, rank, number, step, names) for rank in range(p)]
        self.start = min(mark for mark, _, _ in windows)
        self.events = [spans for _, spans, _ in windows]  # every call of each stage, in program order
        self.marks = [marks for _, _, marks in windows]  # the sent log's after_marks of this step's sends (a range)
        self.compute = [[s for s in spans if s.kind == "compute"] for _, spans, _ in windows]
        self.sent = [[s.peer for s in spans if s.kind == "send"] for _, spans, _ in windows]  # world ranks
        self.collectives = [[s.name for s in spans if s.kind in ("coll", "icoll")] for _, spans, _ in windows]
        self.ops = [declared_operations(spans) for _, spans, _ in windows]
        self.peaks = [peak_stash(ops) for ops in self.ops]
        ends = [s.end for spans in self.compute for s in spans]
        self.end = max(ends) if ends else self.start
        self.busy = sum(s.seconds for spans in self.compute for s in spans)
        self.p = p

    @property
    def bubble(self) -> float | None:
        """Idle over total: 1 - busy / (p x the step's span), None when nothing was computed."""
        return 1.0 - self.busy / (self.p * (self.end - self.start)) if self.end > self.start else None

    def overlapped(self) -> bool:
        """Whether two stages ever computed at the same time."""
        spans = sorted((s.begin, s.end) for stage in self.compute for s in stage)
        return any(b[0] < a[1] - 1e-12 for a, b in zip(spans, spans[1:]))

    def backward_order(self, stage: int) -> list[int]:
        return [i for kind, i in self.ops[stage] if kind == "B"]

    def warmup(self, stage: int) -> int:
        """Forwards before the stage's first backward."""
        kinds = [kind for kind, _ in self.ops[stage]]
        return kinds.index("B") if "B" in kinds else len(kinds)


# == gradients ======================================================================================


def gradient_message(pipe: Pipe, values: dict[int, Any], expected: list[list[dict[str, np.ndarray]]],
                     step_of: Any) -> str | None:
    """None when every stage's gradients are one process's on every step; else what differs, and why
    where the evidence says. ``step_of(k)`` is the Step of training step k (the replay)."""
    for k, want_step in enumerate(expected):
        pairs = []
        for s, want in enumerate(want_step):
            got = returned(values, s, "grads", k)
            if not isinstance(got, dict):
                return (f"{pipe.label()}, step {k}: stage {s} handed back no gradients for this step (the harness "
                        f"returns a dict of every parameter's .grad; got {type(got).__name__})")
            for name, w in want.items():
                g = got.get(name)
                if isinstance(g, str) or g is None:
                    what = f"{name} is missing" if g is None else f"{name}.grad is None"
                    return (f"{pipe.label()}, step {k}: stage {s}'s {what}: no backward reached this stage's "
                            "parameters")
                try:
                    array = np.asarray(g, dtype=np.float64)
                except (TypeError, ValueError, OverflowError):
                    return f"{pipe.label()}, step {k}: stage {s}'s {name}.grad is not an array of numbers"
                if array.shape != w.shape:
                    return (f"{pipe.label()}, step {k}: stage {s}'s {name}.grad has shape {array.shape}, the "
                            f"parameter's is {w.shape}")
                pairs.append((s, name, array, w))
        wrong = [(s, n, g, w, bad) for s, n, g, w in pairs if (bad := first_mismatch(g, w, rtol=RTOL, atol=ATOL))]
        if not wrong:
            continue
        s, name, g, w, bad = wrong[0]
        head = (f"{pipe.label()}, step {k}: the gradients differ from one process training on the whole batch of "
                f"{pipe.batch} samples (the mean loss); first at stage {s}, {name}: {bad.describe()}")
        return head + symptom(pipe, pairs, step_of(k))
    return None


def returned(values: Any, stage: int, key: str, step: int) -> Any:
    """What stage ``stage``'s train() returned under ``key`` for training step ``step``, None if
    that is not there (a rank's return value is the learner process's: anything may come back)."""
    try:
        got = values[stage][key]
        return got[step] if isinstance(got, (list, tuple)) else None
    except (LookupError, TypeError):
        return None


def batch_losses(pipe: Pipe, values: Any) -> list[float] | None:
    """The batch's loss per step, the mean of the last stage's micro-batch losses, None if unreadable."""
    try:
        return [float(sum(float(v) for v in returned(values, pipe.p - 1, "losses", k) if v is not None)) / pipe.m
                for k in range(STEPS)]
    except (TypeError, ValueError, OverflowError):
        return None


def one_process(pipe: Pipe) -> tuple[list[list[dict[str, np.ndarray]]], list[float]]:
    """STEPS SGD steps on the whole batch, the mean loss over all m x MICRO samples: each stage's
    gradients per step, and the batch's loss per step (what the pipeline must give: the checker's,
    from the whole case, which no rank holds)."""
    modules = [programs.stage_module(pipe, s) for s in range(pipe.p)]
    grads, losses = [], []
    for _ in range(STEPS):
        x, labels = programs.inputs(pipe), programs.targets(pipe)
        for module in modules:
            x = module(x)
        loss = F.cross_entropy(x, labels)
        loss.backward()
        grads.append([programs.grads_of(module) for module in modules])
        losses.append(loss.item())
        for module in modules:
            programs.sgd(module)
    return grads, losses


def symptom(pipe: Pipe, pairs: list[tuple[int, str, np.ndarray, np.ndarray]], step: Step) -> str:
    """The known mistake the wrong gradients show, named only where the evidence rules out the others."""
    got = np.concatenate([g.ravel() for _, _, g, _ in pairs])
    want = np.concatenate([w.ravel() for _, _, _, w in pairs])
    scale = float(got @ want / (want @ want))
    if np.linalg.norm(got - scale * want) <= 1e-6 * np.linalg.norm(want):  # every gradient, one factor
        if abs(scale - pipe.m) < 1e-6 * pipe.m:
            return (f". Every gradient is m = {pipe.m} times the batch's: the micro-batches' losses were summed, "
                    f"not averaged. The batch's loss is the mean of the m micro-batch losses, so the last stage's "
                    f"backward takes 1/m as each micro-batch loss's weight")
        twice, by_p = abs(scale - 1 / pipe.m) < 1e-6 / pipe.m, abs(scale - pipe.m / pipe.p) < 1e-6 * pipe.m / pipe.p
        if twice and by_p:  # m * m == p: the factor cannot tell the two apart
            return (f". Every gradient is 1/{pipe.m} of the batch's: divided by m twice, or each micro-batch's loss "
                    f"weighted 1/p instead of 1/m (at m = {pipe.m}, p = {pipe.p} both give this factor)")
        if twice:
            return (f". Every gradient is 1/m = 1/{pipe.m} of the batch's: divided by m twice (the last stage's "
                    f"1/m weight already makes the gradient the mean's; do not divide .grad again)")
        if by_p:
            return (f". Every gradient is m/p = {pipe.m}/{pipe.p} times the batch's: each micro-batch's loss was "
                    f"weighted 1/p, the number of stages; the batch's loss is the mean of the m micro-batch losses")
        if abs(scale - 1) < 1e-6:
            error = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            return (f". Every gradient is the batch's to a relative {error:.1g}, not to float64's precision: a "
                    "float32 buffer or cast on the way? (the activations and gradients are float64)")
        return f". Every gradient is {scale:.4g} times the batch's"
    for s in range(pipe.p - 1):
        mine, theirs = step.backward_order(s), step.backward_order(s + 1)
        if mine != theirs and sorted(mine) == sorted(theirs):
            n = next(n for n, (a, b) in enumerate(zip(mine, theirs)) if a != b)
            return (f". Stage {s + 1} computed its gradients for the micro-batches in the order {theirs}, stage {s} "
                    f"ran its backwards in the order {mine}: gradient number {n + 1} (micro-batch {theirs[n]}'s) went "
                    f"into micro-batch {mine[n]}'s backward, another micro-batch's stashed activation. Backward "
                    f"the micro-batch whose gradient arrived (oldest first: a queue, not a stack), or match by tag")
    return ""


# == the bubble and the stash =======================================================================


def bubble_message(pipe: Pipe, step: Step, bound: float, tolerance: float) -> str | None:
    measured = step.bubble
    if measured is None:
        return f"{pipe.label()}: no stage ran a forward or a backward"
    if abs(measured - bound) <= tolerance * bound:
        return None
    what = "(p-1)/(m+p-1)" if pipe.equal else "the critical path of the schedule with these stage times"
    message = (f"{pipe.label()}: bubble {measured:.3f} on the virtual clock (idle / total over the {pipe.p} stages), "
               f"expected {bound:.3f} = {what}, within {tolerance:.0%}")
    canonical = [operations(pipe.schedule, pipe.p, pipe.m, s) for s in range(pipe.p)]
    if (s := next((s for s in range(pipe.p) if step.ops[s] != canonical[s]), None)) is not None:
        message += (f"; stage {s} ran {' '.join(f'{k}{i}' for k, i in step.ops[s])} where {NAMES[pipe.schedule]} runs "
                    f"{' '.join(f'{k}{i}' for k, i in canonical[s])}")
    if not step.overlapped():
        message += (": no two stages ever computed at the same time, so one micro-batch at a time went through the "
                    "pipeline; send each activation on as soon as it is computed and go on with the next micro-batch")
    return message


def messages_message(pipe: Pipe, step: Step) -> str | None:
    """Every stage sends each micro-batch's activation to the next stage and its gradient to the
    previous one, point to point: m messages each way between neighbours, and no collective."""
    for s in range(pipe.p):
        if step.collectives[s]:
            return (f"{pipe.label()}: stage {s} called {', '.join(sorted(set(step.collectives[s])))}: activations "
                    "and gradients go point to point, to the neighbouring stages only")
        want = {n: pipe.m for n in (s - 1, s + 1) if 0 <= n < pipe.p}
        got = {n: step.sent[s].count(n) for n in set(step.sent[s]) | set(want)}
        if got != want:
            return (f"{pipe.label()}: stage {s} sent {', '.join(f'{c} messages to stage {n}' for n, c in sorted(got.items()))}"
                    f"; expected m = {pipe.m} to each neighbouring stage (an activation forward, a gradient back, "
                    "per micro-batch)")
    return None


def traffic_message(pipe: Pipe, step: Step) -> str | None:
    """What the gradients need besides being right: the messages that carried the other stages'
    part, m each way between neighbours, each one micro-batch's activation or gradient in bytes.
    (No stage holds the other stages' weights or data: right gradients came through these.)"""
    if message := messages_message(pipe, step):
        return message
    for s in range(pipe.p):
        for span in step.events[s]:
            if span.kind == "send" and span.nbytes != MESSAGE_BYTES:
                return (f"{pipe.label()}: stage {s} sent {span.nbytes} bytes to stage {span.peer}; a micro-batch's "
                        f"activation or gradient is MICRO x WIDTH = {MICRO} x {WIDTH} float64, {MESSAGE_BYTES} bytes")
    return None


def task_traffic_message(task: Any, pipes: list[Pipe]) -> str | None:
    """Over the whole task, each stage sent exactly what its pipelines' steps account for (m each way
    per step and pipeline, one micro-batch's bytes each), so that nothing travelled outside a step,
    and called no collective but the harness's Barrier before each step."""
    p, total = pipes[0].p, STEPS * sum(pipe.m for pipe in pipes)
    for s in range(p):
        counts = task.counts(s)
        want = {n: total for n in (s - 1, s + 1) if 0 <= n < p}
        got = {n: c for n, c in counts.sent_msgs.items() if c}
        sent = {n: b for n, b in counts.sent_bytes.items() if b}
        if got != want or sent != {n: c * MESSAGE_BYTES for n, c in want.items()}:
            said = ", ".join(f"{c} messages ({sent.get(n, 0)} bytes) to stage {n}" for n, c in sorted(got.items()))
            return (f"over the whole task, stage {s} sent {said or 'nothing'}; its {len(pipes)} pipelines' steps "
                    f"account for {total} to each neighbouring stage, {MESSAGE_BYTES} bytes each (every message "
                    "an activation or a gradient of a step)")
        others = [op for op in counts.collectives_used() if op != "Barrier"]
        if others or counts.calls.get("Barrier", 0) != STEPS * len(pipes):
            return (f"over the whole task, stage {s} called {', '.join(others) or 'Barrier'} besides the harness's "
                    "Barrier before each step: activations and gradients go point to point")
    return None


# == what the messages carried ======================================================================
#
# The counters and the trace say how many bytes went where, not what they were: junk of the right
# size in the right order would pass every check above. The task keeps a copy of every buffer each
# rank sent (Task(record_sent=True), taken by the rank's agent as the call started), and here each
# step's messages are held against the pipeline the checker computes on the whole case:
#
# - a forward message from stage s must be stage s's output activation of one of the step's
#   micro-batches (each once), exactly one process's within MESSAGE_RTOL;
# - a backward message from the last stage must be the gradient of the batch's loss with respect
#   to its input for one micro-batch (each once), up to one factor for the whole step: the loss's
#   weight, whose value the gradient checks grade; from a stage s in between, its own backward of
#   one micro-batch applied to one of the gradients stage s+1 sent (each once): the right one when
#   each gradient meets its own micro-batch; another pairing is the gradient checks' to name.
#
# Step 1 starts from the weights SGD made of step 0's gradients, so its messages are graded only
# where every stage handed back step 0's gradients right (else the gradient checks say why).

MESSAGE_RTOL = 1e-6  # relative to the message's largest value; float64 in another order is 1e-15 off
WEIGHT_RANGE = (1e-3, 1e3)  # the last stage's loss weight, relative to 1/m: any plausible one, not 0


@dataclass(frozen=True, eq=False)
class Carried:
    """One step of the single-process pipeline: what each stage's messages must carry."""

    activations: list[np.ndarray | None]  # stage s < p-1: (m, MICRO, WIDTH), its output per micro-batch
    input_grads: list[np.ndarray | None]  # stage s > 0: (m, MICRO, fan_in), d(batch loss)/d(its input)
    weights: list[np.ndarray]  # stage s: its linear layer's weight (fan_out x fan_in) during the step
    grads: list[dict[str, np.ndarray]]  # stage s: its parameters' gradients of the step (one_process's)


@lru_cache(maxsize=32)
def carried(pipe: Pipe) -> tuple[Carried, ...]:
    """Each step's Carried, from STEPS SGD steps of one process on the whole batch (as one_process)."""
    modules = [programs.stage_module(pipe, s) for s in range(pipe.p)]
    steps = []
    for _ in range(STEPS):
        x, inputs, outputs = programs.inputs(pipe), [], []
        for module in modules:
            if x.requires_grad:  # a stage's input: the previous stage's output, whose gradient is sent back
                x.retain_grad()
            inputs.append(x)
            x = module(x)
            outputs.append(x)
        F.cross_entropy(x, programs.targets(pipe)).backward()
        steps.append(Carried([_per_micro(pipe, outputs[s]) if s < pipe.p - 1 else None for s in range(pipe.p)],
                             [_per_micro(pipe, inputs[s].grad) if s > 0 else None for s in range(pipe.p)],
                             [next(module.parameters()).detach().numpy().copy() for module in modules],
                             [programs.grads_of(module) for module in modules]))
        for module in modules:
            programs.sgd(module)
    return tuple(steps)


def _per_micro(pipe: Pipe, tensor: Any) -> np.ndarray:
    """A batch's rows (m x MICRO) as (m, MICRO, width): micro-batch i is rows i*MICRO..."""
    return tensor.detach().numpy().reshape(pipe.m, MICRO, -1).copy()


def step_sends(task: Any, step: Step) -> list[list[tuple[int, np.ndarray]]] | str:
    """Each stage's sends of the step, (destination, values) in call order, from its sent log; why
    not, where the log cannot say (it overflowed, or the task did not keep it)."""
    sends = []
    for s in range(step.p):
        try:
            log = task.sent(s)
        except (ValueError, LookupError, AttributeError) as error:
            return f"stage {s}: no copy of what it sent ({error})"
        if log.overflowed:
            return (f"stage {s} sent more than its log keeps (it copies up to 64 MiB): what its messages carried "
                    "is unknown")
        sends.append([(item.peer, item.data) for item in log.items if step.marks[s][0] <= item.after_marks <= step.marks[s][1]])
    return sends


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.max(np.abs(got - want)) <= MESSAGE_RTOL * max(float(np.max(np.abs(want))), 1e-12))


def _values(array: Any, limit: int = 4) -> str:
    """The first few values of a message, as the failure says them."""
    try:
        flat = np.asarray(array, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        return "values that are not numbers"
    return "[" + ", ".join(f"{x:.4g}" for x in flat[:limit]) + (", ...]" if flat.size > limit else "]")


def _readable(data: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    try:
        array = np.asarray(data, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return array.reshape(shape) if array.size == int(np.prod(shape)) and np.isfinite(array).all() else None


def contents_message(pipe: Pipe, step: Step, sends: Any, want: Carried, k: int = 0) -> str | None:
    """None when every message of training step ``k`` carried what the pipeline computes (see
    above); else the first that did not: its stage, its number on its channel, what it carried and
    what it should have. ``sends``: step_sends's."""
    head = f"{pipe.label()}, step {k}: "
    if isinstance(sends, str):
        return head + sends
    p, m = pipe.p, pipe.m
    channels = [{n: [d for peer, d in sends[s] if peer == n] for n in (s - 1, s + 1) if 0 <= n < p} for s in range(p)]
    orders = [{kind: [i for k, i in step.ops[s] if k == kind] for kind in "FB"} for s in range(p)]
    for s in range(p):
        for n, got in channels[s].items():
            if len(got) != m:
                return (head + f"stage {s} sent {len(got)} messages to stage {n} in this step; expected m = {m}, one "
                        f"{'activation' if n > s else 'gradient'} per micro-batch")
    for s in range(p - 1):  # the activations, in the forwards' direction
        if message := _forwards_message(s, channels[s][s + 1], want.activations[s], orders[s]["F"]):
            return head + message
    received: list[np.ndarray] = []  # the gradients stage s+1 sent to stage s, as sent
    for s in range(p - 1, 0, -1):  # the gradients, in the backwards' direction
        message, received = _backwards_message(pipe, s, channels[s][s - 1], want, received, orders[s]["B"])
        if message:
            return head + message
    return None


def _which(order: list[int], n: int) -> int:
    """The micro-batch of the stage's n-th forward (backward), by its declared order."""
    return order[n] if n < len(order) else n


def _forwards_message(s: int, got: list[np.ndarray], activations: np.ndarray, order: list[int]) -> str | None:
    free = set(range(len(activations)))
    for n, data in enumerate(got):
        value = _readable(data, activations.shape[1:])
        j = None if value is None else next((j for j in sorted(free) if _close(value, activations[j])), None)
        if j is None:
            i = _which(order, n)
            return (f"stage {s}'s message {n + 1} to stage {s + 1} carried {_values(data)}, not stage {s}'s output "
                    f"activation of micro-batch {i} ({_values(activations[i])}) nor of any other micro-batch "
                    "of the step: each activation a stage sends on is the one its forward computed")
        free.discard(j)
    return None


def _backwards_message(pipe: Pipe, s: int, got: list[np.ndarray], want: Carried, received: list[np.ndarray],
                       order: list[int]) -> tuple[str | None, list[np.ndarray]]:
    """Stage ``s``'s gradients to stage s-1 against what its backward gives; ``received``: the
    gradients stage s+1 sent it (empty for the last stage). Returns why not, or the values sent."""
    truth = want.input_grads[s]
    shape = truth.shape[1:]
    if s == pipe.p - 1:  # each micro-batch's own gradient, times one loss weight for the step
        candidates = {(b, None): truth[b] for b in range(pipe.m)}
    else:  # this stage's backward of micro-batch b applied to stage s+1's gradient a
        slope = 1.0 - want.activations[s] ** 2  # tanh's, from the stage's output
        product = np.einsum("arw,brw,wi->abri", np.stack(received), slope, want.weights[s])
        candidates = {(b, a): product[a, b] for a in range(len(received)) for b in range(pipe.m)}
    used_b, used_a, factor, values = set(), set(), None, []
    for n, data in enumerate(got):
        value = _readable(data, shape)
        match = None
        for (b, a), cand in ([] if value is None else candidates.items()):
            if b in used_b or a in used_a:
                continue
            scale = 1.0
            if a is None:  # the last stage: the factor of the loss's weight, one for the step
                norm = float(np.sum(cand * cand))
                scale = float(np.sum(value * cand)) / norm if norm > 0 else 0.0
                low, high = WEIGHT_RANGE
                if not low <= scale <= high or (factor is not None and abs(scale - factor) > 1e-6 * factor):
                    continue
            if _close(value, scale * cand):
                match = (b, a, scale)
                break
        if match is None:
            i = _which(order, n)
            return (f"stage {s}'s message {n + 1} to stage {s - 1} carried {_values(data)}, not the gradient of the "
                    f"batch's loss with respect to stage {s}'s input for micro-batch {i} ({_values(truth[i])}), "
                    + ("nor that of any other micro-batch of the step, times one weight of the loss"
                       if s == pipe.p - 1 else
                       f"nor stage {s}'s backward of any micro-batch of the step applied to a gradient stage {s + 1} "
                       "sent") + ": each gradient a stage sends back is the one its backward computed"), []
        b, a, scale = match
        used_b.add(b)
        if a is not None:
            used_a.add(a)
        else:
            factor = scale
        values.append(value)
    return None, values


def gradients_right(pipe: Pipe, values: Any, step: int) -> bool:
    """Whether every stage handed back one process's gradients on every step before ``step`` (so
    that its weights in ``step`` are one process's, and so are its messages)."""
    for k in range(step):
        for s, want in enumerate(carried(pipe)[k].grads):
            got = returned(values, s, "grads", k)
            if not isinstance(got, dict):
                return False
            for name, w in want.items():
                try:
                    array = np.asarray(got.get(name), dtype=np.float64)
                except (TypeError, ValueError, OverflowError):
                    return False
                if array.shape != w.shape or first_mismatch(array, w, rtol=RTOL, atol=ATOL):
                    return False
    return True


def carried_message(pipe: Pipe, task: Any, step: Step, k: int, values: Any) -> str | None:
    """contents_message for training step ``k`` of the pipeline (see above), None where not graded:
    a step after wrong gradients (the gradient checks say why)."""
    if k > 0 and not gradients_right(pipe, values, k):
        return None
    return contents_message(pipe, step, step_sends(task, step), carried(pipe)[k], k)


def _ops_text(ops: list[tuple[str, int]]) -> str:
    return " ".join(f"{kind}{i}" for kind, i in ops) or "nothing"


def declared_message(pipe: Pipe, step: Step, times: bool = True) -> str | None:
    """None when every stage's compute spans are the ones the harness's Stage declares for this
    case, each where the messages allow it; else what differs.

    The Stage declares "forward i" and "backward i" with the case's stage times, once per micro-batch
    and stage; a forward on stage s > 0 needs the activation stage s-1 sent (its k-th forward comes
    after its k-th activation in), a backward the gradient stage s+1 sent and its own forward, and a
    stage sends its k-th activation after its k-th forward, its k-th gradient after its k-th
    backward. ``times``: compare the seconds too (not under a fault plan, which may slow a rank).
    Nothing declared is no pass: a schedule that hid its spans from one step (its Stage's comm
    swapped for one whose compute() does nothing) showed a stash of none there."""
    if not any(step.compute):
        return (f"{pipe.label()}: no stage declared a forward or a backward on the virtual clock (stage.forward "
                "and stage.backward declare each one they run): no micro-batch went through the Stage, or its "
                "declarations were kept off the clock")
    head = f"{pipe.label()}: the declared compute differs from the harness's: "
    every = sorted((kind, i) for kind in "FB" for i in range(pipe.m))
    for s in range(pipe.p):
        for span in step.compute[s]:
            op = parse_label(span.name)
            if op is None or op[1] >= pipe.m:
                return (head + f"stage {s} declared {str(span.name)[:60]!r}, which its Stage never declares (it "
                        f"declares \"forward i\" and \"backward i\" for micro-batches i = 0 to m - 1 = {pipe.m - 1})")
            want = (pipe.forward_s if op[0] == "F" else pipe.backward_s)[s]
            if times and not abs(span.seconds - want) <= 1e-6 * want:
                return (head + f"stage {s} declared {span.name} for {span.seconds * 1e3:.4g} ms, where its Stage "
                        f"declares {want * 1e3:.4g} ms ({'forward' if op[0] == 'F' else 'backward'} of this stage)")
        if sorted(step.ops[s]) != every:
            missing = [f"{k}{i}" for k, i in every if (k, i) not in step.ops[s]]
            twice = sorted({f"{k}{i}" for k, i in step.ops[s] if step.ops[s].count((k, i)) > 1})
            return (head + f"stage {s} declared {_ops_text(step.ops[s])}"
                    + (f"; missing {' '.join(missing)}" if missing else "")
                    + (f"; twice {' '.join(twice)}" if twice else "")
                    + ": its Stage declares one forward and one backward of each micro-batch")
        if message := _order_message(pipe, step, s):
            return head + message
    return None


def _order_message(pipe: Pipe, step: Step, s: int) -> str | None:
    """Where stage ``s``'s declared operations come before the messages they need, or its sends
    before the operations that computed them (see declared_message)."""
    received = {s - 1: 0, s + 1: 0}
    sent = {s - 1: 0, s + 1: 0}
    forwards, backwards, forwarded = 0, 0, set()
    for span in step.events[s]:
        if span.kind == "wait":
            for key in span.received:
                if key[1] in received:
                    received[key[1]] += 1
        elif span.kind == "send" and span.peer in sent:
            sent[span.peer] += 1
            done, what = (forwards, "forward") if span.peer == s + 1 else (backwards, "backward")
            if sent[span.peer] > done:
                return (f"stage {s} sent message {sent[span.peer]} to stage {span.peer} after only {done} "
                        f"{what}(s): each activation (gradient) it sends comes out of a {what}")
        elif span.kind == "compute" and (op := parse_label(span.name)) is not None:
            kind, i = op
            if kind == "F":
                forwards += 1
                forwarded.add(i)
                if s > 0 and received[s - 1] < forwards:
                    return (f"stage {s} declared forward {i}, its forward number {forwards}, having received "
                            f"{received[s - 1]} activation(s) from stage {s - 1}: a forward needs the previous "
                            "stage's activation")
            else:
                backwards += 1
                if i not in forwarded:
                    return f"stage {s} declared backward {i} before forward {i}: a backward needs its stashed activation"
                if s < pipe.p - 1 and received[s + 1] < backwards:
                    return (f"stage {s} declared backward {i}, its backward number {backwards}, having received "
                            f"{received[s + 1]} gradient(s) from stage {s + 1}: a backward needs the next stage's "
                            "gradient")
    return None


def stash_message(pipe: Pipe, step: Step) -> str | None:
    """GPipe holds all m activations at its peak on every stage; 1F1B at most p on any."""
    for s, top in enumerate(step.peaks):
        ops = " ".join(f"{kind}{i}" for kind, i in step.ops[s]) or "no forward at all"
        if pipe.schedule == "gpipe" and top != pipe.m:
            return (f"{pipe.label()}: stage {s} held at most {top} stashed activations, expected m = {pipe.m}: GPipe "
                    f"runs every forward before the first backward (stage {s} ran {ops})")
        if pipe.schedule == "1f1b" and top > pipe.p:
            warm = step.warmup(s)
            why = (f"its warm-up ran all m = {pipe.m} forwards before the first backward, as GPipe does"
                   if warm >= pipe.m else f"its warm-up ran {warm} forwards before the first backward")
            return (f"{pipe.label()}: stage {s} held {top} stashed activations at once, more than p = {pipe.p}: {why}; "
                    f"1F1B warms up min(p - 1 - stage, m) forwards, here {min(pipe.p - 1 - s, pipe.m)} (stage {s} "
                    f"ran {ops})")
    return None


# == the free run's picture =========================================================================


def parse_order(text: Any, m: int) -> list[tuple[str, int]] | None:
    """"F0 F1 B0 ..." as [("F", 0), ...], or None unless every forward and backward of 0..m-1 is there once."""
    if not isinstance(text, str):
        return None
    ops = [(op[0], int(op[1:])) for op in text.split() if op[:1] in ("F", "B") and op[1:].isdigit()]
    return ops if sorted(ops) == sorted([(k, i) for k in "FB" for i in range(m)]) else None


def schedule_svg(summary: dict) -> str:
    """GPipe and 1F1B side by side, a row per stage: the free run's order of operations on each
    stage, replayed here with its stage times (forward blue, backward orange, idle grey)."""
    if not isinstance(summary, dict) or not all(isinstance(summary.get(k), (int, float)) for k in ("p", "m", "forward_ms")):
        return ""
    if not (summary["p"] in range(1, 65) and summary["m"] in range(1, 257) and 0 < summary["forward_ms"] < 1e6):
        return ""  # rank 0's numbers, from the learner's process: only a pipeline worth drawing is drawn
    p, m, f = int(summary["p"]), int(summary["m"]), float(summary["forward_ms"]) * 1e-3
    panels = []
    for name in ("gpipe", "1f1b"):
        orders = [parse_order(o, m) for o in summary.get(f"order_{name}") or []]
        if len(orders) == p and all(orders):
            try:
                panels.append((name, cases_replay(Pipe(name, m, (f,) * p, (2 * f,) * p, 0), order=orders)))
            except ValueError:  # an order that deadlocks has no picture
                continue
    if not panels:
        return ""
    width, row = 470, 26
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width * len(panels) + 20}" height="{90 + row * p}" '
             'font-size="12" font-family="sans-serif">']
    for k, (name, (makespan, spans)) in enumerate(panels):
        left, x0 = 10 + k * width, 10 + k * width + 50
        scale = (width - 70) / makespan
        limit = f"m = {m}" if name == "gpipe" else f"at most p = {p}"
        parts.append(f'<text x="{left}" y="18" font-weight="bold">{escape(NAMES[name])}: bubble '
                     f'{float(summary.get(f"bubble_{name}", 0)):.3f}, (p-1)/(m+p-1) = {formula_bubble(p, m):.3f}</text>'
                     f'<text x="{left}" y="36">peak stashed activations {int(summary.get(f"stash_{name}", 0))} '
                     f'({escape(limit)})</text>')
        for s, stage in enumerate(spans):
            y = 50 + s * row
            parts.append(f'<text x="{left}" y="{y + 16}">stage {s}</text><rect x="{x0}" y="{y}" '
                         f'width="{makespan * scale:.1f}" height="{row - 4}" fill="#e4e4e4"/>')
            for kind, micro, begin, end in stage:
                colour = "#4c78a8" if kind == "F" else "#f58518"
                x, w = x0 + begin * scale, max((end - begin) * scale, 1.0)
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 4}" fill="{colour}" '
                             f'stroke="white"><title>{"forward" if kind == "F" else "backward"} {micro}</title></rect>'
                             f'<text x="{x + w / 2 - 3:.1f}" y="{y + 15}" fill="white">{micro}</text>')
    parts.append(f'<text x="10" y="{74 + row * p}">blue: forward, orange: backward of micro-batch i; grey: idle, '
                 'the bubble. Each stage runs the order your free run did, replayed with its stage times.</text></svg>')
    return "".join(parts)
