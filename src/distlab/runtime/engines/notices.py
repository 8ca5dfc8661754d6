"""Failure notices of a gloo job whose ranks survive their peers (``Task(survivors=True)``), on
the launch's store (the supervisor's TCPStore, runtime/supervisor/store_host.py).

Gloo has no failure detector of its own: a call with a dead peer fails with a broken connection
at best, and a rank waiting on a live peer that is itself stuck waits until the process group's
timeout. So the supervisor, which sees every rank's process, publishes each death here once the
process is gone, and a rank publishes each revocation (``comm.Revoke()``); every rank's
``FailureWatch`` follows the notices in a thread of its own, and the engine's polled calls
(engines/surviving_gloo.py) read what it has seen. Notices are numbered: the writer takes a
number with the store's atomic ``add`` and writes the notice under it, and a watch reads them in
order, so every rank sees the same notices in the same order.

Keys live under ``distlab/a<attempt>/`` (every attempt of a restarted job uses the same store).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

# How often a watch looks for the next notice: the time from a death to a PeerFailed is the
# supervisor's poll (50 ms) plus at most this.
WATCH_EVERY_S = 0.01


def job_keys(attempt: int) -> str:
    """The prefix of every key of one attempt of the job: notices, agreements, groups."""
    return f"distlab/a{attempt}/"


def _count_key(attempt: int) -> str:
    return f"{job_keys(attempt)}notices"


def _notice_key(attempt: int, number: int) -> str:
    return f"{job_keys(attempt)}notice/{number}"


def publish(store: Any, attempt: int, kind: str, what: str) -> None:
    """Writes the next notice: ``kind`` "dead" (``what``: a world rank) or "revoked" (``what``:
    the path of the revoked group)."""
    number = int(store.add(_count_key(attempt), 1)) - 1
    store.set(_notice_key(attempt, number), f"{kind} {what}")


def publish_death(store: Any, attempt: int, world_rank: int) -> None:
    publish(store, attempt, "dead", str(world_rank))


def connect(address: str, timeout_s: float = 300.0) -> Any:
    """A client of the launch's store at ``address`` ("host:port")."""
    import torch.distributed as dist

    host, port = address.rsplit(":", 1)
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))


class FailureWatch:
    """What this rank knows of the job's deaths and revocations, kept current by a thread with
    a store client of its own. ``dead`` and ``revoked`` are replaced, never changed in place, so
    a reader needs no lock."""

    def __init__(self, address: str, attempt: int) -> None:
        self.dead: frozenset[int] = frozenset()  # world ranks
        self.revoked: frozenset[str] = frozenset()  # group paths
        self._address, self._attempt = address, attempt
        self._thread = threading.Thread(target=self._follow, name="distlab-failure-watch",
                                        daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            store = connect(self._address)
        except RuntimeError:
            return  # the launch is over
        number = 0
        while True:
            key = _notice_key(self._attempt, number)
            try:
                if not store.check([key]):
                    time.sleep(WATCH_EVERY_S)
                    continue
                kind, what = store.get(key).decode().split(" ", 1)
            except RuntimeError:
                return  # the store went away with the launch
            if kind == "dead":
                self.dead = self.dead | {int(what)}
            else:
                self.revoked = self.revoked | {what}
            number += 1

    def wait_for_death(self, world_ranks: set[int], seconds: float) -> frozenset[int]:
        """The ranks among ``world_ranks`` known dead, waiting up to ``seconds`` for one to be:
        a broken connection is a death only once the supervisor has seen the process gone."""
        end = time.monotonic() + seconds
        while True:
            found = self.dead & world_ranks
            if found or time.monotonic() >= end:
                return frozenset(found)
            time.sleep(WATCH_EVERY_S)
