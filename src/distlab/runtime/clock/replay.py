"""The virtual clock: every rank's recorded events replayed through a fluid network model.

    from distlab.runtime.clock.replay import replay
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
- The point-to-point messages of one ordered pair go through one *channel*, first in, first out
  (an MPI connection delivers in order): a message's bytes move once the pair's earlier ones are
  in, so a burst of Isends to one peer completes one message after another, as the online clock
  times it too. The flows of a collective share their pair's path equally instead.
- Sends follow MPI's protocols. One of at most ``eager_limit`` bytes (64 KiB, as the proxy's)
  is *eager*: its request completes when posted (copying the message out is the sender's own
  work, not modelled: ``online.SEND_OVERHEAD_S``), while its flow moves on. A larger one is a
  *rendezvous*: its request completes when its flow has delivered everything. A receive request
  completes at max(posted, delivery of the message it matched). "wait" ends at the latest
  completion among its requests, or at once.
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

Not modelled: per-message CPU overheads; a rendezvous' wait for a late receive (its flow moves
from the send on, whether or not the receive is posted: the online clock could learn the
receiver's post time only from a reply, which could deadlock a correct program, and the two
clocks keep one model); Ssend below the eager limit (timed as an eager send: the trace does not
tell them apart); and requests completed by Test instead of Wait.

Implementation notes. The flows of one ordered (src, dst) pair cross the same links with the same
cap, so the simulator keeps them together in a ``_Path`` (two per pair: its channel and its
collectives' path) with one "bytes served" counter. On a shared path max-min fairness gives its
flows the same rate, the counter counts bytes per flow, and a flow that joins when it reads S is
done when it reads S + nbytes; on a channel the counter counts the path's bytes and a flow is
done at the previous flow's mark + nbytes. A burst of a thousand Isends to one peer therefore
costs one rate computation per event, not a thousand. A heap orders the events by (time, sequence number);
entries for a path are invalidated by a version number when its rate changes.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from ..trace.events import (
    COLL,
    COMPUTE,
    ICOLL,
    MARK,
    RECV,
    SEND,
    STORE,
    TIMEOUT,
    WAIT,
    Event,
)
from .collectives_replay import CollectiveReplay, _Coll
from .fairshare import max_min_rates
from .flows import _START, _Flow
from .network import FlowRecord, Network, Replay, ReplayError, Route, RouteLike
from .online import EAGER_LIMIT


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


MessageKey = tuple[int, int, int, int, int]  # (ctx, src, dst, tag, k)


def _seconds(value: Any, what: str, rank: int, event: int) -> float:
    """An event's duration, once it is one: a finite number of seconds >= 0."""
    seconds = float(value)
    if not seconds >= 0 or seconds == math.inf:
        raise ReplayError(f"rank {rank}, event {event}: {what} {value!r} seconds", rank, event)
    return seconds


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
class _Replayer(CollectiveReplay):
    def __init__(self, traces: Mapping[int, Sequence[Event]], network: Network,
                 eager_limit: int = EAGER_LIMIT) -> None:
        super().__init__(network)
        self.ranks = {r: _Rank(r, traces[r]) for r in sorted(traces)}
        self.eager_limit = eager_limit
        self.messages: dict[MessageKey, _Flow] = {}
        self.early: dict[MessageKey, list[_Rank]] = {}  # waits on messages not yet sent
        self.received: dict[MessageKey, tuple[int, int]] = {}  # -> (rank, event) that took it
        self.sent: dict[MessageKey, tuple[int, int]] = {}  # every send in the traces
        self.channel_sends: dict[tuple[int, int, int, int], int] = {}
        self.ready: deque[_Rank] = deque()
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
                seconds = _seconds(e[1], "compute of", r, i)
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
                n = self._nbytes(nbytes, r, i)
                flow = self._post(r, dst, n, t, i, extra, factor)
                self.messages[key] = flow
                early = self.early.pop(key, None)
                if early is not None:
                    flow.waiters = early
                # Eager: the sender is done once posted; a rendezvous, once its bytes are in.
                rs.requests[req] = self._lost(r, dst, t, i) if n <= self.eager_limit else flow
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
            elif kind == STORE:  # the side channel: no time on the modelled network
                spans.append((t, t))
            elif kind == TIMEOUT:  # a call waited its whole timeout, then gave up
                seconds = _seconds(e[3], "a timeout of", r, i)
                spans.append((t, t + seconds))
                t += seconds
                rs.comm += seconds
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
        for (src, dst, _), path in sorted(self.paths.items(), key=lambda item: item[0]):
            pair_bytes[(src, dst)] = pair_bytes.get((src, dst), 0) + path.nbytes
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


def replay(traces: Mapping[int, Sequence[Event]], network: Network,
           eager_limit: int = EAGER_LIMIT) -> Replay:
    """Replays every rank's events (world rank -> events in program order) through ``network``;
    sends of more than ``eager_limit`` bytes are rendezvous (see the module notes).
    Raises ReplayError for a message received but never sent, a deadlock, or a malformed event."""
    return _Replayer(traces, network, eager_limit).run()


__all__ = [
    "FlowRecord", "Network", "Replay", "ReplayError", "Route", "RouteLike", "max_min_rates",
    "replay",
]
