"""Problem 10, bounded staleness: the checks' pure helpers, then `distlab check 10` end to end.

The first half starts no process: the staleness read from a server's trace, the card's server
simulated on the checker's side (s = 0 is gradient descent, the bound holds and is reached), the
diagnoses, and the margins: over many hidden variants the card's server stays well clear of each
threshold and the common wrong servers (waiting for every worker, never updating) far past it.

The second half runs the real CLI once per solution (the reference sealed, as a learner runs it;
the starter; every fixture in tests/fixtures/10/ unsealed; the alternative on gloo) with one fixed
seed, so a failure replays with `distlab check 10 --seed 1010 --solution ...`; then the tune
sweep and the report's picture.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import PROBLEMS, run_cli
from e2e import (
    Checked,
    CheckRuns,
    assert_clean,
    assert_fails_with_symptom,
    assert_passes,
    assert_starter_fails,
    fixture_names,
    fixture_runs,
    fixture_solution,
    leftovers,
    problem_modules,
)

SEED = 1010
FOLDER = PROBLEMS / "10-bounded-staleness"
cases, programs, judging, check = problem_modules(FOLDER, "cases", "programs", "judging", "check")
MARGIN_SEEDS = range(40)  # 300 held when written (set it to range(300) to see); 40 in the suite


def lax_gate(c: int, clock: list[float], s: int) -> bool:
    return min(clock) >= c - s - 1  # the off-by-one fixture's rule


def all_gate(c: int, clock: list[float], s: int) -> bool:
    return min(clock) >= c  # waits for every worker: synchronous whatever s is


def unbound_after_finish(c: int, clock: list[float], s: int) -> bool:
    return math.inf in clock or min(clock) >= c - s  # once a worker is done, every read at once (a cheat)


# -- the staleness read from the trace ---------------------------------------------------------------


def test_staleness_counts_the_pushes_the_server_had_in_before_each_reply() -> None:
    case = cases.Training("t", 1, ((1.0,) * 2, (1.0,) * 2), 1.0, 0)  # two workers (ranks 1, 2), two steps
    P, A, M = cases.PUSH, cases.ANNOUNCE, cases.MODEL
    events = [("recv", 1, P), ("recv", 2, P), ("send", 1, M), ("send", 2, M),  # both read at clock 0
              ("recv", 1, A), ("recv", 1, P),  # an announcement is no push; rank 1 pushes its step 0
              ("send", 1, M),  # rank 1 reads at clock 1, rank 2 has pushed nothing: staleness 1
              ("recv", 1, P),  # rank 1's last push: it counts as infinitely far ahead
              ("recv", 2, P), ("send", 2, M), ("recv", 2, P), ("send", 9, M)]  # a send elsewhere is ignored
    reads = judging.reads_in_trace(events, case, 0, [1, 2])
    assert [(r.worker, r.clock, r.staleness) for r in reads] == [(0, 0, 0), (1, 0, 0), (0, 1, 1), (1, 1, 0)]
    assert judging.worst(reads).staleness == 1 and judging.over_bound(case, reads, [1, 2]) is None
    assert judging.reads_count_problem(case, reads, [1, 2]) is None
    strict = cases.Training("t", 0, case.slow, 1.0, 0)
    said = judging.over_bound(strict, reads, [1, 2])
    assert "worker rank 1 read the model at clock 1 while the slowest worker had pushed only 0" in said
    assert "staleness 1, expected at most s = 0 (1 of 4 reads over)" in said
    assert "sent worker rank 2 1 models for its 2 reads" in judging.reads_count_problem(case, reads[:3], [1, 2])


def test_a_trace_with_a_push_after_the_last_is_told_not_crashed() -> None:
    """A push after a worker's last, then a model sent (an outside tester's probe once made the loss
    check index past the worker's steps): the applied check says the trace does not fit the steps."""
    case = cases.Training("t", 1, ((1.0,), (1.0,)), 1.0, 0)  # two workers (ranks 1, 2), one step each
    P, M = cases.PUSH, cases.MODEL
    events = [("recv", 1, P), ("recv", 2, P), ("send", 1, M), ("send", 2, M), ("recv", 1, P),
              ("recv", 1, P), ("recv", 1, P), ("send", 2, M)]  # rank 1: its last push, then two more (3 in all)
    reads = judging.reads_in_trace(events, case, 0, [1, 2])
    models = [[cases.initial_weights(case)] * 2 for _ in range(2)]
    said = judging.applied_problem(case, reads, models, cases.initial_weights(case), [1, 2])
    assert "the server's trace does not fit the workers' steps" in said and "3 gradients from rank 1" in said


def test_the_cause_is_named_only_where_every_case_agrees() -> None:
    assert judging.OFF_BY_ONE in judging.staleness_cause([1, 0, 1])
    assert judging.staleness_cause([0, 0, 0]) == ""
    assert judging.staleness_cause([1, 1, 0]) == ""  # the long straggler within its bound: not off by one
    for excess in ([0, 3, 0], [0, 1, -1]):  # within the bound at s = 0 and under the long straggler only
        said = judging.staleness_cause(excess)
        assert judging.RULE_BY_S in said and judging.OFF_BY_ONE not in said and judging.NOT_THE_SLOWEST not in said
    assert judging.RULE_BY_S not in judging.staleness_cause([1, 3, 0]) + judging.staleness_cause([0, 3, 1])
    for excess in ([4, 3, 9], [1, 0, 5], [2, 0, 1]):
        said = judging.staleness_cause(excess)
        assert judging.NOT_THE_SLOWEST in said and judging.OFF_BY_ONE not in said


# -- the card's server simulated, over the hidden variants --------------------------------------------


def test_the_simulated_server_at_s0_is_gradient_descent_and_keeps_every_bound() -> None:
    for seed in range(5):
        session = cases.session(seed)
        sync = cases.simulate(session.synchronous, train=True)
        np.testing.assert_allclose(sync.model, cases.synchronous(session.synchronous)[-1], rtol=1e-12)
        for case in session.all():
            run = cases.simulate(case)
            assert not run.stuck and max(r.staleness for r in run.reads) <= case.staleness
            assert [sum(r.worker == j for r in run.reads) for j in range(case.workers)] == list(case.steps)
        assert len(set(session.finish.steps)) == cases.WORKERS and min(session.finish.steps) == 6


def test_margins_over_the_hidden_variants() -> None:
    """Every check stands clear of its threshold for the card's server, and the common wrong servers
    far past it (over 300 seeds when written: speedup 1.627-1.963 against the 1.5 asked, where
    waiting for every worker gives 1.0; the loss within 1.32% of synchronous against the 5% allowed,
    where a server that never updates is more than 20% off; a server with no bound at all 5 to 7
    stale with s = 3, where an outside tester's was within 3 on two seeds in five before the
    stragglers were drawn to drift)."""
    speedups, losses = [], []
    for seed in MARGIN_SEEDS:
        session = cases.session(seed)
        sync_case, ssp_case, bound = session.synchronous, session.stragglers, session.bound
        sync = cases.simulate(sync_case, train=True)
        ssp = cases.simulate(ssp_case, train=True)
        speedups.append(sync.makespan / ssp.makespan)
        # s = 0 one step too lax trains another model, a million tolerances away
        lax = cases.simulate(sync_case, lax_gate, train=True).model
        assert np.max(np.abs(lax - sync.model) / np.abs(sync.model)) > 1e6 * cases.RTOL
        # no bound at all goes at least two past s = 3 (a server unbounded from s = 3 up, synchronous below)
        assert max(r.staleness for r in cases.simulate(ssp_case, lambda c, clock, s: True).reads) >= 5, seed
        # waiting for every worker is synchronous training: 1.0x, a third below the 1.5x threshold
        assert cases.simulate(ssp_case, all_gate).makespan == pytest.approx(sync.makespan)
        start, want = cases.loss(sync_case, cases.initial_weights(sync_case)), cases.loss(sync_case, sync.model)
        losses.append(abs(cases.loss(ssp_case, ssp.model) - want) / want)
        assert abs(start - want) / want > 4 * check.LOSS_TOLERANCE  # a server that never updates: far off
        # the long straggler drives the card's server to its bound, and an off-by-one gate one past it
        assert max(r.staleness for r in cases.simulate(bound).reads) == bound.staleness
        assert max(r.staleness for r in cases.simulate(bound, lax_gate).reads) == bound.staleness + 1
        # each gate's excess over the three cases names its own cause, and only its own
        for gate, cause, other in ((lax_gate, judging.OFF_BY_ONE, judging.NOT_THE_SLOWEST),
                                   (lambda c, clock, s: True, judging.NOT_THE_SLOWEST, judging.OFF_BY_ONE)):
            excess = [max(r.staleness for r in cases.simulate(c, gate).reads) - c.staleness
                      for c in (sync_case, ssp_case, bound)]
            said = judging.staleness_cause(excess)
            assert cause in said and other not in said
        # a finished worker left at its last clock, or its last push not re-checked: the others wait for ever
        assert cases.simulate(session.finish, done_counts=False).stuck
        assert cases.simulate(session.finish, recheck_last=False).stuck
    assert min(speedups) >= check.SPEEDUP + 0.1, min(speedups)  # 1.627 the least of 300 seeds
    assert max(losses) <= check.LOSS_TOLERANCE / 2, max(losses)


def test_the_finishing_case_blocks_everyone_on_the_first_to_finish_then_bounds_the_rest() -> None:
    """On every variant: when the first worker sends its last push, every other one waits on it with
    its read at FIRST_DONE + s, which only that push frees (a server that does not re-check then
    deadlocks); after it, a server that stops bounding goes past s (over 2000 seeds when written: by
    1 to 6)."""
    for seed in range(400):
        case = cases.session(seed).finish
        first = case.steps.index(cases.FIRST_DONE)
        held = cases.FIRST_DONE + case.staleness
        fair = cases.simulate(case)
        # the others' reads at FIRST_DONE + s, answered once the first is done and both others are there
        before = [r for r in fair.reads if r.clock == held and r.worker != first]
        assert len(before) == cases.WORKERS - 1 and all(r.staleness == 0 for r in before), seed
        assert cases.simulate(case, recheck_last=False).stuck, seed
        cheat = cases.simulate(case, unbound_after_finish)
        assert not cheat.stuck and max(r.staleness for r in cheat.reads) > case.staleness, seed


def test_the_free_runs_bound_and_picture() -> None:
    assert (programs.bounds(None, 4, staleness="3")["samples_per_s"]
            > programs.bounds(None, 4, staleness="0")["samples_per_s"])
    assert programs.bounds(None, 4) == {}
    summary = {"staleness": [0, 1, 2], "samples_per_s": [100.0, 150.0, 160.0], "loss": [0.3, 0.31, float("nan")],
               "sync_samples_per_s": 101.0, "sync_loss": 0.3}
    svg = programs.figure(summary)
    assert svg.startswith("<svg") and svg.count("<polyline") == 2 and "held-out loss" in svg
    assert programs.figure({"staleness": [0]}) == "" and programs.figure({}) == ""


class Scripted:
    """The comm a mailbox needs: each worker's pushes (clock, last) and the times its later pushes leave."""

    def __init__(self, pushes: dict[int, list[tuple[int, bool]]], leaves: dict[int, list[float]]) -> None:
        self.pushes, self.leaves = {w: list(p) for w, p in pushes.items()}, {w: list(t) for w, t in leaves.items()}

    def Recv(self, buf, source, tag):  # noqa: N802
        buf[:] = 0.0
        if tag == cases.ANNOUNCE:
            buf[0] = self.leaves[source].pop(0)
        else:
            buf[:2] = self.pushes[source].pop(0)

    def Send(self, buf, dest, tag):  # noqa: N802
        pass

    def mark(self, name):
        pass


def test_a_server_that_never_answers_is_told_why_instead_of_hanging() -> None:
    box = programs.Mailbox(Scripted({1: [(0, False)], 2: [(0, False)]}, {}), [1, 2], cases.FEATURES)
    assert box.next().clock == 0 and box.next().clock == 0  # both read at clock 0; nobody answers
    with pytest.raises(programs.Stuck, match=r"rank 1 \(reading at clock 0\), rank 2 \(reading at clock 0\) wait "
                                             "for a read, and no worker has finished"):
        box.next()
    with pytest.raises(ValueError, match="worker 3 has no read waiting"):
        box.reply(3, np.zeros(cases.FEATURES))


def stuck_after(pushes: dict[int, list[tuple[int, bool]]], replies: list[int | None], second: float = 3.0) -> str:
    """Rank 2 has one step, its last push leaving at 2.0, rank 1 more (s = 0), its pushes at 1.0 and
    ``second``: the mailbox takes a push for each None in ``replies`` and sends the model to each
    rank named, then says why nothing can come."""
    box = programs.Mailbox(Scripted(pushes, {1: [1.0, second], 2: [2.0]}), [1, 2], cases.FEATURES, 0)
    for step in replies:
        box.next() if step is None else box.reply(step, np.zeros(cases.FEATURES))
    with pytest.raises(programs.Stuck) as stuck:
        box.next()
    said = str(stuck.value)
    assert "sent its last push" in said
    return said


def test_a_deadlock_after_a_last_push_names_the_cause_the_evidence_leaves() -> None:
    start = [None, None, 1, 2]  # both read at clock 0, answered
    # rank 1 waits at clock 1 when rank 2's last push (clock 1) frees it: kept at 1, rank 2 would free it too
    said = stuck_after({1: [(0, False), (1, False)], 2: [(0, False), (1, True)]}, start + [None, None])
    assert "after the last push of worker rank 2 " + cases.NOT_RECHECKED in said and cases.KEPT_CLOCK not in said
    # rank 2 done, then rank 1 asks at clock 2: the rule freed it then; only a kept clock (1) holds it
    said = stuck_after({1: [(0, False), (1, False), (2, False)], 2: [(0, False), (1, True)]},
                       start + [None, None, 1, None])
    assert cases.KEPT_CLOCK in said and cases.NOT_RECHECKED not in said
    # rank 1 answered too early at clock 1, asks at 2, then rank 2 finishes: either mistake leaves it waiting
    said = stuck_after({1: [(0, False), (1, False), (2, False)], 2: [(0, False), (1, True)]},
                       start + [None, 1, None, None], second=1.5)
    assert "Two mistakes" in said and "worker rank 2" in said
    assert cases.KEPT_CLOCK not in said and cases.NOT_RECHECKED not in said


def test_a_read_answered_after_a_later_push_is_late() -> None:
    case = cases.Finishing("t", 0, ((1.0,) * 3, (1.0,), (1.0,) * 3), 1.0, 0)  # ranks 1, 3: three steps; 2: one
    P, M = cases.PUSH, cases.MODEL
    fair = [("recv", 1, P), ("send", 1, M), ("recv", 2, P), ("send", 2, M), ("recv", 3, P), ("send", 3, M),
            ("recv", 1, P), ("recv", 3, P),  # ranks 1 and 3 wait at clock 1 for rank 2
            ("recv", 2, P), ("send", 1, M), ("send", 3, M),  # rank 2's last push frees both
            ("recv", 1, P), ("recv", 3, P), ("send", 1, M), ("send", 3, M), ("recv", 1, P), ("recv", 3, P)]
    assert judging.late_read(fair, case, [1, 2, 3]) is None
    late = fair[:10] + [("recv", 1, P), ("send", 3, M)]  # rank 3's read only after rank 1's next push
    said = judging.late_read(late, case, [1, 2, 3])
    assert "worker rank 3's read at clock 1 was allowed once rank 2's push was in" in said
    assert "after the last push of worker rank 2 " + cases.NOT_RECHECKED in said
    assert judging.late_read(late, case, [1, 2, 3], last_only=True) == said
    early = fair[:3] + [("recv", 1, P), ("send", 2, M)]  # rank 2's read at clock 0 after rank 1's push
    said = judging.late_read(early, case, [1, 2, 3])
    assert "rank 2's read at clock 0" in said and "after every push, answer every kept read" in said
    assert cases.NOT_RECHECKED not in said
    assert judging.late_read(early, case, [1, 2, 3], last_only=True) is None  # check 5: only what a last push frees


def test_a_read_held_after_a_worker_finished_is_late_by_the_rule_the_server_kept() -> None:
    """Rank 2 has one step, ranks 1 and 3 four; s = 1. A server that keeps rank 2's last clock (1)
    and answers what it holds only when every worker left waits (an outside tester's) runs in
    lockstep after rank 2 is done: rank 1's read at clock 3, allowed by its own push, waits for rank
    3's. The same lockstep from the start is synchronous training, the throughput check's to grade."""
    case = cases.Finishing("t", 1, ((1.0,) * 4, (1.0,), (1.0,) * 4), 1.0, 0)
    P, M = cases.PUSH, cases.MODEL
    start = [("recv", 1, P), ("send", 1, M), ("recv", 2, P), ("send", 2, M), ("recv", 3, P), ("send", 3, M)]
    ssp = start + [("recv", 1, P), ("send", 1, M),  # rank 1 reads at clock 1, rank 3 at 0: the bound used
                   ("recv", 1, P), ("recv", 2, P),  # rank 1 waits at 2; rank 2's last push
                   ("recv", 3, P), ("send", 1, M), ("send", 3, M), ("recv", 3, P), ("send", 3, M)]
    end = [("recv", 1, P), ("recv", 3, P)]  # the last pushes
    fair = ssp + [("recv", 1, P), ("send", 1, M), ("recv", 3, P), ("send", 3, M)] + end
    flush = ssp + [("recv", 1, P), ("recv", 3, P), ("send", 1, M), ("send", 3, M)] + end
    assert judging.late_after_finish(fair, case, [1, 2, 3]) is None
    said = judging.late_after_finish(flush, case, [1, 2, 3])
    assert "worker rank 1's read at clock 3 was allowed once rank 1's push was in (rank 2 had finished" in said
    assert judging.KEPT_AFTER_FINISH + " (1, below c - s = 2)" in said and cases.KEPT_CLOCK not in said
    assert judging.late_read(flush, case, [1, 2, 3], last_only=True) is None  # no last push freed it
    sync = start + [("recv", 1, P), ("recv", 2, P), ("recv", 3, P), ("send", 1, M), ("send", 3, M)]
    sync += [("recv", 1, P), ("recv", 3, P), ("send", 1, M), ("send", 3, M)] * 2 + end
    assert judging.late_after_finish(sync, case, [1, 2, 3]) is None
    # late before any worker finished too: the finish is not shown to be the cause
    early_late = start + [("recv", 1, P), ("recv", 3, P), ("send", 1, M), ("send", 3, M)]
    early_late += [("recv", 1, P), ("send", 1, M), ("recv", 2, P), ("recv", 3, P), ("send", 3, M)]
    early_late += [("recv", 1, P), ("recv", 3, P), ("send", 1, M), ("send", 3, M)] + end
    said = judging.late_after_finish(early_late, case, [1, 2, 3])
    assert "after every push, answer every kept read" in said and judging.KEPT_AFTER_FINISH not in said


def test_a_wrong_synchronous_read_names_only_the_cause_its_model_shows() -> None:
    case = cases.session(3).synchronous
    models = cases.synchronous(case)
    grads = [cases.gradient(models[1], *cases.batch(case, j, 1), case.workers) for j in range(case.workers)]
    said = {}
    for name, got in (("timing", models[1] - case.lr * grads[0]),  # step 1 with one of its gradients
                      ("another step", models[1]),
                      ("float32", models[2].astype(np.float32).astype(np.float64)),
                      ("scaled", models[1] + (models[2] - models[1]) / case.workers),
                      ("noise", models[2] + 1e-3)):
        said[name] = judging.sync_read_problem(case, 1, 2, got, models, "element 0 ...")
    assert "the model after 1 step and 1 of step 1's 3 gradients" in said["timing"]
    assert "it is the model after 1 step:" in said["another step"]
    assert "a float32 number: the model is kept in float32 precision" in said["float32"]
    assert "0.3333 times synchronous training's" in said["scaled"]
    for name, phrase in (("timing", judging.TIMING), ("another step", judging.TIMING), ("float32", judging.PRECISION),
                         ("scaled", judging.SCALED)):
        assert [n for n in said if phrase in said[n]] == (["timing", "another step"] if phrase == judging.TIMING
                                                          else [name]), (phrase, said)


# -- end to end -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checked() -> CheckRuns:
    return CheckRuns("10", seed=SEED, timeout=120,
                     together=fixture_runs("10", sorted(BUGGY)))


SYNC, STALE, SPEED, LOSS, FINISH = ("s = 0 reproduces", "observed staleness", "throughput with s = 3",
                                    "the final loss", "no deadlock")

# fixture -> (the check that must fail, texts its message holds, checks that must pass)
BUGGY: dict[str, tuple[str, list[str], list[str]]] = {
    "lax_bound.py": (STALE, ["staleness 1, expected at most s = 0", judging.OFF_BY_ONE], [SPEED, LOSS]),
    "own_clock.py": (STALE, ["expected at most s = 0", judging.NOT_THE_SLOWEST], [SPEED, LOSS]),
    "wait_for_all.py": (SPEED, ["1.00x the synchronous throughput, expected at least 1.5x",
                                "no read saw any staleness at s = 3"], [SYNC, STALE, LOSS, FINISH]),
    "held_gradients.py": (LOSS, ["a model that is not the initial one minus lr x the 1 gradients the server had "
                                 "received by then"], [SYNC, STALE, SPEED, FINISH]),
    "never_done.py": (FINISH, ["no worker can send one", "sent its last push", cases.KEPT_CLOCK],
                      [SYNC, STALE, SPEED, LOSS]),
    "last_not_rechecked.py": (FINISH, ["no worker can send one", "after the last push of worker rank",
                                       cases.NOT_RECHECKED], [SYNC, STALE, SPEED, LOSS]),
    "forged_stragglers.py": (STALE, ["worker rank 1 declared", "the solution changed what they declare"],
                             [SYNC, LOSS]),
    "forged_reorder.py": (STALE, ["worker rank 1 pushes at its step 0 where the harness's worker declares its compute",
                                  judging.REORDERED], [SYNC, LOSS]),
    "forged_trace.py": (SYNC, ["worker rank 1 sent rank 0 16 bytes tagged PUSH", judging.NOT_HARNESS], []),
    "forged_extra_push.py": (SYNC, ["worker rank 1 " + judging.AFTER_LAST, "26 messages tagged PUSH"], []),
    "forged_gradients.py": (SYNC, ["worker rank 1's push at clock 1 is " + judging.NOT_ITS_GRADIENT], []),
    # Outside testers' attacks: a finished worker's clock kept, every read answered whenever all the others
    # wait (lockstep, no deadlock); synchronous below s = 3 and unbounded from it.
    "forged_kept_clock_flush.py": (FINISH, ["the server took another push before answering it",
                                            judging.KEPT_AFTER_FINISH], [SYNC, STALE, SPEED, LOSS]),
    "forged_sync_or_unbounded.py": (STALE, ["expected at most s = 3", judging.RULE_BY_S], [SYNC, SPEED, FINISH]),
    # An outside tester's attack: last_not_rechecked's server, which catches the mailbox's Stuck and only
    # then answers the reads it kept (no worker computes by then, so the order of messages looks right).
    "forged_caught_stuck.py": (FINISH, [judging.CAUGHT_STUCK, "a worker's last push too"], [SYNC, STALE, SPEED, LOSS]),
}

# Each diagnosis that names a cause, and the fixture whose bug it is: silent on every other one.
NAMES_ITS_BUG = {
    judging.OFF_BY_ONE: "lax_bound.py",
    judging.NOT_THE_SLOWEST: "own_clock.py",
    "no read saw any staleness": "wait_for_all.py",
    "does your server still count its last clock": "never_done.py",
    cases.NOT_RECHECKED: "last_not_rechecked.py",
    "Does every push apply at once, and once?": "held_gradients.py",
    "the solution changed what they declare": "forged_stragglers.py",
    judging.REORDERED: "forged_reorder.py",
    judging.NOT_HARNESS: "forged_trace.py",
    judging.AFTER_LAST: "forged_extra_push.py",
    judging.NOT_ITS_GRADIENT: "forged_gradients.py",
    judging.KEPT_AFTER_FINISH: "forged_kept_clock_flush.py",
    judging.RULE_BY_S: "forged_sync_or_unbounded.py",
    judging.CAUGHT_STUCK: "forged_caught_stuck.py",
}


def test_every_buggy_fixture_has_a_row_and_a_diagnosis() -> None:
    assert fixture_names("10") - {"alt_pending_heap.py"} == set(BUGGY) == set(NAMES_ITS_BUG.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUGGY))
def test_buggy_solution_fails_with_its_symptom(name: str, checked: Callable[..., Checked]) -> None:
    failing, needles, passing = BUGGY[name]
    run = checked("--solution", str(fixture_solution("10", name)))
    assert_fails_with_symptom(run, name, failing, needles, NAMES_ITS_BUG)
    assert judging.PRECISION not in run.messages() and judging.SCALED not in run.messages()  # no fixture's bug
    assert all(run.status(n) == "passed" for n in passing), run.out


@pytest.mark.slow
def test_reference_passes_sealed(checked: Callable[..., Checked]) -> None:
    run = checked("--solution", "reference")
    assert_clean(run)
    assert run.rc == 0, run.out
    r = run.results
    assert r is not None and r["passed"] and r["score"] == r["max_score"] == 14 and r["seal"] == "on"
    assert r["totals"]["launches"] == 1 and r["totals"]["bound_s"] > 0
    metrics = {k: v for c in r["checks"] for k, v in c["metrics"].items()}
    assert metrics["speedup"] >= 1.5 and metrics["measured_s"] <= 1.01 * metrics["bound_s"]
    assert metrics["loss"]["stale"] < metrics["loss"]["start"] / 2  # real training: the loss fell
    assert metrics["max_staleness"]["s = 3 under stragglers"] == 3.0 and "(the bound reached)" in run.flat


@pytest.mark.slow
def test_alternative_passes_on_gloo(checked: Callable[..., Checked]) -> None:
    assert_passes(checked("--solution", str(fixture_solution("10", "alt_pending_heap.py")), "--backend", "gloo"), "gloo")


@pytest.mark.slow
def test_starter_fails_with_helpful_messages(checked: Callable[..., Checked]) -> None:
    run = checked()  # no workspace file: the starter is checked
    assert_starter_fails(run, ["a model that is not synchronous training's", "while the slowest worker had pushed only",
                               judging.NOT_THE_SLOWEST])
    assert run.status(SPEED) == "passed"  # no bound at all is fast: the staleness is what it costs


@pytest.mark.slow
def test_tune_sweeps_the_bound_and_the_report_draws_speed_beside_loss(tmp_path: Path) -> None:
    proc = run_cli("tune", "10", "--solution", "reference", "--param", "staleness=0,3", "--metric", "samples_per_s",
                   "--beside", "loss", "--out", str(tmp_path / "sweep"), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = (tmp_path / "sweep.csv").read_text().splitlines()
    assert (tmp_path / "sweep.png").exists() and rows[0] == "staleness,samples_per_s,note,bound,loss"
    (s0, got0, _, bound0, loss0), (s3, got3, _, bound3, loss3) = (row.split(",") for row in rows[1:])
    assert float(got3) > 1.5 * float(got0) and math.isclose(float(got3), float(bound3), rel_tol=0.02)
    assert math.isclose(float(loss3), float(loss0), rel_tol=0.05)  # the speed costs little loss at equal samples
    page = tmp_path / "report.html"
    proc = run_cli("report", "10", "--solution", "reference", "--out", str(page), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    html = page.read_text()
    assert '<section id="figure">' in html and "samples per virtual second" in html and "held-out loss" in html
    assert not leftovers()
