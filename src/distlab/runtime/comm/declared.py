"""What problem code declares on the learner's ``comm``, beside mpi4py's API: work for the
virtual clock (``compute``), the time on it (``now``), and points in the trace (``mark``, whose
"step" numbers the training steps that fault plans trigger on: ``step``). Mixed into ``Comm``
(proxy.py), whose constructor sets these attributes."""

from __future__ import annotations

import math
import time
from typing import Any

from ..clock.online import Timekeeper
from ..trace.events import COMPUTE, MARK, TraceRecorder
from .rankstate import NullSlot, RankSlot


class Declarations:
    _book: Any  # groups.py's RankBook
    _slot: RankSlot | NullSlot
    _clock: Timekeeper | None
    _trace: TraceRecorder | None
    _trigger_steps: frozenset[int]  # steps at which the supervisor kills or stops us
    _compute_multiplier: float
    _device_flops: float | None

    @property
    def step(self) -> int:
        """The current training step (0 before and during the first marked step)."""
        return max(self._book.steps_started - 1, 0)

    def compute(self, seconds: float | None = None, flops: float | None = None, label: str = "") -> None:
        """Declares work for the virtual clock: seconds, or FLOPs over this rank's device."""
        if (seconds is None) == (flops is None):
            raise TypeError("compute() takes seconds= or flops=, exactly one")
        declared_amount(seconds, flops)
        if flops is not None:
            if not self._device_flops:
                raise ValueError("compute(flops=...) needs a platform with a device profile")
            seconds = flops / self._device_flops
        assert seconds is not None
        seconds *= self._compute_multiplier
        if self._clock is not None:
            self._clock.compute(seconds)
        if self._trace is not None:
            now = time.perf_counter()
            self._trace.add((COMPUTE, seconds, label, now, now))

    def now(self) -> float:
        """This rank's virtual time, in seconds (0 when no virtual clock runs)."""
        return self._clock.now if self._clock is not None else 0.0

    def mark(self, name: str) -> None:
        """A point in the trace, such as the start of a training step.

        ``mark("step")`` at the start of each training step also numbers the steps from 0, which
        fault plans trigger on (``at_step = 30``: when step 30 starts); a kill or stop with
        ``at_mark = "NAME"`` lands at the rank's first ``mark("NAME")``, which waits there
        until the supervisor has acted (rankstate.py's ``pause``), as a trigger step does."""
        book = self._book
        if name == "step":
            book.steps_started += 1
            self._slot.set_step(book.steps_started - 1)
            if self.step in self._trigger_steps:  # wait here until the supervisor has acted
                self._slot.pause()
        if name in book.trigger_marks:  # the same, at a mark
            self._slot.pause(1 << book.trigger_marks.index(name))
        book.marked.append((name, book.totals()))
        if book.memory_probe is not None:
            book.memory.append((name, *book.memory_probe(name)))
        if self._trace is not None:
            now = time.perf_counter()
            self._trace.add((MARK, name, now, now))


def declared_amount(seconds: float | None, flops: float | None) -> float:
    """The amount a compute() declares, as a float: finite and not negative, or a ValueError (a
    negative one would move the rank's virtual clock back: sealed, the agent refused it as a
    request its client never builds, unsealed the clock went back)."""
    name, amount = ("seconds", seconds) if seconds is not None else ("flops", flops)
    value = float(amount)  # type: ignore[arg-type]
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"compute({name}={amount!r}): the work a rank declares is finite and not negative")
    return value
