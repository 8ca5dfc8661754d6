"""``Probe`` and ``Iprobe`` of the learner's ``comm``, as mpi4py's: the source, tag and size of a
message a receive would match, without receiving it (MPI only: gloo cannot look at a message
before its receive takes it, and says so).

A probe is counted (``calls["Probe"]``/``["Iprobe"]``) and a blocking one shows in the slot as a
wait on its source, but neither is an event on the virtual clock: it moves no bytes, and the
receive that follows it waits for the message's arrival as any receive does.
"""

from __future__ import annotations

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

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Any = None) -> None:  # noqa: N802
        """Waits until a message from ``source`` with ``tag`` can be received; fills ``status``
        (Get_source, Get_tag, Get_count(datatype)) without receiving it."""
        source, tag = self._peer(source, "source", wildcard=True), int(tag)
        self._check_hung()
        src = self._world_ranks[source] if source >= 0 else -1
        self._slot.blocked_on("Probe", src, -1, 0, self._ctx)
        found = self._engine.probe(source, tag, block=True)
        self._slot.running()
        self.stats.count_call("Probe", 0)
        assert found is not None  # a blocking probe returns a message
        _fill_status(status, *found, probed=True)

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Any = None) -> bool:  # noqa: N802
        """True, with ``status`` filled, if a message from ``source`` with ``tag`` can be received
        now; False at once otherwise."""
        source, tag = self._peer(source, "source", wildcard=True), int(tag)
        self._check_hung()
        found = self._engine.probe(source, tag, block=False)
        self.stats.count_call("Iprobe", 0)
        if found is not None:
            _fill_status(status, *found, probed=True)
        return found is not None
