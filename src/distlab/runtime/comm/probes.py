"""``Probe`` and ``Iprobe`` of the learner's ``comm``, as mpi4py's: the source, tag and size of a
message a receive would match, without receiving it (MPI only: gloo cannot look at a message
before its receive takes it, and says so).

A probe is counted (``calls["Probe"]``/``["Iprobe"]``) and a blocking one shows in the slot as a
wait on its source, but neither is an event on the virtual clock: it moves no bytes, and the
receive that follows it waits for the message's arrival as any receive does. A Probe with a
timeout (timed.py) polls Iprobe to its deadline.
"""

from __future__ import annotations

import time
from typing import Any

from ..engines.base import ANY_SOURCE, ANY_TAG, Engine
from .requests import _fill_status
from .stats import CommStats


class Probes:
    """Mixed into ``Comm`` (proxy.py)."""

    _engine: Engine
    _world_ranks: list[int]
    _slot: Any
    _ctx: int
    stats: CommStats

    def _peer(self, peer: Any, what: str, wildcard: bool = False) -> int:
        raise NotImplementedError

    def _check_hung(self) -> None:
        raise NotImplementedError

    def _check_broken(self) -> None:
        raise NotImplementedError

    def _limit(self, timeout: Any, call: str) -> float | None:
        raise NotImplementedError

    def _deadline(self, limit: float, wall0: float) -> float:
        raise NotImplementedError

    def _timed_out(self, call: str, peer: Any, seconds: float, wall0: float, why: str) -> Exception:
        raise NotImplementedError

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Any = None,  # noqa: N802
              timeout: Any = None) -> None:
        """Waits until a message from ``source`` with ``tag`` can be received; fills ``status``
        (Get_source, Get_tag, Get_count(datatype)) without receiving it."""
        source, tag = self._peer(source, "source", wildcard=True), int(tag)
        self._check_broken()
        limit = self._limit(timeout, "Probe")
        self._check_hung()
        src = self._world_ranks[source] if source >= 0 else -1
        wall0 = time.perf_counter()
        self._slot.blocked_on("Probe", src, -1, 0, self._ctx)
        if limit is None:
            found = self._engine.probe(source, tag, block=True)
        else:
            found = self._probe_until(source, tag, limit, wall0)
        self._slot.running()
        self.stats.count_call("Probe", 0)
        assert found is not None  # a blocking probe returns a message
        _fill_status(status, *found)

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Any = None) -> bool:  # noqa: N802
        """True, with ``status`` filled, if a message from ``source`` with ``tag`` can be received
        now; False at once otherwise."""
        source, tag = self._peer(source, "source", wildcard=True), int(tag)
        self._check_hung()
        found = self._engine.probe(source, tag, block=False)
        self.stats.count_call("Iprobe", 0)
        if found is not None:
            _fill_status(status, *found)
        return found is not None

    def _probe_until(self, source: int, tag: int, limit: float,
                     wall0: float) -> tuple[int, int, int]:
        deadline = self._deadline(limit, wall0)
        pause = 20e-6
        while True:
            found = self._engine.probe(source, tag, block=False)
            if found is not None:
                return found
            left = deadline - time.perf_counter()
            if left <= 0:
                raise self._timed_out("Probe", source, limit, wall0, "no message came")
            time.sleep(min(pause, left))
            pause = min(pause * 2, 1e-3)
