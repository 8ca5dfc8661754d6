"""How problem 08 judges a hidden run: its truth from the replay's marks, never what the ranks say;
readers of rank 0's answer that fail the check, naming the variant, on a missing or malformed entry."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from distlab.grading import CaseRun, CheckContext, Span, TaskRun

from .cases import Variant, harness_training, look_alikes
from .programs import RankResult


@dataclass
class Truth:
    compute: np.ndarray  # (p, steps) seconds, from the replay
    sync: np.ndarray  # (p, steps)
    trained_s: float  # training makespan: the last rank's "trained" mark

    @property
    def ratio(self) -> float:
        return float(self.sync.sum() / self.compute.sum())

    def look_alike(self, got: float) -> tuple[str, float] | None:
        """The common wrong answer that got is (within 0.5%; the nearest), if any: (what, its value)."""
        near = [(abs(got - value), name, value) for name, value in look_alikes(self.compute, self.sync).items()
                if abs(got - value) <= 0.005 * abs(value)]
        return min(near)[1:] if near else None

    def compute_over_median(self) -> np.ndarray:
        per_rank = self.compute.mean(axis=1)
        return per_rank / float(np.median(per_rank))


def phase_times(marks: list[tuple[str, float]], steps: int) -> tuple[list[float], list[float], float]:
    """(compute per step, sync per step, end of training) of one rank, from its marks."""
    starts = [t for name, t in marks if name == "step"]
    syncs = [t for name, t in marks if name == "sync"]
    trained = next(t for name, t in marks if name == "trained")
    ends = starts[1:steps] + [trained]
    return [syncs[k] - starts[k] for k in range(steps)], [ends[k] - syncs[k] for k in range(steps)], trained


def marks_message(task_run: TaskRun, v: Variant) -> str | None:
    """None if every rank's marks up to its first "trained" are the harness's ("step", "sync" per
    step, then "trained"), the only ones the truth is read from; else what differs (the rank's
    process sets them, so a patched comm or a probe could set others)."""
    timeline, want = task_run.timeline(), ["step", "sync"] * v.steps + ["trained"]
    for rank in range(v.p):
        names = [name for name, _ in timeline.marks(rank)]
        got = names[: names.index("trained") + 1] if "trained" in names else names
        if got != want:
            shown = ", ".join(map(repr, got[:8])) + (", ..." if len(got) > 8 else "")
            return (f"{v.label()}: rank {rank}'s marks differ from the harness's: [{shown or 'none'}] up to its "
                    f"\"trained\" mark, where the harness sets 'step' and 'sync' in each of the {v.steps} steps, "
                    "then 'trained', and nothing else (the probes must not set marks)")
    return None


def result_message(result: CaseRun[Variant]) -> str | None:
    """None if rank 0 returned what run_variant returns (a RankResult with a JSON string or None
    for the trace and a string for its error); the rank's process could return anything."""
    rank0 = result.values[0] if result.values else None
    if not isinstance(rank0, RankResult):
        return f"{result.case.label()}: rank 0 returned {type(rank0).__name__}, not run_variant's RankResult"
    if not isinstance(rank0.trace_json, (str, type(None))) or not isinstance(rank0.trace_error, str):
        return (f"{result.case.label()}: rank 0's RankResult holds a {type(rank0.trace_json).__name__} trace_json "
                f"and a {type(rank0.trace_error).__name__} trace_error, where run_variant sets a string (or None) "
                "and a string")
    return None


def truth_of(task_run: TaskRun, v: Variant) -> Truth:
    timeline = task_run.timeline()
    compute, sync, trained = zip(*(phase_times(timeline.marks(rank), v.steps) for rank in range(v.p)))
    return Truth(np.array(compute), np.array(sync), max(trained))


def training_calls(task_run: TaskRun) -> int:
    """Communication calls of every rank before its "trained" mark: the task's, less diagnose()'s."""
    return sum(sum(task_run.counts(r).calls.values()) - sum(task_run.counts(r, "trained").calls.values())
               for r in range(task_run.spec.ranks))


def exchange_bytes(v: Variant, rank: int, peer: int) -> int:
    """Bytes the harness's direct exchange has rank send peer over the training: each step, the
    peer's chunk of the gradient (reduce-scatter), then its own summed chunk (allgather)."""
    chunk = 4 * np.diff(np.linspace(0, v.grad_elems, v.p + 1).astype(int))
    return v.steps * int(chunk[peer] + chunk[rank])


def harness_message(task_run: TaskRun, v: Variant) -> str | None:
    """None if every rank's training, on its agent's record up to its "trained" mark, declared the
    harness's compute (its own table, times the straggler's factor on the straggler) and sent each
    peer at least the harness's exchange; else what differs. The rank's process declares both, so a
    patched comm or exchange could make a run look cheaper (or its twin dearer) than it is."""
    timeline = task_run.timeline()
    for rank in range(v.p):
        events = timeline.events(rank)
        end = next((k for k, e in enumerate(events) if e.kind == "mark" and e.name == "trained"), len(events))
        training = events[:end]
        want = v.declared(rank)
        spans = [e for e in training if e.kind == "compute"]
        if len(spans) != len(want) or any(e.name != "forward+backward" or not abs(e.seconds - w) <= 1e-9 + 1e-6 * w
                                          for e, w in zip(spans, want)):
            saw = ", ".join(f"{str(e.name)[:30]!r} {e.seconds * 1e3:.4f}" for e in spans[:12]) or "none"
            return (f"{v.label()}: the declared compute differs from the harness's: rank {rank} declared [{saw}] "
                    f"ms before its \"trained\" mark; the harness declares 'forward+backward' "
                    f"[{', '.join(f'{w * 1e3:.4f}' for w in want)}] ms, one per step")
        sent: dict[int, int] = {}
        for e in training:
            if e.kind == "send" and e.peer is not None:
                sent[e.peer] = sent.get(e.peer, 0) + e.nbytes
        for peer in range(v.p):
            if peer != rank and sent.get(peer, 0) < (need := exchange_bytes(v, rank, peer)):
                return (f"{v.label()}: the gradient exchange differs from the harness's: rank {rank} sent rank "
                        f"{peer} {sent.get(peer, 0)} bytes before its \"trained\" mark; the harness's direct "
                        f"exchange sends it {need} over the {v.steps} steps")
    return None


def recorded(e: Span) -> tuple[Any, ...]:
    """One call of the agent's record as (kind, what tells it apart): a mark's name, a compute's label and
    seconds, a send's or receive's peer, tag and bytes, the (source, tag) of each message a wait matched."""
    if e.kind == "mark":
        return (e.kind, e.name)
    if e.kind == "compute":
        return (e.kind, e.name, e.seconds)
    if e.kind in ("send", "recv"):
        return (e.kind, e.peer, e.tag, e.nbytes)
    if e.kind == "wait":
        return (e.kind, tuple(sorted((key[1], key[3]) for key in e.received)))
    return (e.kind, e.name, e.peer, e.nbytes)


def call_text(call: tuple[Any, ...]) -> str:
    kind, *rest = call
    if kind == "mark":
        return f"the mark {shown(rest[0])}"
    if kind == "compute":
        return f"a compute {shown(rest[0])} of {rest[1] * 1e3:.4f} ms"
    if kind in ("send", "recv"):
        return f"a {kind} of {rest[2]} bytes {'to' if kind == 'send' else 'from'} rank {rest[0]} (tag {rest[1]})"
    if kind == "wait":
        return f"a wait matching the messages of {', '.join(f'rank {r} (tag {g})' for r, g in rest[0]) or 'nothing'}"
    what = {"coll": "collective", "icoll": "nonblocking collective", "store": "store call"}.get(kind, kind)
    return f"a {what} {shown(rest[0])} of {rest[2]} bytes"


def same_call(got: tuple[Any, ...], want: tuple[Any, ...]) -> bool:
    if got[0] == want[0] == "compute":
        return got[1] == want[1] and abs(got[2] - want[2]) <= 1e-9 + 1e-6 * want[2]
    return got == want


def twin_message(task_run: TaskRun, v: Variant) -> str | None:
    """None if every rank of the unprobed twin did exactly the harness's training (harness_training), no
    call more or fewer, no byte more or fewer; else the first call that differs. No probe runs there, so
    anything else came from code that replaced the harness's in the learner's process, and the twin's
    time, the baseline of what the probes cost, would be that code's."""
    timeline = task_run.timeline()
    for rank in range(v.p):
        want = harness_training(v, rank)
        got = [recorded(e) for e in timeline.events(rank)][: len(want)]
        k = next((k for k, (a, b) in enumerate(zip(got, want)) if not same_call(a, b)), min(len(got), len(want)))
        if k < len(want):
            saw = call_text(got[k]) if k < len(got) else "nothing more"
            return (f"{v.label()} without probes: the unprobed run was not the harness's: rank {rank}'s call #{k} "
                    f"was {saw} where the harness's training makes {call_text(want[k])}; no probe runs in that "
                    "run, so its time (the baseline of what the probes cost) must be the harness's own, "
                    "call for call and byte for byte")
        calls, sent = training_counts(task_run, rank)
        want_calls = {"Irecv": 2 * (v.p - 1) * v.steps, "Isend": 2 * (v.p - 1) * v.steps}
        want_sent = {peer: exchange_bytes(v, rank, peer) for peer in range(v.p) if peer != rank}
        if (calls, sent) != (want_calls, want_sent):
            return (f"{v.label()} without probes: the unprobed run was not the harness's: rank {rank}'s agent "
                    f"counted the calls {shown(calls)} and the bytes sent by peer {shown(sent)} before its "
                    f"\"trained\" mark, where the harness's training makes {shown(want_calls)} and "
                    f"{shown(want_sent)}")
    return None


def training_counts(task_run: TaskRun, rank: int) -> tuple[dict[str, int], dict[int, int]]:
    """The rank's calls and bytes sent by peer before its "trained" mark, as its agent counted them."""
    whole, after = task_run.counts(rank), task_run.counts(rank, "trained")
    calls = {k: n - after.calls.get(k, 0) for k, n in whole.calls.items() if n - after.calls.get(k, 0)}
    sent = {k: n - after.sent_bytes.get(k, 0) for k, n in whole.sent_bytes.items() if n - after.sent_bytes.get(k, 0)}
    return calls, sent


@dataclass
class HiddenRun:
    """One probed variant as the checks judge it: its truth and what came back from rank 0."""

    variant: Variant
    task_run: TaskRun
    truth: Truth
    rank0: RankResult


def hidden_run(result: CaseRun[Variant]) -> HiddenRun:
    return HiddenRun(result.case, result.task, truth_of(result.task, result.case), result.values[0])


def report_of(t: CheckContext, case: HiddenRun) -> dict[str, Any]:
    """What diagnose() returned on rank 0; the check fails unless it is a dict."""
    report = case.rank0.report
    if not isinstance(report, dict):
        t.fail(f"{case.variant.label()}: diagnose() returned {type(report).__name__} on rank 0, not a dict")
    return report


def answer(t: CheckContext, case: HiddenRun, key: str) -> Any:
    report = report_of(t, case)
    if key not in report:
        t.fail(f"{case.variant.label()}: diagnose() returned no {key!r} "
               f"(its keys: {', '.join(map(str, report)) or 'none'})")
    return report[key]


def finite(value: Any) -> float | None:
    """value as a finite float, or None (NaN, infinite, too large, not a number)."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def shown(value: Any, limit: int = 120) -> str:
    """repr(value) cut to limit characters; never fails (an int of too many digits has no repr)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - the learner's value: its repr may refuse
        text = f"<a {type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def pings_of(report: dict[str, Any]) -> np.ndarray:
    """The report's ping matrix as floats; an empty array where it cannot be read as one."""
    try:
        return np.asarray(report.get("pings", ()), dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        return np.zeros(0)


def listed(t: CheckContext, case: HiddenRun, key: str, what: str, read: Callable[[Any], list[Any]]) -> list[Any]:
    """The answer under key through read (to a sorted list); the check fails where read cannot."""
    value = answer(t, case, key)
    try:
        return read(value)
    except (TypeError, ValueError, OverflowError):
        t.fail(f"{case.variant.label()}: {key!r} must be a list of {what}; saw {shown(value)}")


def spans_of(t: CheckContext, case: HiddenRun) -> np.ndarray:
    v = case.variant
    raw = answer(t, case, "spans")
    try:
        spans = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        t.fail(f"{v.label()}: 'spans' is not an array of numbers; saw {type(raw).__name__}")
    want = (v.p, v.steps, 4)
    if spans.shape != want:
        why = []
        if spans.ndim == 3 and spans.shape[1] == 0:
            why.append("the probes recorded no step")
        elif spans.ndim == 3 and spans.shape[1] != v.steps:
            why.append(f"{spans.shape[1]} steps recorded, the job ran {v.steps}")
        if spans.ndim == 3 and spans.shape[0] == 1 and v.p > 1:
            why.append("only rank 0's own spans reached rank 0: the aggregation is missing")
        t.fail(f"{v.label()}: expected rank 0 to hold spans of shape {want} (ranks, steps, "
               f"[compute start, compute end, sync start, sync end]); saw {spans.shape}"
               + "".join(f"; {w}" for w in why))
    if not np.isfinite(spans).all():
        rank, step, k = (int(x) for x in np.argwhere(~np.isfinite(spans))[0])
        t.fail(f"{v.label()}: 'spans' holds {spans[rank, step, k]} at rank {rank}, step {step}, column {k}: "
               "expected times on the virtual clock (comm.now())")
    return spans


def trace_tracks(events: list[Any]) -> dict[tuple[Any, Any], list[dict[str, Any]]]:
    """Complete events ("X") by (pid, tid): the tracks a viewer draws."""
    tracks: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for event in events:
        if isinstance(event, dict) and event.get("ph") == "X":
            tracks.setdefault((event.get("pid"), event.get("tid")), []).append(event)
    return tracks

