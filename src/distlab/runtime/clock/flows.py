"""The fluid network the replay moves bytes through: a flow per message, flows of one ordered
(src, dst) pair kept together on a path, rates shared max-min fairly over finite links and
recomputed for the paths connected to a change (see the notes in replay.py). A pair has two
paths: its point-to-point messages queue one behind another on a *channel* (first in, first out,
as an MPI connection delivers them), its collectives' flows share theirs equally.

``FluidNetwork`` is the half of the replayer that knows only flows and links; the replayer
(replay.py) is the other half, which knows ranks, matching and collectives, and is told when a
flow completes through ``_complete``'s hooks ``_wake`` and ``_coll_flow_done``.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any, Callable

from .fairshare import progressive_fill
from .network import Network, ReplayError, RouteLike

if TYPE_CHECKING:
    from .replay import _Coll, _Rank

_START, _END = 0, 1  # heap entry kinds: a flow's first byte leaves; a path's front flow is done


class _Path:
    """Every flow of one ordered (src, dst) pair (see the module notes)."""

    __slots__ = (
        "src", "dst", "alpha", "beta", "cap", "links", "names", "price", "instant",
        "rate", "served", "t_last", "pending", "version", "nbytes", "channel", "tail", "route",
    )

    def __init__(self, src: int, dst: int, route: RouteLike, links: tuple[int, ...],
                 channel: bool) -> None:
        self.src, self.dst = src, dst
        # A channel serves its flows one at a time, in order; otherwise they share the path equally.
        self.channel = channel
        self.route = route
        self.alpha = float(route.alpha_s)
        self.beta = float(route.beta_s_per_byte)
        self.cap = 1.0 / self.beta if self.beta > 0 else math.inf
        self.links = links  # interned ids of the links that limit bandwidth (finite capacity)
        self.names = tuple(route.links)
        self.price = float(route.price_per_byte)
        self.instant = self.cap == math.inf and not links  # nothing limits it: bytes take no time
        self.rate = 0.0  # per flow served at once, bytes/s, valid since t_last
        # Bytes each flow has received since the path was idle (a channel: the path in all).
        self.served = 0.0
        self.tail = 0.0  # a channel: the served count at which its last queued flow is done
        self.t_last = 0.0
        self.pending: list[tuple[float, int, _Flow]] = []  # (served at which it is done, seq, flow)
        self.version = 0
        self.nbytes = 0  # all flows ever posted on it, for the byte and money counts


class _Flow:
    __slots__ = ("seq", "path", "nbytes", "posted", "start", "end", "event", "waiters",
                 "coll", "src_g", "dst_g", "step")

    def __init__(self, seq: int, path: _Path, nbytes: int, posted: float, event: int) -> None:
        self.seq, self.path, self.nbytes, self.posted, self.event = seq, path, nbytes, posted, event
        self.start = math.nan
        self.end: float | None = None
        self.waiters: list[_Rank] = []  # ranks whose current wait includes this flow
        self.coll: _Coll | None = None
        self.src_g = self.dst_g = self.step = 0


class FluidNetwork:
    """Flows on the platform's links, ordered on one heap of (time, sequence, kind, object)."""

    def __init__(self, network: Network) -> None:
        self.net = network
        self.link_price: Callable[[str], float] | None = getattr(network, "link_price", None)
        self.heap: list[tuple[float, int, int, Any, int]] = []
        self.seq = 0
        self.paths: dict[tuple[int, int, bool], _Path] = {}  # (src, dst, channel) -> path
        self.link_ids: dict[str, int] = {}
        self.link_cap: list[float] = []
        self.link_paths: list[dict[_Path, None]] = []  # active paths on each link, insertion order
        self.touched: dict[_Path, None] = {}  # paths whose flows changed in this instant
        self.flows: list[_Flow] = []

    def _push(self, time: float, kind: int, obj: Any, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time, self.seq, kind, obj, version))

    # What a completed flow means belongs to the replayer: a rank wakes, a collective steps on.

    def _wake(self, rs: _Rank, now: float) -> None:
        raise NotImplementedError

    def _coll_flow_done(self, flow: _Flow, now: float) -> None:
        raise NotImplementedError

    # -- flows -----------------------------------------------------------------------------------

    def _path(self, src: int, dst: int, channel: bool = True) -> _Path:
        path = self.paths.get((src, dst, channel))
        if path is not None:
            return path
        twin = self.paths.get((src, dst, not channel))
        if twin is not None:  # the route was read and checked for the pair's other path
            path = self.paths[(src, dst, channel)] = _Path(src, dst, twin.route, twin.links, channel)
            return path
        route = self.net.route(src, dst)
        what = f"the route from rank {src} to rank {dst}"
        for label, value in (("alpha_s", route.alpha_s), ("beta_s_per_byte", route.beta_s_per_byte),
                             ("price_per_byte", route.price_per_byte)):
            if not (math.isfinite(value) and value >= 0):
                raise ReplayError(f"{what} has {label} = {value!r}; it must be a finite number >= 0")
        limiting: list[int] = []
        for name in route.links:
            link = self.link_ids.get(name)
            if link is None:
                capacity = float(self.net.capacity(name))
                if not capacity > 0:
                    raise ReplayError(f"link '{name}' on {what} has capacity {capacity!r} bytes/s")
                link = self.link_ids[name] = len(self.link_cap)
                self.link_cap.append(capacity)
                self.link_paths.append({})
            if self.link_cap[link] < math.inf and link not in limiting:
                limiting.append(link)
        path = self.paths[(src, dst, channel)] = _Path(src, dst, route, tuple(limiting), channel)
        return path

    def _post(
        self, src: int, dst: int, nbytes: int, t: float, event: int,
        extra_s: float = 0.0, bandwidth_factor: float = 1.0, channel: bool = True,
    ) -> _Flow:
        """A flow of nbytes from src to dst posted at t, on the pair's channel (a point-to-point
        message) or its shared path (a collective's flow)."""
        path = self._path(src, dst, channel)
        # A fault's bandwidth factor f is modelled as n/f bytes at the path's rate: the same time
        # alone on the path; the byte and money counts keep the real n.
        timed = nbytes if bandwidth_factor == 1.0 else nbytes / bandwidth_factor
        flow = _Flow(len(self.flows), path, timed, t, event)  # type: ignore[arg-type]
        self.flows.append(flow)
        path.nbytes += nbytes
        self._push(t + extra_s + path.alpha, _START, flow)
        return flow

    def _lost(self, src: int, dst: int, t: float, event: int) -> _Flow:
        """A message a fault dropped: its send completes at once and nothing travels. (Also the
        request of an eager send, whose message moves as a flow of its own.)"""
        flow = _Flow(-1, self._path(src, dst), 0, t, event)
        flow.start = flow.end = t
        return flow

    def _start(self, flow: _Flow, now: float) -> None:
        flow.start = now
        path = flow.path
        if flow.nbytes == 0 or path.instant:
            self._complete(flow, now)
            return
        if path.pending:
            self._advance(path, now)
        else:  # an idle path restarts its counter at 0, so a lone flow's arithmetic is exact
            path.served, path.t_last = 0.0, now
            for link in path.links:
                self.link_paths[link][path] = None
        # A flow that joins a shared path when its counter reads S is done when it reads S + n; on
        # a channel it queues behind the flows already there.
        done = (path.tail if path.channel and path.pending else path.served) + flow.nbytes
        path.tail = done
        heapq.heappush(path.pending, (done, flow.seq, flow))
        self.touched[path] = None

    def _end(self, path: _Path, now: float) -> None:
        done = path.pending[0][0]
        path.served, path.t_last = done, now
        while path.pending and path.pending[0][0] <= done:
            self._complete(heapq.heappop(path.pending)[2], now)
        if not path.pending:
            for link in path.links:
                del self.link_paths[link][path]
        self.touched[path] = None

    def _complete(self, flow: _Flow, now: float) -> None:
        flow.end = now
        if flow.coll is not None:
            self._coll_flow_done(flow, now)
            return
        for rs in flow.waiters:
            rs.outstanding -= 1
            if rs.outstanding == 0:
                self._wake(rs, now)
        flow.waiters = []

    @staticmethod
    def _advance(path: _Path, now: float) -> None:
        path.served += path.rate * (now - path.t_last)
        path.t_last = now

    def _reallocate(self, now: float) -> None:
        """New rates for every path connected (through shared links) to one that changed.

        A walk from the changed paths' links over link -> active paths -> their links finds the
        component and numbers its links and paths for the filling on the way."""
        touched, self.touched = self.touched, {}
        paths: dict[_Path, int] = {}  # the component, numbered in walk order
        local: dict[int, int] = {}  # global link id -> number in the component
        remaining: list[float] = []
        members: list[list[int]] = []
        uses: list[list[int]] = []
        stack: list[int] = []

        def reach(link: int) -> int:
            j = local[link] = len(remaining)
            remaining.append(self.link_cap[link])
            members.append([])
            stack.append(link)
            return j

        for path in touched:
            if not path.links:  # limited by its own cap only: a component by itself
                self._set_rate(path, path.cap, now, True)
            for link in path.links:
                if link not in local:
                    reach(link)
        while stack:
            link = stack.pop()
            on = members[local[link]]
            for path in self.link_paths[link]:
                c = paths.get(path)
                if c is None:
                    c = paths[path] = len(uses)
                    uses.append([local[k] if k in local else reach(k) for k in path.links])
                on.append(c)
        if not paths:
            return
        order = list(paths)
        weights = [1 if p.channel else len(p.pending) for p in order]  # flows served at once
        if len(order) == 1:  # the common case (disjoint flows): no filling needed
            rate = order[0].cap
            for j in uses[0]:
                rate = min(rate, remaining[j] / weights[0])
            rates = [rate]
        else:
            rates = progressive_fill(uses, members, remaining, [p.cap for p in order], weights)
        for path, rate in zip(order, rates):
            self._set_rate(path, rate, now, path in touched)

    def _set_rate(self, path: _Path, rate: float, now: float, changed: bool) -> None:
        if rate != path.rate:
            self._advance(path, now)  # bytes served so far were served at the old rate
            path.rate = rate
        elif not changed:
            return  # same rate, same front flow: its pending end event still holds
        path.version += 1
        if path.pending:
            left = path.pending[0][0] - path.served
            # At its own cap the time is left * beta: exactly n * beta for a lone flow.
            dt = left * path.beta if rate == path.cap else left / rate
            self._push(now + max(dt, 0.0), _END, path, path.version)
