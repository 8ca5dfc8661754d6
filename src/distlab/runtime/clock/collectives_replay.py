"""Built-in collectives in the replay. A collective starts when its last member arrives and runs
the flows of its standard algorithm (``collectives_cost.collective_schedule``) through the fluid
network step by step: each member posts a step's sends once its own previous step is done (its
sends delivered and the step's receives arrived), as a hand-written Sendrecv loop would. Blocking
members leave when its last flow ends; a nonblocking one's request completes then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .collectives_cost import Schedule, collective_schedule
from .flows import FluidNetwork, _Flow
from .network import Network, ReplayError

if TYPE_CHECKING:
    from .replay import _Rank


class _Coll:
    __slots__ = ("op", "group", "index", "root", "p", "where", "arrival", "nbytes", "arrived",
                 "start", "schedule", "step", "sends_left", "recv_left", "flows_left",
                 "blocking", "event", "end", "waiters")

    def __init__(self, op: str, group: tuple[int, ...], index: int, root: int) -> None:
        self.op, self.group, self.index, self.root, self.p = op, group, index, root, len(group)
        self.where = {rank: g for g, rank in enumerate(group)}
        self.arrival: list[float | None] = [None] * self.p
        self.blocking = [True] * self.p  # False for a member that posted it nonblocking
        self.event = [0] * self.p  # each member's "coll" or "icoll" event, for FlowRecord.event
        self.end: float | None = None  # set when its last flow has ended
        self.waiters: list[_Rank] = []  # ranks whose current wait includes it (nonblocking)
        self.nbytes: list[Any] = [0] * self.p  # an int per member (Alltoallv: a tuple)
        self.arrived = 0
        self.start = 0.0
        self.schedule: Schedule = ()
        self.step = [-1] * self.p  # the step each group rank is in (-1: not started)
        self.sends_left = [0] * self.p  # its sends of that step not yet delivered
        self.recv_left: list[list[int]] = []  # [group rank][step] -> receives not yet arrived
        self.flows_left = 0

    def label(self) -> str:
        return f"{self.op} #{self.index} over ranks {list(self.group)}"


class CollectiveReplay(FluidNetwork):
    """The collectives' half of the replayer (replay.py holds the ranks' half)."""

    ranks: dict[int, _Rank]

    def __init__(self, network: Network) -> None:
        super().__init__(network)
        self.coll_callers: dict[tuple[tuple[int, ...], int], list[int]] = {}
        self.colls: dict[tuple[tuple[int, ...], int], _Coll] = {}
        self.schedules: dict[tuple[str, tuple[int, ...], int], Schedule] = {}

    def _nbytes(self, value: Any, rank: int, event: int) -> int:
        raise NotImplementedError

    def _arrive(self, rs: _Rank, i: int, op: Any, group: Any, index: Any, nbytes: Any, root: Any,
                t: float, blocking: bool) -> _Coll:
        """Rank ``rs`` reaches collective call ``i`` at time t; the last member starts it."""
        op, group, index, root = str(op), tuple(group), int(index), int(root)
        r = rs.rank
        coll = self.colls.get((group, index))
        if coll is None:
            coll = self._open_coll(r, i, op, group, index, root)
        g = coll.where.get(r)
        if g is None:
            raise ReplayError(f"rank {r}, event {i}: calls {coll.label()} but is not in it", r, i)
        if op != coll.op or root != coll.root:
            raise ReplayError(
                f"rank {r}, event {i}: calls {op} (root {root}) as collective #{index} over ranks "
                f"{list(group)}, where the others call {coll.op} (root {coll.root})", r, i)
        coll.arrival[g] = t
        coll.blocking[g] = blocking
        coll.event[g] = i
        if isinstance(nbytes, (tuple, list)):  # Alltoallv: the bytes for each group rank
            if len(nbytes) != coll.p:
                raise ReplayError(f"rank {r}, event {i}: {op} names {len(nbytes)} block sizes "
                                  f"for a group of {coll.p}", r, i)
            coll.nbytes[g] = tuple(self._nbytes(n, r, i) for n in nbytes)
        else:
            coll.nbytes[g] = self._nbytes(nbytes, r, i)
        coll.arrived += 1
        if coll.arrived == coll.p:
            self._begin(coll, r, i)
        return coll

    def _open_coll(self, r: int, i: int, op: str, group: tuple[int, ...], index: int,
                   root: int) -> _Coll:
        if len(set(group)) != len(group):
            raise ReplayError(f"rank {r}, event {i}: {op} over ranks {list(group)} names a rank twice", r, i)
        callers = self.coll_callers.get((group, index), [])
        missing = [m for m in group if m not in callers]
        if missing:
            raise ReplayError(
                f"rank {r}, event {i}: {op} #{index} over ranks {list(group)} can never complete: "
                f"rank(s) {missing} never make that call", r, i)
        coll = _Coll(op, group, index, root)
        self.colls[(group, index)] = coll
        return coll

    def _begin(self, coll: _Coll, r: int, i: int) -> None:
        arrivals = [a for a in coll.arrival if a is not None]
        coll.start = start = max(arrivals)
        for g, member in enumerate(coll.group):
            if coll.blocking[g]:  # a member that posted it nonblocking was not waiting
                self.ranks[member].sync_wait += start - arrivals[g]
        key = (coll.op, tuple(coll.nbytes), coll.root)
        schedule = self.schedules.get(key)
        if schedule is None:
            try:
                schedule = collective_schedule(coll.op, coll.nbytes, coll.root)
            except ValueError as err:
                raise ReplayError(f"rank {r}, event {i}: {err}", r, i) from None
            self.schedules[key] = schedule
        coll.schedule = schedule
        coll.recv_left = [[0] * len(steps) for steps in schedule]
        for steps in schedule:
            for s, sends in enumerate(steps):
                for dst, _ in sends:
                    coll.recv_left[dst][s] += 1
                    coll.flows_left += 1
        if coll.flows_left == 0:
            self._finish(coll, start)
            return
        for g in range(coll.p):
            self._step(coll, g, start)

    def _step(self, coll: _Coll, g: int, t: float) -> None:
        """Moves group rank g through its steps while the current one is complete, posting the
        sends of each step it enters at time t."""
        steps = coll.schedule[g]
        s = coll.step[g]
        while s < len(steps):
            if s >= 0 and (coll.sends_left[g] or coll.recv_left[g][s]):
                break
            s += 1
            if s < len(steps):
                coll.sends_left[g] = len(steps[s])
                for dst, nbytes in steps[s]:
                    flow = self._post(coll.group[g], coll.group[dst], nbytes, t, coll.event[g],
                                      channel=False)
                    flow.coll, flow.src_g, flow.dst_g, flow.step = coll, g, dst, s
        coll.step[g] = s

    def _coll_flow_done(self, flow: _Flow, now: float) -> None:
        coll = flow.coll
        assert coll is not None
        coll.sends_left[flow.src_g] -= 1
        coll.recv_left[flow.dst_g][flow.step] -= 1
        coll.flows_left -= 1
        if coll.flows_left == 0:
            self._finish(coll, now)
            return
        self._step(coll, flow.src_g, now)
        if flow.dst_g != flow.src_g:
            self._step(coll, flow.dst_g, now)

    def _finish(self, coll: _Coll, end: float) -> None:
        coll.end = end
        for g, member in enumerate(coll.group):
            if coll.blocking[g]:
                self._wake(self.ranks[member], end)
        for rs in coll.waiters:  # ranks waiting on it as a request
            rs.outstanding -= 1
            if rs.outstanding == 0:
                self._wake(rs, end)
        coll.waiters = []
        del self.colls[(coll.group, coll.index)]
