"""Running a problem's checks, scoring them and reporting the results.

``check.py`` files import only from here (and ``distlab.runtime.jobspec.Task``, re-exported):
``Checklist`` to declare checks, ``CheckContext`` to launch rank programs and judge what they did,
``check_part`` to load the parts of a check.py too long for one file.
"""

from __future__ import annotations

from ..platforms import Platform, parse_platform, resolve, uniform
from ..runtime.faults import parse_fault_plan
from ..runtime.jobspec import Task
from .api import CheckContext, CheckFailed, Checklist, Run, RunFailed, TaskRun
from .parts import check_part

__all__ = [
    "CheckContext", "CheckFailed", "Checklist", "Platform", "Run", "RunFailed", "Task", "TaskRun",
    "check_part", "parse_fault_plan",
    "parse_platform", "resolve", "uniform",
]
