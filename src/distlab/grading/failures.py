"""How a check fails: a wrong answer (``CheckFailed``), or a launch that ended badly (``RunFailed``)."""

from __future__ import annotations

from ..runtime.supervisor import LaunchResult


class CheckFailed(Exception):
    """A check found the solution wrong; the message says what was expected and what was seen."""


class RunFailed(CheckFailed):
    """A launch ended badly (exception, deadlock, timeout, crash) before results came back.

    ``first_report``: this check is the first to read the failure, and tells the whole story; the
    later readers of the same run say "not graded"."""

    def __init__(self, result: LaunchResult, first_report: bool) -> None:
        super().__init__(result.message)
        self.result = result
        self.first_report = first_report
