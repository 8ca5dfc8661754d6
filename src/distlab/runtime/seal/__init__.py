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

Figures (scripts/seal_handshake.py, this 2-core VM, under the heavy-run lock; medians): an empty
call crosses in 180-210 us, a 1 MiB buffer in and out in 470-560 us; the handshake's own round
trip is about 60 us, and the Python of both ends about 22-54 us. doorbell.py has the table and
why the rest goes to waking a sleeping CPU. Issue 10's target (30 us added per small call) is
not met here by a blocking handshake.

Not yet: the wiring (worker.py starting the learner process, the client ``comm``, the verdicts);
arena slots that outlive a call (an Irecv's buffer until its Wait: calls.py passes it again);
torch tensors and bfloat16 (NumPy's little-endian numbers only); Waitall beyond 64 requests.
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
