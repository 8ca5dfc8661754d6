"""Asking the zygote for a rank (the protocol is in server.py): connect, send the request with the
rank's three standard streams, read the answers. Standard library only: the MPI stand-in
(stand_in.py) imports it as a script's neighbour, without distlab or site-packages, to start fast.
"""

from __future__ import annotations

import json
import os
import select
import socket
import time
from typing import Any

ZYGOTE_ENV = "DISTLAB_ZYGOTE"  # the zygote's address, for the MPI stand-ins (set by the supervisor)
RANK_MODULE = "distlab.runtime.rank.worker"


class Refused(Exception):
    """The zygote is not there, or would not fork this rank; start a plain process instead."""


def connect(address: str, patience_s: float, alive: Any = None) -> socket.socket:
    """A connection to the zygote at ``address`` (abstract namespace, without the leading NUL),
    trying again while it is still starting; ``alive()`` (if given) says whether to keep trying."""
    deadline = time.monotonic() + patience_s
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect("\0" + address)
            return conn
        except (ConnectionRefusedError, FileNotFoundError) as exc:
            conn.close()
            if time.monotonic() > deadline or (alive is not None and not alive()):
                raise Refused(f"no zygote at {address!r}") from exc
            time.sleep(0.01)


def ask(conn: socket.socket, argv: list[str], env: dict[str, str], cwd: str,
        streams: tuple[int, int, int], patience_s: float) -> int:
    """Sends the request; returns the forked rank's pid once the zygote says it started."""
    request = json.dumps({"argv": argv, "env": env, "cwd": cwd})
    try:
        socket.send_fds(conn, [request.encode() + b"\n"], list(streams))
    except BrokenPipeError:
        pass  # it refused us as soon as we connected and hung up: its reason is still to read
    answer = read_line(conn, patience_s)
    if not answer.startswith("started "):
        raise Refused(answer or "the zygote closed the connection")
    return int(answer.split()[1])


def read_line(conn: socket.socket, timeout_s: float | None) -> str:
    """The next line from the zygote ('' at EOF); raises TimeoutError if none within the time."""
    data = b""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not data.endswith(b"\n"):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([conn], [], [], left)
        if not ready:
            raise TimeoutError("the zygote did not answer in time")
        chunk = conn.recv(1)  # one byte at a time: an answer is a few bytes, and no more is taken
        if not chunk:
            return ""
        data += chunk
    return data.decode().strip()


def exit_code(answer: str) -> int | None:
    """The rank's exit code from an ``exited CODE`` answer; None for anything else (EOF)."""
    return int(answer.split()[1]) if answer.startswith("exited ") else None


def devnull() -> int:
    return os.open(os.devnull, os.O_RDONLY)
