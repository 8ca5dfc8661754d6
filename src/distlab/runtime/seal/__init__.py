"""The seal: the channel between a rank's agent process and its learner process (issue 10).

Not wired into the ranks yet: today a rank is still one process (runtime/rank/worker.py). The
agent (the engine, the proxy, the counters, the clock, the faults, the trace) will run the
learner's code in a child process whose ``comm`` is a thin client; each call crosses here.

``arena.py``    one shared memory region per rank (a sealed memfd, inherited by the child)
``wire.py``     the request encoding the agent validates field by field; never a pickle
``calls.py``    the op codes and what each request may carry
``doorbell.py`` the handshake: a Unix socketpair, one byte per request and per reply
``agent.py``    ``AgentEnd``: serve one validated request, reply with output buffers
``learner.py``  ``LearnerEnd``: call(op, args, inputs, outputs), outputs filled in place

Figures: FIGURES_PENDING
"""

from .agent import AgentEnd, Rejected, Request
from .calls import CALLS, Call
from .errors import (
    AgentGone,
    ArenaTooSmall,
    BadRequest,
    CallFailed,
    CallRejected,
    LearnerFlooding,
    LearnerGone,
    SealError,
)
from .learner import LearnerEnd

__all__ = [
    "CALLS",
    "AgentEnd",
    "AgentGone",
    "ArenaTooSmall",
    "BadRequest",
    "Call",
    "CallFailed",
    "CallRejected",
    "LearnerEnd",
    "LearnerFlooding",
    "LearnerGone",
    "Rejected",
    "Request",
    "SealError",
]
