"""What the survivors of a peer's death call on the learner's ``comm`` (``Task(survivors=True)``),
following mpi4py's names for Open MPI's user-level failure mitigation (ULFM):

* a call that involves a dead rank raises ``distlab.PeerFailed`` (engines/surviving.py);
* ``comm.Revoke()`` makes every pending and later call on the communicator fail on every rank
  (PeerFailed, ``revoked``), so that ranks waiting on a live peer learn of the death too;
* ``comm.Agree(flag)`` returns the bitwise AND of the survivors' flags, whatever has failed; a
  failure that not every survivor had acknowledged before the call makes it raise PeerFailed at
  every survivor alike (ULFM's rule), so the survivors acknowledge and agree again together;
* ``comm.Get_failed()`` is the group of the ranks this rank knows have failed, and
  ``comm.Ack_failed()`` acknowledges them (a wildcard receive then goes on without them);
* ``comm.Shrink()`` is a new communicator of the survivors, renumbered in their order here,
  with the rank's slot, trace, clock and counters as every communicator of the rank (groups.py);
* ``comm.Admit()`` (distlab's own) is the membership barrier of an elastic job: every
  rank of the communicator calls it at a step boundary, and the ranks waiting to join (a
  ``join`` fault's, a dead rank started again alone) enter: a new communicator of this one's
  ranks then the newcomers, renumbered in that order, or this communicator itself when no one
  waits. A newcomer's task starts with that communicator (it knows it is one from
  ``DISTLAB_JOINED`` in its environment).

On MPI these are Open MPI's own; on gloo, the same calls over the launch's store
(engines/surviving_gloo.py). In a task without survivors they say so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..clock.online import Timekeeper
from ..engines.base import Engine
from .groups import Group
from .rankstate import ALL_PEERS, NullSlot, RankSlot

if TYPE_CHECKING:
    from .proxy import Comm


class Survivors:
    """Mixed into ``Comm`` (proxy.py), after ``Communicators`` (groups.py), whose ``_derive``
    makes the shrunk communicator."""

    _engine: Engine
    _clock: Timekeeper | None
    _world_ranks: list[int]
    _slot: RankSlot | NullSlot
    _ctx: int

    if TYPE_CHECKING:
        def _derive(self, engine: Engine, clock: Timekeeper | None) -> Comm: ...

    def _ulfm(self, call: str) -> Any:
        """The engine's failure mitigation, or an error saying there is none."""
        if not getattr(self._engine, "survives_peers", False):
            raise RuntimeError(f"{call}: this task's ranks do not survive their peers; a problem "
                               "asks for it with Task(survivors=True)")
        return self._engine

    def Revoke(self) -> None:  # noqa: N802
        self._ulfm("Revoke").revoke()

    def Is_revoked(self) -> bool:  # noqa: N802
        return bool(self._ulfm("Is_revoked").is_revoked())

    def Agree(self, flag: int) -> int:  # noqa: N802
        return int(self._ulfm("Agree").agree(int(flag)))

    def Get_failed(self) -> Group:  # noqa: N802
        failed = self._ulfm("Get_failed").failed()
        me = self._world_ranks[self._engine.rank]
        return Group([self._world_ranks[r] for r in failed], me)

    def Ack_failed(self) -> int:  # noqa: N802
        return int(self._ulfm("Ack_failed").ack_failed())

    def Shrink(self) -> Comm:  # noqa: N802
        engine = self._ulfm("Shrink").shrink()
        clock = self._clock.shrink() if self._clock is not None else None
        return self._derive(engine, clock)

    def Admit(self) -> Comm:  # noqa: N802
        surviving = self._ulfm("Admit")
        # Shown as a wait of the whole communicator: its members wait for each other, and for
        # the newcomers to start (a newcomer in the lobby shows "Admit" without peers).
        self._slot.blocked("Admit", (ALL_PEERS,), 0, self._ctx)
        try:
            engine = surviving.admit()
        finally:
            self._slot.running()
        if engine is self._engine:
            return self  # type: ignore[return-value]  # mixed into Comm
        clock = self._clock.admit(engine) if self._clock is not None else None
        return self._derive(engine, clock)
