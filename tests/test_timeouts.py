"""Timeouts on communication (runtime/comm/timed.py): comm.set_timeout and a call's timeout=
make a blocking call raise distlab.CommTimeout naming the call, the peer and the time waited,
within its timeout and half a second; the virtual clock charges the wait; what the call started
is finished later (a late message reaches the next receive, a late rank finishes the collective
the others gave up on, whose communicator is broken); the supervisor does not take timed waits
for a deadlock; a bad timeout is named. Sealed and not, on both engines."""

from __future__ import annotations

from pathlib import Path

import pytest

from distlab.grading import Task
from distlab.runs import Program, Run, run, run_options
from distlab.runtime.comm.errors import CommBroken, CommTimeout, comm_timeout_from

PROGRAMS = Path(__file__).resolve().parent / "programs.py"
SOLUTION = Path(__file__).resolve().parent / "timeout_programs.py"

_LAUNCHES: dict[tuple[str, bool], Run] = {}


def launched(backend: str, seal: bool) -> Run:
    """One launch per engine and seal, every case a task; the clock runs online (comm.now())."""
    if (backend, seal) not in _LAUNCHES:
        tasks = [Task(ranks=2, case="receive_late"), Task(ranks=3, case="collective_left_behind"),
                 Task(ranks=2, case="send_and_wait_give_up"), Task(ranks=1, case="bad_timeouts")]
        done = run(Program(PROGRAMS, "call_solution", SOLUTION), [t.for_ranks() for t in tasks],
                   run_options(backend, seal=seal), online_clock=True, deadline_s=90)
        assert done.ok, done.result.message
        _LAUNCHES[backend, seal] = done
    return _LAUNCHES[backend, seal]


ENGINES = [("mpi", True), ("gloo", True), ("mpi", False)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend,seal", ENGINES)
def test_a_receive_gives_up_and_its_message_goes_to_the_next_receive(backend: str, seal: bool) -> None:
    task = launched(backend, seal).tasks[0]
    got = task.values[0]
    message, call, peer, waited, took = got["timed_out"]
    assert message == "Recv with rank 1 timed out after 0.3 s: no message came"
    assert (call, peer, waited) == ("Recv", 1, 0.3) and 0.3 <= took <= 0.3 + 0.5
    assert got["untouched"] == [0.0] * 4  # a withdrawn receive writes nothing
    assert got["later"] == [1.0, 2.0, 3.0, 4.0]
    assert got["any"][0] == "Recv with any rank timed out after 0.2 s: no message came"
    assert got["now"] >= 0.3  # the online clock charged the wait
    timeouts = [e for e in task.traces[0] if e[0] == "timeout"]
    assert [(e[1], e[2], e[3]) for e in timeouts] == [("Recv", 1, 0.3), ("Recv", -1, 0.2)]
    assert task.outcomes[0].stats.recv_msgs[1] == 1  # only the message that came
    played = task.replay()
    assert played.finish[0] >= 0.5 and played.comm_s[0] >= 0.5  # both waits, charged as comm


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend,seal", ENGINES)
def test_a_collective_gives_up_breaks_its_communicator_and_a_late_rank_finishes_it(
        backend: str, seal: bool) -> None:
    task = launched(backend, seal).tasks[1]
    for r in (0, 1):
        got = task.values[r]
        message, call, peer, waited, took = got["timed_out"]
        assert message == ("Allreduce with ranks 0-2 timed out after 0.3 s: not every rank of "
                           "the communicator reached it in time")
        assert (call, peer, waited) == ("Allreduce", (0, 1, 2), 0.3) and took <= 0.3 + 0.5
        for what in ("broken", "broken_send"):
            assert got[what].startswith("CommBroken: this communicator (3 ranks) is unusable: "
                                        "its Allreduce timed out after 0.3 s")
        assert got["other"] == 3.0  # the Dup made before still works
    assert task.values[2]["sum"] == [6.0] * 3  # the late rank got everyone's contribution
    assert task.values[2]["other"] == 3.0
    assert [e[0] for e in task.traces[0] if e[0] in ("icoll", "timeout")] == ["icoll", "timeout"]
    task.replay()  # the abandoned collective lines up with the late rank's


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend,seal", ENGINES)
def test_set_timeout_gives_up_a_send_and_a_wait_and_the_send_still_arrives(
        backend: str, seal: bool) -> None:
    task = launched(backend, seal).tasks[2]
    got = task.values[0]
    assert got["timeout"] == 0.25
    assert got["send"][:4] == ("Send with rank 1 timed out after 0.25 s: no rank took the "
                               "message", "Send", 1, 0.25)
    assert got["wait"][:4] == ("Wait with rank 1 timed out after 0.25 s: the request did not "
                               "complete", "Wait", 1, 0.25)
    assert got["wait_all"][:4] == ("Waitall with rank 1 timed out after 0.1 s: 1 of its 1 "
                                   "requests did not complete", "Waitall", 1, 0.1)
    assert all(got[k][4] <= got[k][3] + 0.5 for k in ("send", "wait", "wait_all"))
    assert task.values[1]["received"] is True
    task.replay()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend,seal", ENGINES)
def test_a_bad_timeout_is_named(backend: str, seal: bool) -> None:
    got = launched(backend, seal).tasks[3].values[0]
    assert got == {
        "zero": "ValueError: Recv: a timeout is a number of seconds > 0, not 0",
        "negative": "ValueError: set_timeout: a timeout is a number of seconds > 0, not -1",
        "text": "ValueError: Barrier: a timeout is a number of seconds > 0, not 'soon'",
        "infinite": "ValueError: Allreduce: a timeout is a number of seconds > 0, not inf",
        "unset": None,
    }


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_ranks_waiting_with_timeouts_are_not_a_deadlock(backend: str) -> None:
    """A cycle of receives ends the job as a deadlock after stall_s (0.5 s) without timeouts;
    with a 1.5 s timeout on each, every rank gives up and the job ends well."""
    done = run(Program(PROGRAMS, "call_solution", SOLUTION),
               [Task(ranks=3, case="waiting_in_a_cycle").for_ranks()],
               run_options(backend, seal=True), deadline_s=60, stall_s=0.5)
    assert done.ok, done.result.message
    for got in done.tasks[0].values:
        message, call, _, waited, took = got["timed_out"]
        assert call == "Recv" and waited == 1.5 and 1.5 <= took <= 2.0


def test_a_timeout_crosses_the_seal_as_itself() -> None:
    """The sealed client rebuilds the learner's CommTimeout from its message alone."""
    for error in (CommTimeout("Recv", 3, 0.5, "no message came"), CommTimeout("Recv", -1, 2.0),
                  CommTimeout("Allreduce", (0, 1, 2, 3), 1.0, "why"),
                  CommTimeout("Waitall", (1, 3), 0.1), CommTimeout("store.get", "a key", 0.4)):
        again = comm_timeout_from(str(error))
        assert (again.call, again.peer, again.waited_s, str(again)) == (
            error.call, error.peer, error.waited_s, str(error))
    assert issubclass(CommTimeout, TimeoutError) and issubclass(CommBroken, RuntimeError)


def test_no_mixin_stub_hides_a_real_method_of_comm() -> None:
    """Comm is made of mixins (proxy.py) that declare what they use of each other as stubs
    raising NotImplementedError: a stub earlier in the bases than the real method would win."""
    import inspect

    from distlab.runtime.comm.proxy import Comm

    winners = []
    for name in dir(Comm):
        owner = next(k for k in Comm.__mro__ if name in k.__dict__)
        try:
            source = inspect.getsource(owner.__dict__[name])
        except (TypeError, OSError):
            continue
        if "raise NotImplementedError" in source and source.count("\n") <= 3:
            winners.append(f"{owner.__name__}.{name}")
    assert winners == []
