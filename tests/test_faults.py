"""Fault plans: every kind parses from TOML and decides as docs/fault-plans.md says; no processes.

The decisions are pure, so each scenario is a story told with a fake clock: a rank at step s and
virtual time t asks what happens to its k-th message to a peer, or the supervisor asks which signal
is due. Randomness is checked for being a function of the plan and the message, never of timing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from distlab.errors import DistlabError
from distlab.platforms import uniform
from distlab.runtime.faults.plans import (
    KINDS,
    FaultPlan,
    FaultPlanError,
    MessageAction,
    MessageFaults,
    ProcessAction,
    ProcessFaults,
    draw,
    load_fault_plan,
    parse_fault_plan,
)

HEAD = "format_version = 1\nseed = 7\n"


def plan_from(tmp_path: Path, body: str, head: str = HEAD) -> FaultPlan:
    path = tmp_path / "faults.toml"
    path.write_text(head + textwrap.dedent(body))
    return load_fault_plan(path)


# -- every kind parses ----------------------------------------------------------------------------

ONE_OF_EACH = """
[[fault]]
kind = "delay"
src = 1
dst = [2, 3]
latency_s = 0.002
wall = true
[[fault]]
kind = "spike"
latency_s = 0.05
probability = 0.1
[[fault]]
kind = "bandwidth"
groups = [[0, 1], [2, 3]]
gbps = 1.0
[[fault]]
kind = "drop"
src = "all"
dst = 3
probability = 0.3
[[fault]]
kind = "partition"
groups = [[0, 1], [2, 3]]
from_s = 1.0
until_s = 3.0
mode = "hold"
[[fault]]
kind = "dead"
rank = 3
at_step = 30
[[fault]]
kind = "hung"
rank = 2
at_s = 1.5
[[fault]]
kind = "kill"
rank = 3
at_step = 30
[[fault]]
kind = "stop"
rank = 1
at_s = 5.0
cont_after_s = 2.0
[[fault]]
kind = "slow"
ranks = [1, 2]
factor = 3.0
[[fault]]
kind = "restart"
max_restarts = 2
"""


def test_a_plan_with_one_fault_of_each_kind_parses_and_describes_itself(tmp_path: Path) -> None:
    plan = plan_from(tmp_path, ONE_OF_EACH)
    assert [f.kind for f in plan.faults] == [
        "delay", "spike", "bandwidth", "drop", "partition", "dead", "hung", "kill", "stop", "slow", "restart",
    ]
    assert [f.index for f in plan.faults] == list(range(11))
    delay, spike, bw, drop, part, dead, hung, kill, stop, slow, restart = plan.faults
    assert delay.src == {1} and delay.dst == {2, 3} and delay.latency_s == 0.002 and delay.wall
    assert spike.probability == 0.1 and spike.src is None
    assert bw.groups == (frozenset({0, 1}), frozenset({2, 3})) and bw.gbps == 1.0
    assert drop.src is None and drop.dst == {3}
    assert part.mode == "hold" and part.window.until_s == 3.0
    assert dead.ranks == {3} and dead.at_step == 30
    assert stop.cont_after_s == 2.0 and slow.factor == 3.0 and restart.max_restarts == 2
    assert plan.seed == 7 and plan.seed_origin == "file"

    text = plan.describe()
    assert text.startswith(f"fault plan {tmp_path / 'faults.toml'}: seed 7 (from the plan):")
    assert "fault[7] kill: rank 3 is killed (SIGKILL) at step 30" in text
    assert "fault[4] partition: messages between {0, 1} and {2, 3} cannot pass from 1 s until 3 s" in text
    assert "fault[9] slow: ranks 1, 2 compute 3x slower" in text
    assert len(text.splitlines()) == 12


def test_an_empty_plan_is_valid_and_changes_nothing() -> None:
    plan = parse_fault_plan({"format_version": 1}, "none")
    assert plan.faults == () and "no faults" in plan.describe()
    action = MessageFaults(plan, 0).decide(1, 100, 0, 0, 0, 0.0)
    assert action == MessageAction(src=0, dst=1, k=0) and action.untouched
    assert ProcessFaults(plan).due(0, 100, 100.0, frozenset()) == []
    assert ProcessFaults(plan).restarts_allowed() == 0


# -- message faults -------------------------------------------------------------------------------


def test_delay_adds_latency_to_matching_messages_only(tmp_path: Path) -> None:
    plan = plan_from(tmp_path, """
        [[fault]]
        kind = "delay"
        src = 1
        dst = [2, 3]
        latency_s = 0.002
        wall = true
        [[fault]]
        kind = "delay"
        src = 1
        dst = 2
        tags = 9
        latency_s = 0.001
    """)
    rank1 = MessageFaults(plan, 1)
    to2 = rank1.decide(dst=2, nbytes=64, tag=0, k=0, step=0, vtime_s=0.0)
    assert to2.extra_latency_s == pytest.approx(0.002) and to2.wall_sleep_s == pytest.approx(0.002)
    assert not to2.drop and to2.hold_until_s is None and to2.causes == ("fault[0] delay",)
    # The second delay adds up, and only on its tag.
    tagged = rank1.decide(dst=2, nbytes=64, tag=9, k=1, step=0, vtime_s=0.0)
    assert tagged.extra_latency_s == pytest.approx(0.003) and tagged.wall_sleep_s == pytest.approx(0.002)
    assert rank1.decide(dst=0, nbytes=64, tag=0, k=0, step=0, vtime_s=0.0).untouched
    # Rank 2 sending to rank 1 is another direction: untouched.
    assert MessageFaults(plan, 2).decide(dst=1, nbytes=64, tag=0, k=0, step=0, vtime_s=0.0).untouched
    assert "took 2 ms longer" in to2.describe()


def test_spike_hits_a_fraction_of_messages_or_a_window(tmp_path: Path) -> None:
    plan = plan_from(tmp_path, """
        [[fault]]
        kind = "spike"
        latency_s = 0.05
        probability = 0.1
        [[fault]]
        kind = "spike"
        src = 0
        latency_s = 0.02
        from_s = 2.0
        until_s = 4.0
    """)
    rank0 = MessageFaults(plan, 0)
    spiked = [rank0.decide(1, 8, 0, k, 0, 0.0).extra_latency_s for k in range(2000)]
    assert set(spiked) == {0.0, 0.05}
    assert 0.07 < spiked.count(0.05) / 2000 < 0.13
    in_window = [rank0.decide(2, 8, 0, k, 0, 3.0).extra_latency_s for k in range(200)]
    assert all(x in (pytest.approx(0.02), pytest.approx(0.07)) for x in in_window)
    assert rank0.decide(2, 8, 0, 5, 0, 4.0).extra_latency_s in (0.0, 0.05)  # until is exclusive


def test_drop_with_probability_drops_about_that_share_and_the_same_messages_each_time(tmp_path: Path) -> None:
    body = """
        [[fault]]
        kind = "drop"
        src = 0
        dst = 1
        probability = 0.3
    """
    plan = plan_from(tmp_path, body)
    lost = [k for k in range(2000) if MessageFaults(plan, 0).decide(1, 8, 0, k, 0, 0.0).drop]
    assert 0.26 < len(lost) / 2000 < 0.34
    # A second evaluation, at other times and steps, decides the very same messages.
    again = MessageFaults(plan, 0)
    assert [k for k in range(2000) if again.decide(1, 8, 0, k, k, 0.001 * k).drop] == lost
    # Another seed drops others; other channels are untouched.
    other = [k for k in range(2000) if MessageFaults(plan.with_seed(8), 0).decide(1, 8, 0, k, 0, 0.0).drop]
    assert other != lost
    assert not any(MessageFaults(plan, 0).decide(2, 8, 0, k, 0, 0.0).drop for k in range(200))
    action = MessageFaults(plan, 0).decide(1, 8, 0, lost[0], 0, 0.0)
    assert action.describe() == f"message {lost[0]} from rank 0 to rank 1 was lost (fault[0] drop)"


def test_the_draws_are_the_same_in_another_process(tmp_path: Path) -> None:
    code = "from distlab.runtime.faults.plans import draw; print([round(draw(7, 0, 0, 1, k), 12) for k in range(50)])"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str([round(draw(7, 0, 0, 1, k), 12) for k in range(50)])


def test_bandwidth_caps_only_messages_between_the_groups(tmp_path: Path) -> None:
    plan = plan_from(tmp_path, """
        [[fault]]
        kind = "bandwidth"
        groups = [[0, 1], [2, 3]]
        gbps = 1.0
        [[fault]]
        kind = "bandwidth"
        src = 0
        dst = 2
        factor = 0.25
    """)
    rank0 = MessageFaults(plan, 0)
    across = rank0.decide(2, 1 << 20, 0, 0, 0, 0.0)
    assert across.bandwidth_cap_gbps == 1.0 and across.bandwidth_factor == 0.25
    inside = rank0.decide(1, 1 << 20, 0, 0, 0, 0.0)
    assert inside.untouched and inside.bandwidth_factor == 1.0
    assert MessageFaults(plan, 3).decide(1, 8, 0, 0, 0, 0.0).bandwidth_cap_gbps == 1.0  # both ways
    # A 100 Gb/s link (beta = 8e-11 s/byte) at a quarter is 25 Gb/s, then capped at 1 Gb/s.
    assert across.effective_beta(8e-11) == pytest.approx(8e-9)
    assert MessageFaults(plan, 3).decide(1, 8, 0, 0, 0, 0.0).effective_beta(8e-11) == pytest.approx(8e-9)
    assert inside.effective_beta(8e-11) == pytest.approx(8e-11)


PARTITION = """
[[fault]]
kind = "partition"
groups = [[0, 1], [2, 3]]
from_s = 1.0
until_s = 3.0
mode = "{mode}"
"""


def test_a_partition_drops_only_messages_crossing_the_groups_and_only_inside_its_window(tmp_path: Path) -> None:
    plan = plan_from(tmp_path, PARTITION.format(mode="drop"))
    rank0, rank3 = MessageFaults(plan, 0), MessageFaults(plan, 3)
    assert rank0.decide(2, 8, 0, 0, 0, 1.0).drop and rank0.decide(3, 8, 0, 1, 0, 2.9).drop
    assert rank3.decide(1, 8, 0, 0, 0, 2.0).drop  # both directions
    assert not rank0.decide(1, 8, 0, 0, 0, 2.0).drop  # same side
    assert rank0.decide(2, 8, 0, 2, 0, 0.999).untouched  # before
    assert rank0.decide(2, 8, 0, 3, 0, 3.0).untouched  # healed: until is exclusive


def test_a_holding_partition_returns_its_heal_time(tmp_path: Path) -> None:
    plan = plan_from(tmp_path, PARTITION.format(mode="hold"))
    held = MessageFaults(plan, 1).decide(2, 8, 0, 0, 0, 1.5)
    assert not held.drop and held.hold_until_s == 3.0
    assert held.describe() == (
        "message 0 from rank 1 to rank 2 was held until 3 s (virtual clock) (fault[0] partition)"
    )
    assert MessageFaults(plan, 1).decide(0, 8, 0, 0, 0, 1.5).hold_until_s is None
    assert MessageFaults(plan, 1).decide(2, 8, 0, 1, 0, 3.5).hold_until_s is None


def test_a_permanent_partition_by_steps_drops_for_good(tmp_path: Path) -> None:
    plan = plan_from(tmp_path, """
        [[fault]]
        kind = "partition"
        groups = [[0], [1, 2], [3]]
        from_step = 10
    """)
    rank1 = MessageFaults(plan, 1)
    assert not rank1.decide(3, 8, 0, 0, 9, 50.0).drop
    assert rank1.decide(3, 8, 0, 1, 10, 0.0).drop and rank1.decide(0, 8, 0, 2, 10**6, 0.0).drop
    assert not rank1.decide(2, 8, 0, 0, 10**6, 0.0).drop


def test_a_dead_peer_sends_nothing_and_receives_nothing_after_its_trigger(tmp_path: Path) -> None:
    plan = plan_from(tmp_path, """
        [[fault]]
        kind = "dead"
        rank = 3
        at_step = 30
    """)
    rank0, rank3 = MessageFaults(plan, 0), MessageFaults(plan, 3)
    # Before step 30 everyone talks to rank 3.
    assert rank0.decide(3, 8, 0, 0, 29, 0.0).untouched and rank3.decide(0, 8, 0, 0, 29, 0.0).untouched
    assert rank0.incoming(3, 29, 0.0) and rank0.dead_peers(29, 0.0) == frozenset()
    # From step 30 on (by the deciding rank's own counter): lost both ways, delivered neither way.
    assert rank0.decide(3, 8, 0, 1, 30, 0.0).drop
    assert rank3.decide(0, 8, 0, 1, 30, 0.0).drop
    assert not rank0.incoming(3, 30, 0.0)  # even a message that was in flight
    assert not rank3.incoming(0, 31, 0.0)
    assert rank0.incoming(1, 30, 0.0) and not rank0.decide(1, 8, 0, 0, 30, 0.0).drop
    assert rank0.dead_peers(30, 0.0) == frozenset({3})
    assert rank0.decide(3, 8, 0, 1, 30, 0.0).describe() == "message 1 from rank 0 to rank 3 was lost (fault[0] dead)"


def test_a_hung_rank_blocks_in_its_first_call_after_the_trigger(tmp_path: Path) -> None:
    plan = plan_from(tmp_path, """
        [[fault]]
        kind = "hung"
        rank = 2
        at_s = 1.5
        [[fault]]
        kind = "delay"
        latency_s = 0.1
    """)
    rank2 = MessageFaults(plan, 2)
    assert not rank2.on_call(step=100, vtime_s=1.49)
    assert not rank2.decide(0, 8, 0, 0, 100, 1.49).hang
    assert rank2.on_call(step=0, vtime_s=1.5) and rank2.hung_by(0, 1.5) is plan.faults[0]
    hung = rank2.decide(0, 8, 0, 1, 0, 1.6)
    assert hung.hang and hung.extra_latency_s == 0.0 and hung.causes == ("fault[0] hung",)
    assert hung.describe() == "rank 2 hung sending message 1 from rank 2 to rank 0 (fault[0] hung)"
    assert not MessageFaults(plan, 0).on_call(step=100, vtime_s=100.0)


def test_messages_to_oneself_never_meet_network_faults(tmp_path: Path) -> None:
    plan = plan_from(tmp_path, '[[fault]]\nkind = "drop"\n')
    assert MessageFaults(plan, 1).decide(1, 8, 0, 0, 0, 0.0).untouched
    assert MessageFaults(plan, 1).decide(2, 8, 0, 0, 0, 0.0).drop


# -- process faults -------------------------------------------------------------------------------


def test_a_kill_fires_once_at_its_step_on_its_rank(tmp_path: Path) -> None:
    plan = plan_from(tmp_path, """
        [[fault]]
        kind = "kill"
        rank = 3
        at_step = 30
        [[fault]]
        kind = "kill"
        rank = 1
        at_s = 5.0
    """)
    sup = ProcessFaults(plan)
    assert sup.due(3, 29, 100.0, frozenset()) == []
    assert sup.due(2, 30, 0.0, frozenset()) == []  # another rank
    [kill] = sup.due(3, 30, 0.0, frozenset())
    assert kill == ProcessAction("kill", 3, 0, "at step 30")
    assert kill.describe() == "rank 3 was killed (SIGKILL) at step 30 by fault[0]"
    assert sup.due(3, 31, 0.0, frozenset({0})) == []  # fired: never again, even after a restart
    assert sup.trigger_steps(3) == frozenset({30}) and sup.target(0) == (3, 30)
    # The time trigger reads the supervisor's wall clock, whatever the step.
    assert sup.due(1, 1000, 4.99, frozenset({0})) == []
    [late] = sup.due(1, 0, 5.0, frozenset({0}))
    assert late.describe() == "rank 1 was killed (SIGKILL) at 5.0 s (wall clock) by fault[1]"
    assert sup.due(1, 0, 9.0, frozenset({0, 1})) == []


def test_a_stop_fires_once_and_its_cont_follows_once(tmp_path: Path) -> None:
    plan = plan_from(tmp_path, """
        [[fault]]
        kind = "stop"
        rank = 2
        at_step = 10
        cont_after_s = 2.0
        [[fault]]
        kind = "stop"
        rank = 1
        at_step = 10
    """)
    sup = ProcessFaults(plan)
    [stop] = sup.due(2, 10, 4.0, frozenset())
    assert stop.kind == "stop" and stop.describe() == "rank 2 was stopped (SIGSTOP) at step 10 by fault[0]"
    fired = frozenset({0})
    stopped = {0: 4.0}  # the supervisor's record: SIGSTOP sent at 4.0 s
    assert sup.due(2, 10, 5.9, fired, stopped) == []
    [cont] = sup.due(2, 10, 6.0, fired, stopped)
    assert cont.kind == "cont" and cont.fault_index == 0
    assert cont.describe().startswith("rank 2 was continued (SIGCONT) at 6.0 s (wall clock)")
    assert sup.due(2, 10, 60.0, fired, {}) == []  # continued: the entry is gone, nothing more
    # Without cont_after_s a stop is for good.
    [stop1] = sup.due(1, 12, 0.0, fired)
    assert stop1.fault_index == 1 and sup.due(1, 12, 1e6, fired | {1}, {1: 0.0}) == []


def test_a_random_kill_picks_one_rank_and_step_from_the_seed(tmp_path: Path) -> None:
    body = """
        [[fault]]
        kind = "kill"
        probability = 0.02
        from_step = 10
        until_step = 100
    """
    plan = plan_from(tmp_path, body)
    with pytest.raises(FaultPlanError, match=r"fault\[0\] \(kind 'kill'\) draws among all ranks; call plan\.validate"):
        ProcessFaults(plan)
    bound = plan.validate_for(4)
    target = ProcessFaults(bound).target(0)
    assert target is not None and target == ProcessFaults(bound).target(0)
    rank, step = target
    assert 10 <= step < 100 and 0 <= rank < 4
    # It is the first (step, rank) whose draw hits.
    hits = [(s, r) for s in range(10, 100) for r in range(4) if draw(bound.seed, 0, r, s) < 0.02]
    assert hits[0] == (step, rank)
    sup = ProcessFaults(bound)
    assert sup.due(rank, step - 1, 0.0, frozenset()) == []
    assert all(sup.due(r, step, 0.0, frozenset()) == [] for r in range(4) if r != rank)
    [kill] = sup.due(rank, step, 0.0, frozenset())
    assert f"at step {step} (a draw with probability 0.02 per rank and step, seed 7)" in kill.describe()
    assert sup.due(rank, step + 1, 0.0, frozenset({0})) == []


def test_slow_multiplies_declared_compute(tmp_path: Path) -> None:
    plan = plan_from(tmp_path, """
        [[fault]]
        kind = "slow"
        ranks = [1, 2]
        factor = 3.0
        [[fault]]
        kind = "slow"
        rank = 2
        factor = 1.5
        [[fault]]
        kind = "slow"
        rank = 3
        factor_range = [2.0, 5.0]
        probability = 0.5
        from_step = 10
    """)
    sup = ProcessFaults(plan)
    assert sup.compute_multiplier(0) == 1.0
    assert sup.compute_multiplier(1) == 3.0
    assert sup.compute_multiplier(2) == pytest.approx(4.5)  # several slow faults multiply
    assert sup.compute_multiplier(3) == 1.0  # steady part only: its slowdown is per step
    assert all(sup.compute_multiplier(3, s) == 1.0 for s in range(10))
    per_step = [sup.compute_multiplier(3, s) for s in range(10, 1010)]
    slowed = [m for m in per_step if m != 1.0]
    assert 0.45 < len(slowed) / 1000 < 0.55 and all(2.0 <= m <= 5.0 for m in slowed)
    assert per_step == [ProcessFaults(plan).compute_multiplier(3, s) for s in range(10, 1010)]


def test_restart_gives_the_restart_budget(tmp_path: Path) -> None:
    restart = plan_from(tmp_path, '[[fault]]\nkind = "restart"\nmax_restarts = 3\n')
    assert ProcessFaults(restart).restarts_allowed() == 3
    assert ProcessFaults(restart).rank_restarts_allowed() == 0
    assert ProcessFaults(plan_from(tmp_path, "")).restarts_allowed() == 0
    alone = plan_from(tmp_path, '[[fault]]\nkind = "restart"\nmax_restarts = 2\nrestart = "rank"\n')
    assert (ProcessFaults(alone).restarts_allowed(), ProcessFaults(alone).rank_restarts_allowed()) == (0, 2)
    assert alone.newcomers() == 2
    assert "a rank that dies starts again alone" in alone.describe()


def test_a_join_is_due_once_a_rank_starts_its_step_or_at_its_time(tmp_path: Path) -> None:
    plan = plan_from(tmp_path, '[[fault]]\nkind = "join"\ncount = 2\nat_step = 4\n'
                               '[[fault]]\nkind = "join"\nat_s = 1.5\n')
    faults = ProcessFaults(plan)
    assert plan.newcomers() == 3 and faults.trigger_steps(0) == faults.trigger_steps(7) == {4}
    assert faults.joins_due(3, 1.0, frozenset()) == []
    assert [f.index for f in faults.joins_due(4, 1.0, frozenset())] == [0]
    assert [f.index for f in faults.joins_due(9, 2.0, frozenset({0}))] == [1]
    assert faults.never_fired(frozenset({1})) == [
        "fault[0] (join at_step = 4) never fired: no rank started step 4 (steps are numbered by "
        "comm.mark('step'))"]
    assert "fault[0] join: 2 new ranks join the job at step 4; they enter at the others' next " \
           "comm.Admit()" in plan.describe()


@pytest.mark.parametrize(("survivors", "seats", "message"), [
    (False, 8, "fault[0] (join) adds ranks to a running job, which only a task whose ranks "
               "survive their peers takes (Task(survivors=True)"),
    (True, 5, "fault[0] (join) may bring the job to 6 ranks, and platform 'uniform-5' seats 5"),
])
def test_a_plan_that_adds_ranks_is_refused_where_they_cannot_join(
        tmp_path: Path, survivors: bool, seats: int, message: str) -> None:
    plan = plan_from(tmp_path, '[[fault]]\nkind = "join"\ncount = 2\nat_step = 4\n')
    with pytest.raises(FaultPlanError, match=re.escape(message)):
        plan.newcomers_for(survivors, 4, uniform(seats, 1e-6, 1e-9))
    assert plan.newcomers_for(True, 4, uniform(6, 1e-6, 1e-9)) == 2


# -- seeds ----------------------------------------------------------------------------------------


def test_the_seed_comes_from_the_file_the_caller_or_the_plan_text(tmp_path: Path) -> None:
    body = '[[fault]]\nkind = "drop"\nprobability = 0.5\n'
    derived = plan_from(tmp_path, body, head="format_version = 1\n")
    assert derived.seed_origin == "derived"
    assert derived.seed == plan_from(tmp_path, body, head="format_version = 1\n").seed  # stable
    assert derived.seed != plan_from(tmp_path, body.replace("0.5", "0.4"), head="format_version = 1\n").seed
    assert "(derived from the plan)" in derived.describe()
    path = tmp_path / "faults.toml"
    replay = load_fault_plan(path, seed=99)
    assert (replay.seed, replay.seed_origin) == (99, "caller")
    assert "seed 99 (given by the caller)" in replay.describe()
    with pytest.raises(FaultPlanError, match="the seed must be an integer"):
        derived.with_seed(-1)


# -- world size -----------------------------------------------------------------------------------


def test_validate_for_refuses_ranks_outside_the_world(tmp_path: Path) -> None:
    plan = plan_from(tmp_path, ONE_OF_EACH)
    assert plan.validate_for(4).world_size == 4
    with pytest.raises(FaultPlanError) as err:
        plan.validate_for(3)
    assert str(err.value) == (
        f"{tmp_path / 'faults.toml'}: fault[0].dst names rank 3, outside the world of 3 ranks (0..2)"
    )
    with pytest.raises(FaultPlanError, match="outside the world of 4"):
        MessageFaults(plan.validate_for(4), 4)


# -- malformed plans ------------------------------------------------------------------------------

MALFORMED = [
    ('[[fault]]\nkind = "drop"\n[[fault]]\nkind = "drop"\n[[fault]]\nkind = "partition"\nfrom_s = 1.0\n',
     "faults.toml: fault[2] (kind 'partition') needs 'groups'"),
    ('[[fault]]\nkind = "drop"\nprobability = 1.5\n',
     "faults.toml: fault[0].probability must be between 0 and 1; got 1.5"),
    ('[[fault]]\nkind = "drop"\n[[fault]]\nkind = "explode"\n',
     "faults.toml: fault[1]: unknown kind 'explode' (known: delay, spike, bandwidth, drop, partition, dead, hung, "
     "kill, stop, reclaim, slow, restart, join)"),
    ('[[fault]]\nkind = "join"\ncount = 2\n',
     "faults.toml: fault[0] (kind 'join') needs one trigger, 'at_step' (when a rank starts that step) "
     "or 'at_s' (wall clock)"),
    ('[[fault]]\nkind = "join"\ncount = 0\nat_step = 3\n',
     "faults.toml: fault[0].count must be an integer >= 1 and at most 64; got 0"),
    ('[[fault]]\nkind = "join"\nrank = 4\nat_step = 3\n',
     "faults.toml: fault[0] (kind 'join') has unknown key 'rank'"),
    ('[[fault]]\nkind = "restart"\nmax_restarts = 1\nrestart = "node"\n',
     "faults.toml: fault[0].restart must be \"job\" (start the whole job again) or \"rank\" (the dead "
     "rank alone, which joins the survivors); got 'node'"),
    ('[[fault]]\nkind = "delay"\nlatency = 0.1\n',
     "faults.toml: fault[0] (kind 'delay') has unknown key 'latency' (did you mean 'latency_s'?)"),
    ('[[fault]]\nkind = "drop"\nfrom_s = 5.0\nuntil_s = 2.0\n',
     "faults.toml: fault[0] (kind 'drop') has an empty window: from_s = 5.0 must be less than until_s = 2.0"),
    ('[[fault]]\nkind = "partition"\ngroups = [[0, 1], [2, 3]]\nfrom_s = 1.0\nmode = "hold"\n',
     "faults.toml: fault[0] (kind 'partition') with mode = \"hold\" needs 'until_s'"),
    ('[[fault]]\nkind = "partition"\ngroups = [[0, 1], [1, 2]]\n',
     "faults.toml: fault[0].groups must be disjoint (rank 1 is in groups 0 and 1); got [[0, 1], [1, 2]]"),
    ('[[fault]]\nkind = "kill"\nrank = 2\n',
     "faults.toml: fault[0] (kind 'kill') needs a trigger: 'at_step', 'at_s' or 'at_mark'"),
    ('[[fault]]\nkind = "kill"\nrank = 2\nat_mark = "save"\nat_step = 3\n',
     "faults.toml: fault[0] (kind 'kill') takes one trigger, 'at_mark' or 'at_s'/'at_step', not both"),
    ('[[fault]]\nkind = "stop"\nrank = 2\nat_mark = "step"\n',
     "faults.toml: fault[0] (kind 'stop') has at_mark = \"step\": steps are numbered; use at_step"),
    ('[[fault]]\nkind = "kill"\nrank = 2\nat_mark = 3\n',
     "faults.toml: fault[0].at_mark must be the name of a comm.mark(...) call (a string of 1 to 64 "
     "characters); got 3"),
    ('[[fault]]\nkind = "kill"\nranks = [1, 2]\nat_mark = "save"\n',
     "faults.toml: fault[0] (kind 'kill') acts on one rank: give 'rank'"),
    ('[[fault]]\nkind = "stop"\nprobability = 0.1\nuntil_step = 4\nat_mark = "save"\n',
     "faults.toml: fault[0] (kind 'stop') takes either 'probability' (a random step) or "
     "'at_s'/'at_step'/'at_mark', not both"),
    ('[[fault]]\nkind = "reclaim"\nrank = 1\nat_step = 2\ngrace_s = 0\n',
     "faults.toml: fault[0].grace_s must be a number > 0 and at most 86400 s; got 0"),
    ('[[fault]]\nkind = "reclaim"\nrank = 1\n',
     "faults.toml: fault[0] (kind 'reclaim') needs a trigger"),
    ('[[fault]]\nkind = "dead"\nrank = 1\nat_mark = "save"\n',
     "faults.toml: fault[0] (kind 'dead') has unknown key 'at_mark'"),
    ('[[fault]]\nkind = "kill"\nranks = [1, 2]\nat_step = 3\n',
     "faults.toml: fault[0] (kind 'kill') acts on one rank: give 'rank'"),
    ('[[fault]]\nkind = "stop"\nprobability = 0.1\n',
     "faults.toml: fault[0] (kind 'stop') needs 'until_step' with 'probability'"),
    ('[[fault]]\nkind = "bandwidth"\nfactor = 4\n',
     "faults.toml: fault[0].factor must be in (0, 1], the fraction of the link's bandwidth left; got 4"),
    ('[[fault]]\nkind = "bandwidth"\nfactor = 0.5\ngbps = 2.0\n',
     "faults.toml: fault[0] (kind 'bandwidth') needs exactly one of 'factor'"),
    ('[[fault]]\nkind = "spike"\nlatency_s = 0.05\n',
     "faults.toml: fault[0] (kind 'spike') needs 'probability' or a window"),
    ('[[fault]]\nkind = "dead"\nrank = 1\nfrom_s = 2.0\n',
     "faults.toml: fault[0] (kind 'dead') has unknown key 'from_s' (it is for good once triggered: "
     "use at_s or at_step)"),
    ('[[fault]]\nkind = "partition"\ngroups = [[0], [1]]\nat_s = 2.0\n',
     "faults.toml: fault[0] (kind 'partition') has unknown key 'at_s' (it lasts a window"),
    ('[[fault]]\nkind = "hung"\nrank = 1\nat_s = 1.0\nat_step = 4\n',
     "faults.toml: fault[0] (kind 'hung') takes one trigger, 'at_s' or 'at_step', not both"),
    ('[[fault]]\nkind = "slow"\nrank = 1\nfactor = 0.5\n',
     "faults.toml: fault[0].factor must be a number >= 1 and at most 10000 (how many times slower); got 0.5"),
    ('[[fault]]\nkind = "delay"\nsrc = "zero"\nlatency_s = 0.1\n',
     "faults.toml: fault[0].src must be a rank, a list of ranks or \"all\"; got 'zero'"),
    ('[[fault]]\nkind = "delay"\nlatency_s = -0.1\n',
     "faults.toml: fault[0].latency_s must be a number > 0 and at most 86400 s; got -0.1"),
    # Values past anything physical: a sum of them would be inf on the virtual clock.
    ('[[fault]]\nkind = "delay"\nlatency_s = 1e308\n',
     "faults.toml: fault[0].latency_s must be a number > 0 and at most 86400 s; got 1e+308"),
    ('[[fault]]\nkind = "drop"\n[[fault]]\nkind = "drop"\nfrom_s = 0.0\nuntil_s = 1e300\n',
     "faults.toml: fault[1].until_s must be a number >= 0 and at most 86400 s; got 1e+300"),
    ('[[fault]]\nkind = "bandwidth"\ngbps = 1e300\n',
     "faults.toml: fault[0].gbps must be a number > 0 and at most 1e+06 Gb/s; got 1e+300"),
    ('[[fault]]\nkind = "slow"\nrank = 1\nfactor = 1e300\n',
     "faults.toml: fault[0].factor must be a number >= 1 and at most 10000 (how many times slower)"),
    ('[[fault]]\nkind = "slow"\nrank = 1\nfactor_range = [2.0, 1e300]\n',
     "faults.toml: fault[0].factor_range must be [low, high] with 1 <= low <= high <= 10000"),
    ('[[fault]]\nkind = "stop"\nrank = 1\nat_step = 2\ncont_after_s = 1e300\n',
     "faults.toml: fault[0].cont_after_s must be a number > 0 and at most 86400 s"),
    ('[[fault]]\nkind = "restart"\nmax_restarts = 1000000\n',
     "faults.toml: fault[0].max_restarts must be an integer >= 0 and at most 100; got 1000000"),
    ('[[fault]]\nkind = "restart"\nmax_restarts = 1\n[[fault]]\nkind = "restart"\nmax_restarts = 2\n',
     "faults.toml: fault[1] (kind 'restart') repeats fault[0]"),
    ('[[fault]]\nrank = 1\n', "faults.toml: fault[0] needs 'kind'"),
    ('[[faults]]\nkind = "drop"\n', "faults.toml: unknown key 'faults' (did you mean 'fault'?)"),
    ('[fault]\nkind = "drop"\n', "faults.toml: 'fault' must be an array of tables, written [[fault]]"),
]


@pytest.mark.parametrize("body, message", MALFORMED, ids=[m.split(": ", 1)[1][:40] for _, m in MALFORMED])
def test_a_malformed_plan_names_the_file_the_entry_and_the_value(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(FaultPlanError) as err:
        plan_from(tmp_path, body)
    assert isinstance(err.value, DistlabError)
    assert message in str(err.value)
    assert str(err.value).startswith(str(tmp_path / "faults.toml"))


@pytest.mark.parametrize("head, message", [
    ("format_version = 2\n", "'format_version' must be 1; got 2"),
    ("", "'format_version' must be 1; got None"),
    ("format_version = 1\nseed = -3\n", "'seed' must be an integer in 0..2**63-1; got -3"),
])
def test_the_plan_header_is_checked(tmp_path: Path, head: str, message: str) -> None:
    with pytest.raises(FaultPlanError, match=message.replace("*", r"\*").replace("(", r"\(").replace(")", r"\)")):
        plan_from(tmp_path, "", head=head)


def test_a_toml_syntax_error_names_its_line(tmp_path: Path) -> None:
    with pytest.raises(FaultPlanError, match=r"faults.toml: not valid TOML: .*at line 5, column 13"):
        plan_from(tmp_path, '[[fault]]\nkind = "drop"\nprobability 0.3\n')
    with pytest.raises(FaultPlanError, match="fault plan not found"):
        load_fault_plan(tmp_path / "missing.toml")


def test_every_example_in_the_doc_parses() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "fault-plans.md").read_text()
    blocks = [b.split("```", 1)[0] for b in doc.split("```toml\n")[1:]]
    assert len(blocks) == 14  # the file, then one per kind
    kinds = set()
    for n, block in enumerate(blocks):
        text = block if "format_version" in block else "format_version = 1\n" + block
        plan = parse_fault_plan(tomllib.loads(text), f"docs example {n}").validate_for(8)
        kinds |= {f.kind for f in plan.faults}
    assert kinds == set(KINDS)


def test_a_kill_at_a_mark_fires_once_the_rank_shows_the_mark_and_not_before() -> None:
    plan = parse_fault_plan({"format_version": 1, "seed": 1, "fault": [
        {"kind": "kill", "rank": 1, "at_mark": "save"},
        {"kind": "stop", "rank": 1, "at_mark": "load", "cont_after_s": 1.0}]}, where="test")
    faults = ProcessFaults(plan)
    assert faults.trigger_marks(1) == ("load", "save") and faults.trigger_marks(0) == ()
    assert faults.marks_reached(1, 0b10) == {"save"}
    assert faults.due(1, 0, 0.0, frozenset()) == []
    (kill,) = faults.due(1, 0, 0.0, frozenset(), marks=frozenset({"save"}))
    assert kill.describe() == "rank 1 was killed (SIGKILL) at its comm.mark('save') by fault[0]"
    assert faults.never_fired(frozenset({0})) == [
        "fault[1] (stop at_mark = 'load') never fired: rank 1 never called comm.mark('load')"]
    assert plan.faults[0].describe() == (
        "fault[0] kill: rank 1 is killed (SIGKILL) when it first calls comm.mark('save')")


def test_a_step_kill_that_never_fired_is_named_and_a_random_or_timed_one_is_not() -> None:
    plan = parse_fault_plan({"format_version": 1, "seed": 1, "fault": [
        {"kind": "kill", "rank": 1, "at_step": 3},
        {"kind": "stop", "rank": 0, "at_s": 5.0, "cont_after_s": 1.0},
        {"kind": "kill", "probability": 0.5, "until_step": 9}]}, where="test").validate_for(2)
    assert ProcessFaults(plan).never_fired(frozenset()) == [
        "fault[0] (kill at_step = 3) never fired: rank 1 never started step 3 (steps are "
        "numbered by its comm.mark('step') calls)"]
    assert ProcessFaults(plan).never_fired(frozenset({0})) == []


def test_a_reclaim_is_a_notice_then_a_kill_after_its_grace() -> None:
    plan = parse_fault_plan({"format_version": 1, "seed": 1, "fault": [
        {"kind": "reclaim", "rank": 2, "at_step": 4, "grace_s": 1.5}]}, where="test")
    assert plan.faults[0].describe() == (
        "fault[0] reclaim: rank 2 is reclaimed (SIGTERM, then SIGKILL) at step 4; the SIGKILL "
        "comes 1.5 s after the SIGTERM")
    faults = ProcessFaults(plan)
    assert faults.due(2, 3, 0.0, frozenset()) == []
    (notice,) = faults.due(2, 4, 10.0, frozenset())
    assert (notice.kind, notice.describe()) == (
        "term", "rank 2 was told to leave (SIGTERM: its instance is reclaimed) at step 4 by fault[0]")
    assert faults.due(2, 5, 11.0, frozenset({0}), {0: 10.0}) == []  # within its grace
    (kill,) = faults.due(2, 5, 11.5, frozenset({0}), {0: 10.0})
    assert kill.describe() == ("rank 2 was killed (SIGKILL) at 11.5 s (wall clock), 1.5 s after "
                               "its reclaim notice, by fault[0]")
