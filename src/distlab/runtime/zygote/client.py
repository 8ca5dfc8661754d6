"""The supervisor's side of the zygote (server.py): start it once, ask it for ranks.

A supervisor process keeps a zygote per set of modules to import (numpy and the worker; torch as
well for gloo or for a program that imports it), started at its first launch with the ranks'
environment and kept for the next launches; a launch whose environment differs (beyond what
differs between ranks anyway) gets new ones, since the imports made could depend on it. A gloo rank is asked for
here (``ForkedRank``: the part of ``Popen`` the supervisor uses, answered from the zygote's
reports); an MPI rank is asked for by the stand-in mpiexec starts (stand_in.py), which finds
the zygote through ``DISTLAB_ZYGOTE``. Where the zygote cannot start or answer, the ranks start as
plain processes instead, so a zygote problem costs time, never a run. ``DISTLAB_NO_ZYGOTE=1`` turns
it off (the benchmark's baseline, and for debugging).
"""

from __future__ import annotations

import ast
import os
import secrets
import select
import subprocess
import sys
import threading
from pathlib import Path

from . import wire as zygote_wire
from .server import PRELOADABLE

ZYGOTE_MODULE = "distlab.runtime.zygote.server"
OFF_ENV = "DISTLAB_NO_ZYGOTE"
STAND_IN = Path(zygote_wire.__file__).with_name("stand_in.py")
# What differs from rank to rank and launch to launch; anything else in the environment is the
# zygote's, and a change in it means a new zygote. The workspace is read by the ranks (each gets
# its whole environment at its fork), never at an import: a process that launches for several
# workspaces (the suite: one a test) would otherwise start a zygote each time, 0.3-1.7 s of CPU.
PER_RANK_VARIABLES = frozenset({
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
    "MASTER_PORT", "DISTLAB_ATTEMPT", "TMPDIR", "PYTEST_CURRENT_TEST", zygote_wire.ZYGOTE_ENV,
    "DISTLAB_WORKSPACE",
})
ANSWER_S = 120.0  # a first request waits for the imports, on a loaded machine
GLOO_PRELOAD = ("torch", "torch.distributed", "distlab.runtime.engines.gloo")


class Zygote:
    def __init__(self, env: dict[str, str], preload: list[str]) -> None:
        self.address = f"distlab-zygote-{os.getpid()}-{secrets.token_hex(8)}"
        self.process = subprocess.Popen(
            [sys.executable, "-P", "-m", ZYGOTE_MODULE, self.address, *preload], env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def fork(self, argv: list[str], env: dict[str, str], log: Path) -> ForkedRank:
        """A rank forked with ``env``, its output appended to ``log``; raises ``Refused``."""
        conn = zygote_wire.connect(self.address, patience_s=10.0, alive=self.alive)
        null = zygote_wire.devnull()
        out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            pid = zygote_wire.ask(conn, argv, env, os.getcwd(), (null, out, out), ANSWER_S)
        except (OSError, TimeoutError) as exc:
            conn.close()
            raise zygote_wire.Refused(str(exc)) from exc
        except zygote_wire.Refused:
            conn.close()
            raise
        finally:
            os.close(null)
            os.close(out)
        return ForkedRank(conn, pid)

    def close(self) -> None:
        if self.process.stdin is not None:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ForkedRank:
    """A rank the zygote forked: what the supervisor asks of a ``Popen``. The connection it was
    asked on carries its exit code; closing it (this process's death) makes the zygote kill it."""

    def __init__(self, conn: zygote_wire.Socket, pid: int) -> None:
        self.conn = conn
        self.pid = pid
        self.returncode: int | None = None
        self._answer = b""

    def poll(self) -> int | None:
        return self._read(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._read(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0.0)
        return code

    def _read(self, timeout: float | None) -> int | None:
        # Bytes are kept across calls: a poll must never lose half an answer to its timeout.
        while self.returncode is None:
            if not select.select([self.conn], [], [], timeout)[0]:
                return None
            chunk = self.conn.recv(64)
            self._answer += chunk
            if chunk and not self._answer.endswith(b"\n"):
                continue
            # EOF without an exit: the zygote died first, and how the rank ended is unknown.
            code = zygote_wire.exit_code(self._answer.decode().strip())
            self.returncode = 1 if code is None else code
            self.conn.close()
        return self.returncode


_zygotes: dict[tuple[object, ...], Zygote] = {}  # (environment, preload) -> its zygote
_zygotes_lock = threading.Lock()


def zygote_for(env: dict[str, str], preload: list[str]) -> Zygote | None:
    """This process's zygote for ranks of environment ``env`` that need ``preload`` imported,
    started if needed; None when off or when it cannot start. One zygote per preload: a rank
    forked from one that imported more than the rank would have (torch, for a program that never
    imports it) would carry its address space, which counts against the rank's memory limit."""
    if os.environ.get(OFF_ENV) == "1" or env.get(OFF_ENV) == "1":
        return None
    environment = _key(env)
    with _zygotes_lock:
        for key, zygote in list(_zygotes.items()):
            if not zygote.alive() or key[0] != environment:
                zygote.close()
                del _zygotes[key]
        key = (environment, tuple(preload))
        if key not in _zygotes:
            try:
                _zygotes[key] = Zygote({k: v for k, v in env.items() if k not in PER_RANK_VARIABLES},
                                       preload)
            except OSError:
                return None
        return _zygotes[key]


def preload_for(backend: str, program_file: str, sealed: bool, store: bool = False,
                solution_file: str | None = None) -> list[str]:
    """What the zygote should import before forking the ranks of a job: the engine's modules,
    torch.distributed for a job with a store (its client is torch's TCPStore), and the heavy
    modules its program file imports at its top (a problem that trains a model imports torch
    there; the supervisor never imports the program itself). With ``solution_file`` (a job that
    reads the learner's memory, Task(memory=True)), the heavy modules it imports anywhere too:
    imported in the zygote, their pages are held before the first reading, and a learner who
    imports torch inside a method is not charged its hundred MiB as memory the method kept."""
    wanted = list(GLOO_PRELOAD) if backend == "gloo" else []
    if store and backend != "gloo":
        wanted += ["torch", "torch.distributed"]
    if sealed:
        wanted += ["distlab.runtime.rank.sealed", "distlab.runtime.rank.learner_main"]
    for top in (*_imported(program_file, anywhere=False),
                *(_imported(solution_file, anywhere=True) if solution_file else ())):
        if top in PRELOADABLE and top not in wanted:
            wanted.append(top)
    return wanted


def _imported(source: str, anywhere: bool) -> list[str]:
    """The top-level packages a Python file imports, at its top or ``anywhere`` in it ("import
    torch.nn.functional as F" imports torch); none when it cannot be read or parsed."""
    try:
        tree = ast.parse(Path(source).read_text())
    except (OSError, SyntaxError, ValueError):
        return []
    found = []
    for node in (ast.walk(tree) if anywhere else tree.body):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [])
        found += [name.partition(".")[0] for name in names]
    return found


def _key(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if k not in PER_RANK_VARIABLES))

