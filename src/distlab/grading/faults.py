"""Fault plans written in code: one builder per kind, checked by the same parser as a plan file.

    plan = faults.plan(faults.delay(src=slow, latency_s=0.02, wall=True), seed=t.seed,
                       where="03 slow-rank check")

Each builder takes the keys of its kind in docs/fault-plans.md as keyword arguments (ranks, the
window ``from_s``/``until_s``/``from_step``/``until_step``, a ``note``); ``plan`` validates the
whole plan, so a mistyped value fails with the entry named, as a plan file would.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..runtime.faults.plans import FORMAT_VERSION, FaultPlan, parse_fault_plan

__all__ = [
    "FaultPlan", "bandwidth", "delay", "drop", "join", "kill", "partition", "plan", "reclaim",
    "restart", "slow", "spike", "stop",
]

Ranks = int | Sequence[int]
Groups = Sequence[Sequence[int]]
Entry = dict[str, Any]


def plan(*entries: Entry, seed: int, where: str = "a check's fault plan", note: str = "") -> FaultPlan:
    """The validated plan of ``entries`` (each from a builder below); ``where`` names it in errors."""
    table: dict[str, Any] = {"format_version": FORMAT_VERSION, "seed": seed, "fault": list(entries)}
    if note:
        table["note"] = note
    return parse_fault_plan(table, where=where)


def _entry(kind: str, keys: dict[str, Any]) -> Entry:
    entry: Entry = {"kind": kind}
    for key, value in keys.items():
        if value is None or (key == "note" and not value):
            continue
        if key == "groups":
            value = [list(group) for group in value]
        entry[key] = list(value) if isinstance(value, (tuple, list)) else value
    return entry


def delay(*, latency_s: float, src: Ranks | None = None, dst: Ranks | None = None,
          groups: Groups | None = None, wall: bool | None = None, probability: float | None = None,
          note: str = "", **window: float) -> Entry:
    """Every selected message waits ``latency_s`` more (``wall``: in real time too)."""
    return _entry("delay", dict(latency_s=latency_s, src=src, dst=dst, groups=groups, wall=wall,
                                probability=probability, note=note, **window))


def spike(*, latency_s: float, probability: float, src: Ranks | None = None,
          dst: Ranks | None = None, wall: bool | None = None, note: str = "",
          **window: float) -> Entry:
    """A random fraction of the selected messages waits ``latency_s`` more."""
    return _entry("spike", dict(latency_s=latency_s, probability=probability, src=src, dst=dst,
                                wall=wall, note=note, **window))


def bandwidth(*, factor: float | None = None, gbps: float | None = None, src: Ranks | None = None,
              dst: Ranks | None = None, groups: Groups | None = None, note: str = "",
              **window: float) -> Entry:
    """The selected links run at ``factor`` of their bandwidth, or at ``gbps``; ``groups``
    selects the messages between two groups of ranks (a slow link between two ranks)."""
    return _entry("bandwidth", dict(factor=factor, gbps=gbps, src=src, dst=dst, groups=groups,
                                    note=note, **window))


def drop(*, probability: float, src: Ranks | None = None, dst: Ranks | None = None,
         note: str = "", **window: float) -> Entry:
    return _entry("drop", dict(probability=probability, src=src, dst=dst, note=note, **window))


def partition(*, groups: Sequence[Sequence[int]], mode: str | None = None, note: str = "",
              **window: float) -> Entry:
    return _entry("partition", dict(groups=[list(g) for g in groups], mode=mode, note=note, **window))


def slow(*, rank: int | None = None, ranks: Sequence[int] | None = None,
         factor: float | None = None, factor_range: Sequence[float] | None = None,
         probability: float | None = None, note: str = "", **steps: int) -> Entry:
    """The ranks' compute takes ``factor`` times as long (or a factor drawn from the range)."""
    return _entry("slow", dict(rank=rank, ranks=ranks, factor=factor, factor_range=factor_range,
                               probability=probability, note=note, **steps))


def kill(*, rank: int | None = None, ranks: Sequence[int] | None = None, note: str = "",
         at_mark: str | None = None, **at: float) -> Entry:
    """SIGKILL, at ``at_s`` (wall seconds), ``at_step``, or ``at_mark`` (when the rank first calls
    ``comm.mark(at_mark)``)."""
    return _entry("kill", dict(rank=rank, ranks=ranks, note=note, at_mark=at_mark, **at))


def reclaim(*, rank: int | None = None, ranks: Sequence[int] | None = None,
            grace_s: float | None = None, note: str = "", at_mark: str | None = None,
            **at: float) -> Entry:
    """A spot instance taken away: SIGTERM at ``at_s``, ``at_step`` or ``at_mark``, then SIGKILL
    ``grace_s`` later (default 2 s)."""
    return _entry("reclaim", dict(rank=rank, ranks=ranks, grace_s=grace_s, note=note,
                                  at_mark=at_mark, **at))


def stop(*, rank: int | None = None, ranks: Sequence[int] | None = None,
         cont_after_s: float | None = None, note: str = "", at_mark: str | None = None,
         **at: float) -> Entry:
    """SIGSTOP, at ``at_s``, ``at_step`` or ``at_mark``; SIGCONT after ``cont_after_s`` if given."""
    return _entry("stop", dict(rank=rank, ranks=ranks, cont_after_s=cont_after_s, note=note,
                               at_mark=at_mark, **at))


def join(*, count: int | None = None, note: str = "", **at: float) -> Entry:
    """``count`` new ranks (default 1) join the running job at ``at_step`` or ``at_s``; a task
    with survivors lets them in with ``comm.Admit()`` (gloo)."""
    return _entry("join", dict(count=count, note=note, **at))


def restart(*, max_restarts: int, rank_alone: bool = False, note: str = "") -> Entry:
    """After a failure the whole job starts again, at most ``max_restarts`` times; with
    ``rank_alone`` only the dead rank does (``restart = "rank"``), as a rank that joins."""
    return _entry("restart", dict(max_restarts=max_restarts,
                                  restart="rank" if rank_alone else None, note=note))
