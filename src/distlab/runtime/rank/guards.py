"""Calls of the engine's own API that learner code must not make, named at once.

A learner who writes ``MPI.Finalize()`` at the end of a function (as a standalone MPI script
would) finalizes MPI under the harness: every later call of any rank then fails or waits, and the
job only ends at its deadline. The rank replaces the function with one that says what happened
before the learner's module is loaded; the harness keeps the real one (mpi4py finalizes at exit).
"""

from __future__ import annotations

from typing import Any, Callable


class EngineMisuse(BaseException):
    """Raised where learner code calls what the harness owns; the worker reports it."""


_harness_finalize: list[Callable[[], None]] = []  # the real MPI.Finalize, once replaced


def forbid_finalize(backend: str) -> None:
    if backend != "mpi":
        return
    from mpi4py import MPI

    def finalize(*args: Any, **kwargs: Any) -> None:
        raise EngineMisuse("the solution called MPI.Finalize(): distlab starts and ends MPI "
                           "itself, and no rank can communicate after it; remove the call")

    if not _harness_finalize:
        _harness_finalize.append(MPI.Finalize)
    MPI.Finalize = finalize


def finalize_mpi() -> None:
    """The harness's own MPI_Finalize (a no-op if MPI is not up), whatever the learner's code saw."""
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized():
        (_harness_finalize[0] if _harness_finalize else MPI.Finalize)()


def require_completed(unwaited: dict[str, int]) -> None:
    """Raises when the learner's code returned with requests it never completed: MPI may still
    read a send buffer or write a receive buffer that the code then reuses or frees, which shows
    up much later as wrong values or a crash far from the cause."""
    if not unwaited:
        return
    total = sum(unwaited.values())
    kinds = " and ".join(f"{count} {kind}" for kind, count in unwaited.items())
    raise EngineMisuse(f"returned with {kinds} request{'s' if total > 1 else ''} never waited: "
                       "MPI needs Wait (or Test until it is true) before the buffer is reused or freed")
