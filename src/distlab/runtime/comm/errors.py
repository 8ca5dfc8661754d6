"""The errors the learner's ``comm`` raises for what goes wrong between ranks, as distlab's own
types (``distlab.CommTimeout``), so that learner code can catch them by name, sealed or not."""

from __future__ import annotations

import re


class CommTimeout(TimeoutError):
    """A blocking call gave up after its timeout: ``call`` ("Recv", "store.get", ...), ``peer``
    (the rank, key or group it waited on) and ``waited_s`` say which, how long."""

    def __init__(self, call: str, peer: object, waited_s: float, why: str = "") -> None:
        self.call, self.peer, self.waited_s = call, peer, waited_s
        tail = f": {why}" if why else ""
        super().__init__(f"{call} on {peer!r} timed out after {waited_s:g} s{tail}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.call, self.peer, self.waited_s))


def comm_timeout_from(message: str) -> CommTimeout:
    """The CommTimeout whose message this is (the sealed client gets the message alone)."""
    found = re.match(r"(\S+) on (.*) timed out after ([0-9.e+-]+) s(?:: (.*))?$", message, re.S)
    if found is None:
        error = CommTimeout("a call", "?", 0.0)
        error.args = (message,)
        return error
    call, peer, waited, why = found.groups()
    return CommTimeout(call, _unquoted(peer), float(waited), why or "")


def _unquoted(text: str) -> object:
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"" else text
