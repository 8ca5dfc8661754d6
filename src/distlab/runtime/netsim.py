"""The virtual clock: every rank's recorded events replayed through a fluid network model.

    from distlab.runtime.netsim import replay
    result = replay(traces, platform)       # traces: world rank -> events (see trace.py)
    result.makespan, result.finish[0], result.spans[0][5], result.link_bytes["sw0>sw1"]

Why a replay. Ranks run for real and only record what they did. Flows that share a link slow each
other down, and which flows overlap depends on every rank's virtual time, so it cannot be settled
online without making the times depend on the real-time order of the processes. Afterwards it
can: the replay is a discrete-event simulation over all ranks at once, with no randomness and no
iteration over hashed strings, so the same traces give bit-identical times in any process.

The model:

- Each rank is a sequential process whose virtual time starts at 0. "compute" advances it by the
  given seconds; "send", "recv" and "mark" take no time ("mark" records the time).
- A send posted at time t becomes a *flow*: it waits the route's latency alpha (no bandwidth
  used), then moves its bytes over every directed link of its route. A flow alone moves at
  1 / route.beta, so an uncontended message takes exactly alpha + n * beta; a 0-byte message
  takes alpha. Concurrent flows share links max-min fairly (progressive filling), each also
  capped at its own 1 / beta; rates are recomputed whenever a flow starts or ends, but only
  for the flows connected to it through shared links.
- A send request completes when its flow has delivered everything (the conservative "buffer
  reusable once delivered" reading); a receive request completes at max(posted, delivery of the
  message it matched). "wait" ends at the latest completion among its requests, or at once.
- A built-in collective ("coll") starts when the last participant arrives, runs the flows of its
  standard algorithm (``collectives_cost``) through the same fluid model, and every participant
  leaves when its last flow ends. A nonblocking one ("icoll", e.g. ``Iallreduce``) is the same
  collective, but posting it takes no time: a member goes on at once (its compute overlaps the
  flows), the collective starts when the last member has posted it, and a "wait" on its request
  ends when its last flow ends (at once if it has already ended). Inside, each rank goes step by step like a hand-written
  Sendrecv loop: it posts a step's sends once its own previous step is done (its sends
  delivered and the step's receives arrived), not when the whole group's step is.
- Per rank: compute_s + comm_s + idle_s == makespan, where comm_s is time blocked in waits and
  collectives (sync_wait_s is the part of it spent in blocking collectives waiting for the last
  peer to arrive) and idle_s is the time after the rank's last event until the slowest rank finishes.

Not modelled: per-message CPU overheads, eager versus rendezvous protocols (a flow moves whether
or not its receive is posted), and requests completed by Test instead of Wait.

Implementation notes. The flows of one ordered (src, dst) pair cross the same links with the same
cap, so max-min fairness gives them the same rate: the simulator keeps them together in a
``_Path`` with one "bytes served per flow" counter, and a flow that joins when the counter reads S
is done when it reads S + nbytes. A burst of a thousand Isends to one peer therefore costs one
rate computation per event, not a thousand. A heap orders the events by (time, sequence number);
entries for a path are invalidated by a version number when its rate changes.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from distlab.errors import DistlabError

from .collectives_cost import Schedule, collective_schedule
from .trace import COLL, COMPUTE, ICOLL, MARK, RECV, SEND, WAIT, Event

# -- the network, as the platforms package provides it ------------------------------------------


@dataclass(frozen=True)
class Route:
    alpha_s: float  # one-way latency of the path
    links: tuple[str, ...]  # directed link ids on the path
    beta_s_per_byte: float  # 1 / smallest bandwidth on the path (bytes/s); 0 for no limit
    price_per_byte: float


class RouteLike(Protocol):
    @property
    def alpha_s(self) -> float: ...
    @property
    def links(self) -> tuple[str, ...]: ...
    @property
    def beta_s_per_byte(self) -> float: ...
    @property
    def price_per_byte(self) -> float: ...


class Network(Protocol):
    """What the replay needs from a platform. A network may also offer
    ``link_price(link) -> float`` (money per byte on that link alone); ``Replay.link_money`` then
    charges each link its own price instead of the whole route's."""

    def route(self, src_rank: int, dst_rank: int) -> RouteLike: ...
    def capacity(self, link: str) -> float: ...  # bytes per second of a directed link; may be inf


class ReplayError(DistlabError):
    """The traces cannot be replayed: a message never sent, a deadlock, a malformed event."""

    def __init__(self, message: str, rank: int | None = None, event: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.event = event


# -- the result ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlowRecord:
    """One message on the wire: posted by the sender, moving bytes from start to end."""

    src: int
    dst: int
    nbytes: int
    posted: float
    start: float  # posted + alpha: the first byte leaves
    end: float  # the last byte has arrived
    op: str  # "send" for point-to-point, else the collective ("Allreduce", ...)
    event: int  # index of the sender's event that created it ("send" or "coll")


@dataclass(frozen=True)
class Replay:
    spans: dict[int, tuple[tuple[float, float], ...]]  # rank -> (begin, end) of each event
    finish: dict[int, float]  # rank -> virtual time after its last event
    makespan: float
    compute_s: dict[int, float]
    comm_s: dict[int, float]  # blocked in waits and collectives
    sync_wait_s: dict[int, float]  # part of comm_s: in blocking collectives, before the last peer came
    idle_s: dict[int, float]  # makespan - finish == makespan - (compute_s + comm_s)
    marks: dict[int, tuple[tuple[str, float], ...]]  # rank -> (name, time) of each "mark"
    pair_bytes: dict[tuple[int, int], int]  # (src, dst) -> bytes, collectives included
    link_bytes: dict[str, int]
    link_money: dict[str, float]  # money of the bytes that crossed each link (see Network)
    money: float  # sum over flows of nbytes * route.price_per_byte
    flows: tuple[FlowRecord, ...]

    @property
    def messages(self) -> int:
        return len(self.flows)


# -- max-min fairness ---------------------------------------------------------------------------

L = TypeVar("L", bound=Hashable)


def max_min_rates(
    routes: Sequence[Sequence[L]],
    caps: Sequence[float],
    weights: Sequence[int],
    capacity: Callable[[L], float],
) -> list[float]:
    """Max-min fair per-flow rates by progressive filling.

    Class c holds ``weights[c]`` identical flows over the links ``routes[c]``, each flow capped
    at ``caps[c]`` (math.inf for no cap). All unfrozen flows rise together; when a link fills
    (its remaining capacity over its unfrozen flows is the lowest such share) or a class reaches
    its cap, those flows freeze at that level. Returns each class's per-flow rate.
    """
    slot: dict[L, int] = {}  # link -> index, in order of first appearance
    remaining: list[float] = []
    members: list[list[int]] = []
    uses: list[list[int]] = []
    for c, links in enumerate(routes):
        mine: list[int] = []
        for link in links:
            j = slot.get(link)
            if j is None:
                j = slot[link] = len(remaining)
                remaining.append(float(capacity(link)))
                members.append([])
            if j not in mine:
                mine.append(j)
                members[j].append(c)
        uses.append(mine)
    return _progressive_fill(uses, members, remaining, caps, weights)


def _progressive_fill(
    uses: Sequence[Sequence[int]],
    members: Sequence[Sequence[int]],
    remaining: list[float],
    caps: Sequence[float],
    weights: Sequence[int],
) -> list[float]:
    """max_min_rates on numbered links: ``uses[c]`` are class c's links (each once),
    ``members[j]`` the classes on link j, ``remaining[j]`` its capacity (consumed in place).

    Links wait in a heap keyed by their current share, so a call costs
    O(sum of route lengths * log links), not a pass over every class at every level.
    """
    n = len(uses)
    unfrozen_on = [sum(weights[c] for c in on) for on in members]  # flows not yet frozen
    share = [r / k if k > 0 else math.inf for r, k in zip(remaining, unfrozen_on)]
    heap = [(s, j) for j, s in enumerate(share) if s < math.inf]
    heapq.heapify(heap)
    by_cap = sorted(range(n), key=lambda c: caps[c])  # stable: ties keep class order
    rates = [-1.0] * n  # -1: not frozen yet
    left, next_cap, level = n, 0, 0.0
    while left:
        # Drop heap entries made stale by later updates of their link.
        while heap and (unfrozen_on[heap[0][1]] == 0 or heap[0][0] != share[heap[0][1]]):
            heapq.heappop(heap)
        while next_cap < n and rates[by_cap[next_cap]] >= 0:
            next_cap += 1
        link_level = heap[0][0] if heap else math.inf
        cap_level = caps[by_cap[next_cap]] if next_cap < n else math.inf
        # Rounding may put a share a hair under the last level; levels never go down, which
        # also keeps every rate positive.
        if cap_level <= link_level:
            level = max(level, cap_level)
            freezing = [by_cap[next_cap]]
        else:
            j = heapq.heappop(heap)[1]
            level = max(level, link_level)
            freezing = [c for c in members[j] if rates[c] < 0]
        changed: dict[int, None] = {}  # links whose share moved; each re-enters the heap once
        for c in freezing:
            rates[c] = level
            left -= 1
            w = weights[c]
            for k in uses[c]:
                unfrozen_on[k] -= w
                remaining[k] -= w * level
                changed[k] = None
        for k in changed:
            if unfrozen_on[k] > 0:
                share[k] = remaining[k] / unfrozen_on[k]
                heapq.heappush(heap, (share[k], k))
    return rates


# -- simulator state ----------------------------------------------------------------------------

_START, _END = 0, 1  # heap entry kinds: a flow's first byte leaves; a path's front flow is done


class _Path:
    """Every flow of one ordered (src, dst) pair (see the module notes)."""

    __slots__ = (
        "src", "dst", "alpha", "beta", "cap", "links", "names", "price", "instant",
        "rate", "served", "t_last", "pending", "version", "nbytes",
    )

    def __init__(self, src: int, dst: int, route: RouteLike, links: tuple[int, ...]) -> None:
        self.src, self.dst = src, dst
        self.alpha = float(route.alpha_s)
        self.beta = float(route.beta_s_per_byte)
        self.cap = 1.0 / self.beta if self.beta > 0 else math.inf
        self.links = links  # interned ids of the links that limit bandwidth (finite capacity)
        self.names = tuple(route.links)
        self.price = float(route.price_per_byte)
        self.instant = self.cap == math.inf and not links  # nothing limits it: bytes take no time
        self.rate = 0.0  # per flow, bytes/s, valid since t_last
        self.served = 0.0  # bytes each flow of the path has received since the path was idle
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


class _Recv:
    __slots__ = ("posted", "ctx", "src", "tag", "event", "key")

    def __init__(self, posted: float, ctx: int, src: int, tag: int, event: int) -> None:
        self.posted, self.ctx, self.src, self.tag, self.event = posted, ctx, src, tag, event
        self.key: tuple[int, int, int, int, int] | None = None  # the message, once matched


class _Rank:
    __slots__ = ("rank", "events", "pc", "t", "spans", "marks", "compute", "comm", "sync_wait",
                 "requests", "outstanding", "done")

    def __init__(self, rank: int, events: Sequence[Event]) -> None:
        self.rank, self.events = rank, events
        self.pc = 0  # next event; while blocked, the blocking event
        self.t = 0.0  # virtual time; while blocked, when the blocking event began
        self.spans: list[tuple[float, float]] = []
        self.marks: list[tuple[str, float]] = []
        self.compute = self.comm = self.sync_wait = 0.0
        self.requests: dict[int, _Flow | _Recv | _Coll] = {}  # _Coll: a nonblocking collective
        self.outstanding = 0  # requests the current wait still needs
        self.done = False


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
        self.nbytes = [0] * self.p
        self.arrived = 0
        self.start = 0.0
        self.schedule: Schedule = ()
        self.step = [-1] * self.p  # the step each group rank is in (-1: not started)
        self.sends_left = [0] * self.p  # its sends of that step not yet delivered
        self.recv_left: list[list[int]] = []  # [group rank][step] -> receives not yet arrived
        self.flows_left = 0

    def label(self) -> str:
        return f"{self.op} #{self.index} over ranks {list(self.group)}"


MessageKey = tuple[int, int, int, int, int]  # (ctx, src, dst, tag, k)


def _describe_message(key: MessageKey) -> str:
    ctx, src, dst, tag, k = key
    return f"message #{k} from rank {src} to rank {dst} on tag {tag} (communicator {ctx})"


def _match_table(reqs: Sequence[int], matches: Any) -> dict[int, tuple[int, ...]]:
    """The wait's ``matches`` as {receive request: (ctx, src, tag, k)}. Accepted shapes: a
    mapping; pairs (req, match); or one entry per request, None for sends."""
    if isinstance(matches, Mapping):
        return {int(req): tuple(m) for req, m in matches.items()}
    items = list(matches or ())
    aligned = len(items) == len(reqs) and all(m is None or len(m) == 4 for m in items)
    if aligned:
        return {int(req): tuple(m) for req, m in zip(reqs, items) if m is not None}
    return {int(req): tuple(m) for req, m in items}


# -- the replay ---------------------------------------------------------------------------------


class _Replayer:
    def __init__(self, traces: Mapping[int, Sequence[Event]], network: Network) -> None:
        self.net = network
        self.link_price: Callable[[str], float] | None = getattr(network, "link_price", None)
        self.ranks = {r: _Rank(r, traces[r]) for r in sorted(traces)}
        self.heap: list[tuple[float, int, int, Any, int]] = []
        self.seq = 0
        self.paths: dict[tuple[int, int], _Path] = {}
        self.link_ids: dict[str, int] = {}
        self.link_cap: list[float] = []
        self.link_paths: list[dict[_Path, None]] = []  # active paths on each link, insertion order
        self.touched: dict[_Path, None] = {}  # paths whose flows changed in this instant
        self.messages: dict[MessageKey, _Flow] = {}
        self.early: dict[MessageKey, list[_Rank]] = {}  # waits on messages not yet sent
        self.received: dict[MessageKey, tuple[int, int]] = {}  # -> (rank, event) that took it
        self.sent: dict[MessageKey, tuple[int, int]] = {}  # every send in the traces
        self.channel_sends: dict[tuple[int, int, int, int], int] = {}
        self.coll_callers: dict[tuple[tuple[int, ...], int], list[int]] = {}
        self.colls: dict[tuple[tuple[int, ...], int], _Coll] = {}
        self.schedules: dict[tuple[str, tuple[int, ...], int], Schedule] = {}
        self.ready: deque[_Rank] = deque()
        self.flows: list[_Flow] = []
        self._prescan()

    # -- before: what the traces promise ---------------------------------------------------------

    def _prescan(self) -> None:
        """Indexes every send and collective call, so that a receive of a message nobody sends
        fails at once with a clear message instead of as a deadlock at the end."""
        for r, rs in self.ranks.items():
            for i, e in enumerate(rs.events):
                if e[0] == SEND and e[5] >= 0:  # k = -1: lost to a fault, never received
                    key = (e[2], r, e[3], e[4], e[5])
                    if key in self.sent:
                        raise ReplayError(
                            f"rank {r}, event {i}: {_describe_message(key)} is sent twice "
                            f"(also at event {self.sent[key][1]}); the trace is corrupt",
                            r, i)
                    self.sent[key] = (r, i)
                    channel = key[:4]
                    self.channel_sends[channel] = self.channel_sends.get(channel, 0) + 1
                elif e[0] in (COLL, ICOLL):
                    op, group, index = e[1:4] if e[0] == COLL else e[2:5]
                    callers = self.coll_callers.setdefault((tuple(group), index), [])
                    if r in callers:
                        raise ReplayError(
                            f"rank {r}, event {i}: {op} #{index} over ranks {list(group)} is "
                            "recorded twice; the trace is corrupt", r, i)
                    callers.append(r)

    # -- the main loop ---------------------------------------------------------------------------

    def run(self) -> Replay:
        self.ready.extend(self.ranks.values())
        self._drain()
        heap = self.heap
        while heap:
            now = heap[0][0]
            while heap and heap[0][0] == now:
                _, _, kind, obj, version = heapq.heappop(heap)
                if kind == _START:
                    self._start(obj, now)
                elif version == obj.version:
                    self._end(obj, now)
                if self.ready:
                    self._drain()
            if self.touched:
                self._reallocate(now)
        stuck = [rs for rs in self.ranks.values() if not rs.done]
        if stuck:
            raise self._deadlock(stuck)
        return self._result()

    def _push(self, time: float, kind: int, obj: Any, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time, self.seq, kind, obj, version))

    def _drain(self) -> None:
        while self.ready:
            self._run(self.ready.popleft())

    # -- ranks -----------------------------------------------------------------------------------

    def _run(self, rs: _Rank) -> None:
        """Runs one rank from its current event until it blocks or ends. Its time is never
        behind the simulation's: it starts at 0 with everything else, and resumes at the latest
        of its own time and the completion that woke it."""
        events, spans, r = rs.events, rs.spans, rs.rank
        i, t = rs.pc, rs.t
        while i < len(events):
            e = events[i]
            kind = e[0]
            if kind == COMPUTE:
                seconds = float(e[1])
                if not seconds >= 0 or seconds == math.inf:
                    raise ReplayError(f"rank {r}, event {i}: compute of {e[1]!r} seconds", r, i)
                spans.append((t, t + seconds))
                t += seconds
                rs.compute += seconds
            elif kind == SEND:
                _, req, ctx, dst, tag, k, nbytes = e[:7]
                # A fault plan may shape the message: (extra latency, bandwidth factor, lost).
                fault = e[7] if len(e) > 9 else None
                if fault is not None and fault[2]:
                    rs.requests[req] = self._lost(r, dst, t, i)
                    spans.append((t, t))
                    i += 1
                    continue
                key = (ctx, r, dst, tag, k)
                extra, factor = (fault[0], fault[1]) if fault is not None else (0.0, 1.0)
                flow = self._post(r, dst, self._nbytes(nbytes, r, i), t, i, extra, factor)
                self.messages[key] = flow
                early = self.early.pop(key, None)
                if early is not None:
                    flow.waiters = early
                rs.requests[req] = flow
                spans.append((t, t))
            elif kind == RECV:
                rs.requests[e[1]] = _Recv(t, e[2], e[3], e[4], i)
                spans.append((t, t))
            elif kind == WAIT:
                outstanding = self._wait_on(rs, i, e)
                if outstanding:
                    rs.pc, rs.t, rs.outstanding = i, t, outstanding
                    return
                spans.append((t, t))
            elif kind == COLL:
                rs.pc, rs.t = i, t
                # Always blocks; the collective's end wakes every blocking member.
                self._arrive(rs, i, e[1], e[2], e[3], e[4], e[5], t, blocking=True)
                return
            elif kind == ICOLL:
                # Posted: the rank goes on; a later wait on the request blocks until it ends.
                coll = self._arrive(rs, i, e[2], e[3], e[4], e[5], e[6], t, blocking=False)
                if e[1] in rs.requests:
                    raise ReplayError(f"rank {r}, event {i}: request {e[1]} is posted twice", r, i)
                rs.requests[e[1]] = coll
                spans.append((t, t))
            elif kind == MARK:
                spans.append((t, t))
                rs.marks.append((str(e[1]), t))
            else:
                raise ReplayError(f"rank {r}, event {i}: unknown event kind {kind!r}", r, i)
            i += 1
        rs.pc, rs.t, rs.done = i, t, True

    def _wait_on(self, rs: _Rank, i: int, e: Event) -> int:
        """Hooks the rank onto every incomplete request of wait event ``e``; returns how many."""
        reqs = tuple(e[1])
        table: dict[int, tuple[int, ...]] | None = None
        outstanding = 0
        for req in reqs:
            got = rs.requests.get(req)
            if got is None:
                raise ReplayError(
                    f"rank {rs.rank}, event {i}: wait on request {req}, which no earlier send or "
                    "receive of this rank posted", rs.rank, i)
            if isinstance(got, _Coll):
                if got.end is None:
                    got.waiters.append(rs)
                    outstanding += 1
                continue
            if isinstance(got, _Flow):
                flow = got
            else:
                key = got.key
                if key is None:
                    if table is None:
                        table = _match_table(reqs, e[2])
                    key = got.key = self._match(rs, i, req, got, table)
                sent = self.messages.get(key)
                if sent is None:  # the sender has not reached its send yet
                    self.early.setdefault(key, []).append(rs)
                    outstanding += 1
                    continue
                flow = sent
            if flow.end is None:
                flow.waiters.append(rs)
                outstanding += 1
        return outstanding

    def _match(self, rs: _Rank, i: int, req: int, recv: _Recv,
               table: dict[int, tuple[int, ...]]) -> MessageKey:
        r = rs.rank
        m = table.get(req)
        if m is None:
            raise ReplayError(
                f"rank {r}, event {i}: the wait names receive request {req} (posted at event "
                f"{recv.event}) but records no message it matched", r, i)
        ctx, src, tag, k = (int(x) for x in m)
        key = (ctx, src, r, tag, k)
        if ctx != recv.ctx or (recv.src >= 0 and src != recv.src) or (recv.tag >= 0 and tag != recv.tag):
            raise ReplayError(
                f"rank {r}, event {i}: receive request {req} was posted for source {recv.src}, "
                f"tag {recv.tag} (communicator {recv.ctx}) but matched {_describe_message(key)}",
                r, i)
        if key not in self.sent:
            sent = self.channel_sends.get((ctx, src, r, tag), 0)
            raise ReplayError(
                f"rank {r}, event {i}: waits for {_describe_message(key)}, matched by its receive "
                f"at event {recv.event}, but rank {src} never sends it: rank {src} sends "
                f"{sent} message(s) to rank {r} on that tag and communicator", r, i)
        if key in self.received:
            other, at = self.received[key]
            raise ReplayError(
                f"rank {r}, event {i}: {_describe_message(key)} is matched twice (also by rank "
                f"{other}, event {at}); the trace is corrupt", r, i)
        self.received[key] = (r, i)
        return key

    def _wake(self, rs: _Rank, now: float) -> None:
        begin = rs.t
        end = now if now > begin else begin
        rs.spans.append((begin, end))
        rs.comm += end - begin
        rs.t = end
        rs.pc += 1
        self.ready.append(rs)

    def _nbytes(self, value: Any, rank: int, event: int) -> int:
        n = int(value)
        if n < 0:
            raise ReplayError(f"rank {rank}, event {event}: a message of {value!r} bytes", rank, event)
        return n

    # -- collectives -----------------------------------------------------------------------------

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
                    flow = self._post(coll.group[g], coll.group[dst], nbytes, t, coll.event[g])
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

    # -- flows -----------------------------------------------------------------------------------

    def _path(self, src: int, dst: int) -> _Path:
        path = self.paths.get((src, dst))
        if path is not None:
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
        path = self.paths[(src, dst)] = _Path(src, dst, route, tuple(limiting))
        return path

    def _post(
        self, src: int, dst: int, nbytes: int, t: float, event: int,
        extra_s: float = 0.0, bandwidth_factor: float = 1.0,
    ) -> _Flow:
        path = self._path(src, dst)
        # A fault's bandwidth factor f is modelled as n/f bytes at the path's rate: the same time
        # alone on the path; the byte and money counts keep the real n.
        timed = nbytes if bandwidth_factor == 1.0 else nbytes / bandwidth_factor
        flow = _Flow(len(self.flows), path, timed, t, event)  # type: ignore[arg-type]
        self.flows.append(flow)
        path.nbytes += nbytes
        self._push(t + extra_s + path.alpha, _START, flow)
        return flow

    def _lost(self, src: int, dst: int, t: float, event: int) -> _Flow:
        """A message a fault dropped: its send completes at once and nothing travels."""
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
        heapq.heappush(path.pending, (path.served + flow.nbytes, flow.seq, flow))
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
        weights = [len(p.pending) for p in order]
        if len(order) == 1:  # the common case (disjoint flows): no filling needed
            rate = order[0].cap
            for j in uses[0]:
                rate = min(rate, remaining[j] / weights[0])
            rates = [rate]
        else:
            rates = _progressive_fill(uses, members, remaining, [p.cap for p in order], weights)
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

    # -- after -----------------------------------------------------------------------------------

    def _deadlock(self, stuck: list[_Rank]) -> ReplayError:
        lines = [self._blocked_on(rs) for rs in stuck]
        first = stuck[0]
        return ReplayError(
            "deadlock: no rank can make progress.\n  " + "\n  ".join(lines), first.rank, first.pc)

    def _blocked_on(self, rs: _Rank) -> str:
        e = rs.events[rs.pc]
        where = f"rank {rs.rank}, event {rs.pc} ({e[0]}, at t={rs.t:.9g} s)"
        if e[0] == COLL:
            coll = self.colls[(tuple(e[2]), int(e[3]))]
            absent = [m for g, m in enumerate(coll.group) if coll.arrival[g] is None]
            return f"{where}: in {coll.label()}, waiting for rank(s) {absent} to arrive"
        waits = []
        for req in tuple(e[1]):
            got = rs.requests[req]
            if isinstance(got, _Coll) and got.end is None:
                absent = [m for g, m in enumerate(got.group) if got.arrival[g] is None]
                waits.append(f"{got.label()} (posted without blocking), which rank(s) {absent} "
                             "have not reached" if absent else f"{got.label()}")
                continue
            if isinstance(got, _Recv) and got.key is not None and got.key not in self.messages:
                src = got.key[1]
                other = self.ranks[src]
                waits.append(f"{_describe_message(got.key)}, which rank {src} has not sent "
                             f"(it is blocked at its event {other.pc}, {other.events[other.pc][0]})")
        return f"{where}: waits for " + "; ".join(waits or ["requests that never complete"])

    def _result(self) -> Replay:
        finish = {r: rs.t for r, rs in self.ranks.items()}
        makespan = max(finish.values(), default=0.0)
        pair_bytes: dict[tuple[int, int], int] = {}
        link_bytes: dict[str, int] = {}
        link_money: dict[str, float] = {}
        money = 0.0
        for (src, dst), path in sorted(self.paths.items(), key=lambda item: item[0]):
            pair_bytes[(src, dst)] = path.nbytes
            money += path.nbytes * path.price
            for name in path.names:
                link_bytes[name] = link_bytes.get(name, 0) + path.nbytes
                price = path.price if self.link_price is None else float(self.link_price(name))
                link_money[name] = link_money.get(name, 0.0) + path.nbytes * price
        order = sorted(link_bytes)
        flows = tuple(
            FlowRecord(f.path.src, f.path.dst, f.nbytes, f.posted, f.start,
                       f.end if f.end is not None else math.nan,
                       "send" if f.coll is None else f.coll.op, f.event)
            for f in self.flows)
        return Replay(
            spans={r: tuple(rs.spans) for r, rs in self.ranks.items()},
            finish=finish,
            makespan=makespan,
            compute_s={r: rs.compute for r, rs in self.ranks.items()},
            comm_s={r: rs.comm for r, rs in self.ranks.items()},
            sync_wait_s={r: rs.sync_wait for r, rs in self.ranks.items()},
            idle_s={r: makespan - t for r, t in finish.items()},
            marks={r: tuple(rs.marks) for r, rs in self.ranks.items()},
            pair_bytes=pair_bytes,
            link_bytes={name: link_bytes[name] for name in order},
            link_money={name: link_money[name] for name in order},
            money=money,
            flows=flows,
        )


def replay(traces: Mapping[int, Sequence[Event]], network: Network) -> Replay:
    """Replays every rank's events (world rank -> events in program order) through ``network``.
    Raises ReplayError for a message received but never sent, a deadlock, or a malformed event."""
    return _Replayer(traces, network).run()


__all__ = [
    "FlowRecord", "Network", "Replay", "ReplayError", "Route", "RouteLike", "max_min_rates",
    "replay",
]

