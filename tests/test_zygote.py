"""Ranks forked from the zygote: the same runs, and the same ends, as ranks started afresh.

The zygote (runtime/zygote/server.py) has imported what ranks import; gloo ranks are forked from it
at the supervisor's request, MPI ranks at the request of the stand-in that mpiexec starts. These
tests show that each rank is such a fork, in a session of its own, that turning the zygote off
gives plain processes and the same results, that a sealed rank forks its learner process (or,
with the zygote off, starts it afresh), that a rank dies with the stand-in that asked for it
and the zygote with its supervisor, and that the zygote serves no other user.
"""

from __future__ import annotations

import array
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import test_launcher
from test_launcher import make_job, run

from distlab.runtime.jobspec import JOB_FILE, Task, pid_path, write_pickle_atomically
from distlab.runtime.rank.learner_fork import LEARNER_PROCESS_NAME
from distlab.runtime.supervisor.start import free_port, rank_env
from distlab.runtime.zygote import client as zygote_client
from distlab.runtime.zygote import server as zygote_server
from distlab.runtime.zygote import wire as zygote_wire
from distlab.runtime.zygote.server import RANK_PROCESS_NAME


def test_each_rank_is_a_fork_of_a_zygote_that_imported_no_more_than_the_rank_would() -> None:
    # gloo first: its zygote imports torch, which the MPI ranks of a program that does not import
    # it must not carry (their address space counts against their memory limit).
    for backend, torch_imported in (("gloo", True), ("mpi", False)):
        result = run(make_job("process_facts", [Task(ranks=3)], backend=backend), deadline_s=60)
        assert result.status == "ok", result.message
        zygotes = {z.process.pid for z in zygote_client._zygotes.values() if z.alive()}
        for outcome in result.task_outcomes(0):
            pid, parent, session, name, torch = outcome.value
            assert parent in zygotes and (session, name) == (pid, RANK_PROCESS_NAME.decode())
            assert torch is torch_imported, backend


def test_an_mpi_zygote_has_loaded_the_mpi_library_and_a_gloo_zygote_has_not() -> None:
    # Loaded, not initialized: each MPI rank's import of mpi4py.MPI finds the libraries in place
    # (60-100 ms of CPU a rank otherwise); gloo's ranks never use them.
    for backend in ("mpi", "gloo"):
        result = run(make_job("process_facts", [Task(ranks=2)], backend=backend), deadline_s=60)
        assert result.status == "ok", result.message
    seen = set()
    for zygote in [z for z in zygote_client._zygotes.values() if z.alive()]:
        gloo = zygote_server.GLOO_ENGINE in zygote.process.args
        maps = Path(f"/proc/{zygote.process.pid}/maps").read_text()
        assert ("/libmpi.so" in maps) is not gloo, zygote.process.args
        seen.add(gloo)
    assert seen == {True, False}


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_launches_for_other_workspaces_share_a_zygote_and_each_rank_sees_its_own(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The suite launches from one process for a workspace per test: a zygote each was 0.3-1.7 s.
    started = []
    for name in ("first", "second"):
        monkeypatch.setenv("DISTLAB_WORKSPACE", str(tmp_path / name))
        job = make_job("environment_seen", [Task(ranks=2, args=("DISTLAB_WORKSPACE",))], backend=backend)
        result = run(job, deadline_s=60)
        assert result.status == "ok", result.message
        assert [o.value for o in result.task_outcomes(0)] == [str(tmp_path / name)] * 2
        started.append({z.process.pid for z in zygote_client._zygotes.values() if z.alive()})
    assert started[0] == started[1]  # the second launch started none


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_without_the_zygote_ranks_are_plain_processes_with_the_same_results(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(zygote_client.OFF_ENV, "1")
    result = run(make_job("ring_sum", [Task(ranks=3, args=(5,))], backend=backend), deadline_s=60)
    facts = run(make_job("process_facts", [Task(ranks=2)], backend=backend), deadline_s=60)
    assert result.status == facts.status == "ok", result.message + facts.message
    assert [o.value.tolist() for o in result.task_outcomes(0)] == [[2.0] * 5, [0.0] * 5, [1.0] * 5]
    assert {o.value[3] for o in facts.task_outcomes(0)} == {"python"}


@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "no zygote"])
def test_a_sealed_rank_forks_its_learner_process_unless_the_zygote_is_off(
    zygote: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rank/learner_fork.py: forked as the rank starts, or, with the zygote off, started afresh;
    # the same program either way.
    monkeypatch.setattr(test_launcher, "SEAL", True)
    if not zygote:
        monkeypatch.setenv(zygote_client.OFF_ENV, "1")
    result = run(make_job("process_facts", [Task(ranks=2)]), deadline_s=60)
    assert result.status == "ok", result.message
    names = {o.value[3] for o in result.task_outcomes(0)}
    assert names == {LEARNER_PROCESS_NAME.decode() if zygote else "python"}


def _rank_in_rendezvous(tmp_path: Path) -> tuple[zygote_client.Zygote, zygote_wire.Socket, int]:
    """A rank asked of the zygote as an MPI stand-in asks, on a connection of our own: rank 0 of two,
    waiting at the rendezvous for a rank 1 that never comes. The zygote, the connection, its pid."""
    write_pickle_atomically(tmp_path / JOB_FILE, make_job("ring_sum", [Task(ranks=2, args=(1,))], backend="gloo"))
    env = dict(rank_env(), RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    zygote = zygote_client.zygote_for(rank_env(), [])
    assert zygote is not None
    conn = zygote_wire.connect(zygote.address, patience_s=10)
    log = os.open(tmp_path / "rank.log", os.O_WRONLY | os.O_CREAT)
    pid = zygote_wire.ask(conn, ["--job", str(tmp_path)], env, str(tmp_path), (0, log, log), 60)
    os.close(log)
    _wait_for(lambda: pid_path(tmp_path, 0).read_text() or None)  # it is in the rendezvous now
    return zygote, conn, pid


def test_a_rank_dies_when_the_process_that_asked_for_it_dies(tmp_path: Path) -> None:
    # As an MPI stand-in does: ask for a rank, then go away. The rank must go with it.
    _, conn, pid = _rank_in_rendezvous(tmp_path)
    assert psutil.Process(pid).status() != "zombie"
    conn.close()
    assert _wait_for(lambda: not psutil.pid_exists(pid) or None, timeout=5)


def test_a_rank_dies_with_its_zygote_whatever_its_own_threads_can_do(tmp_path: Path) -> None:
    # The worker's watchdog of its supervisor is a thread, which cannot run while the main thread
    # holds the GIL in native code: CI found a rank alive minutes after its harness was killed,
    # stuck in MPI's start-up. A forked rank dies with its zygote (PR_SET_PDEATHSIG) instead; here the
    # supervisor (this process) and the asker's connection stay, and only the zygote goes.
    zygote, conn, pid = _rank_in_rendezvous(tmp_path)
    zygote.process.kill()
    zygote.process.wait()
    try:
        assert _wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie" or None,
                         timeout=5)
    finally:
        conn.close()


def test_the_zygote_leaves_with_its_supervisor() -> None:
    supervisor = subprocess.Popen(
        [sys.executable, "-c", "from distlab.runtime.zygote import client as z; "
         "print(z.zygote_for({}, []).process.pid, flush=True); import time; time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )
    assert supervisor.stdout is not None
    zygote = int(supervisor.stdout.readline())
    assert psutil.pid_exists(zygote)
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait()
    assert _wait_for(lambda: not psutil.pid_exists(zygote) or None, timeout=5)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to ask as another user")
def test_the_zygote_forks_nothing_for_another_user() -> None:
    zygote = zygote_client.zygote_for(dict(os.environ), [])
    assert zygote is not None
    asker = subprocess.run(
        [sys.executable, "-c", _ASK_AS_NOBODY, zygote.address], capture_output=True, text=True,
        timeout=30,
    )
    assert asker.stdout.startswith("refused PermissionError"), asker.stdout + asker.stderr


_ASK_AS_NOBODY = """
import os, sys
from distlab.runtime.zygote import server as zygote_server
from distlab.runtime.zygote import wire as zygote_wire
os.setgid(65534); os.setuid(65534)
conn = zygote_wire.connect(sys.argv[1], patience_s=10)
try:
    zygote_wire.ask(conn, ["--job", "/nonexistent"], {}, "/", (0, 1, 2), patience_s=10)
    print("started")
except zygote_wire.Refused as exc:
    print(exc)
"""


def test_a_request_carries_any_argument_variable_and_folder_unchanged() -> None:
    not_utf8 = os.fsdecode(b"caf\xe9")  # as os.environ holds a value that is not UTF-8
    argv = ["--job", "", "two\nlines", not_utf8]
    env = {"PLAIN": "1", "EQUALS": "a=b=c", "NEWLINE": "x\ny", "EMPTY": "", "LATIN": not_utf8}
    framed = zygote_wire.encode_request(argv, env, "/a folder/with\nnewline")
    head, _, body = framed.partition(b"\n")
    assert int(head) == len(body)
    got_argv, got_env, got_cwd = zygote_wire.decode_request(body)
    assert got_argv == argv and got_cwd == b"/a folder/with\nnewline"
    assert got_env == {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    assert got_env[b"LATIN"] == b"caf\xe9"
    for malformed in (b"/", b"/\0x", b"/\x003\0a\0b", b"/\x000\0NOEQUALS", b"/\x000\0=value"):
        with pytest.raises(ValueError):
            zygote_wire.decode_request(malformed)


@pytest.mark.parametrize("sent,said", [
    (b"ten\n/\x000", "a request starts with its length"),
    (b"%d\n" % (zygote_server.REQUEST_LIMIT + 1), "request too long"),
    (b"3\n/\x000\0A=1", "came with"),
    (b"3\n/\x005", "a malformed request"),
], ids=["no length", "too long", "longer than said", "malformed"])
def test_a_malformed_request_is_refused_and_the_zygote_serves_the_next(sent: bytes, said: str) -> None:
    zygote = zygote_client.zygote_for(rank_env(), [])
    assert zygote is not None
    conn = zygote_wire.connect(zygote.address, patience_s=10)
    conn.sendmsg([sent], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    answer = zygote_wire.read_line(conn, 30)
    conn.close()
    assert answer.startswith("refused ValueError") and said in answer, answer
    result = run(make_job("ring_sum", [Task(ranks=2, args=(1,))], backend="gloo"), deadline_s=60)
    assert result.status == "ok", result.message


def test_the_preload_is_the_engine_and_the_heavy_modules_a_program_imports(tmp_path: Path) -> None:
    program = tmp_path / "programs.py"
    program.write_text("import numpy as np\nimport torch.nn.functional as F\nfrom . import cases\n"
                       "def f():\n    import torch.distributed\n")
    assert zygote_client.preload_for("mpi", str(program), sealed=False) == ["torch"]
    assert zygote_client.preload_for("gloo", str(program), sealed=True) == [
        *zygote_client.GLOO_PRELOAD, "distlab.runtime.rank.sealed", "distlab.runtime.rank.learner_main",
    ]
    assert zygote_client.preload_for("mpi", str(tmp_path / "missing.py"), sealed=False) == []


def _rank_of(process: psutil.Process) -> int | None:
    try:
        return int(process.environ().get("OMPI_COMM_WORLD_RANK", -1))
    except psutil.Error:
        return None


def _wait_for(probe, timeout: float = 30):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            value = probe()
            if value is not None:
                return value
        except (OSError, ValueError, StopIteration, psutil.Error):
            pass
        time.sleep(0.05)
    raise AssertionError("timed out")



@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_no_process_of_the_harness_imports_from_the_current_folder(backend: str, tmp_path: Path) -> None:
    """`distlab exam --submit` run from the candidate's work folder imported the candidate's json.py
    as root in the zygote and every rank: `python -m` puts the current folder first on the import
    path. Every process the harness starts runs with -P (supervisor/start.py's rank_command)."""
    marker = tmp_path / "imported-from-the-current-folder"
    (tmp_path / "json.py").write_text(
        "import os, sys\n"
        f"open({str(marker)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        "sys.path = [p for p in sys.path if p not in ('', os.path.dirname(__file__))]\n"
        "del sys.modules['json']\n"
        "import json as _stdlib_json\n"
        "sys.modules['json'] = _stdlib_json\n")
    # The console script, as the README runs it (`python -m distlab.cli` would itself import from
    # the current folder, as any `python -m` does).
    script = Path(sys.executable).with_name("distlab")
    done = subprocess.run([str(script), "run", "03", "--solution", "reference", "--backend", backend],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not marker.exists(), f"imported from the current folder by pids {marker.read_text().split()}"
