"""The learner process of a sealed rank: the problem's rank program and the learner's file, nothing else.

A seed forked as the rank started (runtime/rank/learner_fork.py) becomes it by calling ``run``
with the spec the rank's agent sent (runtime/rank/sealed.py: the program and the solution file,
the resource limits, what the sandbox hides and keeps) and the descriptors of its end of the seal.
It never joins the engine: mpi4py, if learner code imports it, is told not to initialize MPI, and
the launcher's variables are not in this process's environment. It asks the agent for each task
of the batch, runs ``program(comm, solution, *args, **kwargs)`` with a ``SealedComm``, and hands
back the value (or the failure, in the words a rank's outcome uses) until the agent says the
batch is done.

It dies with its agent (PR_SET_PDEATHSIG), runs in the sandbox of runtime/seal/sandbox.py (its own PID
namespace: every process it starts dies with it; ``enter_sandbox``; at every isolation level a
seccomp filter refuses the kernel's shared objects, the keyring and file locks), and writes its stack to the rank's stack file, which
the agent opened for it, when the supervisor asks (SIGUSR1) or on a fatal signal.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import pickle
import signal
import socket
import struct
import sys
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from ..comm.mpi4py_objects import use_mpi_without_init
from ..comm.requests import Status
from ..jobspec import Limits, import_program_module, is_problem_module
from ..seal import sandbox
from ..seal.calls import Call
from ..seal.client import SealedComm
from ..seal.learner import LearnerEnd
from ..seal.lines import LearnerLines
from ..seal.values import encode_failure, encode_value
from . import limits as rank_limits
from .failures import error_from
from .guards import forbid_finalize
from .learner import load_module
from .memory import steady_malloc

PR_SET_PDEATHSIG = 1
WORKDIR = "/tmp/learner"  # on the learner's own /tmp (sandbox.py), where its files go
VALUE, FAILURE = 0, 1
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent: int) -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the agent died before the request took hold
        os._exit(70)


def enter_sandbox(hidden: list[str], kept: list[str], shared_tmp_folder: str, limits: Limits) -> str:
    """Runs the rest of this program as the learner, in the sandbox of sandbox.py; returns which
    isolation holds. In a PID namespace of its own, every process the learner's code starts, in
    any session, dies with it: when a namespace's first process ends, the kernel kills the rest.

    Three processes: this one stays outside as the waiter (the agent's child); the namespace's
    first process only reaps; the learner is its child. The learner must not be the first: a
    namespace's first process ignores the signals it sends itself, so its ``os.abort()`` would
    read as a segmentation fault. The waiter forwards SIGUSR1 (the supervisor asking for a stack)
    and SIGTERM (a reclaim's notice, which the learner's code may catch), and ends as the learner
    ended, exit status or signal, so the agent sees one child. ``limits``: the rank's, which size
    the learner's /tmp (sandbox.isolate) and cap its processes (sandbox.drop_privileges)."""
    sandbox.first_to_go_out_of_memory()  # here, before the read-only /proc: inherited by the others
    isolation = sandbox.isolate(hidden, kept, sandbox.scratch_mb(limits.address_space_mb))
    if isolation == sandbox.NONE:
        sandbox.filter_syscalls()
        _enter_folder(isolation, shared_tmp_folder)
        return isolation
    status_r, status_w = os.pipe()  # the learner's wait status, from the first process
    first = os.fork()
    if first == 0:
        os.close(status_r)
        # Should the waiter die before this holds, the learner's next call finds the agent gone
        # (the waiter dies only with the agent) and the learner ends, and with it the namespace.
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if isolation in sandbox.MOUNTED:
            sandbox.mount_proc()
        learner = os.fork()
        if learner == 0:
            os.close(status_w)
            if isolation in sandbox.MOUNTED:
                sandbox.drop_privileges(isolation, limits.processes)  # the seccomp filter last
            else:
                sandbox.filter_syscalls()  # the keyring and file locks are shared here too
            # Set after the change of user, which clears it.
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            _enter_folder(isolation, shared_tmp_folder)  # as the learner: its own to write
            return isolation
        _reap_until(learner, status_w)
    os.close(status_w)
    for handed_on in _HANDED_ON:
        signal.signal(handed_on, lambda signum, frame: os.kill(first, signum))
    _, first_status = os.waitpid(first, 0)
    raw = os.read(status_r, 4)
    _end_as(struct.unpack("<i", raw)[0] if len(raw) == 4 else first_status)


def _enter_folder(isolation: str, shared_tmp_folder: str) -> None:
    """The learner's working folder: on its own /tmp when the sandbox mounted one; otherwise a
    folder of the job's (also its TMPDIR), so that nothing it writes outlives the job."""
    folder = WORKDIR if isolation in sandbox.MOUNTED else shared_tmp_folder
    if isolation not in sandbox.MOUNTED:
        os.environ["TMPDIR"] = folder
    os.makedirs(folder, exist_ok=True)
    os.chdir(folder)


# What the waiter and the namespace's first process hand on to the learner (``enter_sandbox``).
_HANDED_ON = (signal.SIGUSR1, signal.SIGTERM)


def _reap_until(learner: int, status_w: int) -> NoReturn:
    """The namespace's first process: reaps every orphan until the learner ends, hands its wait
    status to the waiter, and leaves (the kernel then kills whatever the learner left)."""
    for handed_on in _HANDED_ON:
        signal.signal(handed_on, lambda signum, frame: os.kill(learner, signum))
    while True:
        pid, status = os.wait()
        if pid == learner:
            os.write(status_w, struct.pack("<i", status))
            os._exit(0)


def _end_as(status: int) -> NoReturn:
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def keep_mpi_uninitialized() -> None:
    """``from mpi4py import MPI`` in learner code must not start an MPI process of its own: the
    constants (MPI.SUM, MPI.DOUBLE, MPI.IN_PLACE) work without MPI_Init, and so do a datatype's
    size and name and a status (comm/mpi4py_objects.py)."""
    try:
        import mpi4py
    except ImportError:
        return
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    use_mpi_without_init(Status)  # else a datatype's size or a status's count ends the process


def load_program(spec: dict[str, Any]) -> Any:
    path, module_name, name = Path(spec["program_file"]), spec["program_module"], spec["program"]
    module = (import_program_module(path, module_name) if is_problem_module(module_name)
              else load_module(path, module_name))
    program = getattr(module, name, None)
    if not callable(program):
        raise AttributeError(f"{path} has no program function {name!r}")
    return program


def send_result(end: LearnerEnd, kind: int, data: bytes) -> None:
    step = end.arena.data_size
    for start in range(0, max(len(data), 1), step):
        part = np.frombuffer(data[start:start + step], dtype=np.uint8)
        end.call(Call.RESULT, (kind, int(start + step >= len(data))), inputs=(part,))


def fetch_args(end: LearnerEnd, nbytes: int) -> Any:
    data = bytearray()
    while len(data) < nbytes:
        part = np.empty(min(nbytes - len(data), end.arena.data_size), dtype=np.uint8)
        reply = end.call(Call.TASK_ARGS, (len(data),), outputs=(part,))
        data += part[: reply.ints[0]].tobytes()
    return pickle.loads(bytes(data))  # written by the agent, which this process trusts


def failure(exc: BaseException, solution: Path | None, task_index: int, limits: Limits) -> bytes:
    error = error_from(exc, solution, task_index, limits)
    return encode_failure(error.kind, error.summary, error.where, error.traceback)


def serve_tasks(lines: LearnerLines, spec: dict[str, Any]) -> None:
    """Runs the learner's tasks as the agent hands them over. The task protocol goes on the first
    line; the learner's own threads may open more (seal/lines.py)."""
    end = lines.first
    limits = Limits(*spec["limits"])
    solution_path = Path(spec["solution_file"]) if spec["solution_file"] else None
    try:
        program = load_program(spec)
        forbid_finalize(spec["backend"])
        if spec.get("memory_probe"):
            steady_malloc()
            end.call(Call.BEFORE_SOLUTION)  # the agent reads what this process holds now
        solution = load_module(solution_path, "solution") if solution_path else None
        rank_limits.apply(limits, mapped_mb=end.arena.size_mb)
    except BaseException as exc:  # noqa: BLE001 - reported as the rank's failure
        send_result(end, FAILURE, failure(exc, solution_path, 0, limits))
        return
    while True:
        index, nbytes, rank, size = end.call(Call.NEXT_TASK).ints
        if index < 0:
            return
        args, kwargs = fetch_args(end, nbytes)
        try:
            value = program(SealedComm(lines, rank, size), solution, *args, **kwargs)
            data, kind = encode_value(value), VALUE
        except BaseException as exc:  # noqa: BLE001 - every failure is reported
            data, kind = failure(exc, solution_path, index, limits), FAILURE
        send_result(end, kind, data)
        if kind == FAILURE:
            return


def run(spec: dict[str, Any], arena_fd: int, bell: tuple[int, int], lines_fd: int,
        stack_fd: int) -> NoReturn:
    die_with_parent(int(spec["agent_pid"]))
    # First: a sandbox that cannot be made is said through it.
    end = LearnerEnd.attach(arena_fd, int(spec["arena_size"]), bell, float(spec["spin_s"]))
    try:
        enter_sandbox(spec["hidden"], spec["kept"], spec["shared_tmp_folder"], Limits(*spec["limits"]))
    except sandbox.SandboxError as exc:
        send_result(end, FAILURE, encode_failure(
            "seal", f"the seal could not be set up ({exc.strerror}): run as root with "
            "CAP_SYS_ADMIN, or with --seal off",
            "", ""))
        os._exit(1)
    stack = os.fdopen(stack_fd, "w")
    faulthandler.enable(file=stack, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True, chain=False)
    keep_mpi_uninitialized()
    serve_tasks(LearnerLines(end, socket.socket(fileno=lines_fd)), spec)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # nothing to tear down; interpreter shutdown with torch loaded takes seconds
