"""The trace recorder: the hot path logs short records, ``events`` numbers them as MPI matches.

A message is named by (ctx, src, dst, tag, k) on both sides without any header on the wire, so k
must follow MPI's matching order exactly: a send takes the next place of its channel when it is
posted; a receive from a named source and tag when it is posted; a wildcard receive when it
completes. These tests mix blocking and nonblocking calls on one channel and check every k.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from distlab.runtime.trace.events import TraceRecorder


def test_sends_are_numbered_per_channel_in_posting_order_whatever_the_call() -> None:
    trace = TraceRecorder(0)
    first = trace.send(0, 1, 7, 8, None, 0.0)  # Isend to 1, tag 7
    trace.blocking_send(0, 1, 7, 8, None, 0.1, 0.2)  # Send to 1, tag 7
    trace.blocking_send(0, 2, 7, 8, None, 0.3, 0.4)  # another channel starts at 0
    trace.sendrecv(0, 1, 7, 8, None, 1, 7, 8, 1, 7, 0.5, 0.6)
    trace.wait(0, (first,), [], 0.7, 0.8)
    sends = [e for e in trace.events if e[0] == "send"]
    assert [(e[3], e[4], e[5]) for e in sends] == [(1, 7, 0), (1, 7, 1), (2, 7, 0), (1, 7, 2)]
    # Request ids are unique and increase in call order, blocking calls included.
    ids = [e[1] for e in trace.events if e[0] in ("send", "recv")]
    assert ids == sorted(set(ids)) and ids[0] == 1


def test_a_named_receive_is_placed_when_posted_a_wildcard_one_when_it_completes() -> None:
    trace = TraceRecorder(0)
    wildcard = trace.recv(0, -1, -1, 8, 0.0)  # Irecv(any source, any tag) posted first
    named = trace.recv(0, 3, 5, 8, 0.1)  # Irecv(source 3, tag 5) posted second
    # The wildcard one completes after the named one, with a message from 3, tag 5: it is the
    # second message of that channel, although it was posted first.
    trace.wait(0, (named,), [(named, 3, 5)], 0.2, 0.3)
    trace.wait(0, (wildcard,), [(wildcard, 3, 5)], 0.4, 0.5)
    trace.blocking_recv(0, 3, 5, 8, 3, 5, 0.6, 0.7)
    waits = [e for e in trace.events if e[0] == "wait"]
    assert waits[0][2] == {named: (0, 3, 5, 0)}
    assert waits[1][2] == {wildcard: (0, 3, 5, 1)}
    assert next(iter(waits[2][2].values())) == (0, 3, 5, 2)


def test_a_dropped_send_takes_no_place_and_collectives_count_per_group() -> None:
    trace = TraceRecorder(0)
    trace.blocking_send(0, 1, 0, 8, (0.0, 1.0, True), 0.0, 0.0)  # dropped by a fault
    trace.blocking_send(0, 1, 0, 8, (0.002, 0.5, False), 0.1, 0.2)  # delayed, slowed
    trace.collective("Allreduce", (0, 1), 64, -1, 0.3, 0.4)
    trace.icollective("Allreduce", (0, 1), 64, -1, 0.5, 0.6)
    trace.collective("Barrier", (0, 1, 2), 0, -1, 0.7, 0.8)
    trace.add(("mark", "step", 0.9, 0.9))
    events = trace.events
    sends = [e for e in events if e[0] == "send"]
    assert [e[5] for e in sends] == [-1, 0]
    assert sends[1][7] == (0.002, 0.5, False)
    # ("coll", op, group, index, ...) and ("icoll", req, op, group, index, ...): one count per
    # group, shared by blocking and nonblocking collectives.
    indexes = [e[3] if e[0] == "coll" else e[4] for e in events if e[0] in ("coll", "icoll")]
    assert indexes == [0, 1, 0]
    assert events[-1] == ("mark", "step", 0.9, 0.9)


def test_reading_events_twice_gives_the_same_list_and_later_calls_extend_it() -> None:
    trace = TraceRecorder(0)
    trace.blocking_send(0, 1, 0, 8, None, 0.0, 0.1)
    once = list(trace.events)
    assert trace.events == once
    trace.blocking_send(0, 1, 0, 8, None, 0.2, 0.3)
    assert trace.events[: len(once)] == once
    assert trace.events[-2][5] == 1  # the second message of the channel


def test_a_held_message_is_recorded_with_its_wait_from_the_send_time() -> None:
    # A partition window holds a message until t = 5 ms; sent at t = 1 ms, the replay must see a
    # 4 ms hold, computed before the send moves the sender's clock to the arrival.
    from distlab.platforms import uniform
    from distlab.runtime.clock.online import Timekeeper
    from distlab.runtime.comm.proxy import Comm
    from distlab.runtime.faults.decide import MessageAction

    class Side:
        rank, size, world_ranks = 0, 2, [0, 1]

        def send(self, *args: Any) -> None:
            pass

    class Engine(Side):
        name = "stub"

        def sendrecv(self, *args: Any) -> tuple[int, int]:
            return 1, 0

    class HoldEverything:
        def decide(self, *args: Any) -> MessageAction:
            return MessageAction(hold_until_s=5e-3, causes=("fault[0] partition",))

        def on_call(self, step: int, vtime_s: float) -> bool:
            return False

    trace = TraceRecorder(0)
    clock = Timekeeper(uniform(2, 1e-6, 1e-9), Side(), start_s=1e-3)  # type: ignore[arg-type]
    clock.receive_stamp = lambda source, tag: 0.0  # type: ignore[method-assign]
    comm = Comm(Engine(), trace=trace, clock=clock, faults=HoldEverything())  # type: ignore[arg-type]
    buf = np.zeros(10_000)  # past the eager limit: the Sendrecv ends when the held bytes are in
    comm.Sendrecv(buf, 1, 0, np.empty(4), 1, 0)
    send = next(e for e in trace.events if e[0] == "send")
    assert send[7] == pytest.approx((4e-3, 1.0, False))
    assert comm.now() > 5e-3  # the clock did move past the hold, after the record was taken
