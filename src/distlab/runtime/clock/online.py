"""The online virtual clock: each rank's running estimate of time on the modelled cluster.

Two clocks, one model. The *graded* virtual time is the replay of every rank's events after the
run (``replay.py``), which also shares links between concurrent flows. During the run, problem code
and time-triggered faults need the time *now* (a deadline, a window of a partition, "the first N
gradients to arrive"); that is this clock. It follows the same alpha-beta model without link
sharing, so both agree wherever no two flows share a link:

* declared compute advances it (``comm.compute``);
* a message sent at time t to rank j arrives at t + alpha + n*beta (+ a fault's extra latency, at
  the fault's bandwidth), or n*beta after the previous message to j if that one is still moving
  (a channel is first in, first out, as in the replay); the sender computes that arrival and
  sends it just *before* the message on a side communicator (a duplicate of the task's, so it
  never matches learner messages; sent first, so a receiver that has the message never waits for
  its stamp), and the receiver moves its clock to max(now, arrival) when the message completes;
* the sender's protocol is MPI's (``EAGER_LIMIT``): a send of at most the eager limit is *eager*:
  it only copies the message out, so it costs its sender nothing (``SEND_OVERHEAD_S``: per-message
  CPU costs are not modelled); a larger one (or an Ssend) is a *rendezvous*: the sender is done
  when the bytes have arrived. Not modelled, here as in the replay: a rendezvous waiting for a late
  receive (the sender would need the receiver's post time, a reply that could deadlock a correct
  program: a receiver may complete its Irecv only after it needs something from the sender);
* a built-in collective starts when its last member arrives (an allreduce of the clocks on the
  side communicator) and costs its algorithm's time on the group's slowest ring link. A call with
  a timeout makes that exchange nonblocking, polled to the same deadline; a rank whose collective
  timed out still posts its part of the exchange (``abandon_exchange``), and never waits for it, so that
  members that do finish the collective get their exchange, as they get the collective.

Everything is local arithmetic plus one 8-byte message per message, so the clock is deterministic:
the same program on the same platform reaches the same times on every run.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ...ops import MAX
from ..engines.base import Engine, abandon, finished_by, split_off
from .collectives_cost import ALIASES, collective_time

EAGER_LIMIT = 64 * 1024  # bytes: sends up to this size are eager (the proxy's and the replay's default)
SEND_OVERHEAD_S = 0.0  # what an eager send costs its sender on the virtual clock: its copy, not modelled


class ExchangeTimedOut(Exception):
    """The clocks' exchange of a collective with a timeout did not end by its deadline."""


class RouteTable(Protocol):
    def route(self, src_rank: int, dst_rank: int) -> Any: ...


class _RankTime:
    """What the clocks of one rank's communicators share: its time, and when the last message
    sent to each world rank is delivered (the next one's bytes wait: one channel per pair of
    ranks, whichever communicator a message goes by, as in the replay)."""

    __slots__ = ("now", "channel_free")

    def __init__(self, start_s: float) -> None:
        self.now = start_s
        self.channel_free: dict[int, float] = {}


class Timekeeper:
    """One rank's clock for one communicator, with its side channel for time stamps (a
    sub-communicator's clock shares the rank's time: ``split``, ``create_group``)."""

    def __init__(self, platform: RouteTable, side: Engine, start_s: float = 0.0,
                 shared: _RankTime | None = None) -> None:
        self._time = shared if shared is not None else _RankTime(start_s)
        self._platform = platform
        self._side = side
        self._world = list(side.world_ranks)
        self._stamp = np.zeros(1)
        self._outgoing_stamp = np.zeros(1)
        # (alpha, beta) to each group rank, looked up once: the route map does not change.
        self._links: dict[int, tuple[float, float]] = {}
        self._channel_free = self._time.channel_free

    @property
    def now(self) -> float:
        return self._time.now

    @now.setter
    def now(self, t: float) -> None:
        self._time.now = t

    def split(self, color: int, key: int) -> Timekeeper | None:
        """The clock of the communicator split off this one with (color, key): its side channel
        split alike (collective over this side channel), its time this rank's."""
        side = self._side.split(color, key)
        return Timekeeper(self._platform, side, shared=self._time) if side is not None else None

    def create_group(self, ranks: list[int], tag: int) -> Timekeeper:
        side = self._side.create_group(ranks, tag)
        return Timekeeper(self._platform, side, shared=self._time)

    def shrink(self) -> Timekeeper:
        """The clock of the survivors' communicator (comm.Shrink): its side channel shrunk alike."""
        side = self._side.shrink()  # type: ignore[attr-defined]  # a SurvivingEngine's
        return Timekeeper(self._platform, side, shared=self._time)

    def admit(self, grown: Engine) -> Timekeeper:
        """The clock of the communicator comm.Admit() made: a side channel split off the grown
        group (as each newcomer splits its own as its task starts), and every member's time the
        latest among them (``catch_up``)."""
        side = split_off(grown, list(range(grown.size)))
        assert side is not None  # every rank of the group is in its side channel
        clock = Timekeeper(self._platform, side, shared=self._time)
        clock.catch_up()
        return clock

    def catch_up(self) -> None:
        """Every member of this clock's group takes the latest time among them (collective): a
        rank that joins a running job starts where the others are, not at 0."""
        latest = np.zeros(1)
        self._side.allreduce(np.array([self.now]), latest, MAX)
        self.now = max(self.now, float(latest[0]))

    def close(self) -> None:
        """Releases the side channel (collective over it, as the communicator's Free is)."""
        self._side.close()

    def compute(self, seconds: float) -> None:
        self._time.now += seconds

    def arrival(self, dest: int, nbytes: int, action: Any = None) -> float:
        """When a message from this rank to group rank ``dest``, leaving now, is delivered."""
        link = self._links.get(dest)
        if link is None:
            route = self._platform.route(self._world[self._side.rank], self._world[dest])
            link = self._links[dest] = (route.alpha_s, route.beta_s_per_byte)
        alpha, beta = link
        leave = self._time.now
        extra = 0.0
        if action is not None:
            if action.hold_until_s is not None:
                leave = max(leave, action.hold_until_s)
            extra = action.extra_latency_s
            beta = action.effective_beta(beta)
        start = leave + extra + alpha
        moving = nbytes * beta
        if moving == 0:  # no bytes to move: it queues behind nothing (as in the replay)
            return start
        if action is not None and action.drop:
            return start + moving  # lost on the way: it holds up no later message
        # The channel to dest is first in, first out: its bytes move once the ones before are in.
        to = self._world[dest]
        arrival = max(start, self._channel_free.get(to, 0.0)) + moving
        self._channel_free[to] = arrival
        return arrival

    def route_beta(self, dest: int) -> float:
        return float(self._platform.route(self._world[self._side.rank], self._world[dest]).beta_s_per_byte)

    def send_stamp(self, dest: int, tag: int, arrival: float) -> None:
        # Eager and tiny: returns at once on both engines, which copy it out (so it is reused).
        self._outgoing_stamp[0] = arrival
        self._side.send(self._outgoing_stamp, dest, tag, False)

    def send_done(self, arrival: float, rendezvous: bool) -> float:
        """When a send leaving now with this ``arrival`` completes for its sender: once copied out
        if eager, once its bytes have arrived if a rendezvous."""
        return arrival if rendezvous else self._time.now + SEND_OVERHEAD_S

    def receive_stamp(self, source: int, tag: int) -> float:
        """The arrival time of the message just matched from group rank ``source`` with ``tag``.

        Its stamp was sent just before it, on the same (source, tag) channel of the side
        communicator, and channels deliver in order: the k-th stamp belongs to the k-th message."""
        self._side.recv(self._stamp, source, tag)
        return float(self._stamp[0])

    def advance_to(self, t: float) -> None:
        if t > self._time.now:
            self._time.now = t

    def collective(self, op: str, nbytes: int, deadline: float | None = None) -> None:
        """Moves the clock past a built-in collective of the whole group: from its last member's
        arrival, for the time its algorithm takes on the largest block any member brought (the
        same on every rank; blocks differ only in Allgatherv). With a ``deadline``
        (``time.perf_counter()``) the exchange raises ExchangeTimedOut if it has not ended by
        then, and the clock stays where it was."""
        latest = np.array([self._time.now, float(nbytes)])
        if deadline is None:
            self._side.allreduce(latest, latest, MAX)
        else:
            exchange = self._side.iallreduce(latest, latest, MAX)
            if not finished_by(exchange, deadline):
                abandon(exchange, latest)
                raise ExchangeTimedOut(op)
            exchange.wait()
        nbytes = int(latest[1])
        p = self._side.size
        routes = [
            self._platform.route(self._world[r], self._world[(r + 1) % p]) for r in range(p)
        ] if p > 1 else []
        alpha = max((r.alpha_s for r in routes), default=0.0)
        beta = max((r.beta_s_per_byte for r in routes), default=0.0)
        self._time.now = float(latest[0]) + collective_time(ALIASES.get(op, op), p, nbytes, alpha, beta)

    def abandon_exchange(self, nbytes: int) -> None:
        """This rank's part of a collective's exchange, posted and never waited on: its
        collective timed out here, and the members that finish it exchange with this."""
        latest = np.array([self._time.now, float(nbytes)])
        abandon(self._side.iallreduce(latest, latest, MAX), latest)
