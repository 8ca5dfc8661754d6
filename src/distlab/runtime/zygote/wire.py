"""Asking the zygote for a rank (the protocol is in server.py): connect, send the request with the
rank's three standard streams, read the answers.

The MPI stand-in (stand_in.py) imports this as a script's neighbour, without distlab or
site-packages, and mpiexec starts one per rank: so it imports only the standard library's C
modules (``_socket`` rather than ``socket``, and no ``json``, ``select`` or ``typing``, which import
``re`` and ``enum`` or load one more library): a stand-in started in 25 ms of CPU with them, 11 without.
"""

from __future__ import annotations

import os
import sys
import time
from _socket import AF_UNIX, SCM_RIGHTS, SOCK_STREAM, SOL_SOCKET
from _socket import socket as Socket

ZYGOTE_ENV = "DISTLAB_ZYGOTE"  # the zygote's address, for the MPI stand-ins (set by the supervisor)
RANK_MODULE = "distlab.runtime.rank.worker"

TYPE_CHECKING = False  # typing's own, without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Callable


class Refused(Exception):
    """The zygote is not there, or would not fork this rank; start a plain process instead."""


def connect(address: str, patience_s: float, alive: Callable[[], bool] | None = None) -> Socket:
    """A connection to the zygote at ``address`` (abstract namespace, without the leading NUL),
    trying again while it is still starting; ``alive()`` (if given) says whether to keep trying."""
    deadline = time.monotonic() + patience_s
    while True:
        conn = Socket(AF_UNIX, SOCK_STREAM)
        try:
            conn.connect("\0" + address)
            return conn
        except (ConnectionRefusedError, FileNotFoundError) as exc:
            conn.close()
            if time.monotonic() > deadline or (alive is not None and not alive()):
                raise Refused(f"no zygote at {address!r}") from exc
            time.sleep(0.01)


def encode_request(argv: list[str], env: dict[str, str], cwd: str) -> bytes:
    """The request: its length in decimal and a newline, then its fields separated by NUL bytes
    (which no argument, variable or path can hold): the folder, the number of arguments, the
    arguments, and each variable as NAME=VALUE. Bytes as the kernel gives them, so that a name
    that is not UTF-8 reaches the rank unchanged."""
    fields = [os.fsencode(cwd), b"%d" % len(argv), *map(os.fsencode, argv),
              *(os.fsencode(name) + b"=" + os.fsencode(value) for name, value in env.items())]
    body = b"\0".join(fields)
    return b"%d\n" % len(body) + body


def decode_request(body: bytes) -> tuple[list[str], dict[bytes, bytes], bytes]:
    """``encode_request``'s body back: (argv, environment as bytes, folder); ValueError if malformed."""
    fields = body.split(b"\0")
    if len(fields) < 2 or not fields[1].isdigit() or len(fields) < 2 + int(fields[1]):
        raise ValueError("a malformed request")
    count = int(fields[1])
    env = {}
    for item in fields[2 + count:]:
        name, equals, value = item.partition(b"=")
        if not name or not equals:
            raise ValueError(f"a malformed variable in the request: {item[:40]!r}")
        env[name] = value
    return [os.fsdecode(arg) for arg in fields[2:2 + count]], env, fields[0]


def ask(conn: Socket, argv: list[str], env: dict[str, str], cwd: str,
        streams: tuple[int, int, int], patience_s: float) -> int:
    """Sends the request; returns the forked rank's pid once the zygote says it started."""
    try:
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in streams)  # an int array, as C has it
        conn.sendmsg([encode_request(argv, env, cwd)], [(SOL_SOCKET, SCM_RIGHTS, fds)])
    except BrokenPipeError:
        pass  # it refused us as soon as we connected and hung up: its reason is still to read
    answer = read_line(conn, patience_s)
    if not answer.startswith("started "):
        raise Refused(answer or "the zygote closed the connection")
    return int(answer.split()[1])


def read_line(conn: Socket, timeout_s: float | None) -> str:
    """The next line from the zygote ('' at EOF); raises TimeoutError if none within the time."""
    data = b""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not data.endswith(b"\n"):
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError("the zygote did not answer in time")
        conn.settimeout(left)
        try:
            chunk = conn.recv(1)  # one byte at a time: an answer is a few bytes, and no more is taken
        except TimeoutError:
            raise TimeoutError("the zygote did not answer in time") from None
        if not chunk:
            return ""
        data += chunk
    return data.decode().strip()


def exit_code(answer: str) -> int | None:
    """The rank's exit code from an ``exited CODE`` answer; None for anything else (EOF)."""
    return int(answer.split()[1]) if answer.startswith("exited ") else None


def devnull() -> int:
    return os.open(os.devnull, os.O_RDONLY)
