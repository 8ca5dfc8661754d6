"""distlab: a hands-on problem bank for distributed training.

What learner code may import: the reduction ops, the wildcards, ``IN_PLACE`` and ``UNDEFINED``
(a Split's color for a rank that joins no group), with the same meaning as mpi4py's ``MPI.SUM``,
``MPI.ANY_SOURCE``, ``MPI.IN_PLACE``, ``MPI.UNDEFINED``; ``CommTimeout``, what a call that
waited past its timeout raises (``comm.set_timeout``, a call's ``timeout=``, a store's get), and
``CommBroken``, what a call raises on a communicator that a timed-out collective left unusable;
and ``PeerFailed``, what a call that touched a dead rank raises in a task whose ranks survive
their peers (``Task(survivors=True)``).
"""

from .ops import MAX, MIN, PROD, SUM, Op
from .runtime.comm.errors import CommBroken, CommTimeout, PeerFailed
from .runtime.comm.requests import IN_PLACE, Request, Status
from .runtime.engines.base import ANY_SOURCE, ANY_TAG, UNDEFINED

__version__ = "0.1.0"

__all__ = [
    "ANY_SOURCE", "ANY_TAG", "CommBroken", "CommTimeout", "IN_PLACE", "MAX", "MIN", "Op",
    "PeerFailed", "PROD", "Request", "SUM",
    "Status", "UNDEFINED",
]
