"""The zygote: a process that has imported what ranks import, and forks each rank from that state.

A rank spends 0.3 s of CPU importing numpy and the worker before it runs a line of the problem,
and 2-3 s more when it imports torch (every gloo rank, and the ranks of the problems that train a
model); a check starts several ranks per launch and several launches, and on a small machine those
imports are most of a short check's time. The supervisor keeps one zygote (its side:
client.py) and asks it for each rank: the fork starts with the modules already
imported, and runs the worker's main() as ``python -m`` of it would, in a session of its own, with the
environment, folder and standard streams it was handed. The zygote holds nothing but imported
modules (no job, no seed, nothing of another rank's), so a rank's copy of its memory shows the
learner nothing new. It never imports ``mpi4py.MPI``, which would initialize MPI in the zygote.

Why not multiprocessing's forkserver: it starts with the caller's environment and standard streams
as they are at its first use, while a rank needs its own per fork (an MPI rank's are those mpiexec
gave the process it started, stand_in.py), and it runs each child through multiprocessing's
own bootstrap.

The protocol, on a Unix socket of the abstract namespace (no file to leave behind), one connection
per rank: the asker sends the rank's arguments, environment and folder (wire.encode_request: its
length on a line, then NUL-separated fields) with three file descriptors (the rank's stdin,
stdout, stderr); the zygote (which imported the modules named
after its address on its command line at its start) forks, and answers ``started PID``, then ``exited CODE`` once
the rank ended (CODE as Popen's returncode: negative for the signal that ended it). An asker that
closes its end first (the MPI stand-in died) takes its rank with it: the zygote SIGKILLs it. Only
processes of the zygote's own user are served, and only the rank worker is ever run. The zygote
leaves at EOF on its stdin (its supervisor closed it, or died: unlike a parent-death signal, which
follows the thread that started it, the pipe closes only with the whole process).
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import select
import signal
import socket
import struct
import sys
import tempfile
import traceback
from typing import Any

from .wire import RANK_MODULE, decode_request

# argv, the environment, the folder: wire.decode_request's.
Request = tuple[list[str], dict[bytes, bytes], bytes]

# The platforms are read by every rank's clock as its task starts (0.2 s a rank: their rendering
# imports rich), and every problem's rank program imports distlab.grading (its cases' types, and
# through them the front door's modules: 70 ms of CPU a rank, 17% of problem 03's tests), so the
# zygote imports them once.
BASE_PRELOAD = ("numpy", RANK_MODULE, "distlab.platforms", "distlab.grading")
# What torch imports at a process's first backward (sympy, through its shape analysis): 0.65 s of
# CPU in every rank of every launch of a problem that trains a model, paid once here instead.
WITH_TORCH = ("torch.fx.experimental.symbolic_shapes",)
GLOO_ENGINE = "distlab.runtime.engines.gloo"  # preloaded for gloo's ranks, which never load MPI
# What a zygote may be started to import besides its base: heavy, and safe to fork after import (they
# start no thread at import with OMP_NUM_THREADS=1, the ranks' setting).
PRELOADABLE = frozenset({"torch", "torch.distributed", GLOO_ENGINE,
                         "distlab.runtime.rank.sealed", "distlab.runtime.rank.learner_main"})
RANK_PROCESS_NAME = b"distlab-rank"  # /proc/PID/comm of a forked rank (its cmdline is the zygote's)
REQUEST_LIMIT = 1 << 20

_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1


def main() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + sys.argv[1])  # first, so that askers queue while the imports run
    listener.listen(64)
    wanted = [m for m in sys.argv[2:] if m in PRELOADABLE]
    for name in (*BASE_PRELOAD, *wanted, *(WITH_TORCH if "torch" in wanted else ())):
        importlib.import_module(name)
    if GLOO_ENGINE not in wanted:
        _load_libmpi()
    wake_read, wake_write = os.pipe()
    for fd in (wake_read, wake_write):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the select below
    askers: dict[int, socket.socket] = {}  # rank pid -> the connection it was asked on
    abandoned: set[int] = set()  # ranks whose asker left: SIGKILLed, not reaped yet
    while True:
        by_fd = {conn.fileno(): pid for pid, conn in askers.items() if pid not in abandoned}
        ready: list[int] = select.select([0, listener.fileno(), wake_read, *by_fd], [], [])[0]
        if 0 in ready and not os.read(0, 1 << 12):
            # The supervisor is gone or done (its end of the pipe closes even when it is
            # SIGKILLed). Its ranks watch it themselves; skip the interpreter's shutdown, which
            # takes seconds with torch imported.
            os._exit(0)
        if wake_read in ready:
            _drain(wake_read)
            _reap(askers, abandoned)
        for fd in ready:
            if fd in by_fd and by_fd[fd] in askers:
                # The asker closed its end (or wrote, which it never does) while its rank runs:
                # a rank dies with the process that stands for it.
                abandoned.add(by_fd[fd])
                _kill_group(by_fd[fd])
        if listener.fileno() in ready:
            conn, _ = listener.accept()
            _serve(conn, libc, askers, (listener.fileno(), wake_read, wake_write))


def _load_libmpi() -> None:
    """Loads the MPI library (and Open MPI's libraries under it) without initializing it, the way
    mpi4py finds it (its ABI probe, whose answer mpi4py keeps): an MPI rank's import of mpi4py.MPI
    then finds them in place. Loading them took 60-100 ms of CPU a rank: a quarter of problem 03's
    check of a solution that raises at once, a sixth of its reference's. MPI_Init stays the rank's."""
    from mpi4py import _mpiabi

    _mpiabi._get_mpiabi()  # type: ignore[attr-defined]  # mpi4py's own, untyped


def _serve(conn: socket.socket, libc: Any, askers: dict[int, socket.socket],
           zygote_fds: tuple[int, ...]) -> None:
    conn.settimeout(10.0)
    received: list[int] = []
    try:
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        if uid != os.getuid():
            raise PermissionError(f"uid {uid} may not ask for ranks")
        request, received = _receive(conn)
        if "mpi4py.MPI" in sys.modules or _threads() > 1:
            raise RuntimeError("the zygote is no longer safe to fork")  # never expected
        # Out of the collector's sight: a rank's collections would otherwise write to every
        # object the zygote imported, copying each page of them (torch's are 200 MB) into every
        # rank, which costs more than the fork saves.
        gc.freeze()
        sys.stdout.flush()
        sys.stderr.flush()
        zygote = os.getpid()
        pid = os.fork()
        if pid == 0:
            others = (conn.fileno(), *(c.fileno() for c in askers.values()))
            _become_rank(request, received, libc, (*zygote_fds, *others), zygote)
        askers[pid] = conn
        conn.sendall(f"started {pid}\n".encode())
    except Exception as exc:  # noqa: BLE001 - the asker falls back to a plain process
        try:
            conn.sendall(f"refused {type(exc).__name__}: {exc}\n".encode())
        except OSError:
            pass
        conn.close()
    finally:
        for fd in received:
            os.close(fd)


def _receive(conn: socket.socket) -> tuple[Request, list[int]]:
    """The request (wire.encode_request: its length, a newline, the body) and its descriptors."""
    data: bytes = b""
    fds: list[int] = []
    size = -1
    while size < 0 or len(data) < size:
        chunk, more, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        if not chunk:
            raise EOFError("the asker left before its request ended")
        data += chunk
        fds += more
        if size < 0 and b"\n" in data:
            head, _, data = data.partition(b"\n")
            if not head.isdigit():
                raise ValueError(f"a request starts with its length, not {head[:20]!r}")
            size = int(head)
        if len(data) > REQUEST_LIMIT or size > REQUEST_LIMIT:
            raise ValueError("request too long")
    if len(fds) != 3:
        raise ValueError(f"expected stdin, stdout and stderr, got {len(fds)} descriptors")
    if len(data) != size:
        raise ValueError(f"a request of {size} bytes came with {len(data) - size} more")
    return decode_request(data), fds


def _become_rank(request: Request, streams: list[int], libc: Any,
                 zygote_fds: tuple[int, ...], zygote: int) -> None:
    """In the fork: drop the zygote's loop, take the rank's session, streams and environment, and
    run the worker's main(), as ``python -m`` of it would. Never returns. (Not runpy as
    __main__: the worker is imported already, so runpy would warn in every rank's output, which a
    crash's verdict shows, and run a second copy of the module beside the imported one.)"""
    code = 1
    try:
        # The rank dies with the zygote, which leaves when its supervisor does. The worker's own
        # watchdog is a thread, which cannot run while the main thread holds the GIL in native
        # code: CI found a rank alive minutes after its harness was killed outright, stuck in
        # MPI's start-up (its launcher gone) with its watchdog waiting for the GIL. (The zygote
        # has one thread, so the signal follows the whole process.)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != zygote:  # it died before the request took hold
            os._exit(70)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in zygote_fds:
            os.close(fd)
        os.setsid()
        libc.prctl(_PR_SET_NAME, RANK_PROCESS_NAME, 0, 0, 0)
        for target, fd in enumerate(streams):
            os.dup2(fd, target)
        for fd in streams:
            os.close(fd)
        sys.stdin = open(0, closefd=False)
        argv, env, cwd = request
        os.chdir(cwd)
        os.environ.clear()
        os.environb.update(env)
        tempfile.tempdir = None  # found again from the rank's TMPDIR
        worker = sys.modules[RANK_MODULE]  # imported before any fork (BASE_PRELOAD)
        sys.argv = [worker.__file__ or RANK_MODULE, *argv]  # as -m sets it
        code = worker.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the rank's log, as the interpreter would
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reap(askers: dict[int, socket.socket], abandoned: set[int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        abandoned.discard(pid)
        conn = askers.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"exited {os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass
            conn.close()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


if __name__ == "__main__":
    main()
