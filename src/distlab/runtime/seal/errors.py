"""What can go wrong across the seal, declared first so that both ends can name it.

The agent's side (``BadRequest``, ``LearnerGone``, ``LearnerFlooding``) describes the learner
process in words the verdict can reuse ("rank 2's learner process died in Sendrecv"). The learner's
side (``CallRejected``, ``CallFailed``, ``AgentGone``) is raised inside learner code. None of
them is a harness crash: each is an answer the caller is expected to turn into a verdict.
"""

from __future__ import annotations


class SealError(Exception):
    """Base of every error of the channel between a rank's agent and its learner process."""


class ArenaTooSmall(SealError, ValueError):
    """The buffers of one call do not fit in the shared arena's data region (it never grows:
    see arena.py)."""

    def __init__(self, what: str, needed: int, limit: int) -> None:
        super().__init__(
            f"{what} need {needed} bytes ({needed / 2**20:.1f} MiB) of the shared arena, "
            f"whose data region holds {limit} bytes ({limit / 2**20:.1f} MiB)"
        )
        self.needed = needed
        self.limit = limit


class BadRequest(SealError):
    """A request that fails validation. Raised only by the pure decoder (wire.py); the agent
    answers it with a rejection and goes on serving."""


class LearnerGone(SealError):
    """The learner process died or closed its end of the channel.

    ``where`` is where it was as the agent saw it ("in Sendrecv", "after Send", "before its first
    call"); ``status`` how it ended, when the agent could tell ("killed by SIGKILL", "exit status
    1"); ``closed`` is true when the process may still run but has closed the channel."""

    def __init__(self, where: str, status: str = "", closed: bool = False) -> None:
        what = "closed its end of the channel" if closed else (
            "exited" if status == "exit status 0" else "died")
        super().__init__(f"the learner process {what} {where}" + (f" ({status})" if status else ""))
        self.where = where
        self.status = status
        self.closed = closed


class LearnerFlooding(SealError):
    """The learner process sends requests without reading the replies: the agent stops rather than
    block on a full channel (a blocked agent could not report anything)."""


class AgentGone(SealError):
    """Learner side: the agent closed the channel (it ended the job, or died)."""


class CallRejected(SealError):
    """Learner side: the agent refused the request as malformed (a forged or broken client)."""


class CallFailed(SealError):
    """Learner side: the agent made the call and it raised; ``kind`` is the exception's class
    name there (the wiring maps it back to ValueError, TypeError, ...), the message its text."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
