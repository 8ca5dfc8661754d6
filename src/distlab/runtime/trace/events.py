"""What each rank did, in order: the record the replay and the trace exporter work from.

The comm proxy appends one small tuple per event (cheap enough for the hot path); the supervisor
gets every rank's list in its outcome file. Messages are identified without any header on the
wire: MPI and gloo deliver messages of one (source, destination, tag) channel in send order, so
the k-th send on a channel is the k-th receive on it. Both sides count per channel, and
(ctx, src, dst, tag, k) names the message on both; ``ctx`` numbers the communicator (the same
number on every rank: communicators are made by collective calls, in the same order everywhere).

Event kinds (the first field), with wall-clock begin and end (``time.perf_counter``) last:

  ("compute", seconds, label, wall0, wall1)
      declared work, already converted to seconds (FLOPs over the device, slow-rank factor).
  ("send", req, ctx, dst, tag, k, nbytes, wall0, wall1)
      a send is posted: request ``req`` (an int unique within the rank). A blocking Send is a
      "send" followed by a "wait" on its request.
  ("recv", req, ctx, src, tag, nbytes, wall0, wall1)
      a receive is posted (src may be -1: any source; tag may be -1: any tag).
  ("wait", reqs, matches, wall0, wall1)
      blocks until every request in ``reqs`` (a tuple) has completed. ``matches`` maps each
      receive request among them to the message it matched, as (ctx, src, tag, k); sends and
      nonblocking collectives have no entry.
  ("coll", op, group, index, nbytes, root, wall0, wall1)
      a built-in collective over ``group`` (a tuple of world ranks, in group-rank order);
      ``index`` counts collectives on that group, so the replay can line up the participants.
      ``nbytes`` is the caller's buffer (runtime/clock/collectives_cost.py says which), except
      for "Alltoallv": a tuple of the bytes this rank sends to each group rank.
  ("icoll", req, op, group, index, nbytes, root, wall0, wall1)
      a nonblocking collective is posted (``comm.Iallreduce``: op "Allreduce"), as request
      ``req``; the other fields as for "coll", and ``index`` shares the group's count with the
      blocking collectives (MPI orders every collective of a communicator together). The rank
      goes on at once; a later "wait" naming ``req`` (with no entry in ``matches``) blocks until
      the collective has finished. In the replay the collective starts when the last member has
      posted it, and its flows run while the ranks compute.
  ("mark", name, wall0, wall1)
      a marker set by problem code (for example "step" at each training step boundary).
  ("store", op, key, nbytes, wall0, wall1)
      a call on the task's key-value store (runtime/comm/store.py: "set", "get", ...), which
      costs nothing on the virtual clock (it goes to the supervisor, not over the modelled
      network); ``nbytes`` is the value's size, ``key`` the key (keys, comma-joined, for wait).
  ("timeout", call, peer, seconds, wall0, wall1)
      a blocking call gave up after its timeout (runtime/comm/timed.py): ``call`` ("Recv",
      "Allreduce", "store.get", ...), ``peer`` what it waited on (a world rank, -1 for any, a
      tuple of world ranks for a collective, the key for the store), ``seconds`` the timeout,
      which the replay charges as waiting. What the call had started stays in the trace before
      it: a send as a "send" never waited on, a collective as an "icoll" never waited on (its
      members may still finish it); a receive that was withdrawn leaves nothing.

Ranks in events are world ranks.
"""

from __future__ import annotations

from typing import Any, Sequence

Event = tuple[Any, ...]

COMPUTE, SEND, RECV, WAIT, COLL, MARK = "compute", "send", "recv", "wait", "coll", "mark"
ICOLL = "icoll"
STORE = "store"
TIMEOUT = "timeout"

# What the hot path logs: one short tuple per call, its first field one of these codes. Numbering
# messages and collectives (the ``k`` and ``index`` above) waits until someone reads ``events``:
# dictionary work per call would cost the proxy microseconds that real transports do not spend.
_SEND, _RECV, _WAIT, _SEND_WAIT, _RECV_WAIT, _SENDRECV, _COLL, _ICOLL, _DONE = range(9)

# A fault on a send, as the replay reads it: (extra latency s, bandwidth factor, dropped).
Fault = tuple[float, float, bool]


class TraceRecorder:
    """Records the events of one rank; shared by every communicator of that rank.

    The proxy calls one method per communication call; ``events`` gives them in the documented
    form above. Request ids (``req``) are numbered from 1 as calls are made, so a ``Request``
    can hold its own."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._log: list[tuple[Any, ...]] = []
        self._next_req = 0
        # The expanded form, built incrementally from the log by ``events``.
        self._events: list[Event] = []
        self._expanded = 0
        self._send_count: dict[tuple[int, int, int], int] = {}
        self._recv_count: dict[tuple[int, int, int], int] = {}
        self._coll_count: dict[tuple[int, ...], int] = {}
        self._posted_index: dict[int, int] = {}  # receive request -> k, fixed when posted

    # -- the hot path: append and return -------------------------------------------------------

    def send(self, ctx: int, dst: int, tag: int, nbytes: int, fault: Fault | None, wall0: float) -> int:
        """A posted send (Isend); its completion is a later ``wait``. Returns its request id."""
        self._next_req += 1
        self._log.append((_SEND, self._next_req, ctx, dst, tag, nbytes, fault, wall0))
        return self._next_req

    def recv(self, ctx: int, src: int, tag: int, nbytes: int, wall0: float) -> int:
        """A posted receive (Irecv); ``src`` and ``tag`` may be -1 (any). Returns its id."""
        self._next_req += 1
        self._log.append((_RECV, self._next_req, ctx, src, tag, nbytes, wall0))
        return self._next_req

    def wait(
        self, ctx: int, reqs: tuple[int, ...], received: Sequence[tuple[int, int, int]],
        wall0: float, wall1: float,
    ) -> None:
        """Requests ``reqs`` completed; ``received`` holds (req, src, tag) of each receive among
        them, as matched."""
        self._log.append((_WAIT, ctx, reqs, tuple(received), wall0, wall1))

    def blocking_send(
        self, ctx: int, dst: int, tag: int, nbytes: int, fault: Fault | None, wall0: float, wall1: float
    ) -> None:
        self._next_req += 1
        self._log.append((_SEND_WAIT, self._next_req, ctx, dst, tag, nbytes, fault, wall0, wall1))

    def blocking_recv(
        self, ctx: int, src: int, tag: int, nbytes: int, got_src: int, got_tag: int,
        wall0: float, wall1: float,
    ) -> None:
        self._next_req += 1
        self._log.append((_RECV_WAIT, self._next_req, ctx, src, tag, nbytes, got_src, got_tag, wall0, wall1))

    def sendrecv(
        self, ctx: int, dst: int, sendtag: int, send_nbytes: int, fault: Fault | None,
        src: int, recvtag: int, recv_nbytes: int, got_src: int, got_tag: int,
        wall0: float, wall1: float,
    ) -> None:
        self._next_req += 2  # the send's id, then the receive's
        self._log.append((
            _SENDRECV, self._next_req, ctx, dst, sendtag, send_nbytes, fault, src, recvtag, recv_nbytes,
            got_src, got_tag, wall0, wall1,
        ))

    def collective(
        self, op: str, group: tuple[int, ...], nbytes: int | tuple[int, ...], root: int,
        wall0: float, wall1: float,
    ) -> None:
        self._log.append((_COLL, op, group, nbytes, root, wall0, wall1))

    def icollective(
        self, op: str, group: tuple[int, ...], nbytes: int, root: int, wall0: float, wall1: float
    ) -> int:
        self._next_req += 1
        self._log.append((_ICOLL, self._next_req, op, group, nbytes, root, wall0, wall1))
        return self._next_req

    def add(self, event: Event) -> None:
        """An event already in its final form (compute, mark): no numbering needed."""
        self._log.append((_DONE, event))

    # -- the documented form -----------------------------------------------------------------

    @property
    def events(self) -> list[Event]:
        log, out = self._log, self._events
        for i in range(self._expanded, len(log)):
            self._expand(log[i], out)
        self._expanded = len(log)
        return out

    def _expand(self, r: tuple[Any, ...], out: list[Event]) -> None:
        # Numbering follows the order of the calls, exactly as MPI matches: a send takes the next
        # place in its channel when posted, a receive from a named source and tag when posted, a
        # wildcard receive when it completes (then its channel is known).
        code = r[0]
        if code == _DONE:
            out.append(r[1])
        elif code == _SENDRECV:
            _, rreq, ctx, dst, stag, snb, fault, src, rtag, rnb, gsrc, gtag, w0, w1 = r
            sreq = rreq - 1
            out.append((SEND, sreq, ctx, dst, stag, self._send_index(ctx, dst, stag, fault), snb, fault, w0, w0))
            out.append((RECV, rreq, ctx, src, rtag, rnb, w0, w0))
            out.append((WAIT, (sreq, rreq), {rreq: (ctx, gsrc, gtag, self._recv_index(ctx, gsrc, gtag))}, w0, w1))
        elif code == _SEND_WAIT:
            _, req, ctx, dst, tag, nb, fault, w0, w1 = r
            out.append((SEND, req, ctx, dst, tag, self._send_index(ctx, dst, tag, fault), nb, fault, w0, w0))
            out.append((WAIT, (req,), {}, w0, w1))
        elif code == _RECV_WAIT:
            _, req, ctx, src, tag, nb, gsrc, gtag, w0, w1 = r
            out.append((RECV, req, ctx, src, tag, nb, w0, w0))
            out.append((WAIT, (req,), {req: (ctx, gsrc, gtag, self._recv_index(ctx, gsrc, gtag))}, w0, w1))
        elif code == _SEND:
            _, req, ctx, dst, tag, nb, fault, w0 = r
            out.append((SEND, req, ctx, dst, tag, self._send_index(ctx, dst, tag, fault), nb, fault, w0, w0))
        elif code == _RECV:
            _, req, ctx, src, tag, nb, w0 = r
            if src >= 0 and tag >= 0:
                self._posted_index[req] = self._recv_index(ctx, src, tag)
            out.append((RECV, req, ctx, src, tag, nb, w0, w0))
        elif code == _WAIT:
            _, ctx, reqs, received, w0, w1 = r
            matches = {}
            for req, src, tag in received:
                k = self._posted_index.pop(req, None)
                matches[req] = (ctx, src, tag, self._recv_index(ctx, src, tag) if k is None else k)
            out.append((WAIT, reqs, matches, w0, w1))
        elif code == _COLL:
            _, op, group, nb, root, w0, w1 = r
            out.append((COLL, op, group, self._coll_index(group), nb, root, w0, w1))
        elif code == _ICOLL:
            _, req, op, group, nb, root, w0, w1 = r
            out.append((ICOLL, req, op, group, self._coll_index(group), nb, root, w0, w1))

    def _send_index(self, ctx: int, dst: int, tag: int, fault: Fault | None) -> int:
        if fault is not None and fault[2]:
            return -1  # dropped: never delivered, it takes no place in the channel's order
        key = (ctx, dst, tag)
        k = self._send_count.get(key, 0)
        self._send_count[key] = k + 1
        return k

    def _recv_index(self, ctx: int, src: int, tag: int) -> int:
        key = (ctx, src, tag)
        k = self._recv_count.get(key, 0)
        self._recv_count[key] = k + 1
        return k

    def _coll_index(self, group: tuple[int, ...]) -> int:
        k = self._coll_count.get(group, 0)
        self._coll_count[group] = k + 1
        return k
