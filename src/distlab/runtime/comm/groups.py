"""Sub-communicators of the learner's ``comm``, as mpi4py makes them: ``Split``, ``Dup``,
``Get_group`` with ``Group.Incl``/``Excl``, ``Create_group`` and ``Free``.

A sub-communicator is a full ``Comm`` (proxy.py) over a sub-group of the engine (engines/base.py:
MPI's own ``Split``/``Create_group``, gloo process groups of the members only), and it shares with
every other communicator of its rank what belongs to the rank rather than to one communicator
(``RankBook``): the state slot the supervisor reads, the trace, the fault plan and its per-peer
send count, the online clock's time and channels, the marks and the training step. Its counters
are its own (``comm.stats`` counts that communicator, as before); the rank's totals, which phases
and grading read, add every communicator's (``RankBook.totals``), so a message counts once
whichever communicator carried it. Ranks in counters, events and the slot are world ranks, and a
communicator's events carry its context number (``context_of``), the same on all its members.

Making a communicator is not charged on the virtual clock: it is set-up, as in the real programs
the problems model, and costs a few messages of the engine's own.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..engines.base import UNDEFINED, Engine
from .sent import SentLog
from .stats import CommStats

if TYPE_CHECKING:  # the learner's client (runtime/seal/client.py) uses Group, not the clock
    from ..clock.online import Timekeeper
    from .proxy import Comm


def context_of(path: str) -> int:
    """The context number of a sub-communicator whose engine group has this path: the same on
    every member, and (48 bits of a hash) different from every other communicator of the job.
    0 is the task's own communicator."""
    number = int.from_bytes(hashlib.blake2b(path.encode(), digest_size=6).digest(), "little")
    return number or 1


class RankBook:
    """What every communicator of one rank shares with the others (see the module docstring)."""

    def __init__(self) -> None:
        self.comms: list[Comm] = []  # the task's communicator first, then each one made, in order
        # (mark name, the rank's counters when it was set): the phases a grader reads, kept here
        # with the counters rather than returned by the rank program, which learner code touches.
        self.marked: list[tuple[str, CommStats]] = []
        self.steps_started = 0
        self.attempts: dict[int, int] = {}  # sends per world destination, lost ones included
        self.store_link: Any = None  # where the task's store is (store.py), if it has one
        self.store: Any = None  # the rank's handle on it, made at the first comm.store()
        # Mark names a process fault kills or stops this rank at (faults/decide.py's order).
        self.trigger_marks: tuple[str, ...] = ()
        # A copy of everything the rank sends, on any communicator, where the task asks (sent.py).
        self.sent: SentLog | None = None
        # Where the task asks (Task.memory): what the learner's processes hold, read at each mark
        # (rank/memory.py), and each reading with its mark's name.
        self.memory_probe: Callable[[str], tuple[int, int]] | None = None  # mark -> (held now, peak since)
        self.memory: list[tuple[str, int, int]] = []
        # Bytes the rank sent itself and has not received yet: sealed, they wait in the agent (in
        # MPI's queue or gloo's mailbox), out of the learner's processes, so the memory probe adds
        # them (an outside tester parked 24 MB of optimizer state between steps so).
        self.parked = 0
        self.park_limit = 1 << 62  # half the rank's memory limit, where the job sets one (rank/worker.py)

    def park(self, nbytes: int) -> None:
        """Counts a message the rank sends itself as it is posted, refusing one that would leave
        more unreceived than ``park_limit``: sealed, such messages wait in the agent, whose memory
        is not the learner's to fill (an outside tester's 48 sends of 64 MiB to itself took an agent
        to 3.3 GB). A receive from itself takes its bytes off again."""
        if self.parked + nbytes > self.park_limit:
            raise MemoryError(
                f"the messages this rank sent itself and has not received would hold "
                f"{(self.parked + nbytes) >> 20} MiB, more than half its memory limit "
                f"({self.park_limit >> 20} MiB): receive them before sending more")
        self.parked += nbytes

    def totals(self) -> CommStats:
        """The rank's counters over every communicator: a copy, or the task communicator's own
        counters while it is the only one."""
        if len(self.comms) == 1:
            return self.comms[0].stats.snapshot()
        total = CommStats()
        for comm in self.comms:
            total.merge(comm.stats)
        return total

    def by_communicator(self) -> dict[str, CommStats]:
        """Each sub-communicator's counters, by its engine group's path (empty with none)."""
        return {comm.engine.path: comm.stats for comm in self.comms[1:]}


class Group:
    """A set of ranks in order, as mpi4py's ``MPI.Group`` (``comm.Get_group()``): group rank i
    is world rank ``world[i]``. ``Incl``/``Excl`` make smaller groups; ``Create_group`` turns one
    into a communicator."""

    def __init__(self, world: Sequence[int], me: int, origin: int | None = None) -> None:
        self.world = tuple(world)
        self._me = me  # this rank's world rank
        # Under the seal a group numbers the ranks of the communicator it came from (the
        # learner's client knows no world ranks): that communicator's handle; None here.
        self.origin = origin

    def Get_size(self) -> int:  # noqa: N802
        return len(self.world)

    def Get_rank(self) -> int:  # noqa: N802
        """This rank's rank in the group, or UNDEFINED if it is not a member (as MPI)."""
        return self.world.index(self._me) if self._me in self.world else UNDEFINED

    @property
    def size(self) -> int:
        return len(self.world)

    @property
    def rank(self) -> int:
        return self.Get_rank()

    def Incl(self, ranks: Sequence[int]) -> Group:  # noqa: N802
        """The group of these ranks of this group, in this order."""
        chosen = _group_ranks(ranks, len(self.world), "Incl")
        return Group([self.world[r] for r in chosen], self._me, self.origin)

    def Excl(self, ranks: Sequence[int]) -> Group:  # noqa: N802
        """This group without these ranks, the others in their order."""
        left = set(_group_ranks(ranks, len(self.world), "Excl"))
        return Group([w for r, w in enumerate(self.world) if r not in left], self._me, self.origin)

    def Free(self) -> None:  # noqa: N802
        """Nothing to release: a group is a list of ranks here."""

    def __repr__(self) -> str:
        return f"Group(world ranks {list(self.world)})"


def _group_ranks(ranks: Sequence[int], size: int, what: str) -> list[int]:
    chosen = []
    for r in ranks:
        if type(r) is not int and not hasattr(r, "__index__"):
            raise TypeError(f"{what}: ranks must be ints, got {r!r}")
        r = int(r)
        if not 0 <= r < size:
            raise ValueError(f"{what}: rank {r} is out of range: the group has ranks 0..{size - 1}")
        if r in chosen:
            raise ValueError(f"{what}: rank {r} is listed twice")
        chosen.append(r)
    return chosen


def split_color(color: Any) -> int:
    """A Split's color, checked: an int >= 0, or UNDEFINED (distlab's or mpi4py's)."""
    value = int(color) if type(color) is int or hasattr(color, "__index__") else None
    if value is None:
        raise TypeError(f"Split: the color must be an int, got {color!r}")
    if value < 0 and value != UNDEFINED:
        raise ValueError(f"Split: color {value} is invalid: a color is an int >= 0, or "
                         "distlab.UNDEFINED (MPI.UNDEFINED) on a rank that joins no group")
    return value


class Communicators:
    """Mixed into ``Comm`` (proxy.py): the calls that make and free communicators."""

    _engine: Engine
    _world_ranks: list[int]
    _book: RankBook
    _slot: Any
    _eager_limit: int
    _trace: Any
    _compute_multiplier: float
    _device_flops: float | None
    _clock: Timekeeper | None
    _faults: Any
    _trigger_steps: frozenset[int]
    _timeout_s: float | None

    def _check_broken(self) -> None:
        raise NotImplementedError

    def _derive(self, engine: Engine, clock: Timekeeper | None) -> Comm:
        """A communicator over ``engine`` (a sub-group of this one's) sharing the rank's book."""
        from .proxy import Comm

        ctx = context_of(engine.path)
        self._slot.register(ctx, engine.path, list(engine.world_ranks))
        made = Comm(engine, self._slot, CommStats(), self._eager_limit, self._trace, ctx,
                    self._compute_multiplier, self._device_flops, clock, self._faults,
                    self._trigger_steps, self._book)
        made._timeout_s = self._timeout_s  # it starts with this one's timeout (timed.py)
        return made

    def _clock_split(self, color: int, key: int) -> Timekeeper | None:
        return self._clock.split(color, key) if self._clock is not None else None

    def _clock_create(self, ranks: list[int], tag: int) -> Timekeeper | None:
        return self._clock.create_group(ranks, tag) if self._clock is not None else None

    def Split(self, color: Any = 0, key: Any = 0) -> Comm | None:  # noqa: N802
        """MPI_Comm_split: collective over this communicator; ranks of one color form a new
        communicator, ordered by (key, rank here). A rank whose color is UNDEFINED gets None
        (mpi4py's COMM_NULL)."""
        color, key = split_color(color), int(key)
        self._check_broken()
        sub = self._engine.split(color, key)
        side = self._clock_split(color, key)
        return self._derive(sub, side) if sub is not None else None

    def Dup(self) -> Comm:  # noqa: N802
        """A communicator of the same ranks in the same order, whose messages never match this
        one's (collective over this communicator)."""
        dup = self.Split(0, self._engine.rank)
        assert dup is not None
        return dup

    def Get_group(self) -> Group:  # noqa: N802
        return Group(self._world_ranks, self._world_ranks[self._engine.rank])

    def Create_group(self, group: Group, tag: int = 0) -> Comm:  # noqa: N802
        """MPI_Comm_create_group: a communicator of the group's ranks, in the group's order;
        called by the members of ``group`` only (a subset of this communicator's ranks)."""
        if not isinstance(group, Group):
            raise TypeError(f"Create_group takes a Group (comm.Get_group().Incl(...)), not {group!r}")
        here = {w: r for r, w in enumerate(self._world_ranks)}
        outside = [w for w in group.world if w not in here]
        if outside:
            raise ValueError(f"Create_group: world rank(s) {outside} of the group are not in this "
                             "communicator")
        me = self._world_ranks[self._engine.rank]
        if me not in group.world:
            raise ValueError(f"Create_group: this rank (world rank {me}) is not in the group; only "
                             "the group's members call Create_group")
        ranks = [here[w] for w in group.world]
        sub = self._engine.create_group(ranks, int(tag))
        return self._derive(sub, self._clock_create(ranks, int(tag)))

    def Free(self) -> None:  # noqa: N802
        """Releases a communicator made by Split, Dup or Create_group; its calls raise after."""
        if self is self._book.comms[0]:
            raise ValueError("Free: the task's communicator is the harness's; free only the "
                             "communicators your code made")
        if not isinstance(self._engine, _Freed):
            self._engine.close()
            self._engine = _Freed(self._engine)
            if self._clock is not None:  # its side channel for time stamps goes with it
                self._clock.close()


class _Freed:
    """Stands in for the engine of a freed communicator: every call says so."""

    def __init__(self, engine: Engine) -> None:
        self.rank, self.size, self.path = engine.rank, engine.size, engine.path
        self.world_ranks = engine.world_ranks

    def __getattr__(self, name: str) -> Any:
        raise ValueError(f"this communicator ({self.size} ranks) was freed with Free(); "
                         "make a new one to go on")
