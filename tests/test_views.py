"""Grading's views of a task: counters per phase (from the proxy's own snapshots at each
``comm.mark``, not from what the program returned) and the replay as typed spans and messages."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from distlab.grading import CheckFailed, Counts, Span, Task
from distlab.grading.tasks import typed
from distlab.runs import Program, run, run_options

PROGRAMS = Path(__file__).resolve().parent / "programs.py"
N = 16  # float64 values: 128 bytes per ring message


@pytest.fixture(scope="module")
def task_run():  # type: ignore[no-untyped-def]
    tasks = [Task(ranks=4, case=N)]
    done = run(Program(PROGRAMS, "marked_phases"), [t.for_ranks() for t in tasks], run_options("mpi"))
    assert done.ok, done.result.message
    return typed(done, tasks).tasks[0]


def test_a_phase_counts_what_the_rank_did_from_its_mark_to_the_next(task_run) -> None:  # type: ignore[no-untyped-def]
    ring = task_run.counts(1, "ring")
    assert ring.calls == {"Sendrecv": 1}
    assert ring.sent_bytes == {2: 8 * N} and ring.recv_bytes == {0: 8 * N}
    assert task_run.counts(1, "reduce").collectives_used() == ["Allreduce"]
    assert task_run.counts(1, "reduce").messages_sent == 0


def test_repeated_marks_make_one_phase_each_and_the_last_runs_to_the_end(task_run) -> None:  # type: ignore[no-untyped-def]
    steps = task_run.phases(0, "step")
    assert [s.bytes_sent for s in steps] == [16 * N, 16 * N]
    assert [s.bytes_received for s in task_run.phases(1, "step")] == [16 * N, 16 * N]
    assert task_run.counts(0, "step", nth=1) == steps[1]
    with pytest.raises(KeyError, match="no phase #2"):
        task_run.counts(0, "step", nth=2)
    # Cut once and kept: a check that edits the list it was given changes no later reading.
    steps.clear()
    assert len(task_run.phases(0, "step")) == 2


def test_the_phases_add_up_to_the_whole_task(task_run) -> None:  # type: ignore[no-untyped-def]
    whole = task_run.counts(0)
    assert isinstance(whole, Counts)
    parts = [task_run.counts(0, "ring"), task_run.counts(0, "reduce"), *task_run.phases(0, "step")]
    assert sum(p.bytes_sent for p in parts) == whole.bytes_sent
    assert sum(sum(p.calls.values()) for p in parts) == sum(whole.calls.values())


def test_the_timeline_gives_each_call_its_virtual_span_and_each_message_its_flow(task_run) -> None:  # type: ignore[no-untyped-def]
    timeline = task_run.timeline()
    assert timeline is task_run.timeline()  # replayed once
    assert timeline.ranks == [0, 1, 2, 3]
    (work,) = timeline.events(2, "compute")
    assert isinstance(work, Span) and work.name == "work" and work.seconds == pytest.approx(1e-3)
    assert [name for name, _ in timeline.marks(3)] == ["ring", "reduce", "step", "step"]
    sends = timeline.events(0, "send")
    assert sends[0].peer == 1 and sends[0].nbytes == 8 * N and sends[0].message is not None
    received = [key for span in timeline.events(1, "wait") for key in span.received]
    assert sends[0].message in received  # the sender and the receiver name the message alike
    ring = [m for m in timeline.messages if m.op == "send" and m.src == 0 and m.dst == 1]
    assert ring and all(m.posted <= m.start <= m.end <= timeline.makespan for m in ring)
    assert {m.op for m in timeline.messages} >= {"send", "Allreduce"}
    assert timeline.compute_s[2] == pytest.approx(1e-3)


def test_marks_differ_names_the_first_rank_whose_harness_marks_are_not_the_program_s(task_run) -> None:  # type: ignore[no-untyped-def]
    """Only the marks named in Task(marks=...) count ("reduce" is left out here); a count that
    differs is named with the mark, the same marks in another order with the first out of place."""
    listed = dataclasses.replace(task_run, spec=dataclasses.replace(task_run.spec, marks=("ring", "step"),
                                                                    label="phases"))
    assert listed.marks_differ(["ring", "step", "step"]) is None
    assert listed.marks_differ(["ring", "step"]) == "phases: rank 0 set 2 marks 'step' where the program sets 1"
    assert listed.marks_differ(["step", "ring", "step"], "stage") == (
        "phases: stage 0's mark #0 is 'ring' where the program sets 'step'")


def test_calls_before_the_programs_first_mark_fail_the_phases_that_would_hide_them(task_run) -> None:  # type: ignore[no-untyped-def]
    """The program marks before its first call, so a call before its first listed mark was moved
    out of the phases (by code that drops or sets the harness's marks itself): reading them fails."""
    def listing(*marks: str):  # type: ignore[no-untyped-def]
        return dataclasses.replace(task_run, spec=dataclasses.replace(task_run.spec, marks=marks, label="phases"))

    whole = listing("ring", "reduce", "step")
    assert whole.before_marks(0) == Counts() and len(whole.phases(0, "step")) == 2
    late = listing("reduce", "step")  # as if "ring" were not the program's: its Sendrecv comes first
    assert late.before_marks(1).calls == {"Sendrecv": 1}
    with pytest.raises(CheckFailed, match="phases: rank 1 called Sendrecv before the program's first mark 'reduce'"):
        late.phases(1, "step")
