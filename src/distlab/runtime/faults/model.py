"""Fault plans as data: the types, the seeded draw, and the sentences a learner reads.

A plan is a tuple of ``Fault`` records plus a seed. Nothing here has a side effect: parsing lives in
``plans.py``, the decisions in ``decide.py``, and the comm proxy and the supervisor apply
them. The format and the meaning of every kind are in docs/fault-plans.md.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ...errors import DistlabError

FORMAT_VERSION = 1

# Applied by the comm proxy of the sending (or receiving, for `dead`) rank, on its virtual clock.
MESSAGE_KINDS = ("delay", "spike", "bandwidth", "drop", "partition", "dead", "hung")
# Applied by the supervisor (kill, stop, reclaim, join) or the virtual clock (slow), or a policy
# (restart).
PROCESS_KINDS = ("kill", "stop", "reclaim", "slow", "restart", "join")
KINDS = MESSAGE_KINDS + PROCESS_KINDS

# Seeds fit in an unsigned 64-bit word of the draw's hash input; below 2**63 so that they also fit
# a signed int64 wherever a caller stores them (JSON readers, NumPy).
MAX_SEED = 2**63 - 1

# Bounds on a plan's values: far past any fault worth injecting, and small enough that the
# virtual clock's sums stay finite (a latency of 1e308 s made a run "virtual inf s, idle nan%").
MAX_SECONDS = 86_400.0  # latency_s, at_s, from_s, until_s, cont_after_s: a day
MAX_GBPS = 1e6  # bandwidth gbps: a petabit per second
MAX_SLOWDOWN = 1e4  # slow factor and factor_range: ten thousand times slower
MAX_RESTARTS = 100  # restart max_restarts
MAX_JOINERS = 64  # join count


class FaultPlanError(DistlabError):
    """A fault plan is malformed or does not fit the job; the message names the file and entry."""


def draw(seed: int, *key: int) -> float:
    """A uniform number in [0, 1) that depends only on ``seed`` and ``key``, never on timing.

    The integers (seed, *key) are packed as little-endian 64-bit words (two's complement, so a
    step of -1 before the first marker is fine) and hashed with BLAKE2b (8-byte digest,
    personalization b"distlab-faults"); the digest read as a little-endian integer, shifted right
    by 11 bits and divided by 2**53, gives the number. Message faults draw with
    key (fault index, src, dst, k), process faults with (fault index, rank, step), so every process
    computes the same draw for the same message without any shared state.
    """
    data = struct.pack(f"<{1 + len(key)}Q", *(x & 0xFFFF_FFFF_FFFF_FFFF for x in (seed, *key)))
    digest = hashlib.blake2b(data, digest_size=8, person=b"distlab-faults").digest()
    return (int.from_bytes(digest, "little") >> 11) * 2.0**-53


Ranks = frozenset[int] | None  # None means every rank ("all")


@dataclass(frozen=True)
class Window:
    """Half-open windows [from, until) on the deciding rank's clock and step counter; both must hold."""

    from_s: float | None = None
    until_s: float | None = None
    from_step: int | None = None
    until_step: int | None = None

    def contains(self, step: int, t_s: float) -> bool:
        if self.from_s is not None and t_s < self.from_s:
            return False
        if self.until_s is not None and t_s >= self.until_s:
            return False
        if self.from_step is not None and step < self.from_step:
            return False
        if self.until_step is not None and step >= self.until_step:
            return False
        return True

    @property
    def is_set(self) -> bool:
        return any(v is not None for v in (self.from_s, self.until_s, self.from_step, self.until_step))

    def describe(self, clock: str) -> str:
        parts: list[str] = []
        if self.from_s is not None or self.until_s is not None:
            parts.append(_span(self.from_s, self.until_s, fmt_s) + f" ({clock})")
        if self.from_step is not None or self.until_step is not None:
            parts.append(_span(self.from_step, self.until_step, lambda n: f"step {n}"))
        return " and ".join(parts) if parts else "for the whole run"


@dataclass(frozen=True)
class Fault:
    """One ``[[fault]]`` entry, validated. Unused fields keep their defaults for the kind."""

    index: int
    kind: str
    # Which messages: from `src` to `dst`, or crossing between `groups`; with a tag in `tags`.
    src: Ranks = None
    dst: Ranks = None
    groups: tuple[frozenset[int], ...] = ()
    tags: frozenset[int] | None = None
    # Which ranks, for dead, hung, kill, stop, slow (kill/stop with a fixed trigger: exactly one).
    ranks: Ranks = None
    # One-off triggers (dead, hung, kill, stop) and windows (the others).
    at_step: int | None = None
    at_s: float | None = None
    at_mark: str | None = None  # kill, stop: when the rank first calls comm.mark(at_mark)
    window: Window = Window()
    probability: float | None = None
    # Parameters of the kinds.
    latency_s: float = 0.0  # delay, spike
    wall: bool = False  # delay, spike: also sleep for real on the sender
    factor: float | None = None  # bandwidth: fraction of the link left; slow: compute multiplier
    factor_range: tuple[float, float] | None = None  # slow: multiplier drawn per step
    gbps: float | None = None  # bandwidth: absolute cap
    mode: str = "drop"  # partition: "drop" or "hold"
    cont_after_s: float | None = None  # stop
    grace_s: float = 2.0  # reclaim: from the SIGTERM to the SIGKILL
    max_restarts: int = 0  # restart
    restart: str = "job"  # restart: what starts again, the whole "job" or the dead "rank" alone
    count: int = 0  # join: how many new ranks
    note: str = ""

    @property
    def is_message(self) -> bool:
        return self.kind in MESSAGE_KINDS

    @property
    def is_random(self) -> bool:
        return self.probability is not None and self.probability < 1.0

    def has_rank(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def triggered(self, step: int, t_s: float) -> bool:
        """For one-off kinds: the trigger has passed (no trigger: from the start)."""
        if self.at_step is not None:
            return step >= self.at_step
        if self.at_s is not None:
            return t_s >= self.at_s
        return True

    def crosses(self, src: int, dst: int) -> bool:
        """The message goes from one of `groups` to another (ranks in no group are not affected)."""
        a = next((n for n, g in enumerate(self.groups) if src in g), None)
        b = next((n for n, g in enumerate(self.groups) if dst in g), None)
        return a is not None and b is not None and a != b

    def selects(self, src: int, dst: int, tag: int) -> bool:
        if self.tags is not None and tag not in self.tags:
            return False
        if self.groups:
            return self.crosses(src, dst)
        return (self.src is None or src in self.src) and (self.dst is None or dst in self.dst)

    def rank_refs(self) -> list[tuple[str, int]]:
        """(key, rank) for every rank the entry names, for the world-size check."""
        refs: list[tuple[str, int]] = []
        one = "rank" if self.ranks is not None and len(self.ranks) == 1 else "ranks"
        for key, ranks in (("src", self.src), ("dst", self.dst), (one, self.ranks)):
            refs += [(key, r) for r in sorted(ranks or ())]
        refs += [("groups", r) for g in self.groups for r in sorted(g)]
        return refs

    def describe(self) -> str:
        text = f"fault[{self.index}] {self.kind}: {_describe(self)}"
        return f"{text} ({self.note})" if self.note else text


@dataclass(frozen=True)
class FaultPlan:
    """A validated plan. ``seed`` drives every draw; the caller prints it when a check fails."""

    faults: tuple[Fault, ...] = ()
    seed: int = 0
    seed_origin: str = "derived"  # "file", "caller" or "derived" (a hash of the plan's text)
    where: str = "fault plan"  # the file (or a label) that error messages name
    world_size: int | None = None  # set by validate_for

    def of_kind(self, *kinds: str) -> tuple[Fault, ...]:
        return tuple(f for f in self.faults if f.kind in kinds)

    def with_seed(self, seed: int) -> FaultPlan:
        """The same plan with the caller's seed (a replay, or a hidden variant)."""
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise FaultPlanError(f"{self.where}: the seed must be an integer in 0..2**63-1; got {seed!r}")
        return replace(self, seed=seed, seed_origin="caller")

    def validate_for(self, world_size: int) -> FaultPlan:
        """Checks every rank the plan names against the world; returns the plan bound to it."""
        if world_size < 1:
            raise FaultPlanError(f"{self.where}: the world size must be at least 1; got {world_size}")
        for fault in self.faults:
            for key, rank in fault.rank_refs():
                if rank >= world_size:
                    raise FaultPlanError(
                        f"{self.where}: fault[{fault.index}].{key} names rank {rank}, outside the "
                        f"world of {world_size} ranks (0..{world_size - 1})"
                    )
        return replace(self, world_size=world_size)

    def spare(self, needed: frozenset[int], task: str) -> None:
        """Raises when a kill or reclaim may take away a rank of ``needed``: ranks a task with
        survivors cannot lose (a coordinator, the rank that holds the only copy of a state), so
        a plan that ends one tests nothing the task can pass."""
        for fault in self.of_kind("kill", "reclaim"):
            lost = sorted(needed if fault.ranks is None else needed & fault.ranks)
            if lost:
                among = "draws among all ranks, " if fault.ranks is None else ""
                raise FaultPlanError(
                    f"{self.where}: fault[{fault.index}] ({fault.kind}) {among}would take away "
                    f"rank {lost[0]}, which {task} cannot lose (its ranks survive the others' "
                    f"deaths, not rank {', '.join(map(str, sorted(needed)))}'s); give the fault "
                    "another rank")

    def newcomers(self) -> int:
        """The most ranks a run can gain: every join's, and every rank started again alone."""
        joins = sum(f.count for f in self.of_kind("join"))
        return joins + sum(f.max_restarts for f in self.of_kind("restart") if f.restart == "rank")

    def newcomers_for(self, survivors: bool, world: int, platform: Any) -> int:
        """``newcomers()``, once the job can take them: only a task whose ranks survive their
        peers lets new ranks in (comm.Admit()), and the platform must seat them (a newcomer is a
        new machine: ranks world, world + 1, ...). Raises before any start."""
        adding = [f for f in self.faults if f.kind == "join" or f.restart == "rank"]
        if not adding:
            return 0
        first = adding[0]
        name = f"{self.where}: fault[{first.index}] ({first.kind}" + (
            ' = "rank"' if first.kind == "restart" else "") + ")"
        if not survivors:
            raise FaultPlanError(f"{name} adds ranks to a running job, which only a task whose "
                                 "ranks survive their peers takes (Task(survivors=True): its ranks "
                                 "let the newcomers in with comm.Admit())")
        seats = world + self.newcomers()
        if platform is not None and seats > platform.max_ranks():
            raise FaultPlanError(f"{name} may bring the job to {seats} ranks, and platform "
                                 f"'{platform.name}' seats {platform.max_ranks()}: give it more "
                                 "devices")
        return self.newcomers()

    def describe(self) -> str:
        origin = {"file": "from the plan", "caller": "given by the caller"}.get(
            self.seed_origin, "derived from the plan")
        head = f"fault plan {self.where}: seed {self.seed} ({origin})"
        if not self.faults:
            return head + "; no faults"
        return "\n".join([head + ":"] + ["  " + f.describe() for f in self.faults])


# -- sentences ------------------------------------------------------------------------------------


def fmt_s(seconds: float) -> str:
    if seconds != 0 and abs(seconds) < 1e-3:
        return f"{seconds * 1e6:g} us"
    if seconds != 0 and abs(seconds) < 1:
        return f"{seconds * 1e3:g} ms"
    return f"{seconds:g} s"


def _span(lo: Any, hi: Any, fmt: Callable[[Any], str]) -> str:
    if lo is not None and hi is not None:
        return f"from {fmt(lo)} until {fmt(hi)}"
    return f"from {fmt(lo)} on" if lo is not None else f"until {fmt(hi)}"


def fmt_ranks(ranks: Ranks, none: str = "any rank") -> str:
    if ranks is None:
        return none
    items = sorted(ranks)
    return f"rank {items[0]}" if len(items) == 1 else "ranks " + ", ".join(map(str, items))


def _when(f: Fault, clock: str) -> str:
    if f.at_step is not None:
        return f"from step {f.at_step} on"
    if f.at_s is not None:
        return f"from {fmt_s(f.at_s)} ({clock}) on"
    return "from the start"


def _messages(f: Fault, fraction: bool = True) -> str:
    if f.groups:
        sel = "messages between " + " and ".join("{" + ", ".join(map(str, sorted(g))) + "}" for g in f.groups)
    else:
        sel = f"messages from {fmt_ranks(f.src)} to {fmt_ranks(f.dst)}"
    if f.tags is not None:
        sel += " with tag " + ", ".join(map(str, sorted(f.tags)))
    if fraction and f.is_random:
        sel = f"a fraction {f.probability:g} of " + sel
    return sel


def _describe(f: Fault) -> str:
    window = f.window.describe("virtual clock")
    wall = "; the sender also sleeps that long (wall clock)" if f.wall else ""
    if f.kind in ("delay", "spike"):
        return f"{_messages(f)} take {fmt_s(f.latency_s)} longer, {window}{wall}"
    if f.kind == "bandwidth":
        cap = f"at most {f.gbps:g} Gb/s" if f.gbps is not None else f"{f.factor:g} of their link's bandwidth"
        return f"{_messages(f)} get {cap}, {window}"
    if f.kind == "drop":
        p = 1.0 if f.probability is None else f.probability
        return f"{_messages(f, fraction=False)} are lost with probability {p:g}, {window}"
    if f.kind == "partition":
        fate = "held until it heals" if f.mode == "hold" else "lost"
        return f"{_messages(f)} cannot pass {window}; they are {fate}"
    if f.kind == "dead":
        one = f.ranks is not None and len(f.ranks) == 1
        return (f"{fmt_ranks(f.ranks)} {'is' if one else 'are'} dead to the network "
                f"{_when(f, 'virtual clock')}: nothing {'it sends' if one else 'they send'} arrives, "
                f"nothing sent to {'it' if one else 'them'} is delivered")
    if f.kind == "hung":
        one = f.ranks is not None and len(f.ranks) == 1
        return (f"{fmt_ranks(f.ranks)} {'hangs in its' if one else 'hang in their'} first communication "
                f"call {_when(f, 'virtual clock')}")
    if f.kind in ("kill", "stop", "reclaim"):
        what = {"kill": "killed (SIGKILL)", "stop": "stopped (SIGSTOP)",
                "reclaim": "reclaimed (SIGTERM, then SIGKILL)"}[f.kind]
        if f.probability is not None:
            lo = f.window.from_step or 0
            text = (f"one of {fmt_ranks(f.ranks, 'the ranks')} is {what} at the first step in "
                    f"{lo}..{(f.window.until_step or lo) - 1} where a draw with probability "
                    f"{f.probability:g} per rank and step hits")
        elif f.at_step is not None:
            text = f"{fmt_ranks(f.ranks)} is {what} at step {f.at_step}"
        elif f.at_mark is not None:
            text = f"{fmt_ranks(f.ranks)} is {what} when it first calls comm.mark({f.at_mark!r})"
        else:
            text = f"{fmt_ranks(f.ranks)} is {what} at {fmt_s(f.at_s or 0.0)} (wall clock)"
        if f.cont_after_s is not None:
            text += f", continued (SIGCONT) {fmt_s(f.cont_after_s)} later"
        if f.kind == "reclaim":
            text += f"; the SIGKILL comes {fmt_s(f.grace_s)} after the SIGTERM"
        return text
    if f.kind == "slow":
        how = (f"{f.factor:g}x" if f.factor is not None
               else "{:g}x to {:g}x (drawn per step)".format(*(f.factor_range or (1.0, 1.0))))
        chance = f" on a fraction {f.probability:g} of its steps" if f.is_random else ""
        verb = "computes" if f.ranks is not None and len(f.ranks) == 1 else "compute"
        return f"{fmt_ranks(f.ranks, 'all ranks')} {verb} {how} slower{chance}, {f.window.describe('')}"
    if f.kind == "restart":
        times = "time" if f.max_restarts == 1 else "times"
        if f.restart == "rank":
            return (f"a rank that dies starts again alone, as a new rank that joins the survivors "
                    f"(comm.Admit()), at most {f.max_restarts} {times}")
        return f"the job restarts after a failure, at most {f.max_restarts} {times}"
    if f.kind == "join":
        when = f"at step {f.at_step}" if f.at_step is not None else f"at {fmt_s(f.at_s or 0.0)} (wall clock)"
        ranks = "a new rank joins" if f.count == 1 else f"{f.count} new ranks join"
        return f"{ranks} the job {when}; they enter at the others' next comm.Admit()"
    return "?"

