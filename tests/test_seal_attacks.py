"""The seal holds: a sealed rank's learner process cannot reach the grader's truth (issue 10).

Each test runs a small attack (tests/seal_attacks.py) in sealed ranks through the launcher and
shows what it gets: nothing of the harness in its memory, no engine to join, no view of the job
folder, the references, other processes or the network, no write outside its own folder; a
forged request read as tampering; a detached child gone with the run.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import test_launcher
from conftest import DISTLAB, FIXTURES, REPO, run_cli
from e2e import assert_clean, run_check
from test_launcher import run

import distlab
from distlab.runtime.jobspec import Limits, Task, program_module_name
from distlab.runtime.seal import memgroup, syscalls

ATTACKS = Path(__file__).resolve().parent / "seal_attacks.py"
REFERENCE = Path(__file__).resolve().parents[1] / "problems" / "03-ring-allreduce" / "reference.py"
REFERENCE_02 = REFERENCE.parents[1] / "02-alpha-beta" / "reference.py"
NEEDED_UNDER_TMP = {Path(p).resolve().parts[2] for p in (ATTACKS, sys.prefix, *sys.path)
                    if p and Path(p).resolve().parts[1:2] == ("tmp",)}


@pytest.fixture(autouse=True)
def sealed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(test_launcher, "SEAL", True)


def attack(name: str, *args: object, ranks: int = 2, backend: str = "mpi",  # type: ignore[no-untyped-def]
           solution: Path = ATTACKS):
    job = test_launcher.make_job("call_solution", [Task(ranks=ranks, args=(name, *args))], solution,
                                 backend=backend)
    return run(job, deadline_s=30)


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_the_learner_process_holds_nothing_of_the_harness_and_sees_only_itself(backend: str) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        result = attack("facts", str(REFERENCE), distlab.__file__, listener.getsockname()[1],
                        backend=backend)
    finally:
        listener.close()
    assert result.ok, result.message
    for outcome in result.task_outcomes(0):
        seen = outcome.value
        assert seen["harness objects"] == []
        assert seen["mpi initialized"] is False and seen["engine variables"] == []
        assert seen["parent pid"] == 1  # the namespace's reaper: the agent is outside it
        assert seen["uid"] == 65534  # nobody, though the harness is root
        # /root (0700): shut, or, where the interpreter lives there, an empty tmpfs with what the
        # learner needs of it bound back.
        assert seen["root's home"] in ("PermissionError", [".pyenv"]), seen["root's home"]
        assert len(seen["processes"]) <= 3, seen["processes"]
        # No job folder, no other rank's files: its own folder, and what it needs that lives under
        # /tmp (a checkout there, a virtual environment), bound back read-only.
        assert set(seen["tmp"]) == {"learner", *NEEDED_UNDER_TMP}, seen["tmp"]
        # Empty where the checkout is in sight, not there at all where it is not (a checkout under
        # /tmp, which the learner's own tmpfs covers but for the paths it needs).
        assert seen["reference bytes"] in (0, "FileNotFoundError") and REFERENCE.stat().st_size > 0
        assert seen["bank bytecode"] in ([], "FileNotFoundError")  # a .pyc of check.py would be check.py
        assert seen["write into distlab"] in ("OSError", "PermissionError")  # read-only; not its own
        assert seen["connect to the host"] in ("OSError", "PermissionError")  # no network; no socket (seccomp)
        assert seen["comm.stats"] == "AttributeError"
        assert seen["own folder writable"] is True


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "unsealed"])
def test_the_learner_process_memory_holds_nothing_of_its_job(sealed: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # A task label is written in the job file and never sent to the learner process: forked as its
    # rank starts (rank/learner_fork.py), before the rank reads the job, it never had it. Unsealed,
    # the same search finds it: the test would see a learner forked too late.
    monkeypatch.setattr(test_launcher, "SEAL", sealed)
    first, second = "distlab-label-", uuid.uuid4().hex
    job = test_launcher.make_job("call_solution", [Task(ranks=2, args=("search_memory", first, second),
                                                        label=first + second)], ATTACKS)
    result = run(job, deadline_s=60)
    assert result.ok, result.message
    for outcome in result.task_outcomes(0):
        assert outcome.value["regions"] > 10
        assert (outcome.value["found"] > 0) is not sealed, outcome.value


def test_a_forged_request_is_named_as_tampering() -> None:
    result = attack("forge_request")
    assert result.status == "error", result.message
    assert "tampered with the channel to its rank's agent" in result.message


def test_asking_for_more_lines_than_the_client_opens_is_named_as_tampering() -> None:
    # A thread's call takes a line of its own (seal/lines.py), at most 7 more than the first; an
    # agent that opened all a learner asked for would make arenas and threads without end.
    result = attack("ask_for_lines", 40)
    assert result.status == "error", result.message
    assert ("tampered with the channel to its rank's agent: it asked for more than 7 further lines"
            in result.message), result.message


def test_a_learner_that_floods_the_opener_is_named_once_and_answered_no_more() -> None:
    result = attack("flood_the_opener", 2.0)
    assert result.status == "error", result.message
    assert "tampered with the channel to its rank's agent: it asked for more than 7 further lines" \
        in result.message, result.message


def test_a_child_the_solution_forks_is_told_comm_is_its_rank_s() -> None:
    # It inherits the lines, its main thread the first: its calls crossed its parent's there.
    result = attack("call_from_a_forked_child")
    assert result.ok, result.message
    for outcome in result.task_outcomes(0):
        assert outcome.value.startswith("RuntimeError: comm is its rank's: a process the solution "
                                        "forked cannot call it"), outcome.value


def test_a_result_handed_in_on_a_thread_s_line_is_named_as_tampering() -> None:
    result = attack("result_from_a_thread")
    assert result.status == "error", result.message
    assert "tampered with the channel to its rank's agent: result on a thread's line" in result.message


def test_a_learner_s_processes_are_bounded_together_not_only_each_alone() -> None:
    # Eight children of 250 MiB each, every one within the rank's 512 MiB: 2 GiB in all, which
    # only a memory cgroup per learner bounds (seal/memgroup.py). Before, all eight ran to the end.
    if memgroup.available().startswith("no "):
        pytest.skip(memgroup.available())
    job = test_launcher.make_job("call_solution", [Task(ranks=1, args=("fork_and_fill", 8, 250))], ATTACKS,
                                 limits=Limits(address_space_mb=512))
    result = run(job, deadline_s=60)
    assert result.status == "error", result.message
    limit_mib = memgroup.learner_memory_bytes(512, 256 << 20, 7 * (64 << 20)) >> 20
    assert (f"memory limit exceeded: its processes together passed the {limit_mib} MiB a learner's "
            "processes may hold, and the kernel ended") in result.message, result.message


def test_a_learner_left_waiting_on_a_child_the_kernel_ended_for_memory_is_named_at_once() -> None:
    # The children hold their memory until ended, and the learner waits for them all: once the
    # kernel has ended some, it waits on the rest for good. Before, the job ran to its deadline
    # ("timeout"); its agent now ends the learner and names the group's kills.
    if memgroup.available().startswith("no "):
        pytest.skip(memgroup.available())
    job = test_launcher.make_job("call_solution", [Task(ranks=1, args=("fill_and_wait_on_children", 8, 250))],
                                 ATTACKS, limits=Limits(address_space_mb=512))
    result = run(job, deadline_s=30)
    assert result.status == "error", result.message
    limit_mib = memgroup.learner_memory_bytes(512, 256 << 20, 7 * (64 << 20)) >> 20
    assert (f"its processes together passed the {limit_mib} MiB a learner's processes may hold, and the "
            "kernel ended") in result.message, result.message
    assert "its agent then ended the learner" in result.message, result.message


def test_a_result_nested_past_what_python_can_recurse_is_named_as_tampering() -> None:
    # The agent pickled it into the rank's outcome and crashed ("exited with status 1 before reporting").
    result = attack("forge_deep_result", 300_000)
    assert result.status == "error", result.message
    assert "tampered with its result" in result.message and "more than 100 deep" in result.message


def test_a_result_that_never_ends_is_named_at_the_agent_s_memory_limit() -> None:
    # Parts of a result the learner forges without a last one pile up in its agent, which keeps the
    # rank's limits: the run ends with the limit named, not with a crash or at the deadline.
    job = test_launcher.make_job("call_solution", [Task(ranks=2, args=("forge_endless_result", 100))], ATTACKS,
                                 limits=Limits(address_space_mb=2048))
    result = run(job, deadline_s=60)
    assert result.status == "error", result.message
    assert "memory limit exceeded: the rank may use 2048 MiB" in result.message


def test_a_result_is_rebuilt_up_to_a_depth_no_problem_reaches_and_refused_beyond() -> None:
    import pickle

    from distlab.runtime.seal.values import MAX_DEPTH, NestedTooDeep, read_value

    nested: list[Any] = []
    for _ in range(MAX_DEPTH):
        nested = [nested]
    assert read_value(pickle.dumps(nested), ()) == nested
    looped: list[Any] = []
    looped.append(looped)  # a cycle is not depth
    assert read_value(pickle.dumps(looped), ())[0][0] is not None
    with pytest.raises(NestedTooDeep, match=f"more than {MAX_DEPTH} deep"):
        read_value(pickle.dumps([nested]), ())
    with pytest.raises(NestedTooDeep):  # a dict's value is a level too
        read_value(pickle.dumps({"k": nested}), ())


@dataclasses.dataclass
class Answer:
    """A problem's value, whose fields the agent reads too."""

    start: int


def test_a_result_holding_an_int_wider_than_any_value_of_the_harness_is_refused() -> None:
    # An outside tester's 10**5000 (a shard's start on 01, a plan's degree on 05, a report's key on
    # 08...) and 10**400 (a loss on 15) crashed those checks where they print it or make a float.
    import pickle

    from distlab.runtime.seal.values import MAX_INT_BITS, IntTooLarge, read_value

    widest = 2**MAX_INT_BITS - 1  # a 256-bit digest fits, with room
    assert read_value(pickle.dumps([widest, -widest, {"k": (1, widest)}]), ()) == [widest, -widest, {"k": (1, widest)}]
    for forged in (10**5000, [1, (2, {"loss": 10**400})], {10**200: 1}, Answer(10**5000)):
        with pytest.raises(IntTooLarge, match="wider than the 512"):
            read_value(pickle.dumps(forged), (__name__,))


def test_a_reply_the_learner_forges_for_itself_is_a_call_the_agent_never_counted() -> None:
    # The learner trusts its agent's replies, and a forged one fools only itself: the counters
    # the checks read are the agent's, which saw a Barrier and no Allreduce.
    result = attack("forge_reply")
    assert result.ok, result.message
    for outcome in result.task_outcomes(0):
        assert outcome.value == 2.0
        assert outcome.stats.calls.get("Allreduce", 0) == 0 and outcome.stats.calls["Barrier"] == 1


def test_a_detached_child_of_the_learner_does_not_outlive_the_run() -> None:
    marker = f"distlab-seal-test-{uuid.uuid4().hex}"
    result = attack("leave_a_child", marker)
    assert result.ok, result.message
    survivors = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert survivors == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the learner runs as nobody only under root")
def test_a_learner_starting_processes_without_end_is_refused_at_its_limit_and_they_die_with_the_run() -> None:
    """A fork bomb would fill the machine (a PID namespace bounds no count); the learner's user may run
    Limits.processes processes and threads at once (RLIMIT_NPROC, set before the change of user), so
    the kernel refuses the next one (EAGAIN), and every one started dies with the learner's namespace."""
    marker, limit = f"distlab-seal-test-{uuid.uuid4().hex}", 24
    job = test_launcher.make_job("call_solution", [Task(ranks=2, args=("start_until_refused", marker, 200))],
                                 ATTACKS, limits=Limits(processes=limit))
    result = run(job, deadline_s=60)
    assert result.ok, result.message
    counts = [outcome.value for outcome in result.task_outcomes(0)]
    assert all(refused == "BlockingIOError" for _, refused in counts), counts
    assert sum(started for started, _ in counts) <= limit - 2, counts  # the two learners count too
    survivors = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert survivors == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the learner has a /tmp of its own only under root")
@pytest.mark.parametrize("folder, most_mb", [("/tmp", 1024 // 4), ("/dev/shm", 64)])
def test_a_learner_filling_its_scratch_folders_is_stopped_at_their_size(folder: str, most_mb: int) -> None:
    """Each rank's fresh tmpfs is memory that no limit of its process counts: /tmp holds a quarter of
    the rank's address space (here 1024 MiB: 256 MiB), /var/tmp and /dev/shm 64 MiB each; a write
    past them fails with ENOSPC instead of taking the machine's memory (1 GiB each before)."""
    job = test_launcher.make_job("call_solution", [Task(ranks=2, args=("fill_scratch", folder))], ATTACKS,
                                 limits=Limits(address_space_mb=1024))
    result = run(job, deadline_s=60)
    assert result.ok, result.message
    for written_mb, errno in (outcome.value for outcome in result.task_outcomes(0)):
        assert errno == 28 and most_mb - 32 <= written_mb <= most_mb, (written_mb, errno)  # ENOSPC


def test_the_learner_is_the_first_to_go_when_memory_runs_out_and_cannot_change_that() -> None:
    # Its processes together have no memory limit (each has the rank's): the kernel's OOM killer
    # picks them before the harness.
    result = attack("lower_oom_score")
    assert result.ok, result.message
    for score, lowered in (outcome.value for outcome in result.task_outcomes(0)):
        assert score == 1000 and lowered != "lowered", (score, lowered)


def test_the_learner_cannot_share_the_keyring_locks_or_file_watches_and_ordinary_calls_work() -> None:
    # Ranks could pass data through these kernel objects, outside the counted communicator
    # (runtime/seal/syscalls.py): its seccomp filter refuses each with EPERM, and lets every other
    # fcntl command and a read of a file through.
    result = attack("shared_kernel_objects")
    assert result.ok, result.message
    for outcome in result.task_outcomes(0):
        seen = outcome.value
        refused = ("add_key", "keyctl", "F_SETLK", "F_GETLK", "flock", "inotify_init1", "fanotify_init",
                   "shmget", "msgget", "memfd_create", "socket", "socketpair",
                   "splice", "tee", "vmsplice", "sendfile", "io_uring_setup", "userfaultfd")
        assert {name: seen[name] for name in refused} == dict.fromkeys(refused, "EPERM"), seen
        assert seen["copyfile"] == "allowed", seen  # shutil falls back from sendfile
        assert seen["F_SETFD"] == seen["F_DUPFD"] == "allowed" and seen["F_GETFL"] is seen["read"] is True, seen


def test_a_learner_cannot_hold_the_lock_of_the_pipe_its_agent_reads() -> None:
    """A pipe's ends share one lock, which the agent takes in each read: a splice that waits
    while holding it left the agent asleep in the kernel to the deadline (an outside tester's
    attack). splice and the calls like it are refused: the Barrier after it is served at once."""
    t0 = time.monotonic()
    result = attack("hold_the_ring_pipe")
    assert result.ok, result.message
    assert [o.value for o in result.task_outcomes(0)] == ["PermissionError", "not asked"]
    assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("name, refused", [("covert_keyring.py", "PermissionError"),
                                           ("covert_locks.py", "PermissionError"),
                                           ("covert_cgroup.py", "FileNotFoundError")])
def test_a_covert_channel_between_ranks_outside_the_communicator_is_closed(name: str, refused: str) -> None:
    """An outside tester passed problem 03 with 12/12 while sending only zeros over comm: the data
    crossed between the sandboxed ranks through uid nobody's user keyring, as the offsets of read
    locks on the solution file, which every rank shares, or as the tmpfs pages a rank held, read
    in its memory cgroup's memory.stat by its peer, whose group lies beside it (tests/fixtures/03/).
    Refused now (runtime/seal/syscalls.py; sandbox.py empties /sys/fs/cgroup), the attack fails on
    its first small case, and nothing is left."""
    run = run_check("03", "--solution", str(FIXTURES / "03" / name), "--seal", "on", seed=4242, timeout=150)
    assert_clean(run)
    assert run.rc == 1 and run.results is not None, run.out  # failed, and graded: no harness crash
    assert run.results["score"] < run.results["max_score"], run.out
    assert refused in run.messages(), run.out


@pytest.mark.skipif(os.geteuid() != 0, reason="the learner runs as nobody only under root")
def test_a_solution_only_root_may_read_is_read_by_the_learner_through_a_copy(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    solution = private / "attacks.py"
    solution.write_text(ATTACKS.read_text())
    solution.chmod(0o600)
    result = attack("total_of", solution=solution)
    assert result.ok, result.message
    assert [o.value for o in result.task_outcomes(0)] == [2.0, 2.0]


def test_counters_stay_the_agent_s() -> None:
    result = attack("total_of", ranks=3)
    assert result.ok, result.message
    for outcome in result.task_outcomes(0):
        assert outcome.value == 3.0
        assert outcome.stats.calls["Allreduce"] == 1


def test_signals_from_the_learner_reach_no_process_of_the_harness() -> None:
    # Its PID namespace holds itself and its reaper (which takes no signal from inside): the agent,
    # the peers and the supervisor cannot be named, so the run goes on and grades as usual.
    result = attack("signal_everyone", os.getpid())
    assert result.ok, result.message
    for outcome in result.task_outcomes(0):
        tried, total = outcome.value
        assert total == 2.0 and outcome.stats.calls["Allreduce"] == 1
        # Sent to the reaper and to "everyone" (nobody else in the namespace): nothing happens.
        assert tried["SIGKILL to supervisor"] == tried["SIGSTOP to supervisor"] == "ProcessLookupError"


@pytest.mark.parametrize("how, in_thread", [("exit", False), ("SIGINT", False), ("exit", True)])
def test_a_learner_process_that_dies_in_a_call_is_named_with_the_call(how: str, in_thread: bool) -> None:
    # Its agent waits in the engine: its watcher thread mirrors the death, a signal's too. A call
    # on a thread's line (seal/lines.py) is where it died when the main thread was in none.
    result = attack("die_in_recv", how, in_thread)
    assert result.status == "crashed" and result.failing_rank == 1, result.message
    died = "exited with status 3" if how == "exit" else "died of SIGINT (signal 2)"
    assert result.message.startswith(f"rank 1 {died} before reporting"), result.message
    assert "its learner process died in Recv" in result.message


def _memory_group_words(prefix: list[str]) -> str:
    """What -v says of the learner's memory group (seal/memgroup.py), asked under ``prefix``."""
    asked = subprocess.run([*prefix, sys.executable, "-c", "from distlab.runtime.seal import memgroup; "
                            "print(memgroup.available())"], capture_output=True, text=True, timeout=60)
    assert asked.returncode == 0, asked.stderr
    return asked.stdout.strip()


def _reference_02_leaving_a_child(tmp_path: Path) -> tuple[Path, str]:
    """Problem 02's reference, which also starts a sleeper in a session of its own at import; and
    the marker on the sleeper's command line."""
    marker = f"distlab-seal-test-{uuid.uuid4().hex}"
    solution = tmp_path / "leaves_a_child.py"
    solution.write_text(REFERENCE_02.read_text() + (
        "\n\nimport subprocess as _subprocess, sys as _sys\n"
        f"_subprocess.Popen([_sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'],"
        " start_new_session=True)\n"))
    return solution, marker


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root, and setpriv to drop CAP_SYS_ADMIN")
def test_root_without_cap_sys_admin_falls_back_to_user_and_pid_namespaces(tmp_path: Path) -> None:
    """Root in a container's default profile has no CAP_SYS_ADMIN, so no mount namespace: the
    seal says so in -v (user and PID namespaces only), the check still grades, and a detached
    child of the learner's still dies with it (its PID namespace)."""
    solution, marker = _reference_02_leaving_a_child(tmp_path)
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.run(["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin",
                           *DISTLAB, "check", "02", "--solution", str(solution), "--seal", "on", "-v"],
                          capture_output=True, text=True, timeout=180, env=env, cwd=REPO)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0, out[-3000:]
    assert "the learner's code runs in own user and PID namespaces only" in out, out[:2000]
    assert _memory_group_words(["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin"]) in out
    survivors = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert survivors == []
    # The zygote leaves at EOF on its stdin, a moment after the CLI that started it (CI once found
    # it still there when asked at once).
    test_launcher.assert_nothing_left()
    assert not Path("/tmp/learner").exists()  # its working folder was the job's, gone with it


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root, and unshare to make a user namespace")
def test_root_of_a_user_namespace_without_nobody_keeps_the_mounts_as_uid_0(tmp_path: Path) -> None:
    """Root of a user namespace that maps only itself (`unshare -r`, as in some rootless
    containers) cannot become nobody (setgroups is denied, uid 65534 is not mapped): the seal
    keeps its mounts and namespaces with the learner as that uid 0 without capabilities, says so
    in -v, and the check grades; before, the learner died of a PermissionError."""
    solution, marker = _reference_02_leaving_a_child(tmp_path)
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.run(["unshare", "-r", *DISTLAB, "check", "02", "--solution", str(solution), "-v"],
                          capture_output=True, text=True, timeout=180, env=env, cwd=REPO)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0, out[-3000:]
    assert "uid 0 of the harness's user namespace without capabilities (user nobody is not mapped" in out
    assert _memory_group_words(["unshare", "-r"]) in out, out[:2000]  # as it holds there
    survivors = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert survivors == []
    # The zygote leaves at EOF on its stdin, a moment after the CLI that started it (CI once found
    # it still there when asked at once).
    test_launcher.assert_nothing_left()


PROBE_SYSCALLS = '''
import ctypes, errno, fcntl, os

def allreduce(comm, buf, op=None):
    libc = ctypes.CDLL(None, use_errno=True)
    added = libc.syscall(248, b"user", b"distlab-probe", b"x", 1, ctypes.c_int(-2))  # its own keyring
    add_key = "allowed" if added >= 0 else errno.errorcode[ctypes.get_errno()]
    try:
        fcntl.flock(os.open(__file__, os.O_RDONLY), fcntl.LOCK_SH | fcntl.LOCK_NB)
        flock = "allowed"
    except OSError as exc:
        flock = errno.errorcode[exc.errno]
    raise RuntimeError(f"add_key={{add_key}} flock={{flock}}")
'''


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root, and setpriv to drop CAP_SYS_ADMIN")
def test_the_syscall_filter_holds_without_mounts_too(tmp_path: Path) -> None:
    """The keyring and file locks are shared between ranks without the sandbox's mounts too (the
    fallback of a container's root): the learner gets no_new_privs and the seccomp filter there,
    and -v says so."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE_SYSCALLS.format())
    proc = subprocess.run(["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin",
                           *DISTLAB, "check", "03", "--solution", str(probe), "--seed", "1", "--seal", "on", "-v"],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    said = " ".join((proc.stdout + proc.stderr).split())
    assert f"own user and PID namespaces only (not root with CAP_SYS_ADMIN: the filesystem, network and /proc are shared); {syscalls.DESCRIPTION}" in said, said[:2000]
    assert "add_key=EPERM flock=EPERM" in said, said
    test_launcher.assert_nothing_left()  # the zygote leaves a moment after the CLI


PROBE_CHECKOUT = '''
import os

def allreduce(comm, buf, op=None):
    repo = {repo!r}
    try:
        history = sorted(os.listdir(os.path.join(repo, ".git")))
    except OSError as exc:
        history = type(exc).__name__
    try:
        alternative = len(open(os.path.join(repo, "tests", "fixtures", "03", "alt_isend.py")).read())
    except OSError as exc:
        alternative = type(exc).__name__
    raise RuntimeError(f"git={{history}} alternative={{alternative}}")
'''


def test_a_checked_solution_reads_neither_the_checkout_s_history_nor_its_tests(tmp_path: Path) -> None:
    """An outside tester passed problems 09-12 with references read back from .git's objects;
    tests/fixtures holds correct alternatives. Both are out of a sealed learner's reach."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE_CHECKOUT.format(repo=str(REPO)))
    done = subprocess.run([*DISTLAB, "check", "03", "--solution", str(probe), "--seed", "1"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    said = " ".join((done.stdout + done.stderr).split())
    assert (REPO / ".git").exists() and (REPO / "tests" / "fixtures" / "03" / "alt_isend.py").stat().st_size
    # .git empty where the checkout is in sight, not there where it is not (a checkout under /tmp).
    assert re.search(r"git=(\[\]|FileNotFoundError) alternative=FileNotFoundError", said), said


@pytest.mark.parametrize("route", ["dotted path", "torch storage"])
def test_a_result_that_smuggles_code_into_the_agent_runs_nothing_there(route: str, tmp_path: Path) -> None:
    """Two ways outside testers ran code as root in the agent, which unpickles each result: a name
    ``<problem>.programs`` + ``np.lib._npyio_impl.pickle.loads`` (pickle follows dots; the program
    imports numpy as np), and ``torch.storage._load_from_bytes``, which is torch.load with
    weights_only=False; each around a pickle that runs anything. Now the check fails as tampering
    and the code never ran (it wrote the marker as root before the fix)."""
    marker = tmp_path / "ran-in-the-agent"
    solution = tmp_path / "solution.py"
    code = SMUGGLE_BY[route].replace("SAVED", repr(torch_saved_runner(marker)) if route == "torch storage" else "")
    solution.write_text(SMUGGLER.replace("MARKER", str(marker)) + code)
    proc = run_cli("check", "03", "--solution", str(solution), "--seed", "1", "--seal", "on", timeout=180)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1 and "tampered with its result" in out, out
    assert not marker.exists()


def torch_saved_runner(marker: Path) -> bytes:
    """What torch.save writes for an object whose unpickling writes ``marker``."""
    import torch

    class Runs:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (exec, (f"open({str(marker)!r}, 'w').write('root' if __import__('os').getuid() == 0 else 'user')",))

    saved = io.BytesIO()
    torch.save(Runs(), saved)
    return saved.getvalue()


# A solution of problem 03 whose every result is a pickle that reaches an unpickler, around a
# pickle that writes MARKER.
SMUGGLER = """
import io, pickle, struct, sys
from distlab import SUM


class _Runs:
    def __reduce__(self):
        return (exec, ("open('MARKER', 'w').write('root' if __import__('os').getuid() == 0 else 'user')",))


def allreduce(comm, buf, op=SUM):
    out = buf.copy()
    comm.Allreduce(buf, out, op=op)
    buf[...] = out
"""
SMUGGLE_BY = {
    "dotted path": """
def _text(s):
    return b"\\x8c" + bytes([len(s.encode())]) + s.encode()


_program = next(name for name in sys.modules if name.startswith("distlab_problem_03") and name.endswith(".programs"))
_inner = pickle.dumps(_Runs(), protocol=4)
_evil = (b"\\x80\\x04" + _text(_program) + _text("np.lib._npyio_impl.pickle.loads") + b"\\x93"
         + b"B" + struct.pack("<I", len(_inner)) + _inner + b"\\x85R.")
sys.modules["distlab.runtime.rank.learner_main"].encode_value = lambda value: _evil
""",
    # The saved file is made here, by the test (torch_saved_runner): a solution that imported torch
    # would pay torch's import in every rank of every launch of the check, 20 s of the suite.
    "torch storage": """
def _text(s):
    return b"\\x8c" + bytes([len(s.encode())]) + s.encode()


_saved = SAVED
_evil = (b"\\x80\\x04" + _text("torch.storage") + _text("_load_from_bytes") + b"\\x93"
         + b"B" + struct.pack("<I", len(_saved)) + _saved + b"\\x85R.")
sys.modules["distlab.runtime.rank.learner_main"].encode_value = lambda value: _evil
""",
}


def test_the_agent_rebuilds_only_classes_of_the_package_by_their_plain_names() -> None:
    import dataclasses
    import pickle
    import types

    import numpy as np

    from distlab.runtime.seal.values import UnsafeValue, read_value

    package = types.ModuleType("distlab_problem_99_values")
    cases = types.ModuleType("distlab_problem_99_values.cases")
    sys.modules.update({package.__name__: package, cases.__name__: cases})
    exec("import numpy as np\nfrom dataclasses import dataclass\n@dataclass\nclass Case:\n    n: int\n"
         "def helper(x):\n    return x\n_hidden = 1\n", cases.__dict__)
    try:
        value = cases.Case(3)
        assert read_value(pickle.dumps({"case": value, "a": np.arange(3.0)}, protocol=5), (package.__name__,))["case"] == value
        assert dataclasses.is_dataclass(read_value(pickle.dumps(value, protocol=5), (package.__name__,)))

        def naming(module: str, name: str) -> bytes:
            return b"\x80\x04" + bytes([0x8C, len(module)]) + module.encode() + bytes([0x8C, len(name)]) + name.encode() + b"\x93."

        for module, name in [(cases.__name__, "np.lib._npyio_impl.pickle.loads"), (cases.__name__, "helper"),
                             (cases.__name__, "np"), (cases.__name__, "_hidden"), (cases.__name__, "dataclass"),
                             (package.__name__ + ".reference", "Case"), (package.__name__ + ".judging", "Case"),
                             ("numpy.dtypes", "np"), ("os", "system")]:
            with pytest.raises(UnsafeValue, match="does not rebuild"):
                read_value(naming(module, name), (package.__name__,))

        # Listed makers asked for more than the pickle carries (bytearray(3 << 30) in 48 bytes
        # once took the agent to 12.6 GB): refused, while the values they rebuild still come back.
        class Bomb:
            def __init__(self, make: Any, *args: Any) -> None:
                self.make, self.args = make, args

            def __reduce__(self) -> Any:
                return self.make, self.args

        for bomb in (Bomb(bytearray, 3 << 30), Bomb(list, range(10**9)), Bomb(set, range(10**9)),
                     Bomb(np.ndarray.__reduce__(np.empty(0))[0], np.ndarray, (10**6, 10**6), b"b")):
            with pytest.raises(UnsafeValue, match="items from a pickle of"):
                read_value(pickle.dumps(bomb, protocol=4), (package.__name__,))
        kept = {"bytes": bytearray(b"abc"), "set": {1, 2}, "deque": collections.deque([1, 2], 5),
                "ordered": collections.OrderedDict(a=1), "big": np.arange(10**5)}
        for protocol in (4, 5):
            again = read_value(pickle.dumps(kept, protocol=protocol), (package.__name__,))
            assert again["bytes"] == kept["bytes"] and again["set"] == kept["set"]
            assert again["deque"] == kept["deque"] and again["ordered"] == kept["ordered"]
            assert np.array_equal(again["big"], kept["big"])
    finally:
        del sys.modules[package.__name__], sys.modules[cases.__name__]


@pytest.mark.skipif(os.geteuid() != 0, reason="the learner is left uid 0 only under root")
def test_a_learner_left_uid_0_can_write_neither_the_kernel_s_settings_nor_a_disk(tmp_path: Path) -> None:
    """A program in a folder only root may read, too large to copy (sparse here), leaves the learner
    uid 0 without capabilities (sandbox.FULL_AS_ROOT). An outside tester then wrote core_pattern
    and had the kernel run its script as root: /proc is read-only now, and /dev holds only the
    devices a program opens, not the host's disks."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    shutil.copy(test_launcher.PROGRAMS, private / "programs.py")
    with open(private / "large.bin", "wb") as f:
        f.truncate(80 << 20)  # over the copy limit, no disk used
    job = dataclasses.replace(test_launcher.make_job("call_solution", [Task(ranks=1, args=("what_uid_0_could_write",))],
                                                     ATTACKS),
                              program_file=str(private / "programs.py"),
                              program_module=program_module_name(private / "programs.py"))
    result = run(job, deadline_s=60)
    assert result.ok, result.message
    seen = result.task_outcomes(0)[0].value
    assert seen["uid"] == 0, seen  # the fallback this test is about
    assert seen["/proc/sys/kernel/core_pattern"] != "allowed" and seen["/proc/sysrq-trigger"] != "allowed", seen
    assert seen["dev"] == ["fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero"]


@pytest.mark.parametrize("top", ["/var/tmp", "/srv", "/mnt", "/opt"])
def test_what_users_may_write_is_emptied_for_the_learner(top: str) -> None:
    """Every folder at the top of the filesystem but the system's (/var, /home, /run, /srv, /opt,
    /mnt...), which an exam's candidate could write after the deadline for a solution submitted
    before it to read (an outside tester's notes file in /var/tmp; another's stub ran code it
    wrote after the deadline): empty to the learner, and so are the memory cgroups."""
    if not os.path.isdir(top):
        pytest.skip(f"no {top} here")
    note = Path(tempfile.mkdtemp(dir=top)) / "notes.txt"
    try:
        note.parent.chmod(0o755)
        note.write_text("data written where users may write")
        note.chmod(0o644)
        result = attack("read_where_users_write", str(note), ranks=1)
    finally:
        shutil.rmtree(note.parent)
    assert result.ok, result.message
    seen = result.task_outcomes(0)[0].value
    assert seen == {"file": "FileNotFoundError", "/home": [], "/sys/fs/cgroup": []}, seen
