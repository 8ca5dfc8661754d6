"""Ranks that join a running job (a ``join`` fault's, or a dead rank started again alone:
``restart = "rank"``), and the survivors' ``comm.Admit()`` that lets them in. On gloo the
supervisor starts each newcomer, and the rendezvous is on the launch's store under the attempt's
keys (engines/notices.py):

1. The supervisor announces each newcomer as it starts it (``newcomers/<k>``, then the count),
   and the newcomer takes a place in the *lobby* (``lobby/<n>``, numbered with the store's atomic
   ``add``), shows "Admit" in its slot, and waits.
2. The members of a communicator call ``Admit()`` together, at a step boundary (the membership
   barrier): they meet as Agree and Shrink do (engines/surviving_gloo.py), and the decision is
   the lobby's newcomers not admitted yet, by their world rank (or that a member is dead,
   which makes Admit raise PeerFailed at every member, as a collective would). The decider first
   waits until every announced newcomer is in the lobby (or admitted, or dead), so a newcomer
   started when a rank reached a join's step, or a dead rank started again, enters at the next
   Admit however slowly its process starts.
3. Each member marks every newcomer of the decision admitted (``admitted/<world rank>``: the new
   group's path and its members: the old ones in their order, then the newcomers by world rank,
   whatever order they arrived in), and all of
   them, newcomers included, meet in a ``ProcessGroupGloo`` under that path, as torchrun's elastic
   agent re-forms a group over its store. Ranks are renumbered in that order.

On MPI a running job gains processes only by spawning them itself: the supervisor announces each
newcomer (step 1) and starts nothing, and the members' Admit spawns the announced ones not
admitted yet (``MPI_Comm_spawn`` of the rank's worker, root rank 0, then ``Intercomm_merge``:
engines/surviving.py), in the same order, with the same renumbering.
"""

from __future__ import annotations

import time
from typing import Any, Callable

WAIT_EVERY_S = 0.01  # how often a newcomer in the lobby looks whether it was admitted


def enter_lobby(keys: Any, world_rank: int) -> None:
    """A newcomer's place in the lobby, after those that came before it."""
    number = int(keys.add("lobby/count", 1)) - 1
    keys.set(f"lobby/{number}", str(world_rank))


def announce(store: Any, keys_prefix: str, number: int, world_rank: int,
             restarted: int | None) -> None:
    """The supervisor's: the ``number``-th newcomer of the attempt is ``world_rank`` (in the place
    of dead rank ``restarted``, if it is one), written before the count, and by the supervisor
    alone, so a reader of the count finds every one."""
    value = str(world_rank) if restarted is None else f"{world_rank}:{restarted}"
    store.set(f"{keys_prefix}newcomers/{number}", value)
    store.set(f"{keys_prefix}newcomers/count", str(number + 1))


def announced(keys: Any) -> list[tuple[int, int | None]]:
    """Every newcomer announced so far: (its world rank, the dead rank it replaces or None)."""
    count = int(keys.get("newcomers/count")) if keys.check(["newcomers/count"]) else 0
    found = []
    for number in range(count):
        rank, _, restarted = keys.get(f"newcomers/{number}").decode().partition(":")
        found.append((int(rank), int(restarted) if restarted else None))
    return found


def pending(keys: Any) -> list[tuple[int, int | None]]:
    """The announced newcomers not admitted yet (on MPI, not spawned yet), in order."""
    return [(rank, was) for rank, was in announced(keys) if not keys.check([f"admitted/{rank}"])]


def waiting(keys: Any, dead: Callable[[], frozenset[int]]) -> list[int]:
    """The world ranks in the lobby not admitted yet, in order, once every
    newcomer announced so far is there, admitted or dead (``dead()``: the world ranks known dead,
    read afresh on each look)."""
    expected = {rank for rank, _ in announced(keys)}
    while True:
        found, arrived = [], set()
        for number in range(int(keys.add("lobby/count", 0))):
            key = f"lobby/{number}"
            if keys.check([key]):  # one between its add and its set is there at the next look
                rank = int(keys.get(key))
                arrived.add(rank)
                if not keys.check([f"admitted/{rank}"]):
                    found.append(rank)
        if expected <= arrived | dead():
            return sorted(found)
        time.sleep(WAIT_EVERY_S)


def admit(keys: Any, newcomers: list[int], path: str, members: list[int]) -> None:
    """Marks each newcomer admitted into the group ``path`` of ``members`` (every member writes the
    same: the first write is enough, the others change nothing)."""
    ticket = f"{path}\n{','.join(map(str, members))}"
    for rank in newcomers:
        keys.set(f"admitted/{rank}", ticket)


def wait_admission(keys: Any, world_rank: int, waiting_shown: Callable[[], None]) -> tuple[str, list[int]]:
    """A newcomer's wait in the lobby: the path of the group it was admitted into, and its
    members' world ranks."""
    enter_lobby(keys, world_rank)
    waiting_shown()
    key = f"admitted/{world_rank}"
    while not keys.check([key]):
        time.sleep(WAIT_EVERY_S)
    path, members = keys.get(key).decode().split("\n")
    return path, [int(w) for w in members.split(",")]
