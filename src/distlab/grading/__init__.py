"""Running a problem's checks, scoring them and reporting the results.

A problem's files import only from here and from ``distlab`` (ops, IN_PLACE, wildcards):
``Checklist`` to declare checks and the runs they share, ``CheckContext`` to launch rank programs
and judge what they did, ``Task``/``Run`` for cases and their results, ``faults`` to build fault
plans, what a rank sent (``Sent``, ``TaskRun.sent``), the views of a task's counters and replay (``Counts``, ``Timeline``: views.py, grading's own
types, never the runtime's), the judges (``first_mismatch``, ``agreement``) and the cost formulas
(``cost``, ``collective_time``).
"""

from __future__ import annotations

from ..platforms import Platform, parse_platform, resolve, uniform
from ..runs import collective_time
from ..runtime.clock import collectives_cost as cost
from ..runtime.comm.sent import COLLECTIVE, Sent, SentLog
from ..runtime.comm.stats import COLLECTIVES, POINT_TO_POINT
from ..runtime.faults.plans import FaultPlan, parse_fault_plan
from ..runtime.rank.memory import return_freed_memory
from ..runtime.trace.chrome import validate_chrome_trace
from . import faults
from .api import CheckContext, CheckFailed, Checklist, RunFailed
from .held import HeldMemory
from .judges import Mismatch, agreement, first_mismatch
from .seeds import Widener
from .tasks import CaseRun, Run, Task, TaskRun
from .views import Counts, Message, Span, Timeline

__all__ = [
    "COLLECTIVE", "COLLECTIVES", "CaseRun", "CheckContext", "CheckFailed", "Checklist", "Counts",
    "FaultPlan", "HeldMemory", "Message", "Mismatch", "POINT_TO_POINT", "Platform", "Run", "RunFailed", "Sent", "SentLog", "Span",
    "Task", "TaskRun", "Timeline", "Widener", "agreement", "collective_time", "cost", "faults", "first_mismatch",
    "parse_fault_plan", "parse_platform", "resolve", "return_freed_memory", "uniform", "validate_chrome_trace",
]
