"""The errors the learner's ``comm`` raises for what goes wrong between ranks, as distlab's own
types (``distlab.CommTimeout``, ``distlab.CommBroken``, ``distlab.PeerFailed``), so that learner
code can catch them by name, sealed or not, and the check that every timeout given to a call is
one."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Any

from ..engines.peer_failed import PeerFailed, peer_failed_from

__all__ = ["CommBroken", "CommTimeout", "PeerFailed", "comm_timeout_from", "peer_failed_from",
           "timeout_seconds"]


class CommTimeout(TimeoutError):
    """A blocking call gave up after its timeout: ``call`` ("Recv", "store.get", ...), ``peer``
    (the rank it waited on, -1 for any rank, a tuple of ranks for a collective, or the store's
    key) and ``waited_s`` say which, how long. Ranks are ranks of the call's communicator."""

    def __init__(self, call: str, peer: object, waited_s: float, why: str = "") -> None:
        self.call, self.peer, self.waited_s = call, peer, waited_s
        tail = f": {why}" if why else ""
        super().__init__(f"{call} {_naming(peer)} timed out after {waited_s:g} s{tail}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.call, self.peer, self.waited_s))


class CommBroken(RuntimeError):
    """A call on a communicator that a timed-out collective left unusable: its members may be
    anywhere in that collective, so no later call on it can be matched. Other communicators of
    the rank, and the store, still work."""


def _naming(peer: object) -> str:
    if isinstance(peer, str):
        return f"on {peer!r}"
    if isinstance(peer, tuple):
        ranks = [int(r) for r in peer]
        if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[0] + len(ranks))):
            return f"with ranks {ranks[0]}-{ranks[-1]}"
        return "with ranks " + ", ".join(map(str, ranks))
    if peer == -1:
        return "with any rank"
    return f"with rank {peer}"


_MESSAGE = re.compile(
    r"(\S+) (?:on (?P<key>'.*'|\".*\")|with rank (?P<rank>-?\d+)|with (?P<any>any rank)"
    r"|with ranks (?P<span>\d+)-(?P<last>\d+)|with ranks (?P<list>[\d, ]+)) "
    r"timed out after (?P<waited>[0-9.e+-]+) s(?:: (?P<why>.*))?$", re.S)


def comm_timeout_from(message: str) -> CommTimeout:
    """The CommTimeout whose message this is (the sealed client gets the message alone)."""
    found = _MESSAGE.match(message)
    if found is None:
        error = CommTimeout("a call", "?", 0.0)
        error.args = (message,)
        return error
    peer: object
    if found["key"] is not None:
        peer = found["key"][1:-1]
    elif found["rank"] is not None:
        peer = int(found["rank"])
    elif found["any"] is not None:
        peer = -1
    elif found["span"] is not None:
        peer = tuple(range(int(found["span"]), int(found["last"]) + 1))
    else:
        peer = tuple(int(r) for r in found["list"].split(","))
    return CommTimeout(found[1], peer, float(found["waited"]), found["why"] or "")


def timeout_seconds(value: Any, what: str) -> float:
    """``value`` (seconds, or a ``timedelta``) as a float, once it is a timeout: a finite number
    of seconds above 0. ``what`` names the call or setting, for the error."""
    try:
        seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not 0 < seconds < math.inf:
        raise ValueError(f"{what}: a timeout is a number of seconds > 0, not {value!r}")
    return seconds
