"""The rank slot round trip and the proxy's counters."""

from __future__ import annotations

import pickle
from pathlib import Path

from distlab.runtime.comm.rankstate import BLOCKED, RankSlot, read_state
from distlab.runtime.comm.stats import CommStats


def test_a_slot_written_by_a_rank_is_read_back_by_the_supervisor(tmp_path: Path) -> None:
    slot = RankSlot(tmp_path / "state-3.bin")
    slot.task = 2
    slot.blocked("Sendrecv", (4, 2), 4096)
    state = read_state(tmp_path, 3)
    assert state is not None
    assert (state.state, state.op, state.peers, state.nbytes, state.task) == (
        "blocked", "Sendrecv", (4, 2), 4096, 2)
    before = state.seq
    slot.running()
    after = read_state(tmp_path, 3)
    assert after is not None and after.state == "running" and after.seq == before + 1
    assert BLOCKED == 2


def test_a_missing_slot_reads_as_none(tmp_path: Path) -> None:
    assert read_state(tmp_path, 0) is None


def test_stats_count_per_op_and_peer_and_diff_by_snapshot() -> None:
    stats = CommStats()
    stats.count_call("Send", 100)
    stats.count_send(1, 100)
    before = stats.snapshot()
    stats.count_call("Allreduce", 800)
    stats.count_send(2, 50)
    delta = stats.since(before)
    assert dict(delta.calls) == {"Allreduce": 1}
    assert delta.bytes_sent == 50 and stats.bytes_sent == 150
    assert delta.collectives_used() == ["Allreduce"]
    assert stats.to_dict()["sent_bytes_by_peer"] == {"1": 100, "2": 50}


def test_stats_pickle_round_trip() -> None:
    stats = CommStats()
    stats.count_send(3, 7)
    copy = pickle.loads(pickle.dumps(stats))
    copy.count_send(3, 1)
    assert copy.sent_bytes[3] == 8 and copy.messages_sent == 2


def test_the_sent_log_stops_copying_at_its_limit_and_says_so() -> None:
    import numpy as np

    from distlab.runtime.comm import sent

    log = sent.SentLog()
    whole = np.zeros(sent.SENT_LIMIT_BYTES // 8 - 1)
    log.add("Send", 1, whole, 0)
    log.add("Send", 1, np.ones(1), 0)  # exactly at the limit: kept
    assert (len(log.items), log.overflowed) == (2, False)
    log.add("Allreduce", sent.COLLECTIVE, np.ones(1), 0)
    assert (len(log.items), log.nbytes, log.overflowed) == (2, sent.SENT_LIMIT_BYTES, True)
    assert log.items[0].data is not whole  # a copy: the buffer may change after the call
