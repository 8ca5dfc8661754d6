"""The MPI engine of a task whose ranks survive a peer's death (``Task(survivors=True)``).

The job runs under Open MPI's user-level failure mitigation (ULFM: ``mpiexec --with-ft ulfm``
over the TCP transport, supervisor/start.py), so a call that involves a dead rank returns an
error instead of ending the job: MPI_ERR_PROC_FAILED (or ..._PENDING for a wildcard receive),
or MPI_ERR_REVOKED once a survivor has revoked the communicator. ``SurvivingEngine`` wraps an
``MpiEngine`` (and every group made from it, and every request it starts) and turns those errors
into ``distlab.PeerFailed`` (engines/peer_failed.py; comm/errors.py exports it) naming the failed ranks this rank knows of; other errors pass as they are. It also
marks the rank's slot running again (``on_failure``), since the call that failed never got to.
What the survivors do next is the learner's: ``comm.Revoke()``, ``comm.Agree(flag)``,
``comm.Shrink()`` (comm/survivors.py). ``comm.Admit()`` spawns the newcomers the supervisor
announced on the launch's store (engines/admission.py) and merges with them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import admission
from .mpi import MpiEngine, _mpi
from .notices import FailureWatch, connect, job_keys
from .peer_failed import PeerFailed

# How long an Admit waits for the supervisor to have handled the deaths this rank knows of (it
# announces a dead rank's replacement before it posts the death: notices.py).
POSTED_WAIT_S = 10.0


@dataclass
class Joining:
    """What the Admit of an MPI job whose plan adds ranks needs, shared by a rank's groups: the
    launch's store (``address``: the supervisor's announcements, under the attempt's keys) and a
    watch of the deaths it posted, both made by ``connect``; the command line that starts a
    newcomer (rank/survival.py); the world ranks seen to die."""

    address: str
    attempt: int
    command: Callable[[str, list[int], list[int | None]], list[str]]
    known_dead: set[int] = field(default_factory=set)
    _keys: Any = None
    _watch: FailureWatch | None = None

    def connect(self) -> Any:
        """The store under the attempt's keys (connected, and the watch started, at the first
        call)."""
        if self._keys is None:
            import torch.distributed as dist

            self._keys = dist.PrefixStore(job_keys(self.attempt).rstrip("/"), connect(self.address))
            self._watch = FailureWatch(self.address, self.attempt)
        return self._keys

    def wait_posted(self) -> None:
        """Until the supervisor has posted every death this rank knows of, so that every
        replacement due (restart = "rank") is announced."""
        self.connect()
        assert self._watch is not None
        end = time.monotonic() + POSTED_WAIT_S
        while not self.known_dead <= self._watch.dead and time.monotonic() < end:
            time.sleep(0.01)


def _failure_classes() -> frozenset[int]:
    MPI = _mpi()
    return frozenset({MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED})


class SurvivingEngine:
    """An MpiEngine whose failures of peers raise PeerFailed (see the module docstring)."""

    survives_peers = True  # what comm/survivors.py asks before it revokes, agrees or shrinks

    def __init__(self, inner: MpiEngine, on_failure: Callable[[], None],
                 joining: Joining | None = None) -> None:
        self._inner = inner
        self._on_failure = on_failure  # marks the rank's slot running: the call never will
        self._joining = joining  # None: the plan adds no ranks, so no one ever waits to join
        self._failures = _failure_classes()
        self.name, self.rank, self.size = inner.name, inner.rank, inner.size
        self.world_ranks, self.path = inner.world_ranks, inner.path
        self._admissions = 0

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
                return SurvivingEngine(made, self._on_failure, self._joining)
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
            if self._joining is not None:
                self._joining.known_dead.update(self.world_ranks[r] for r in dead)
            raise PeerFailed(_called(call), dead, revoked) from None

    def admit(self) -> SurvivingEngine:
        """This group's members and the announced newcomers not admitted yet, spawned now and
        merged in that order (collective over the members); this group itself when none waits."""
        joining = self._joining
        if joining is None:
            return self
        self._admissions += 1
        path = f"{self.path}/j{self._admissions - 1}"
        joining.wait_posted()
        # A fault-tolerant barrier first (MPIX_Comm_agree, uniform): a member that died before
        # it (a kill at this step's mark) fails every member's Admit alike, before a spawn that a
        # root would wait in for ever. Then rank 0 reads the announcements and tells the others.
        self.guarded("Admit", self._inner.agree, 1)
        due = admission.pending(joining.connect()) if self.rank == 0 else []
        count = np.array([len(due)], dtype=np.int64)
        self.guarded("Admit", self._inner.bcast, count, 0)
        if count[0] == 0:
            return self
        table = np.array([x for rank, was in due for x in (rank, -1 if was is None else was)]
                         or [0] * (2 * int(count[0])), dtype=np.int64)
        self.guarded("Admit", self._inner.bcast, table, 0)
        newcomers = [int(r) for r in table[0::2]]
        replacing = [None if w < 0 else int(w) for w in table[1::2]]
        members = self.world_ranks + newcomers
        grown = self.guarded("Admit", self._inner.spawn, joining.command(path, members, replacing),
                             len(newcomers), members, path)
        if self.rank == 0:
            admission.admit(joining.connect(), newcomers, path, members)
        return SurvivingEngine(grown, self._on_failure, joining)


class _SurvivingRequest:
    """A request of a SurvivingEngine: its wait and test raise PeerFailed as the calls do."""

    def __init__(self, inner: Any, engine: SurvivingEngine, call: str) -> None:
        self._inner, self._engine, self._call = inner, engine, call

    @property
    def received_bytes(self) -> int | None:
        return getattr(self._inner, "received_bytes", None)

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
