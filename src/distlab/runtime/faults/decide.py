"""Pure decisions over a fault plan: what happens to this message, which signal is due now.

Like torch.distributed's rendezvous handlers, these functions only *decide*: they take the counters
the caller owns (step, virtual or wall time, message index, what already fired) and return an
action; the comm proxy and the supervisor carry it out. Randomness comes from ``draw`` keyed by the
message or (rank, step), so a replay with the same seed decides the same way in every process.

Call order. Comm proxy of rank r, holding ``MessageFaults(plan, r)``:
  1. at the top of every communication call: ``on_call(step, vtime)``; True means block forever;
  2. per outgoing message (k counts messages r -> dst, from 0): ``decide(dst, nbytes, tag, k, ...)``;
  3. per message about to be handed to the learner: ``incoming(src, step, vtime)``; False means
     discard it and keep waiting.
Supervisor, holding ``ProcessFaults(plan)``: each time it observes rank r (a step marker or a poll),
``due(r, step, elapsed, fired, stopped_at_s)``; it sends the signals, adds each kill/stop's
``fault_index`` to ``fired`` (kept across restarts) and records/clears ``stopped_at_s``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .model import Fault, FaultPlan, FaultPlanError, draw, fmt_s

_MESSAGE_WINDOWED = ("delay", "spike", "bandwidth", "drop", "partition")


@dataclass(frozen=True)
class MessageAction:
    """What the proxy does with one outgoing message. The default value is "deliver as usual".

    ``drop``: the message is not sent; the sender's call returns as if it had been (eagerly).
    ``extra_latency_s``: added to the message's arrival time on the virtual clock.
    ``wall_sleep_s``: the sender sleeps this long for real before sending (``wall = true``).
    ``bandwidth_factor`` / ``bandwidth_cap_gbps``: see ``effective_beta``.
    ``hold_until_s``: the message leaves at max(send time, this) on the virtual clock.
    ``hang``: the sending call never returns and nothing is sent (the other fields stay default).
    A lost message keeps the other fields at their defaults too: it has no arrival to shape.
    """

    drop: bool = False
    extra_latency_s: float = 0.0
    wall_sleep_s: float = 0.0
    bandwidth_factor: float = 1.0  # 1.0: no cap
    hold_until_s: float | None = None
    hang: bool = False
    bandwidth_cap_gbps: float | None = None
    src: int = -1
    dst: int = -1
    k: int = -1
    causes: tuple[str, ...] = ()  # "fault[2] drop" for each fault that acted

    @property
    def untouched(self) -> bool:
        return not self.causes

    def effective_beta(self, beta_s_per_byte: float) -> float:
        """Seconds per byte on the wire under this action's caps (the link's own beta otherwise)."""
        beta = beta_s_per_byte / self.bandwidth_factor
        if self.bandwidth_cap_gbps is not None:
            beta = max(beta, 8.0 / (self.bandwidth_cap_gbps * 1e9))
        return beta

    def describe(self) -> str:
        head = f"message {self.k} from rank {self.src} to rank {self.dst}"
        if self.untouched:
            return head + " went through untouched"
        if self.hang:
            return f"rank {self.src} hung sending {head} ({'; '.join(self.causes)})"
        parts: list[str] = []
        if self.drop:
            parts.append("was lost")
        else:
            if self.hold_until_s is not None:
                parts.append(f"was held until {fmt_s(self.hold_until_s)} (virtual clock)")
            if self.extra_latency_s:
                parts.append(f"took {fmt_s(self.extra_latency_s)} longer")
            if self.bandwidth_factor != 1.0:
                parts.append(f"got {self.bandwidth_factor:g} of the link's bandwidth")
            if self.bandwidth_cap_gbps is not None:
                parts.append(f"was capped at {self.bandwidth_cap_gbps:g} Gb/s")
            if self.wall_sleep_s:
                parts.append(f"made the sender sleep {fmt_s(self.wall_sleep_s)} (wall clock)")
        return f"{head} {', '.join(parts)} ({'; '.join(self.causes)})"


class MessageFaults:
    """The message-level faults as seen by one rank: its sends, its receives, its own calls."""

    def __init__(self, plan: FaultPlan, rank: int) -> None:
        if plan.world_size is not None and not 0 <= rank < plan.world_size:
            raise FaultPlanError(f"{plan.where}: rank {rank} is outside the world of {plan.world_size}")
        self.plan = plan
        self.rank = rank
        # Only the faults that can touch this rank's sends, so `decide` stays cheap per message.
        self._sending = tuple(
            f for f in plan.of_kind(*_MESSAGE_WINDOWED)
            if (any(rank in g for g in f.groups) if f.groups else f.src is None or rank in f.src)
        )
        self._dead = plan.of_kind("dead")
        self._hung = tuple(f for f in plan.of_kind("hung") if f.has_rank(rank))

    def decide(self, dst: int, nbytes: int, tag: int, k: int, step: int, vtime_s: float) -> MessageAction:
        """The fate of message number ``k`` from this rank to ``dst``, sent at (step, vtime_s).

        ``nbytes`` only appears in traces for now; no kind depends on the size (bandwidth faults
        return a factor, so the size enters through ``effective_beta``).
        """
        src = self.rank
        hung = self.hung_by(step, vtime_s)
        if hung is not None:  # the call blocks before anything leaves: no other fault matters
            return MessageAction(hang=True, src=src, dst=dst, k=k, causes=(f"fault[{hung.index}] hung",))
        if src == dst:  # a message to oneself never crosses a network
            return MessageAction(src=src, dst=dst, k=k)
        causes: list[str] = []
        lost_by: list[str] = []  # for a lost message, only the causes of the loss are worth naming
        drop = False
        latency = wall = 0.0
        factor = 1.0
        cap: float | None = None
        hold: float | None = None
        for f in self._dead:
            if (src in (f.ranks or ()) or dst in (f.ranks or ())) and f.triggered(step, vtime_s):
                drop = True
                lost_by.append(f"fault[{f.index}] dead")
        for f in self._sending:
            if not (f.selects(src, dst, tag) and f.window.contains(step, vtime_s)):
                continue
            if f.is_random and draw(self.plan.seed, f.index, src, dst, k) >= (f.probability or 0.0):
                continue
            cause = f"fault[{f.index}] {f.kind}"
            causes.append(cause)
            if f.kind in ("delay", "spike"):
                latency += f.latency_s
                wall += f.latency_s if f.wall else 0.0
            elif f.kind == "bandwidth":
                # Two caps on one message: the tighter one wins (they do not compound).
                if f.factor is not None:
                    factor = min(factor, f.factor)
                if f.gbps is not None:
                    cap = f.gbps if cap is None else min(cap, f.gbps)
            elif f.kind == "drop" or (f.kind == "partition" and f.mode == "drop"):
                drop = True
                lost_by.append(cause)
            else:  # partition in hold mode; validation guarantees until_s
                heal = f.window.until_s
                assert heal is not None
                hold = heal if hold is None else max(hold, heal)
        if drop:  # a lost message has no arrival time to delay
            return MessageAction(drop=True, src=src, dst=dst, k=k, causes=tuple(lost_by))
        return MessageAction(
            extra_latency_s=latency, wall_sleep_s=wall, bandwidth_factor=factor, hold_until_s=hold,
            bandwidth_cap_gbps=cap, src=src, dst=dst, k=k, causes=tuple(causes),
        )

    def hung_by(self, step: int, vtime_s: float) -> Fault | None:
        """The `hung` fault that freezes this rank now, if any."""
        return next((f for f in self._hung if f.triggered(step, vtime_s)), None)

    def on_call(self, step: int, vtime_s: float) -> bool:
        """True: this rank is hung; the communication call it is entering must never return."""
        return self.hung_by(step, vtime_s) is not None

    def store_cut(self, step: int, vtime_s: float) -> str | None:
        """Why this rank cannot reach the task's store now, or None. The store lives beside rank
        0 (where a job's coordinator runs): a partition that puts this rank on another side, or
        a dead fault on this rank, cuts it off."""
        for f in self._dead:
            if self.rank in (f.ranks or ()) and f.triggered(step, vtime_s):
                return f"fault[{f.index}] dead"
        for f in self.plan.of_kind("partition"):
            if f.window.contains(step, vtime_s) and f.groups and not any(
                    self.rank in g and 0 in g for g in f.groups):
                return f"fault[{f.index}] partition: rank 0's side holds the store"
        return None

    def dead_peers(self, step: int, vtime_s: float) -> frozenset[int]:
        """Ranks that are dead to the network by this rank's counters (for wait-for reports)."""
        return frozenset(r for f in self._dead if f.triggered(step, vtime_s) for r in f.ranks or ())

    def incoming(self, src: int, step: int, vtime_s: float) -> bool:
        """False: a message from ``src`` must not be handed to this rank (either side is dead).

        Checked by the receiver at delivery, so a message that was in flight when its sender died
        is not delivered either: nothing arrives from a dead peer after the trigger.
        """
        if src == self.rank:  # never crossed a network
            return True
        return not ({src, self.rank} & self.dead_peers(step, vtime_s))


Kind = Literal["kill", "stop", "cont", "term"]
_VERB = {"kill": "killed (SIGKILL)", "stop": "stopped (SIGSTOP)", "cont": "continued (SIGCONT)",
         "term": "told to leave (SIGTERM: its instance is reclaimed)"}


@dataclass(frozen=True)
class ProcessAction:
    """A signal the supervisor must send now. ``reason`` completes "rank r was killed ...": when."""

    kind: Kind
    rank: int
    fault_index: int
    reason: str

    def describe(self) -> str:
        return f"rank {self.rank} was {_VERB[self.kind]} {self.reason} by fault[{self.fault_index}]"


class ProcessFaults:
    """The process-level faults: signals due per rank, compute multipliers, the restart budget.

    ``at_s`` triggers read the supervisor's wall clock (seconds since the first launch of the job):
    signals act on real processes, which have no virtual clock the supervisor could read.
    """

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan
        self._signals = plan.of_kind("kill", "stop", "reclaim")
        self._slow = plan.of_kind("slow")
        self._joins = plan.of_kind("join")
        # (rank, step) each step-triggered kill/stop acts at; None for time triggers or a random
        # fault whose draws never hit. Computed once: a pure function of the plan and its seed.
        self._targets = {f.index: self._target(f) for f in self._signals}

    def _target(self, f: Fault) -> tuple[int, int] | None:
        if f.probability is None:
            rank = min(f.ranks or ())  # validation: exactly one rank
            return (rank, f.at_step) if f.at_step is not None else None
        candidates = f.ranks
        if candidates is None:
            if self.plan.world_size is None:
                raise FaultPlanError(
                    f"{self.plan.where}: fault[{f.index}] (kind '{f.kind}') draws among all ranks; "
                    "call plan.validate_for(world_size) first"
                )
            candidates = frozenset(range(self.plan.world_size))
        lo, hi = f.window.from_step or 0, f.window.until_step
        assert hi is not None  # validation: a random kill/stop needs until_step
        for step in range(lo, hi):  # the first hit in (step, rank) order
            for rank in sorted(candidates):
                if draw(self.plan.seed, f.index, rank, step) < f.probability:
                    return (rank, step)
        return None

    def target(self, fault_index: int) -> tuple[int, int] | None:
        """(rank, step) a step-triggered or random kill/stop acts at; None if time-triggered or never."""
        return self._targets.get(fault_index)

    def trigger_steps(self, rank: int) -> frozenset[int]:
        """Steps at which a kill/stop targets ``rank``, or a join adds ranks: a worker may pause at
        those step markers until the supervisor has acted, so that "killed at step 30" is exact
        rather than polled, and the ranks of a join wait to be admitted from that step on."""
        signals = {t[1] for t in self._targets.values() if t is not None and t[0] == rank}
        return frozenset(signals | {f.at_step for f in self._joins if f.at_step is not None})

    def trigger_marks(self, rank: int) -> tuple[str, ...]:
        """The mark names a kill/stop of ``rank`` triggers on (``at_mark``), in a fixed order: the
        rank shows each one it reaches as a bit of its slot, in that order (rankstate.py)."""
        return tuple(sorted({f.at_mark for f in self._signals
                             if f.at_mark is not None and f.has_rank(rank)}))

    def marks_reached(self, rank: int, bits: int) -> frozenset[str]:
        """The trigger marks of ``rank`` that a slot's bits say it has reached."""
        return frozenset(name for i, name in enumerate(self.trigger_marks(rank)) if bits >> i & 1)

    def due(
        self,
        rank: int,
        step: int,
        elapsed_s: float,
        already_fired: frozenset[int],
        stopped_at_s: Mapping[int, float] | None = None,
        marks: frozenset[str] = frozenset(),
    ) -> list[ProcessAction]:
        """Signals due for ``rank`` at its ``step`` and the job's wall ``elapsed_s``, in plan order;
        ``marks``: the trigger marks it has reached (``marks_reached``).

        ``already_fired``: indices of kill/stop faults already carried out (each fires once per
        check run, restarts included). ``stopped_at_s``: for stop faults whose SIGSTOP is in force,
        the elapsed time it was sent; the supervisor drops the entry once it sends the SIGCONT.
        """
        actions: list[ProcessAction] = []
        for f in self._signals:
            target = self._targets[f.index]
            if target is not None:
                target_rank = target[0]
            elif f.probability is None:  # time-triggered: validation gave it exactly one rank
                target_rank = min(f.ranks or ())
            else:  # a random fault whose draws never hit: it never fires
                continue
            if target_rank != rank:
                continue
            if f.index in already_fired:
                since = (stopped_at_s or {}).get(f.index)
                if f.kind == "stop" and f.cont_after_s is not None and since is not None:
                    if elapsed_s >= since + f.cont_after_s:
                        reason = f"at {elapsed_s:.1f} s (wall clock), {fmt_s(f.cont_after_s)} after its stop,"
                        actions.append(ProcessAction("cont", rank, f.index, reason))
                elif f.kind == "reclaim" and since is not None and elapsed_s >= since + f.grace_s:
                    reason = (f"at {elapsed_s:.1f} s (wall clock), {fmt_s(f.grace_s)} after its "
                              "reclaim notice,")
                    actions.append(ProcessAction("kill", rank, f.index, reason))
                continue
            first: Kind = {"kill": "kill", "stop": "stop", "reclaim": "term"}[f.kind]  # type: ignore[assignment]
            if target is not None and step >= target[1]:
                reason = f"at step {step}"
                if f.probability is not None:
                    reason += (f" (a draw with probability {f.probability:g} per rank and step, "
                               f"seed {self.plan.seed})")
                actions.append(ProcessAction(first, rank, f.index, reason))
            elif f.at_s is not None and elapsed_s >= f.at_s:
                reason = f"at {elapsed_s:.1f} s (wall clock)"
                actions.append(ProcessAction(first, rank, f.index, reason))
            elif f.at_mark is not None and f.at_mark in marks:
                reason = f"at its comm.mark({f.at_mark!r})"
                actions.append(ProcessAction(first, rank, f.index, reason))
        return actions

    def never_fired(self, fired: frozenset[int]) -> list[str]:
        """Why each kill/stop/reclaim at a mark or at a step that did not fire in a run that ended
        well did not: a mark the rank never called, or a step it never reached, is a plan that
        tested nothing. (A random fault may miss by design, and a run may end before an
        ``at_s``: neither is named.)"""
        why = []
        for f in self._signals:
            if f.index in fired:
                continue
            if f.at_mark is not None:
                why.append(f"fault[{f.index}] ({f.kind} at_mark = {f.at_mark!r}) never fired: rank "
                           f"{min(f.ranks or ())} never called comm.mark({f.at_mark!r})")
            elif f.at_step is not None and f.probability is None:
                why.append(f"fault[{f.index}] ({f.kind} at_step = {f.at_step}) never fired: rank "
                           f"{min(f.ranks or ())} never started step {f.at_step} (steps are "
                           "numbered by its comm.mark('step') calls)")
        for f in self._joins:
            if f.index not in fired and f.at_step is not None:
                why.append(f"fault[{f.index}] (join at_step = {f.at_step}) never fired: no rank "
                           f"started step {f.at_step} (steps are numbered by comm.mark('step'))")
        return why

    def compute_multiplier(self, rank: int, step: int | None = None) -> float:
        """How many times longer this rank's declared compute takes (1.0: not slowed).

        Several slow faults on one rank multiply. With ``step=None`` only the steady part counts
        (faults without a step window, probability or factor range); the virtual clock should
        pass the step so that per-step stragglers apply.
        """
        multiplier = 1.0
        for f in self._slow:
            if not f.has_rank(rank):
                continue
            per_step = f.window.is_set or f.is_random or f.factor_range is not None
            if step is None:
                if not per_step:
                    multiplier *= f.factor or 1.0
                continue
            if not f.window.contains(step, 0.0):
                continue
            if f.is_random and draw(self.plan.seed, f.index, rank, step) >= (f.probability or 0.0):
                continue
            if f.factor_range is not None:
                lo, hi = f.factor_range
                # A second draw (key ends in 1) so the factor does not correlate with being picked.
                multiplier *= lo + (hi - lo) * draw(self.plan.seed, f.index, rank, step, 1)
            else:
                multiplier *= f.factor or 1.0
        return multiplier

    def restarts_allowed(self) -> int:
        """How many times the whole job may start again after a crash."""
        restart = self.plan.of_kind("restart")
        return restart[0].max_restarts if restart and restart[0].restart == "job" else 0

    def rank_restarts_allowed(self) -> int:
        """How many dead ranks may start again alone (``restart = "rank"``), in all."""
        restart = self.plan.of_kind("restart")
        return restart[0].max_restarts if restart and restart[0].restart == "rank" else 0

    def joins_due(self, top_step: int, elapsed_s: float, fired: frozenset[int]) -> list[Fault]:
        """The joins whose trigger has passed and that have not fired: ``top_step``, the highest
        step a running rank has started; ``elapsed_s``, the supervisor's wall clock."""
        return [f for f in self._joins if f.index not in fired
                and (f.at_step is not None and top_step >= f.at_step
                     or f.at_s is not None and elapsed_s >= f.at_s)]
