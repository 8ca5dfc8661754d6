"""The seal: the channel between a rank's agent process and its learner process (issue 10).

Sealed (``--seal on``), a rank is two processes (runtime/rank/sealed.py starts the second): the
agent holds the engine, the proxy, the counters, the clock, the faults and the trace; the learner
process runs the problem's rank program and the learner's file, with a thin client ``comm``,
in a sandbox. Each call crosses here.

``arena.py``    one shared memory region per rank (a sealed memfd, inherited by the child)
``wire.py``     the request encoding the agent validates field by field; never a pickle
``calls.py``    the op codes and what each request may carry
``doorbell.py`` the handshake: a pipe each way, one byte per request and per reply
``agent.py``    ``AgentEnd``: serve one validated request, reply with output buffers
``learner.py``  ``LearnerEnd``: call(op, args, inputs, outputs), outputs filled in place
``lines.py``    a line (an arena and a doorbell) per thread's call in flight, opened on demand
``client.py``   ``SealedComm``: mpi4py's API in the learner process, every call through the seal
``service.py``  the agent's side of a task: each request made on the real proxy
``values.py``   a task's result on its way out, read back with listed classes only
``sandbox.py``  what the learner process can see and do: namespaces, read-only files, no caps
``memgroup.py`` a memory cgroup per learner: its processes bounded together
``syscalls.py`` its seccomp filter: no keyring, file locks or file watches shared with other ranks

Figures (scripts/seal_handshake.py, this 2-core VM, under the heavy-run lock; medians): an empty
call crosses in 180-210 us, a 1 MiB buffer in and out in 470-560 us; ``distlab bench`` measures a
message and check 03 sealed against unsealed. Issue 10's target (30 us added per small call) is
not met here by a blocking handshake.

Not yet: torch tensors of bfloat16 (NumPy's little-endian numbers only); more than 32 receive
buffers in one Waitall (they wait in rounds).
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
