"""The MPI engine of a task whose ranks survive a peer's death (``Task(survivors=True)``).

The job runs under Open MPI's user-level failure mitigation (ULFM: ``mpiexec --with-ft ulfm``
over the TCP transport, supervisor/start.py), so a call that involves a dead rank returns an
error instead of ending the job: MPI_ERR_PROC_FAILED (or ..._PENDING for a wildcard receive),
or MPI_ERR_REVOKED once a survivor has revoked the communicator. ``SurvivingEngine`` wraps an
``MpiEngine`` (and every group made from it, and every request it starts) and turns those errors
into ``distlab.PeerFailed`` (engines/peer_failed.py; comm/errors.py exports it) naming the failed ranks this rank knows of; other errors pass as they are. It also
marks the rank's slot running again (``on_failure``), since the call that failed never got to.
What the survivors do next is the learner's: ``comm.Revoke()``, ``comm.Agree(flag)``,
``comm.Shrink()`` (comm/survivors.py).
"""

from __future__ import annotations

from typing import Any, Callable

from .mpi import MpiEngine, _mpi
from .peer_failed import PeerFailed


def _failure_classes() -> frozenset[int]:
    MPI = _mpi()
    return frozenset({MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED})


class SurvivingEngine:
    """An MpiEngine whose failures of peers raise PeerFailed (see the module docstring)."""

    survives_peers = True  # what comm/survivors.py asks before it revokes, agrees or shrinks

    def __init__(self, inner: MpiEngine, on_failure: Callable[[], None]) -> None:
        self._inner = inner
        self._on_failure = on_failure  # marks the rank's slot running: the call never will
        self._failures = _failure_classes()
        self.name, self.rank, self.size = inner.name, inner.rank, inner.size
        self.world_ranks, self.path = inner.world_ranks, inner.path

    @property
    def raw(self) -> Any:
        return self._inner.raw

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            made = self.guarded(name, attribute, *args, **kwargs)
            if isinstance(made, MpiEngine):  # split, create_group, shrink: a group of survivors too
                return SurvivingEngine(made, self._on_failure)
            if hasattr(made, "wait") and hasattr(made, "test"):  # a request: it fails later
                return _SurvivingRequest(made, self, name)
            return made

        return call

    def guarded(self, call: str, function: Any, *args: Any, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)``, a peer's failure in it raised as PeerFailed."""
        MPI = _mpi()
        try:
            return function(*args, **kwargs)
        except MPI.Exception as error:
            if error.Get_error_class() not in self._failures:
                raise
            revoked = error.Get_error_class() == MPI.ERR_REVOKED
            self._on_failure()
            try:
                dead = tuple(self._inner.failed())
            except MPI.Exception:
                dead = ()
            raise PeerFailed(_called(call), dead, revoked) from None


class _SurvivingRequest:
    """A request of a SurvivingEngine: its wait and test raise PeerFailed as the calls do."""

    def __init__(self, inner: Any, engine: SurvivingEngine, call: str) -> None:
        self._inner, self._engine, self._call = inner, engine, call

    def wait(self) -> tuple[int, int]:
        return self._engine.guarded(self._call, self._inner.wait)  # type: ignore[no-any-return]

    def test(self) -> bool:
        return bool(self._engine.guarded(self._call, self._inner.test))

    def cancel(self) -> bool:
        return bool(self._engine.guarded(self._call, self._inner.cancel))


# The engine's method names, as the learner's calls are named in a PeerFailed.
_CALLS = {"send": "Send", "recv": "Recv", "isend": "Isend", "irecv": "Irecv", "probe": "Probe",
          "sendrecv": "Sendrecv", "barrier": "Barrier", "bcast": "Bcast", "reduce": "Reduce",
          "allreduce": "Allreduce", "reduce_scatter": "Reduce_scatter", "allgather": "Allgather",
          "gather": "Gather", "scatter": "Scatter", "allgatherv": "Allgatherv",
          "alltoall": "Alltoall", "alltoallv": "Alltoallv", "split": "Split",
          "create_group": "Create_group", "agree": "Agree"}


def _called(method: str) -> str:
    if method in _CALLS:
        return _CALLS[method]
    if method.startswith("i") and method[1:] in _CALLS:
        return "I" + _CALLS[method[1:]].lower()
    return method
