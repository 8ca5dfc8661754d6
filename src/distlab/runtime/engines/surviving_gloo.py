"""The gloo engine of a task whose ranks survive a peer's death (``Task(survivors=True)``): the
same calls as under MPI's ULFM (engines/surviving.py), built on torch.distributed and the
launch's store, since gloo has no failure mitigation of its own.

* **Detection.** Gloo notices a dead peer only where a call has a connection to it (and a rank
  that waits on a live peer which is itself stuck waits until the group's timeout). So every
  call of this engine runs its nonblocking form and polls it, looking between polls at the
  failure notices that the supervisor publishes on the store once a rank's process is gone
  (engines/notices.py): a call raises ``distlab.PeerFailed`` as soon as it involves a dead rank
  (a collective, any dead member; a point-to-point call, its peer; a receive from any source, a
  dead member not acknowledged yet), as ULFM's calls fail. A call that gloo itself fails with a
  broken connection raises PeerFailed once the notice of a dead member comes (within a few
  seconds), else its own error. The request the call started is left to the dead group.
* **Revoke** publishes a notice; from then on every pending and later call on the group fails
  on every member (PeerFailed, ``revoked``). Gloo cannot interrupt a call, so a revoked call
  ends at its next poll, which is what the polling is for.
* **Agree** and **Shrink** meet on the store: each live member writes its part under the
  operation's key, the first to see every live member's part writes the decision with
  ``compare_set`` (first writer wins) and every member reads that one, so all decide alike
  even when their notices arrive at different times. Agree's decision is the AND of the flags,
  or PeerFailed at every member if a dead member was not acknowledged by all (ULFM's rule);
  Shrink's is the members, in their order here, and they form a ``ProcessGroupGloo`` of their
  own under the shrink's path, as a split does (engines/gloo.py).

* **Admit** (engines/admission.py) meets the same way; its decision is the ranks waiting in the
  lobby to join, and the members and the newcomers form a group of them all.

Known limits: a member that dies after Shrink or Admit has decided but before the new group has
met makes the others wait for it until the group's timeout (gloo's construction cannot be
polled); two communicators that Admit at the same time may both take the same newcomer (admit on
one communicator of the task at a time, as an elastic job re-forms its one world).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

from . import admission
from .base import ANY_SOURCE
from .gloo import GlooEngine, meet_group, use_store
from .gloo import world as gloo_world
from .gloo_parts import _EAGER, _Done, _SelfRecv, _torch
from .notices import FailureWatch, connect, job_keys, publish
from .peer_failed import PeerFailed

# How long a call that gloo failed waits for the notice of a dead member before it raises its
# own error: the supervisor publishes a death within a poll or two of the process's end.
NOTICE_WAIT_S = 5.0


@dataclass
class Survival:
    """What every group of one rank shares: the watch, the store and the slot's reset."""

    watch: FailureWatch
    client: Any  # the rank's client of the launch's store (notices are written through it)
    keys: Any  # the same store under this attempt's keys (agreements, shrinks)
    attempt: int
    on_failure: Callable[[], None]  # marks the rank's slot running: the failed call never will


def surviving_world(address: str, attempt: int, on_failure: Callable[[], None],
                    timeout_s: float = 1800.0) -> SurvivingGlooEngine:
    """The job's world over the launch's store at ``address``, its calls watched for deaths."""
    _, dist = _torch()
    client = connect(address)
    keys = dist.PrefixStore(job_keys(attempt).rstrip("/"), client)
    plain = gloo_world(timeout_s, store=keys)
    life = Survival(FailureWatch(address, attempt), client, keys, attempt, on_failure)
    return SurvivingGlooEngine(plain.raw, plain.rank, plain.size, plain.world_ranks,
                               timedelta(seconds=timeout_s), True, life=life)


def newcomer(address: str, attempt: int, world_rank: int, on_failure: Callable[[], None],
             waiting_shown: Callable[[], None], timeout_s: float = 1800.0) -> SurvivingGlooEngine:
    """The engine of a rank that joins the running job: it waits in the lobby until the members
    of a communicator admit it (engines/admission.py), and is then a member of their new group."""
    _, dist = _torch()
    client = connect(address)
    keys = dist.PrefixStore(job_keys(attempt).rstrip("/"), client)
    use_store(keys)
    life = Survival(FailureWatch(address, attempt), client, keys, attempt, on_failure)
    path, members = admission.wait_admission(keys, world_rank, waiting_shown)
    timeout = timedelta(seconds=timeout_s)
    rank = members.index(world_rank)
    return SurvivingGlooEngine(meet_group(path, rank, len(members), timeout), rank, len(members),
                               members, timeout, True, path, life=life)


class SurvivingGlooEngine(GlooEngine):
    """A GlooEngine whose calls raise PeerFailed (see the module docstring)."""

    survives_peers = True  # what comm/survivors.py asks before it revokes, agrees or shrinks

    def __init__(self, group: Any, rank: int, size: int, world_ranks: list[int],
                 timeout: timedelta, is_world: bool, path: str = "0", *, life: Survival) -> None:
        super().__init__(group, rank, size, world_ranks, timeout, is_world, path)
        self._life = life
        self._label: str | None = None  # the learner's call under way, as a PeerFailed names it
        self._revoked_here = False
        self._acked: frozenset[int] = frozenset()  # world ranks whose death this rank acknowledged
        self._agreements = 0
        self._shrinks = 0
        self._admissions = 0

    def _made(self, group: Any, rank: int, world_ranks: list[int], path: str) -> GlooEngine:
        return SurvivingGlooEngine(group, rank, len(world_ranks), world_ranks, self._timeout,
                                   False, path, life=self._life)

    # -- the failure checks every call makes -------------------------------------------------

    def check(self, call: str, peer: int | None) -> None:
        """Raises PeerFailed if the group is revoked or the call involves a dead rank: ``peer``
        None for a collective, a rank of this group, or ANY_SOURCE."""
        watch = self._life.watch
        if self._revoked_here or self.path in watch.revoked:
            raise self._peer_failed(call, revoked=True)
        dead = watch.dead
        if not dead:
            return
        if peer is None:
            involved = any(w in dead for w in self.world_ranks)
        elif peer == ANY_SOURCE:
            involved = any(w in dead and w not in self._acked for w in self.world_ranks)
        else:
            involved = self.world_ranks[peer] in dead
        if involved:
            raise self._peer_failed(call)

    def broken(self, call: str, error: BaseException) -> PeerFailed | BaseException:
        """What to raise for ``error``, which gloo raised in ``call``: PeerFailed once a member's
        death is known (a broken connection), else the error itself."""
        if self._life.watch.wait_for_death(set(self.world_ranks), NOTICE_WAIT_S):
            return self._peer_failed(call)
        return error

    def _peer_failed(self, call: str, revoked: bool = False) -> PeerFailed:
        self._life.on_failure()
        return PeerFailed(call, tuple(self.failed()), revoked)

    def _watched(self, request: Any, call: str, peer: int | None) -> Any:
        if isinstance(request, (_Done, _SelfRecv, _Watched)):
            return request  # done already, to or from this rank, or watched by an outer call
        return _Watched(request, self, self._label or call, peer)

    def _as(self, label: str, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``, its failures named after the learner's call ``label`` (an outer
        label, such as Split around its Allgather, wins)."""
        if self._label is not None:
            return call(*args)
        self._label = label
        try:
            return call(*args)
        finally:
            self._label = None

    # -- point to point ----------------------------------------------------------------------

    def send(self, buf: Any, dest: int, tag: int, synchronous: bool) -> None:
        if synchronous and dest != self.rank:
            self._as("Send", lambda: self.isend(buf, dest, tag, True).wait())
            return
        self.check(self._label or "Send", dest)
        try:
            super().send(buf, dest, tag, synchronous)  # an eager send: never blocks
        except RuntimeError as error:  # an earlier eager send failed
            raise self.broken(self._label or "Send", error) from None

    def recv(self, buf: Any, source: int, tag: int) -> tuple[int, int]:
        return self._as("Recv", super().recv, buf, source, tag)  # type: ignore[no-any-return]

    def sendrecv(self, sendbuf: Any, dest: int, sendtag: int, recvbuf: Any, source: int,
                 recvtag: int) -> tuple[int, int]:
        return self._as("Sendrecv", super().sendrecv, sendbuf, dest, sendtag,  # type: ignore[no-any-return]
                        recvbuf, source, recvtag)

    def isend(self, buf: Any, dest: int, tag: int, synchronous: bool = True) -> Any:
        return self._started("Isend", dest, super().isend, buf, dest, tag, synchronous)

    def irecv(self, buf: Any, source: int, tag: int, cancellable: bool = False) -> Any:
        return self._started("Irecv", source, super().irecv, buf, source, tag, cancellable)

    def _started(self, call: str, peer: int | None, start: Callable[..., Any], *args: Any) -> Any:
        """The request ``start(*args)`` makes, watched; gloo may refuse to start it on a broken
        connection (or report an earlier buffered send's failure), which is a failure too."""
        self.check(self._label or call, peer)
        try:
            request = start(*args)
        except RuntimeError as error:
            raise self.broken(self._label or call, error) from None
        return self._watched(request, call, peer)

    # -- groups ------------------------------------------------------------------------------

    def split(self, color: int, key: int) -> GlooEngine | None:
        return self._as("Split", super().split, color, key)  # type: ignore[no-any-return]

    def create_group(self, ranks: list[int], tag: int) -> GlooEngine:
        return self._as("Create_group", super().create_group, ranks, tag)  # type: ignore[no-any-return]

    def close(self) -> None:
        # No closing barrier: some members may be dead. Buffered sends get their time to go.
        if self._is_world and not self._closed:
            self._closed = True
            _EAGER.drain(2.0)

    # -- ULFM's calls ------------------------------------------------------------------------

    def revoke(self) -> None:
        self._revoked_here = True
        publish(self._life.client, self._life.attempt, "revoked", self.path)

    def is_revoked(self) -> bool:
        return self._revoked_here or self.path in self._life.watch.revoked

    def failed(self) -> list[int]:
        """The ranks of this group known dead (the supervisor's notices)."""
        dead = self._life.watch.dead
        return [r for r, w in enumerate(self.world_ranks) if w in dead]

    def ack_failed(self) -> int:
        dead = self._life.watch.dead
        self._acked = frozenset(w for w in self.world_ranks if w in dead)
        return len(self._acked)

    def agree(self, flag: int) -> int:
        self._agreements += 1
        mine = f"{int(flag)} {','.join(map(str, sorted(self._acked)))}"

        def decide(parts: dict[int, str]) -> str:
            value, unacknowledged = -1, False
            failed = {w for w in self.world_ranks if w in self._life.watch.dead}
            for part in parts.values():
                flag_text, acked = part.split(" ", 1)
                value &= int(flag_text)
                unacknowledged |= bool(failed - {int(w) for w in acked.split(",") if w})
            return f"{value} {int(unacknowledged)}"

        value, unacknowledged = self._meet(f"agree/{self.path}/{self._agreements - 1}", mine,
                                           decide).split()
        if int(unacknowledged):
            raise self._peer_failed("Agree")
        return int(value)

    def shrink(self) -> GlooEngine:
        """The survivors of this group, renumbered in their order here (collective over them)."""
        self._shrinks += 1
        n = self._shrinks - 1

        def decide(parts: dict[int, str]) -> str:
            return ",".join(str(w) for w in self.world_ranks if w in parts)

        members = [int(w) for w in self._meet(f"shrink/{self.path}/{n}", "in", decide).split(",")]
        return self._group_of([self.world_ranks.index(w) for w in members], f"{self.path}/s{n}")

    def admit(self) -> GlooEngine:
        """This group's members and the ranks waiting to join, in that order (collective over
        the members); this group itself when no one waits."""
        self._admissions += 1
        n = self._admissions - 1
        keys = self._life.keys

        def decide(parts: dict[int, str]) -> str:
            if any(w in self._life.watch.dead for w in self.world_ranks):
                return "a member failed"
            return ",".join(map(str, admission.waiting(keys, lambda: self._life.watch.dead)))

        decision = self._meet(f"admit/{self.path}/{n}", "in", decide)
        if decision == "a member failed":
            raise self._peer_failed("Admit")
        newcomers = [int(w) for w in decision.split(",") if w]
        if not newcomers:
            return self
        members, path = self.world_ranks + newcomers, f"{self.path}/j{n}"
        admission.admit(keys, newcomers, path, members)
        group = meet_group(path, self.rank, len(members), self._timeout)
        return self._made(group, self.rank, members, path)

    def _meet(self, base: str, mine: str, decide: Callable[[dict[int, str]], str]) -> str:
        """This rank's part of an agreement of the live members, and the decision (see the
        module docstring)."""
        keys, me = self._life.keys, self.world_ranks[self.rank]
        keys.set(f"{base}/part/{me}", mine)
        decision = f"{base}/decision"
        pause = 1e-4
        while not keys.check([decision]):
            live = [w for w in self.world_ranks if w not in self._life.watch.dead]
            if keys.check([f"{base}/part/{w}" for w in live]):
                parts = {w: keys.get(f"{base}/part/{w}").decode() for w in live}
                return str(keys.compare_set(decision, "", decide(parts)).decode())
            time.sleep(pause)
            pause = min(2 * pause, 5e-3)
        return str(keys.get(decision).decode())


# The nonblocking collectives, watched as one call of the group each; their blocking forms wait
# on them (engines/gloo.py), named after the blocking call.
_COLLECTIVES = {"ibarrier": "Barrier", "ibcast": "Bcast", "ireduce": "Reduce",
                "iallreduce": "Allreduce", "ireduce_scatter": "Reduce_scatter",
                "iallgather": "Allgather", "igather": "Gather", "iscatter": "Scatter",
                "iallgatherv": "Allgatherv", "ialltoall": "Alltoall", "ialltoallv": "Alltoallv"}


def _watched_nonblocking(name: str, call: str) -> Callable[..., Any]:
    started = getattr(GlooEngine, name)

    def nonblocking(self: SurvivingGlooEngine, *args: Any) -> Any:
        return self._started(call, None, started, self, *args)

    return nonblocking


def _named_blocking(name: str, call: str) -> Callable[..., Any]:
    waited = getattr(GlooEngine, name)

    def blocking(self: SurvivingGlooEngine, *args: Any) -> Any:
        return self._as(call, waited, self, *args)

    return blocking


for _name, _call in _COLLECTIVES.items():
    setattr(SurvivingGlooEngine, _name, _watched_nonblocking(_name, "I" + _call.lower()))
    setattr(SurvivingGlooEngine, _name[1:], _named_blocking(_name[1:], _call))
SurvivingGlooEngine.ireduce_scatter_block = _watched_nonblocking(  # type: ignore[method-assign]
    "ireduce_scatter_block", "Ireduce_scatter_block")


class _Watched:
    """A request of a surviving gloo engine: each poll looks at the failure notices first."""

    def __init__(self, inner: Any, engine: SurvivingGlooEngine, call: str, peer: int | None) -> None:
        self._inner, self._engine, self._call, self._peer = inner, engine, call, peer

    def test(self) -> bool:
        self._engine.check(self._call, self._peer)
        try:
            return bool(self._inner.test())
        except RuntimeError as error:
            raise self._engine.broken(self._call, error) from None

    def wait(self) -> tuple[int, int]:
        pause = 20e-6
        while not self.test():
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)
        return self._inner.wait()  # type: ignore[no-any-return]

    def cancel(self) -> bool:
        return bool(self._inner.cancel())
