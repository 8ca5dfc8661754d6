"""Fault plans: a TOML file of ``[[fault]]`` entries, validated into data, decided by pure functions.

    format_version = 1
    seed = 7                                    # optional; else derived from the plan's text
    [[fault]]
    kind = "drop"                               # message-level: the comm proxy of the sender
    src = 0
    dst = [2, 3]
    probability = 0.3
    [[fault]]
    kind = "kill"                               # process-level: the supervisor
    rank = 3
    at_step = 30

Message faults (delay, spike, bandwidth, drop, partition, dead, hung) are decided by the rank that
sends, on its virtual clock and step counter; process faults (kill, stop, reclaim, join) by the
supervisor on the wall clock; slow by the virtual clock; restart is the supervisor's budget. Every random draw is a
hash of (seed, fault index, src, dst, k) or (seed, fault index, rank, step), never of timing.
docs/fault-plans.md is the reference; this module only parses. The types live in model.py,
the decisions in decide.py; import all of them from here.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .decide import MessageAction, MessageFaults, ProcessAction, ProcessFaults
from .model import (
    FORMAT_VERSION,
    KINDS,
    MAX_GBPS,
    MAX_JOINERS,
    MAX_RESTARTS,
    MAX_SECONDS,
    MAX_SEED,
    MAX_SLOWDOWN,
    MESSAGE_KINDS,
    PROCESS_KINDS,
    Fault,
    FaultPlan,
    FaultPlanError,
    Ranks,
    Window,
    draw,
)

__all__ = [
    "FORMAT_VERSION", "KINDS", "MESSAGE_KINDS", "PROCESS_KINDS", "Fault", "FaultPlan", "FaultPlanError",
    "MessageAction", "MessageFaults", "ProcessAction", "ProcessFaults", "Window", "draw", "derive_seed",
    "load_fault_plan", "parse_fault_plan",
]

_MSG_SELECT = frozenset({"src", "dst", "groups", "tags"})
_WINDOW = frozenset({"from_s", "until_s", "from_step", "until_step"})
_STEPS = frozenset({"from_step", "until_step"})
_AT = frozenset({"at_s", "at_step"})
_RANK = frozenset({"rank", "ranks"})
_KEYS: dict[str, frozenset[str]] = {
    "delay": _MSG_SELECT | _WINDOW | {"latency_s", "wall", "probability"},
    "spike": _MSG_SELECT | _WINDOW | {"latency_s", "wall", "probability"},
    "bandwidth": _MSG_SELECT | _WINDOW | {"factor", "gbps", "probability"},
    "drop": _MSG_SELECT | _WINDOW | {"probability"},
    "partition": _WINDOW | {"groups", "mode"},
    "dead": _RANK | _AT,
    "hung": _RANK | _AT,
    "kill": _RANK | _AT | _STEPS | {"probability", "at_mark"},
    "stop": _RANK | _AT | _STEPS | {"probability", "at_mark", "cont_after_s"},
    "reclaim": _RANK | _AT | _STEPS | {"probability", "at_mark", "grace_s"},
    "slow": _RANK | _STEPS | {"factor", "factor_range", "probability"},
    "restart": frozenset({"max_restarts", "restart"}),
    "join": _AT | {"count"},
}
_COMMON = frozenset({"kind", "note"})
_PLAN_KEYS = frozenset({"format_version", "seed", "note", "fault"})


class _Entry:
    """Typed reads of one ``[[fault]]`` table; every error names the file, the entry and the value."""

    def __init__(self, table: Mapping[str, Any], where: str, index: int, kind: str) -> None:
        self.t, self.where, self.i, self.kind = table, where, index, kind

    def fail(self, msg: str) -> FaultPlanError:
        return FaultPlanError(f"{self.where}: fault[{self.i}] (kind '{self.kind}') {msg}")

    def bad(self, key: str, must: str) -> FaultPlanError:
        return FaultPlanError(f"{self.where}: fault[{self.i}].{key} must be {must}; got {self.t[key]!r}")

    def has(self, *keys: str) -> bool:
        return any(k in self.t for k in keys)

    def need(self, key: str, why: str = "") -> None:
        if key not in self.t:
            raise self.fail(f"needs '{key}'{why}")

    def number(self, key: str, lo: float = 0.0, hi: float = MAX_SECONDS, lo_open: bool = False,
               must: str = "", unit: str = " s") -> float | None:
        """A finite number in [lo, hi] ((lo, hi] with ``lo_open``); by default seconds up to a day."""
        if key not in self.t:
            return None
        v = self.t[key]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v < lo or v > hi or (lo_open and v == lo):
            bound = f"a number > {lo:g}" if lo_open else f"a number >= {lo:g}"
            raise self.bad(key, must or f"{bound} and at most {hi:g}{unit}")
        return float(v)

    def integer(self, key: str, lo: int = 0, hi: int | None = None) -> int | None:
        if key not in self.t:
            return None
        v = self.t[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
            raise self.bad(key, f"an integer >= {lo}" + (f" and at most {hi}" if hi is not None else ""))
        return v

    def ranks(self, key: str, allow_all: bool = True, noun: str = "rank") -> Ranks:
        """An int, a non-empty list of distinct ints, or "all" (None)."""
        v = self.t[key]
        if allow_all and v == "all":
            return None
        items = [v] if isinstance(v, int) and not isinstance(v, bool) else v
        must = f'a {noun}, a list of {noun}s or "all"' if allow_all else f"a {noun} or a list of {noun}s"
        if not isinstance(items, list) or not items:
            raise self.bad(key, must)
        if any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in items):
            raise self.bad(key, must + f" ({noun}s are integers >= 0)")
        if len(set(items)) != len(items):
            raise self.bad(key, must + " without repeats")
        return frozenset(items)

    def groups(self) -> tuple[frozenset[int], ...]:
        v = self.t["groups"]
        must = "a list of at least two non-empty lists of ranks, like [[0, 1], [2, 3]]"
        if not isinstance(v, list) or len(v) < 2 or not all(isinstance(g, list) and g for g in v):
            raise self.bad("groups", must)
        if any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for g in v for r in g):
            raise self.bad("groups", must + " (ranks are integers >= 0)")
        seen: dict[int, int] = {}
        for n, g in enumerate(v):
            for r in g:
                if seen.setdefault(r, n) != n:
                    raise self.bad("groups", f"disjoint (rank {r} is in groups {seen[r]} and {n})")
        return tuple(frozenset(g) for g in v)

    def window(self) -> Window:
        w = Window(self.number("from_s"), self.number("until_s"),
                   self.integer("from_step"), self.integer("until_step"))
        for lo, hi, unit in (("from_s", "until_s", "s"), ("from_step", "until_step", "step")):
            a, b = getattr(w, lo), getattr(w, hi)
            if a is not None and b is not None and a >= b:
                raise FaultPlanError(
                    f"{self.where}: fault[{self.i}] (kind '{self.kind}') has an empty window: "
                    f"{lo} = {self.t[lo]!r} must be less than {hi} = {self.t[hi]!r}"
                )
        return w


def derive_seed(data: Mapping[str, Any]) -> int:
    """The seed of a plan that gives none: the first 4 bytes of SHA-256 over its canonical JSON
    (keys sorted, ``seed`` left out), so the same plan text always draws the same way."""
    text = json.dumps({k: v for k, v in data.items() if k != "seed"}, sort_keys=True, default=str)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def load_fault_plan(path: str | Path, seed: int | None = None) -> FaultPlan:
    """Reads and validates a plan file; ``seed`` (a replay or a hidden variant) overrides the file's."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise FaultPlanError(f"{path}: fault plan not found") from None
    except tomllib.TOMLDecodeError as exc:  # its message ends with "(at line L, column C)"
        raise FaultPlanError(f"{path}: not valid TOML: {exc}") from None
    return parse_fault_plan(data, str(path), seed)


def parse_fault_plan(data: Mapping[str, Any], where: str, seed: int | None = None) -> FaultPlan:
    """Validates a plan already read from TOML (or built by a check); ``where`` names it in errors."""
    extra = sorted(set(data) - _PLAN_KEYS)
    if extra:
        raise FaultPlanError(f"{where}: unknown key '{extra[0]}'{_did_you_mean(extra[0], _PLAN_KEYS)} "
                             f"(known: {', '.join(sorted(_PLAN_KEYS))})")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise FaultPlanError(f"{where}: 'format_version' must be {FORMAT_VERSION}; got {version!r}")
    entries = data.get("fault", [])
    if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
        raise FaultPlanError(f"{where}: 'fault' must be an array of tables, written [[fault]]")
    faults = tuple(_parse_fault(e, where, i) for i, e in enumerate(entries))
    restarts = [f.index for f in faults if f.kind == "restart"]
    if len(restarts) > 1:
        raise FaultPlanError(f"{where}: fault[{restarts[1]}] (kind 'restart') repeats fault[{restarts[0]}]; "
                             "a plan has at most one restart policy")
    plan_seed, origin = data.get("seed"), "file"
    if plan_seed is None:
        plan_seed, origin = derive_seed(data), "derived"
    elif isinstance(plan_seed, bool) or not isinstance(plan_seed, int) or not 0 <= plan_seed <= MAX_SEED:
        raise FaultPlanError(f"{where}: 'seed' must be an integer in 0..2**63-1; got {plan_seed!r}")
    plan = FaultPlan(faults=faults, seed=plan_seed, seed_origin=origin, where=where)
    return plan.with_seed(seed) if seed is not None else plan


def _did_you_mean(key: str, known: frozenset[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _parse_fault(table: Mapping[str, Any], where: str, i: int) -> Fault:
    kind = table.get("kind")
    if kind not in _KEYS:
        if kind is None:
            raise FaultPlanError(f"{where}: fault[{i}] needs 'kind' (one of: {', '.join(KINDS)})")
        raise FaultPlanError(f"{where}: fault[{i}]: unknown kind {kind!r} (known: {', '.join(KINDS)})")
    e = _Entry(table, where, i, kind)
    allowed = _KEYS[kind] | _COMMON
    for key in sorted(set(table) - allowed):
        hint = _did_you_mean(key, allowed)
        if key in _AT and kind in ("delay", "spike", "bandwidth", "drop", "partition", "slow"):
            hint = " (it lasts a window: use from_s/until_s or from_step/until_step)"
        elif key in _WINDOW and kind in ("dead", "hung"):
            hint = " (it is for good once triggered: use at_s or at_step)"
        raise e.fail(f"has unknown key '{key}'{hint} (keys for {kind}: {', '.join(sorted(allowed))})")
    if "note" in table and not isinstance(table["note"], str):
        raise e.bad("note", "a string")
    fields: dict[str, Any] = {"index": i, "kind": kind, "note": table.get("note", "")}
    if kind == "restart":
        e.need("max_restarts")
        what = table.get("restart", "job")
        if what not in ("job", "rank"):
            raise e.bad("restart", '"job" (start the whole job again) or "rank" (the dead rank '
                        'alone, which joins the survivors)')
        return Fault(**fields, max_restarts=e.integer("max_restarts", hi=MAX_RESTARTS) or 0,
                     restart=what)
    if kind == "join":
        if e.has("at_s") == e.has("at_step"):
            raise e.fail("needs one trigger, 'at_step' (when a rank starts that step) or 'at_s' "
                         "(wall clock)")
        count = e.integer("count", lo=1, hi=MAX_JOINERS)
        return Fault(**fields, at_s=e.number("at_s"), at_step=e.integer("at_step"),
                     count=1 if count is None else count)

    # Selection.
    if e.has("groups") and e.has("src", "dst"):
        raise e.fail("takes either 'groups' or 'src'/'dst', not both")
    for key in ("src", "dst"):
        if key in table:
            fields[key] = e.ranks(key)
    if "groups" in table:
        fields["groups"] = e.groups()
    if "tags" in table:
        fields["tags"] = e.ranks("tags", allow_all=False, noun="tag")
    if kind in ("dead", "hung", "kill", "stop", "reclaim", "slow"):
        if e.has("rank") and e.has("ranks"):
            raise e.fail("takes 'rank' or 'ranks', not both")
        if "rank" in table:
            if isinstance(table["rank"], bool) or not isinstance(table["rank"], int) or table["rank"] < 0:
                raise e.bad("rank", "a rank (an integer >= 0)")
            fields["ranks"] = frozenset({table["rank"]})
        elif "ranks" in table:
            fields["ranks"] = e.ranks("ranks", allow_all=kind not in ("dead", "hung"))
        elif kind not in ("kill", "stop", "reclaim"):
            raise e.fail("needs 'rank' or 'ranks'")

    # Triggers.
    if e.has(*_WINDOW):
        fields["window"] = e.window()
    if "probability" in table:
        fields["probability"] = e.number("probability", 0.0, 1.0, must="between 0 and 1")
    if e.has("at_s") and e.has("at_step"):
        raise e.fail("takes one trigger, 'at_s' or 'at_step', not both")
    fields["at_s"], fields["at_step"] = e.number("at_s"), e.integer("at_step")

    # Parameters, and the rules that tie keys together per kind.
    if kind in ("delay", "spike"):
        e.need("latency_s", " (the extra latency in seconds, e.g. 0.05)")
        fields["latency_s"] = e.number("latency_s", lo_open=True)
        if "wall" in table and not isinstance(table["wall"], bool):
            raise e.bad("wall", "true or false")
        fields["wall"] = table.get("wall", False)
        if kind == "spike" and not e.has("probability", *_WINDOW):
            raise e.fail("needs 'probability' or a window (from_s/until_s, from_step/until_step); "
                         "a spike on every message all the time is a 'delay'")
    elif kind == "bandwidth":
        if e.has("factor") == e.has("gbps"):
            raise e.fail("needs exactly one of 'factor' (fraction of the link's bandwidth) or 'gbps' (a cap)")
        must = "in (0, 1], the fraction of the link's bandwidth left"
        fields["factor"] = e.number("factor", 0.0, 1.0, lo_open=True, must=must)
        fields["gbps"] = e.number("gbps", lo_open=True, hi=MAX_GBPS, unit=" Gb/s")
    elif kind == "partition":
        e.need("groups", " (the sides, like groups = [[0, 1], [2, 3]])")
        mode = table.get("mode", "drop")
        if mode not in ("drop", "hold"):
            raise e.bad("mode", '"drop" or "hold"')
        if mode == "hold" and ("until_s" not in table or e.has("from_step", "until_step")):
            raise e.fail("with mode = \"hold\" needs 'until_s' (the heal time on the virtual clock) and "
                         "no step window; a partition that never heals cannot hold messages: "
                         "use mode = \"drop\"")
        fields["mode"] = mode
    elif kind in ("kill", "stop", "reclaim"):
        _check_signal(e, fields)
        fields["at_mark"] = _mark_name(e)
        fields["cont_after_s"] = e.number("cont_after_s", lo_open=True)
        if "grace_s" in table:
            fields["grace_s"] = e.number("grace_s", lo_open=True)
    elif kind == "slow":
        if e.has("factor") == e.has("factor_range"):
            raise e.fail("needs exactly one of 'factor' (e.g. 3.0) or 'factor_range' (e.g. [2.0, 5.0])")
        fields["factor"] = e.number("factor", 1.0, hi=MAX_SLOWDOWN, unit="",
                                    must=f"a number >= 1 and at most {MAX_SLOWDOWN:g} (how many times slower)")
        if "factor_range" in table:
            fr = table["factor_range"]
            if (not isinstance(fr, list) or len(fr) != 2
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in fr)
                    or not 1.0 <= fr[0] <= fr[1] <= MAX_SLOWDOWN):
                raise e.bad("factor_range", f"[low, high] with 1 <= low <= high <= {MAX_SLOWDOWN:g}")
            fields["factor_range"] = (float(fr[0]), float(fr[1]))
    return Fault(**fields)


def _check_signal(e: _Entry, fields: dict[str, Any]) -> None:
    """kill/stop: either a fixed trigger on one rank, or a random (rank, step) among candidates."""
    if "probability" in e.t:
        if e.has(*_AT, "at_mark"):
            raise e.fail("takes either 'probability' (a random step) or 'at_s'/'at_step'/'at_mark', "
                         "not both")
        e.need("until_step", " with 'probability' (the end of the steps a random hit may fall in)")
        return
    if not e.has(*_AT, "at_mark"):
        raise e.fail("needs a trigger: 'at_step', 'at_s' or 'at_mark' (or 'probability' with "
                     "'until_step')")
    if e.has("at_mark") and e.has(*_AT):
        raise e.fail("takes one trigger, 'at_mark' or 'at_s'/'at_step', not both")
    if e.has(*_STEPS):
        raise e.fail("takes 'from_step'/'until_step' only with 'probability'")
    if "rank" not in e.t:
        raise e.fail("acts on one rank: give 'rank' (write one entry per rank to signal several)")


MAX_MARK = 64  # the longest mark name a trigger takes


def _mark_name(e: _Entry) -> str | None:
    """kill/stop's ``at_mark``: the name of a ``comm.mark`` the rank calls (its first call)."""
    name = e.t.get("at_mark")
    if name is None:
        return None
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_MARK or "\0" in name:
        raise e.bad("at_mark", f"the name of a comm.mark(...) call (a string of 1 to {MAX_MARK} "
                    "characters)")
    if name == "step":
        raise e.fail("has at_mark = \"step\": steps are numbered; use at_step = N for the Nth")
    return name
