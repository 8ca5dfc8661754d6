"""The launcher's scenarios again, each rank sealed: its learner code in a process of its own.

Every way a run can end (tests/test_launcher.py) must read the same when the learner's code runs
behind the seal (runtime/seal/): the same status, the same rank blamed, the same file and line,
the same cycle in a deadlock, the same stacks, and nothing left behind.
"""

from __future__ import annotations

import pytest
import test_launcher as unsealed

# The scenarios whose account depends most on where the code runs: the rank and line blamed, a
# deadlock's cycle, the stacks, a death's cause, the limits, the guards. (All 16 of the file
# passed sealed when this was written; the suite's time keeps these.)
from test_launcher import (  # noqa: F401 - collected again here, sealed
    test_a_batch_runs_smaller_tasks_on_sub_communicators,
    test_a_call_whose_buffers_take_80_mib_runs_as_it_does_unsealed,
    test_a_failing_rank_s_outcome_says_which_marks_its_task_had_set,
    test_a_learner_exception_names_the_file_and_line_and_ends_the_peers,
    test_a_learner_s_endless_error_message_is_cut_saying_how_much_was_left_out,
    test_a_message_larger_than_its_receive_buffer_is_named_on_both_engines,
    test_a_message_one_task_left_unreceived_never_reaches_the_next,
    test_a_nonblocking_collective_delivers_its_inputs_at_the_post_and_its_result_at_the_wait,
    test_a_thread_that_finds_no_room_under_the_memory_limit_is_named,
    test_abort_in_a_rank_is_reported_as_a_crash,
    test_an_infinite_loop_ends_at_the_deadline_with_every_stack,
    test_mpi_finalize_in_the_solution_is_named_at_once_not_at_the_deadline,
    test_requests_never_waited_are_named_when_the_solution_returns,
    test_send_send_past_the_eager_limit_is_reported_as_a_deadlock_with_its_cycle,
    test_the_file_size_limit_is_enforced_and_named,
    test_the_memory_limit_is_enforced_and_named,
    test_the_rank_that_died_first_is_named_with_how_and_where,
    test_threads_of_a_rank_call_at_once_as_they_would_in_mpi4py,
    test_work_declared_negative_or_not_a_number_is_refused_alike_sealed_or_not,
)


@pytest.fixture(autouse=True)
def sealed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unsealed, "SEAL", True)
