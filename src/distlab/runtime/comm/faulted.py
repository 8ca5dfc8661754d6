"""The fault plan's message faults, applied by the learner's ``comm`` to each call
(runtime/faults/decide.py decides them): a message delayed, slowed, held, dropped or cut off
by a partition, a rank hung in a call; and how the replay must treat a faulted send. Mixed into
``Comm`` (proxy.py), whose constructor sets these attributes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..clock.online import Timekeeper
from .rankstate import NullSlot, RankSlot

if TYPE_CHECKING:  # a fault plan's modules load only in a rank that has one (rank/worker.py)
    from ..faults.decide import MessageAction, MessageFaults


class MessageFaultsApplied:
    _faults: MessageFaults | None
    _attempts: dict[int, int]  # sends per world destination, lost ones included
    _slot: RankSlot | NullSlot
    _clock: Timekeeper | None

    @property
    def step(self) -> int:
        raise NotImplementedError

    def now(self) -> float:
        raise NotImplementedError

    def _world(self, rank: int) -> int:
        raise NotImplementedError

    def _outgoing(self, dest: int, tag: int, nbytes: int) -> tuple[MessageAction | None, float]:
        """Applies the fault plan to one outgoing message; returns (action, virtual arrival)."""
        action = None
        if self._faults is not None:
            dst = self._world(dest)
            k = self._attempts.get(dst, 0)
            self._attempts[dst] = k + 1
            action = self._faults.decide(dst, nbytes, tag, k, self.step, self.now())
            if action.untouched:
                action = None
            elif action.hang:
                self._hang()
            elif action.wall_sleep_s > 0:
                self._slot.set(1, "delay")
                time.sleep(action.wall_sleep_s)
        arrival = self._clock.arrival(dest, nbytes, action) if self._clock is not None else 0.0
        return action, arrival

    def _hang(self) -> None:
        """A `hung` fault: this call never returns (the supervisor or a watchdog must act)."""
        self._slot.blocked("hung", ())
        while True:
            time.sleep(3600)

    def _check_hung(self) -> None:
        if self._faults is not None and self._faults.on_call(self.step, self.now()):
            self._hang()

    def _send_fault(self, dest: int, action: MessageAction | None) -> tuple[float, float, bool] | None:
        """How the replay must treat a faulted send: (extra latency, bandwidth factor, dropped)."""
        if action is None:
            return None
        if action.drop:
            return (0.0, 1.0, True)
        held = max((action.hold_until_s or 0.0) - self.now(), 0.0)
        return (action.extra_latency_s + held, self._clock_beta_factor(dest, action), False)

    def _clock_beta_factor(self, dest: int, action: MessageAction) -> float:
        """How much of the route's bandwidth a faulted message gets (1.0: all of it)."""
        if action.bandwidth_factor == 1.0 and action.bandwidth_cap_gbps is None:
            return 1.0
        if self._clock is None:
            return action.bandwidth_factor
        route_beta = self._clock.route_beta(dest)
        slowed = action.effective_beta(route_beta)
        return route_beta / slowed if slowed > 0 else 1.0
