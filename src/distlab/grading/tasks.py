"""Tasks that carry their cases, and runs read back case by case.

A check hands the ranks *cases* (a problem's own dataclasses, from its ``cases.py``) and reads the
results back with the case they belong to; it never unpacks argument tuples or finds a task by
its label::

    run = t.launch(programs.run_cases, [Task(ranks=4, cases=batch), Task(ranks=8, case=timed)])
    for result in run.cases():          # one CaseRun per case, in order
        result.case, result.values      # the case, and what each rank returned for it
    for result in run.cases(Timed):     # only the cases of one type

``Task(ranks, case=c)`` runs ``program(comm, solution, c)`` and each rank returns one value;
``Task(ranks, cases=[c1, c2])`` runs ``program(comm, solution, [c1, c2])`` in one go (one
sub-communicator, one set of processes for many cases) and each rank returns a list with one
value per case.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, NoReturn, Sequence, TypeVar, overload

from .. import runs
from ..platforms import Platform
from ..runtime.comm.sent import SentLog
from ..runtime.faults.plans import FaultPlan
from ..runtime.jobspec import Task as RankTask
from ..runtime.supervisor import LaunchResult
from .failures import CheckFailed, RunFailed
from .held import HeldMemory, held_with_in_flight
from .views import Counts, Timeline, phases_of

C = TypeVar("C")


@dataclass(frozen=True)
class Task:
    """One run of a program on the first ``ranks`` ranks of the launch."""

    ranks: int
    case: Any = None
    cases: Sequence[Any] | None = None  # several cases in one go: the program gets the list
    faults: FaultPlan | None = None  # this task's own fault plan (faults.py builds one)
    platform: Platform | None = None  # this task's own cluster (a hidden variant)
    label: str = ""  # how a failure names the task: "while running <label>"
    store: bool = False  # comm.store(): a key-value store of the task's own
    # A killed rank does not end the task: the others get distlab.PeerFailed and can Shrink
    # their communicator and go on (MPI or gloo; the task runs in a launch of its own).
    survivors: bool = False
    # With survivors: the ranks the task cannot lose (its coordinator); a fault plan that kills
    # or reclaims one is refused before any process starts.
    needed_ranks: tuple[int, ...] = ()
    # Every rank keeps a copy of each buffer it sends, read back with ``TaskRun.sent(rank)``:
    # evidence of what travelled, where the counters only tell how much.
    record_sent: bool = False
    # The names of the marks the rank program sets. Given, the phases that counts() and phases()
    # read begin and end only at marks of these names: a mark the learner's code sets for its own
    # trace (or to cut a phase short and hide what follows) cuts nothing.
    marks: tuple[str, ...] = ()
    # Each rank's agent reads what the learner's processes hold in memory, from /proc, at every
    # mark and once before the learner's file is imported: ``TaskRun.memory(rank)``.
    memory: bool = False
    # From each mark named here to the next, the agent samples that memory every few milliseconds
    # (a reading at a mark alone is taken when the learner's code calls it): HeldMemory.peak_to.
    memory_sampled: tuple[str, ...] = ()

    def for_ranks(self) -> RankTask:
        args = (list(self.cases),) if self.cases is not None else (self.case,)
        return RankTask(ranks=self.ranks, args=args, faults=self.faults, label=self.label,
                        platform=self.platform, store=self.store, survivors=self.survivors,
                        needed_ranks=tuple(self.needed_ranks), record_sent=self.record_sent,
                        memory=self.memory, memory_sampled=tuple(self.memory_sampled),
                        memory_named=tuple(self.marks))


@dataclass
class TaskRun(runs.TaskRun):
    """One task of a launch, with the task as the check wrote it (``spec``)."""

    spec: Task = field(default_factory=lambda: Task(0))
    _timeline: Timeline | None = None
    # (rank, phase) -> its phases' counts: checks read them case by case (03 reads the nth of 30
    # for each case and rank), and each reading would otherwise cut every phase again.
    _phases: dict[tuple[int, str], tuple[Counts, ...]] = field(default_factory=dict, init=False, repr=False,
                                                                compare=False)

    @property
    def case(self) -> Any:
        return self.spec.case

    def counts(self, rank: int, phase: str | None = None, nth: int = 0) -> Counts:
        """The rank's calls and bytes over the task, or over the ``nth`` phase that starts at a
        ``comm.mark(phase)`` (and ends at the rank's next mark, of a name in ``Task.marks`` if
        the task lists them, or the task's end)."""
        if phase is None:
            return Counts.of(self.outcomes[rank].stats)
        found = self.phases(rank, phase)
        if nth >= len(found):
            raise KeyError(f"rank {rank} set {len(found)} mark(s) {phase!r}; no phase #{nth}")
        return found[nth]

    def cpus(self, rank: int) -> tuple[int, ...]:
        """The CPUs rank ``rank``'s solution process may run on at the task's end, read from the
        kernel by the harness (the affinity the learner's code applied, whatever it says)."""
        return self.outcomes[rank].cpus

    def sent(self, rank: int) -> SentLog:
        """Everything rank ``rank`` sent in this task, in order, as its agent copied it when each
        call started (``Sent``: the call, the destination or COLLECTIVE, the values, how many marks
        came before); ``overflowed`` when it sent more than the log keeps. The task must have
        asked: ``Task(record_sent=True)``."""
        log = self.outcomes[rank].sent
        if log is None:
            raise ValueError(f"task {self.spec.label or '?'} did not record what its ranks sent: "
                             "give it Task(record_sent=True)")
        return log

    def memory(self, rank: int) -> HeldMemory:
        """What rank ``rank``'s learner processes held, in bytes, read from /proc by its agent
        (runtime/rank/memory.py): before the learner's file was imported and at each mark, with
        what it had sent that its peers had not received by the same mark (held.py). The task
        must have asked: ``Task(memory=True)``; sealed, the learner's code cannot touch it."""
        if not self.outcomes[rank].memory:
            raise ValueError(f"task {self.spec.label or '?'} did not read its ranks' memory: "
                             "give it Task(memory=True)")
        return held_with_in_flight(self.outcomes, rank)

    def marks_differ(self, want: Sequence[str], who: str = "rank") -> str | None:
        """None if every rank set exactly ``want`` of the marks named in ``Task(marks=...)``, in
        that order; else what the first rank that did not set differs in: one name set more or
        fewer times ("<label>: rank 1 set 3 marks 'x' where the program sets 2"), or the first
        mark out of order. The learner's code can call comm.mark with a harness's name, which
        would cut a phase short; marks of other names are its own and cut nothing. ``who`` names
        a rank in the message ("stage" in a pipeline)."""
        names, want = set(self.spec.marks), list(want)
        for rank in range(self.spec.ranks):
            got = [name for name, _ in self.outcomes[rank].marks if name in names]
            if got == want:
                continue
            head = f"{self.spec.label}: {who} {rank}"
            name = next((n for n in sorted(names) if got.count(n) != want.count(n)), None)
            if name is not None:
                return f"{head} set {got.count(name)} marks {name!r} where the program sets {want.count(name)}"
            j = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
            return f"{head}'s mark #{j} is {got[j]!r} where the program sets {want[j]!r}"
        return None

    def phases(self, rank: int, phase: str) -> list[Counts]:
        """The rank's counts in every phase named ``phase``, in order (computed once). Where the
        task names the program's marks (``Task(marks=...)``), a rank that communicated before
        the first of them fails the check that reads its phases: ``before_marks``."""
        key = (rank, phase)
        if key not in self._phases:
            if self.spec.marks and (early := self.before_marks(rank)).calls:
                raise CheckFailed(
                    f"{self.spec.label}: rank {rank} called {_calls_text(early)} before the program's "
                    f"first mark {self.spec.marks[0]!r}, where the program calls nothing: the marks were "
                    "moved (comm.mark is the harness's, even in your process), so the phases the "
                    "checks read cannot be trusted")
            self._phases[key] = tuple(phases_of(self, rank, phase))
        return list(self._phases[key])

    def before_marks(self, rank: int) -> Counts:
        """What the rank did before its first mark of a name in ``Task(marks=...)``: a span the
        program leaves empty (it marks before its first call), so calls there were moved out of
        the phases by code that sets or drops the harness's marks itself. With no such mark,
        the whole task."""
        outcome = self.outcomes[rank]
        first = next((stats for name, stats in outcome.marks if name in self.spec.marks), outcome.stats)
        return Counts.of(first)

    def wall_s(self) -> float:
        """The slowest rank's wall seconds in this task (its program, start to end)."""
        return max((o.wall_s for o in self.outcomes), default=0.0)

    def timeline(self) -> Timeline:
        """The task on the virtual clock of its platform (computed once)."""
        if self._timeline is None:
            self._timeline = Timeline(self)
        return self._timeline


@dataclass(frozen=True)
class CaseRun(Generic[C]):
    """One case and what every rank returned for it; ``task`` holds the counters, the trace and
    the replay of the task it ran in (shared with the other cases of a ``cases=`` batch)."""

    case: C
    values: list[Any]  # rank -> its program's value for this case
    task: TaskRun

    @property
    def ranks(self) -> int:
        return self.task.spec.ranks


class FailedTask:
    """A task that did not finish while the launch's other tasks did (see ``CheckContext.launch``):
    reading it raises its failure, for the first reader with the whole story."""

    def __init__(self, spec: Task, failure: LaunchResult, run: Run) -> None:
        self.spec, self._failure, self._run = spec, failure, run

    def fail(self) -> NoReturn:
        first = self not in self._run.reported
        self._run.reported.append(self)
        raise RunFailed(self._failure, first_report=first)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends probe for these: not a read
            raise AttributeError(name)
        self.fail()


@dataclass
class Run(runs.Run):
    """A launch whose tasks came from ``Task``s: read it task by task or case by case.

    When one task failed and the others finished, ``tasks`` holds a ``FailedTask`` in its place
    (``result`` is then the failure): reading the others grades them, reading it fails."""

    tasks: list[TaskRun] = field(default_factory=list)  # type: ignore[assignment]
    reported: list[FailedTask] = field(default_factory=list)  # failed tasks already told of

    @overload
    def cases(self) -> list[CaseRun[Any]]: ...
    @overload
    def cases(self, kind: type[C]) -> list[CaseRun[C]]: ...

    def cases(self, kind: type[Any] = object) -> list[CaseRun[Any]]:
        """Every case of every task in launch order, or only those of the type ``kind``."""
        found: list[CaseRun[Any]] = []
        for task_run in self.tasks:
            spec = task_run.spec
            if isinstance(task_run, FailedTask):
                if any(isinstance(c, kind) for c in (spec.cases if spec.cases is not None else [spec.case])):
                    task_run.fail()
                continue
            if spec.cases is None:
                if isinstance(spec.case, kind):
                    found.append(CaseRun(spec.case, task_run.values, task_run))
                continue
            if any(isinstance(c, kind) for c in spec.cases):
                _one_value_per_case(task_run)
            for i, case in enumerate(spec.cases):
                if isinstance(case, kind):
                    found.append(CaseRun(case, [value[i] for value in task_run.values], task_run))
        return found

    def task_of(self, case: object) -> TaskRun:
        """The task that ran ``case``."""
        for task_run in self.tasks:
            spec = task_run.spec
            if spec.case is case or (spec.cases is not None and any(c is case for c in spec.cases)):
                if isinstance(task_run, FailedTask):
                    task_run.fail()
                return task_run
        raise KeyError(f"no task of this run ran {case!r}")


def _one_value_per_case(task_run: TaskRun) -> None:
    """A task of several cases hands back, on every rank, a list of one value per case: the rank
    program runs in the solution's process (sealed too), so what it returns is the solution's to
    change, and a short list crashed the checks that read it (an outside tester's, on 13 and 14)."""
    spec = task_run.spec
    assert spec.cases is not None
    for rank, value in enumerate(task_run.values):
        if not isinstance(value, (list, tuple)) or len(value) != len(spec.cases):
            got = f"{len(value)} values" if isinstance(value, (list, tuple)) else f"a {type(value).__name__}"
            raise CheckFailed(f"{spec.label or 'a task'}: rank {rank}'s program handed back {got} for "
                              f"{len(spec.cases)} cases, one value per case expected")


def typed(done: runs.Run, tasks: Sequence[Task]) -> Run:
    """The front door's run, with each task run knowing the ``Task`` it came from."""
    return Run(done.result, [
        TaskRun(r.task, r.outcomes, r.platform, spec=spec) for r, spec in zip(done.tasks, tasks)
    ])


def partial(finished: dict[int, TaskRun], failed: dict[int, LaunchResult], tasks: Sequence[Task]) -> Run:
    """A run of ``tasks`` where those in ``failed`` did not finish and the others did (each in
    ``finished``, by its index in ``tasks``); its ``result`` is the first failure."""
    first = failed[min(failed)]
    out = Run(first)
    out.tasks = [finished[i] if i in finished else FailedTask(spec, failed[i], out)  # type: ignore[misc]
                 for i, spec in enumerate(tasks)]
    return out


def _calls_text(counts: Counts) -> str:
    return ", ".join(f"{name} x{n}" if n > 1 else name for name, n in sorted(counts.calls.items()))
