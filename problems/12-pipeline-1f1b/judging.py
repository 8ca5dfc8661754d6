"""Reading a pipeline's run for problem 12: its schedule, bubble and stash on the virtual clock,
its gradients against one process's, the symptoms of known mistakes, and the report's picture.

Everything here reads what the harness recorded: the compute spans the Stage declared ("forward i",
"backward i"), in each rank's program order, and the gradients the ranks hand back as evidence,
judged against the expected values of cases.py and programs.one_process."""

from html import escape
from typing import Any

import numpy as np

from distlab.grading import first_mismatch

from .cases import NAMES, Pipe, formula_bubble, operations, peak_stash
from .cases import replay as cases_replay

RTOL, ATOL = 1e-9, 1e-12  # float64 sums in another order: about 1e-15 apart

# == the schedule, read from the replay =============================================================


def window(timeline: Any, rank: int, number: int, step: int) -> tuple[float, list[Any]]:
    """The rank's mark of case ``number``'s step ``step`` (its virtual time) and its calls up to its next mark."""
    events, name = timeline.events(rank), f"case {number} step {step}"
    starts = [k for k, e in enumerate(events) if e.kind == "mark" and e.name == name]
    if not starts:
        raise ValueError(f"rank {rank}: no mark {name!r} in the trace")
    after = events[starts[0] + 1:]
    end = next((k for k, e in enumerate(after) if e.kind == "mark"), len(after))
    return events[starts[0]].begin, after[:end]


def declared_operations(spans: list[Any]) -> list[tuple[str, int]]:
    """("F" or "B", micro-batch) of each forward and backward the Stage declared, in program order."""
    ops = []
    for span in spans:
        if span.kind == "compute" and span.name.split(" ")[0] in ("forward", "backward"):
            kind, micro = span.name.split(" ")
            ops.append(("F" if kind == "forward" else "B", int(micro)))
    return ops


class Step:
    """One step of one case on the virtual clock: every stage's operations and compute spans."""

    def __init__(self, task: Any, number: int, step: int, p: int) -> None:
        timeline = task.timeline()
        windows = [window(timeline, rank, number, step) for rank in range(p)]
        self.start = min(mark for mark, _ in windows)
        self.compute = [[s for s in spans if s.kind == "compute"] for _, spans in windows]
        self.sent = [[s.peer for s in spans if s.kind == "send"] for _, spans in windows]  # world ranks
        self.collectives = [[s.name for s in spans if s.kind in ("coll", "icoll")] for _, spans in windows]
        self.ops = [declared_operations(spans) for _, spans in windows]
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
            got = values[s]["grads"][k]
            for name, w in want.items():
                g = got.get(name)
                if isinstance(g, str) or g is None:
                    return (f"{pipe.label()}, step {k}: stage {s}'s {g or name + ' is missing'}: no backward reached "
                            "this stage's parameters")
                pairs.append((s, name, np.asarray(g), w))
        wrong = [(s, n, g, w, bad) for s, n, g, w in pairs if (bad := first_mismatch(g, w, rtol=RTOL, atol=ATOL))]
        if not wrong:
            continue
        s, name, g, w, bad = wrong[0]
        head = (f"{pipe.label()}, step {k}: the gradients differ from one process training on the whole batch of "
                f"{pipe.batch} samples (the mean loss); first at stage {s}, {name}: {bad.describe()}")
        return head + symptom(pipe, pairs, step_of(k))
    return None


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
