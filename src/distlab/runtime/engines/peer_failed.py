"""``distlab.PeerFailed``: what a call of a task whose ranks survive their peers
(``Task(survivors=True)``) raises when it touched a rank that died, on either engine (MPI under
ULFM: engines/surviving.py; gloo: engines/surviving_gloo.py). comm/errors.py exports it.
"""

from __future__ import annotations

import re


class PeerFailed(RuntimeError):
    """A call touched a rank that died (Task(survivors=True)): ``call`` names it, ``ranks`` the
    failed ranks of its communicator this rank knows of (comm.Get_failed()), ``revoked`` whether
    it failed because a survivor revoked the communicator (comm.Revoke()). The communicator's
    survivors go on over ``comm.Shrink()``."""

    def __init__(self, call: str, ranks: tuple[int, ...], revoked: bool = False) -> None:
        self.call, self.ranks, self.revoked = call, tuple(ranks), revoked
        who = (f"rank {ranks[0]}" if len(ranks) == 1 else
               f"ranks {', '.join(map(str, ranks))}" if ranks else "a rank")
        if revoked:
            text = f"{call}: the communicator was revoked, {who} of it failed"
        else:
            text = f"{call}: {who} of the communicator failed"
        super().__init__(f"{text}; carry on over comm.Shrink()")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.call, self.ranks, self.revoked))


_FAILED = re.compile(r"(\S+): (?:the communicator was revoked, )?(?:rank (?P<one>\d+)|ranks "
                     r"(?P<many>[\d, ]+)|a rank) (?:of it failed|of the communicator failed)")


def peer_failed_from(message: str) -> PeerFailed:
    """The PeerFailed whose message this is (the sealed client gets the message alone)."""
    found = _FAILED.match(message)
    if found is None:
        error = PeerFailed("a call", ())
        error.args = (message,)
        return error
    ranks = ((int(found["one"]),) if found["one"] else
             tuple(int(r) for r in found["many"].split(",")) if found["many"] else ())
    return PeerFailed(found[1], ranks, "was revoked" in message)
