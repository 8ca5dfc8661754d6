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
  ("icoll", req, op, group, index, nbytes, root, wall0, wall1)
      a nonblocking collective is posted (``comm.Iallreduce``: op "Allreduce"), as request
      ``req``; the other fields as for "coll", and ``index`` shares the group's count with the
      blocking collectives (MPI orders every collective of a communicator together). The rank
      goes on at once; a later "wait" naming ``req`` (with no entry in ``matches``) blocks until
      the collective has finished. In the replay the collective starts when the last member has
      posted it, and its flows run while the ranks compute.
  ("mark", name, wall0, wall1)
      a marker set by problem code (for example "step" at each training step boundary).

Ranks in events are world ranks.
"""

from __future__ import annotations

from typing import Any

Event = tuple[Any, ...]

COMPUTE, SEND, RECV, WAIT, COLL, MARK = "compute", "send", "recv", "wait", "coll", "mark"
ICOLL = "icoll"


class TraceRecorder:
    """Appends events for one rank; shared by every communicator of that rank."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.events: list[Event] = []
        self._next_req = 0
        self._send_count: dict[tuple[int, int, int], int] = {}
        self._recv_count: dict[tuple[int, int, int], int] = {}
        self._coll_count: dict[tuple[int, ...], int] = {}

    def new_request(self) -> int:
        self._next_req += 1
        return self._next_req

    def next_send_index(self, ctx: int, dst: int, tag: int) -> int:
        key = (ctx, dst, tag)
        k = self._send_count.get(key, 0)
        self._send_count[key] = k + 1
        return k

    def next_recv_index(self, ctx: int, src: int, tag: int) -> int:
        key = (ctx, src, tag)
        k = self._recv_count.get(key, 0)
        self._recv_count[key] = k + 1
        return k

    def next_collective_index(self, group: tuple[int, ...]) -> int:
        k = self._coll_count.get(group, 0)
        self._coll_count[group] = k + 1
        return k

    def add(self, event: Event) -> None:
        self.events.append(event)
