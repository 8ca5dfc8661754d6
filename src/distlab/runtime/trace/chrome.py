"""Per-rank spans, and their export in the Chrome trace event format (chrome://tracing, Perfetto).

One process per rank ("rank 3"), with two threads: the virtual clock's timeline (what the graded
time is made of) and the wall clock's (what really happened on this machine). Spans are complete
events (``"ph": "X"``) with microsecond times, as the format wants.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .events import COLL, COMPUTE, MARK, RECV, SEND, STORE, TIMEOUT, WAIT, Event

VIRTUAL_TID, WALL_TID = 0, 1


@dataclass(frozen=True)
class Span:
    rank: int
    name: str  # "compute", "Sendrecv", "Allreduce", ...
    category: str  # "compute", "comm", "wait", "mark"
    start_s: float
    duration_s: float
    args: dict[str, Any] = field(default_factory=dict)


def describe_event(event: Event) -> tuple[str, str, dict[str, Any]]:
    """(name, category, args) of a trace event, for drawing."""
    kind = event[0]
    if kind == COMPUTE:
        return (event[2] or "compute"), "compute", {"seconds": event[1]}
    if kind == SEND:
        return "send", "comm", {"to": event[3], "tag": event[4], "bytes": event[6]}
    if kind == RECV:
        return "recv", "comm", {"from": event[3], "tag": event[4], "bytes": event[5]}
    if kind == WAIT:
        peers = sorted({m[1] for m in event[2].values()})
        return "wait", "wait", {"requests": len(event[1]), "from": peers}
    if kind == COLL:
        return event[1], "comm", {"group": list(event[2]), "bytes": event[4]}
    if kind == "icoll":  # a nonblocking collective posted; its wait is drawn as a "wait"
        return "I" + str(event[2]).lower(), "comm", {"group": list(event[3]), "bytes": event[5]}
    if kind == MARK:
        return event[1], "mark", {}
    if kind == STORE:
        return f"store.{event[1]}", "store", {"key": event[2], "bytes": event[3]}
    if kind == TIMEOUT:
        peer = list(event[2]) if isinstance(event[2], tuple) else event[2]
        return f"{event[1]} timed out", "wait", {"peer": peer, "seconds": event[3]}
    return str(kind), "other", {}


def wall_spans(traces: dict[int, list[Event]]) -> list[Span]:
    """Spans on the wall clock, measured from the earliest event of any rank."""
    starts = [events[0][-2] for events in traces.values() if events]
    origin = min(starts) if starts else 0.0
    spans = []
    for rank, events in sorted(traces.items()):
        for event in events:
            name, category, args = describe_event(event)
            wall0, wall1 = event[-2], event[-1]
            if category in ("compute",) and wall1 == wall0:
                continue  # declared work takes no wall time; it lives on the virtual track
            spans.append(Span(rank, name, category, wall0 - origin, max(wall1 - wall0, 0.0), args))
    return spans


def chrome_trace(virtual: list[Span], wall: list[Span], metadata: dict[str, Any]) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    ranks = sorted({s.rank for s in virtual} | {s.rank for s in wall})
    for rank in ranks:
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
        for tid, label in ((VIRTUAL_TID, "virtual clock"), (WALL_TID, "wall clock")):
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                           "args": {"name": label}})
    for tid, spans in ((VIRTUAL_TID, virtual), (WALL_TID, wall)):
        for span in spans:
            if span.category == "mark":
                events.append({"name": span.name, "cat": "mark", "ph": "i", "s": "t",
                               "ts": span.start_s * 1e6, "pid": span.rank, "tid": tid})
                continue
            events.append({
                "name": span.name, "cat": span.category, "ph": "X",
                "ts": round(span.start_s * 1e6, 3), "dur": round(span.duration_s * 1e6, 3),
                "pid": span.rank, "tid": tid, "args": span.args,
            })
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": metadata}


def write_chrome_trace(path: Path, trace: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(trace))
    tmp.replace(path)


PHASES = {"X", "i", "M", "B", "E"}


def validate_chrome_trace(trace: Any) -> list[str]:
    """Problems found against the trace event format (empty when the trace is well formed)."""
    problems: list[str] = []
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["the top level must be an object with a traceEvents list"]
    for i, event in enumerate(trace["traceEvents"]):
        where = f"traceEvents[{i}]"
        if not isinstance(event, dict):
            problems.append(f"{where} is not an object")
            continue
        ph = event.get("ph")
        if ph not in PHASES:
            problems.append(f"{where}.ph {ph!r} is not a known phase")
        if not isinstance(event.get("name"), str):
            problems.append(f"{where}.name must be a string")
        for key in ("pid", "tid"):
            if not isinstance(event.get(key), int):
                problems.append(f"{where}.{key} must be an integer")
        if ph in ("X", "i", "B", "E") and not isinstance(event.get("ts"), (int, float)):
            problems.append(f"{where}.ts must be a number of microseconds")
        if ph == "X":
            dur = event.get("dur")
            if not isinstance(dur, (int, float)) or dur < 0:
                problems.append(f"{where}.dur must be a non-negative number")
        if ph == "M" and not isinstance(event.get("args"), dict):
            problems.append(f"{where}: metadata events carry args")
    return problems


def virtual_spans(traces: dict[int, list[Event]], replay: Any) -> list[Span]:
    """Spans on the virtual clock, from a replay of the same traces (runtime/clock/replay.py)."""
    spans = []
    for rank, events in sorted(traces.items()):
        for event, (begin, end) in zip(events, replay.spans[rank]):
            name, category, args = describe_event(event)
            if category == "comm" and event[0] in (SEND, RECV) and end == begin:
                continue  # posting a nonblocking call takes no virtual time; its wait is drawn
            spans.append(Span(rank, name, category, begin, end - begin, args))
    return spans


def export(path: Path, traces: dict[int, list[Event]], replay: Any, metadata: dict[str, Any]) -> None:
    """Writes the Chrome trace of one run: a virtual and a wall track per rank."""
    virtual = virtual_spans(traces, replay) if replay is not None else []
    write_chrome_trace(path, chrome_trace(virtual, wall_spans(traces), metadata))
