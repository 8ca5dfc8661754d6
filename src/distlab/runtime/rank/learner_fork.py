"""A sealed rank's learner process, forked as the rank starts, before the rank reads its job.

    seed = LearnerSeed.start()     # the first thing a sealed rank does
    ...                            # the rank reads its job and makes the seal's channel
    child = seed.plant(spec, fds)  # the seed takes them and becomes the learner process

Why a fork: a learner started afresh paid an interpreter's start and its imports (numpy and the
seal's client; torch too, 2.5-3 s here, for a problem that trains a model) once per rank of every
sealed launch (a sealed launch of 8 MPI ranks took 2.44 s against 0.8 s unsealed; forked, 1.0 s),
and the rank has all of them loaded already (it is itself a fork of the
zygote that imported them, runtime/zygote/). Why this early: the rank has read nothing of its job
yet (the hidden cases, the fault plan, the platform), joined no engine and made no counter, so the
seed inherits none of what the seal keeps from the learner. What it does inherit is the zygote's
imports and the rank's command line; its environment is replaced with the one the agent sends
(without the launcher's and the engines' variables), and it keeps no descriptor but the ones it
is sent (SCM_RIGHTS): the channel's arena and socket, the stack file and the rank's log.

The seed waits on a socketpair for its spec. If the rank never sends one (it failed before it
needed a learner) or dies, the seed reads EOF and leaves; it dies with the rank
(PR_SET_PDEATHSIG). Where forking is not wanted (``DISTLAB_NO_ZYGOTE=1``) or not safe (a thread
already runs), the seed is a fresh interpreter running this module, with the same protocol.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from typing import Any, NoReturn, Sequence

NO_FORK_ENV = "DISTLAB_NO_ZYGOTE"  # the zygote's switch (runtime/zygote/client.py) turns this off too
LEARNER_PROCESS_NAME = b"distlab-learner"  # its /proc/PID/comm: forked, its cmdline is the rank's
# The descriptors a seed is sent, in this order: the seal's arena and the doorbell's two pipes
# (the one the learner reads, the one it rings on), the opener of further lines, the stack file
# and the rank's log.
FDS = ("arena", "bell_read", "bell_write", "lines", "stack", "log")
SPEC_LIMIT = 1 << 20
_PR_SET_PDEATHSIG, _PR_SET_NAME = 1, 15


class LearnerSeed:
    """The rank's end of a seed: a child waiting for its spec."""

    def __init__(self, child: ForkedChild | subprocess.Popen[bytes], control: socket.socket) -> None:
        self.child = child
        self._control = control

    @classmethod
    def start(cls, fork: bool = True) -> LearnerSeed:
        """Forks the seed (``fork``: the caller holds nothing the learner may not see), or starts
        it afresh."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        if fork and os.environ.get(NO_FORK_ENV) != "1" and _threads() == 1:
            sys.stdout.flush()
            sys.stderr.flush()
            parent = os.getpid()
            pid = os.fork()
            if pid == 0:
                ours.close()
                _grow(theirs, parent, forked=True)
            theirs.close()
            return cls(ForkedChild(pid), ours)
        child = subprocess.Popen([sys.executable, "-P", "-m", __name__, str(theirs.fileno())],
                                 pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        return cls(child, ours)

    def plant(self, spec: dict[str, Any], fds: Sequence[int]) -> ForkedChild | subprocess.Popen[bytes]:
        """Hands the seed its spec (JSON; ``env``: its environment) and descriptors (``FDS``);
        returns the learner process."""
        if len(fds) != len(FDS):
            raise ValueError(f"a seed takes {len(FDS)} descriptors ({', '.join(FDS)}), not {len(fds)}")
        socket.send_fds(self._control, [json.dumps(spec).encode() + b"\n"], list(fds))
        self._control.close()
        return self.child

    def discard(self) -> None:
        """The rank needs no learner: the seed reads EOF and leaves."""
        self._control.close()
        try:
            self.child.wait(5)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()


class ForkedChild:
    """What subprocess.Popen answers, for a child this process forked: ``pid``, ``poll``,
    ``wait`` (raising subprocess.TimeoutExpired), ``kill`` and ``returncode``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if timeout is not None and not _ends_within(self.pid, timeout):
                raise subprocess.TimeoutExpired(f"learner process {self.pid}", timeout)
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _ends_within(pid: int, timeout: float) -> bool:
    pidfd = os.pidfd_open(pid)
    try:
        return bool(select.select([pidfd], [], [], timeout)[0])
    finally:
        os.close(pidfd)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _grow(control: socket.socket, parent: int, forked: bool) -> NoReturn:
    """In the seed: wait for the spec, take its descriptors and environment, run the learner.
    ``forked``: named for what it is (its command line is the rank's)."""
    code = 1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the rank died before the request took hold
            os._exit(70)
        # Nothing of the rank's but the streams (replaced below) and the control socket.
        os.closerange(3, control.fileno())
        os.closerange(control.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
        received = _receive(control)
        control.close()
        if received is None:
            os._exit(0)  # the rank needed no learner, or died
        spec, fds = received
        fd = dict(zip(FDS, fds))
        null = os.open(os.devnull, os.O_RDONLY)
        for target, source in ((0, null), (1, fd["log"]), (2, fd["log"])):
            os.dup2(source, target)
        os.close(null)
        os.close(fd["log"])
        os.environ.clear()
        os.environ.update(spec.pop("env"))
        tempfile.tempdir = None  # found again from the learner's TMPDIR
        if forked:
            sys.argv = [LEARNER_PROCESS_NAME.decode()]
            libc.prctl(_PR_SET_NAME, LEARNER_PROCESS_NAME, 0, 0, 0)
        # The seal's client: the zygote has imported it where it forks.
        from .learner_main import run

        run(spec, fd["arena"], (fd["bell_read"], fd["bell_write"]), fd["lines"], fd["stack"])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - in the rank's log, as the interpreter would say it
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _receive(control: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk, more, _, _ = socket.recv_fds(control, 1 << 16, len(FDS))
        fds += more
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None
        data += chunk
        if len(data) > SPEC_LIMIT:
            raise ValueError("a learner spec over 1 MiB")
    if len(fds) != len(FDS):
        raise ValueError(f"a seed takes {len(FDS)} descriptors, got {len(fds)}")
    return json.loads(data), fds


if __name__ == "__main__":  # started afresh (LearnerSeed.start): the control socket's descriptor
    _grow(socket.socket(fileno=int(sys.argv[1])), os.getppid(), forked=False)
