"""The wait-for graph and the launcher's verdicts, on made-up observations (no processes)."""

from __future__ import annotations

from distlab.runtime.comm.rankstate import ALL_PEERS, Communicator, RankState
from distlab.runtime.supervisor import waitfor
from distlab.runtime.supervisor.judge import Observation, is_stuck, judge


def st(rank: int, state: str = "blocked", op: str = "Recv", peers: tuple[int, ...] = ()) -> RankState:
    return RankState(rank, state, op, peers, 0, 1, 0.0)


def test_a_ring_of_receives_is_a_cycle_named_in_waiting_order() -> None:
    states = [st(0, peers=(3,)), st(1, peers=(0,)), st(2, peers=(1,)), st(3, peers=(2,))]
    graph = waitfor.build(states, 4)
    assert graph.cycle == (0, 3, 2, 1)
    assert waitfor.cycle_sentence(graph.cycle) == "rank 0 waits on 3, 3 on 2, 2 on 1, 1 on 0"
    assert "a cycle" in graph.describe()


def test_a_chain_ending_at_a_running_rank_is_no_cycle() -> None:
    states = [st(0, peers=(1,)), st(1, peers=(2,)), st(2, state="running")]
    assert waitfor.build(states, 3).cycle is None


def test_a_two_rank_send_send_cycle() -> None:
    states = [st(0, op="Send", peers=(1,)), st(1, op="Send", peers=(0,))]
    assert waitfor.build(states, 2).cycle == (0, 1)


def test_a_collective_waits_only_on_ranks_not_in_it() -> None:
    states = [st(0, op="Allreduce", peers=(ALL_PEERS,)), st(1, op="Allreduce", peers=(ALL_PEERS,)),
              st(2, op="Recv", peers=(0,))]
    graph = waitfor.build(states, 3)
    assert graph.edges[0] == (2,)
    assert graph.cycle in ((0, 2), (2, 0))


def test_describe_reads_as_sentences() -> None:
    assert st(2, op="Send", peers=(3,)).describe() == "rank 2 waits to send to 3 in Send"
    assert st(1, op="Recv", peers=()).describe() == "rank 1 waits to receive from any rank in Recv"
    assert st(0, state="finished").describe() == "rank 0 is finished"


def obs(states: list[RankState], stalled: float = 10.0, elapsed: float = 1.0,
        exited: bool = False) -> Observation:
    return Observation(elapsed, exited, {}, states, stalled)


def test_judge_waits_while_anything_runs() -> None:
    states = [st(0, peers=(1,)), st(1, state="running")]
    assert judge(obs(states), 2, deadline_s=60, stall_s=3).action == "wait"


def test_judge_calls_a_deadlock_when_all_wait_and_nothing_moves() -> None:
    states = [st(0, peers=(1,)), st(1, peers=(0,))]
    assert judge(obs(states, stalled=3.5), 2, 60, 3).action == "deadlock"
    assert judge(obs(states, stalled=1.0), 2, 60, 3).action == "wait"


def test_everyone_in_the_same_collective_is_slow_not_stuck() -> None:
    states = [st(r, op="Allreduce", peers=(ALL_PEERS,)) for r in range(4)]
    assert not is_stuck(states, 4)
    assert judge(obs(states, stalled=100), 4, 60, 3).action == "wait"


def test_idle_ranks_in_a_batch_do_not_hide_a_deadlock() -> None:
    states = [st(0, op="Send", peers=(1,)), st(1, op="Send", peers=(0,)),
              st(2, state="idle", op="-"), st(3, state="idle", op="-")]
    assert is_stuck(states, 4)


def test_judge_deadline_and_crash() -> None:
    running = [st(0, state="running")]
    assert judge(obs(running, elapsed=61), 1, 60, 3).action == "timeout"
    assert judge(obs(running, exited=True), 1, 60, 3).action == "crashed"


def test_missing_states_are_never_a_deadlock() -> None:
    assert not is_stuck([st(0, peers=(1,))], 2)


def test_a_launcher_that_died_before_any_rank_is_retried_only_for_known_reasons() -> None:
    from distlab.runtime.supervisor import LaunchResult
    from distlab.runtime.supervisor.start import failed_to_start

    pmix = LaunchResult("crashed", "mpi", 2, 0.1, details="launcher output:\nThe PMIx server's listener thread failed to start")
    assert failed_to_start(pmix)
    assert not failed_to_start(LaunchResult("crashed", "mpi", 2, 0.1, details="Segmentation fault"))
    assert not failed_to_start(LaunchResult("deadlock", "mpi", 2, 0.1, details=pmix.details))


# -- sub-communicators: a collective waits on its own members only ---------------------------------

EVENS, ODDS = Communicator("0/0.0", (0, 2, 4, 6)), Communicator("0/0.1", (1, 3, 5, 7))
BY_CONTEXT = {11: EVENS, 12: ODDS}


def in_sub(rank: int, ctx: int, op: str = "Allreduce") -> RankState:
    return RankState(rank, "blocked", op, (ALL_PEERS,), 0, 1, 0.0, comm=ctx)


def test_groups_each_inside_their_own_collective_are_not_stuck() -> None:
    # The evens' Allreduce has all its members; the odds' lacks 7: the evens go on, so does 7.
    states = [in_sub(r, 11) for r in (0, 2, 4, 6)] + [in_sub(r, 12) for r in (1, 3, 5)] + [
        st(7, peers=(0,))]
    assert not is_stuck(states, 8, BY_CONTEXT)
    # Without the members, two collectives of one name would pass for one that lacks rank 7.
    assert is_stuck(states, 8, {})


def test_a_cycle_through_two_sub_communicators_is_named_with_them() -> None:
    states = [in_sub(r, 11) for r in (0, 2, 4)] + [st(6, peers=(1,))] + [
        in_sub(r, 12) for r in (1, 3, 5)] + [st(7, peers=(0,))]
    assert is_stuck(states, 8, BY_CONTEXT)
    graph = waitfor.build(states, 8, BY_CONTEXT)
    assert graph.edges[0] == (6,) and graph.edges[1] == (7,)  # its communicator's missing member
    assert graph.cycle == (0, 6, 1, 7)
    lines = graph.describe().splitlines()
    assert lines[0] == ("rank 0 is blocked in Allreduce on communicator 0/0.0 (world ranks 0, 2, 4, 6) "
                        "(waits for every rank of its communicator)")
    assert lines[6] == "rank 6 waits to receive from 1 in Recv"


def test_ranks_waiting_with_a_timeout_are_not_stuck_and_say_when_they_give_up() -> None:
    """A ring of receives is a deadlock, unless one of them has a timeout: that rank returns by
    itself (runtime/comm/timed.py), and its line says when."""
    import time

    from distlab.runtime.supervisor.judge import survivors_stuck

    ring = [st(0, peers=(2,)), st(1, peers=(0,)), st(2, peers=(1,))]
    assert is_stuck(ring, 3) and survivors_stuck(ring, 3, frozenset())
    timed = RankState(0, "blocked", "Recv", (2,), 0, 1, 0.0, until=time.monotonic() + 4.0)
    assert not is_stuck([timed, *ring[1:]], 3)
    assert not survivors_stuck([timed, *ring[1:]], 3, frozenset())
    assert timed.describe().startswith("rank 0 waits to receive from 2 in Recv, and gives up in ")
    assert ring[0].describe() == "rank 0 waits to receive from 2 in Recv"
