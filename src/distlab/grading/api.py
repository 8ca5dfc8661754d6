"""The public API of check.py files.

A problem's checks are plain functions in the supervisor process, declared in order; the runs
they judge are declared once, next to them, and shared like test fixtures::

    CHECKS = Checklist()

    @CHECKS.run
    def every_case(t: CheckContext) -> Run:
        return t.launch(programs.run_cases, [Task(ranks=p, cases=cases.for_ranks(p)) for p in P])

    @CHECKS.check("results equal the built-in Allreduce", points=3)
    def results_match(t: CheckContext, every_case: Run) -> None:
        for result in every_case.cases():
            ...

A check names the runs it reads as parameters; each declared run is made once per session, by
the first check that asks for it (with that check's ``t``), and handed to every later one; a run
that failed fails each of them, the first with the whole story (and when only one of its tasks
failed, only the checks that read that task). ``t.launch`` starts real ranks
running a *program* (a function of the problem's programs.py, run on every rank as
``program(comm, solution, case)``) through the front door (distlab/runs.py); expected values are
computed here, outside the processes that run learner code.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NoReturn, Protocol

import numpy as np

from .. import runs
from ..errors import CardError
from ..platforms import Platform
from ..runs import Program, RunOptions, collective_time, run
from ..runtime.comm.stats import COLLECTIVES
from ..runtime.jobspec import is_problem_module
from ..runtime.supervisor import LaunchResult
from ..runtime.supervisor.mpi_monitoring import Unexplained, unexplained
from .failures import CheckFailed, RunFailed
from .tasks import Run, Task, TaskRun, partial, typed

CheckFn = Callable[["CheckContext"], None]


@dataclass(frozen=True)
class CheckSpec:
    title: str
    points: int
    fn: CheckFn


class Checklist:
    """The ordered checks of one problem, and the runs they share."""

    def __init__(self) -> None:
        self.checks: list[CheckSpec] = []
        self.runs: dict[str, Callable[..., Any]] = {}

    def check(self, title: str, points: int = 1) -> Callable[[CheckFn], CheckFn]:
        def register(fn: CheckFn) -> CheckFn:
            self.checks.append(CheckSpec(title, points, fn))
            return fn

        return register

    def run(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Declares a run (or any value made from runs) that checks read by naming it as a
        parameter: made once per session, on first use."""
        self.runs[fn.__name__] = fn
        return fn

    def wanted(self, fn: Callable[..., Any]) -> list[str]:
        """The declared runs ``fn`` names after its first parameter (the check's ``t``)."""
        return list(inspect.signature(fn).parameters)[1:]

    def undeclared(self) -> list[str]:
        """'check_name: name' for each parameter of a check or a run that no run declares."""
        return [f"{fn.__name__}: {name}"
                for fn in [spec.fn for spec in self.checks] + list(self.runs.values())
                for name in self.wanted(fn) if name not in self.runs]

    def call(self, fn: Callable[..., Any], t: "CheckContext") -> Any:
        """Calls a check (or a run) with the declared runs it names."""
        return fn(t, **{name: t._session.declared(name, self, t) for name in self.wanted(fn)})


class Narrator(Protocol):
    def say(self, text: str) -> None: ...


@dataclass
class SessionTotals:
    """Figures over every launch of a checking session, for the footer."""

    virtual_s: float | None = None  # the headline performance figure a check reported
    bound_s: float | None = None
    summary: dict[str, Any] | None = None  # the metrics of the run behind that figure
    launches: int = 0
    max_ranks: int = 0
    min_ranks: int = 0
    messages: int = 0
    bytes: int = 0

    def add(self, run: LaunchResult, tasks: list[TaskRun]) -> None:
        self.launches += 1
        self.max_ranks = max(self.max_ranks, run.world_size)
        self.min_ranks = min(self.min_ranks or run.world_size, run.world_size)
        for task in tasks:
            for stats in task.stats:
                # Point-to-point messages, plus each built-in collective call and its buffer.
                collectives = [op for op in stats.calls if op in COLLECTIVES]
                self.messages += stats.messages_sent + sum(stats.calls[op] for op in collectives)
                self.bytes += stats.bytes_sent + sum(stats.op_bytes[op] for op in collectives)


@dataclass
class Session:
    """State shared by the checks of one ``distlab check``: options, the declared runs, totals."""

    solution_file: Path
    seed: int
    narrator: Narrator
    options: RunOptions  # backend, platform, clock, fault plan, deadline, limits, monitoring
    card_platform: str = ""  # the platform the card's analytic bounds are written for
    # Exam grading (options.mpi_monitoring): what MPI carried that the proxy did not, summed.
    below_proxy: Unexplained = field(default_factory=Unexplained)
    totals: SessionTotals = field(default_factory=SessionTotals)
    made: dict[str, Any] = field(default_factory=dict)  # declared runs made so far (or their error)

    def declared(self, name: str, checklist: Checklist, t: "CheckContext") -> Any:
        """The declared run ``name``, made on first use with the asking check's context."""
        if name not in self.made:
            try:
                self.made[name] = checklist.call(checklist.runs[name], t)
            except CheckFailed as exc:  # a RunFailed too: the first reader tells its story
                self.made[name] = exc
                raise
        made = self.made[name]
        if isinstance(made, RunFailed):
            raise RunFailed(made.result, first_report=False)
        if isinstance(made, CheckFailed):
            raise CheckFailed(str(made))
        return made


class CheckContext:
    """Handed to each check function."""

    def __init__(self, session: Session, index: int) -> None:
        self._session = session
        self.seed = session.seed
        self.rng = np.random.default_rng([session.seed, index])
        self.backend = session.options.backend
        self.platform = session.options.platform
        self.metrics: dict[str, Any] = {}

    def say(self, text: str) -> None:
        """Narrates one step of the check for the learner."""
        self._session.narrator.say(text)

    def metric(self, name: str, value: Any) -> None:
        """Records a figure in the results JSON."""
        self.metrics[name] = value

    @property
    def clock(self) -> str:
        return self._session.options.clock

    @property
    def on_card_setting(self) -> bool:
        """The card's own platform and no fault plan of the learner's (``--platform``,
        ``--faults``): the setting a card's closed-form bounds are written for."""
        session = self._session
        return session.options.platform.name == session.card_platform and session.options.faults is None

    @property
    def sealed(self) -> bool:
        """The learner's code runs in a process of its own per rank (``--seal on``), apart from the
        engine: a probe that the engine's threads would upset (tracemalloc beside gloo's) may run."""
        return self._session.options.seal

    @property
    def learner_faults(self) -> bool:
        """A fault plan given with ``--faults`` is in force in every run."""
        return self._session.options.faults is not None

    def collective_time(self, op: str, ranks: int, nbytes: int) -> float:
        """The built-in ``op``'s standard algorithm replayed on this check's platform (see
        runs.collective_time): a bound that counts the links the platform shares."""
        return collective_time(self.platform, op, ranks, nbytes)

    def measured_time(self, task_run: runs.TaskRun) -> float:
        """The time a performance check grades: the replay's makespan on the virtual clock, or
        the slowest rank's wall time of the task under ``--clock wall``."""
        if self.clock == "wall":
            return task_run.wall_span()
        return task_run.replay().makespan

    def performance(self, measured_s: float, bound_s: float, task_run: runs.TaskRun | None = None) -> None:
        """Records the headline figure against its analytic bound (and the run's metrics)."""
        self.metric("measured_s", measured_s)
        self.metric("bound_s", bound_s)
        self.metric("clock", self.clock)
        totals = self._session.totals
        totals.virtual_s, totals.bound_s = measured_s, bound_s
        if task_run is not None:
            totals.summary = task_run.metrics().to_dict()

    def expect(self, condition: bool, expected: str, seen: str) -> None:
        if not condition:
            raise CheckFailed(f"expected {expected}; saw {seen}")

    def fail(self, message: str) -> NoReturn:
        raise CheckFailed(message)

    def launch(
        self,
        program: Callable[..., Any],
        tasks: list[Task],
        deadline_s: float | None = None,
        stall_s: float = 3.0,
        online_clock: bool = False,
        platform: Platform | None = None,
    ) -> Run:
        """Runs ``program`` on real ranks, one task after another; raises RunFailed if it ends badly.

        One failing task loses only its own checks: when a task fails (an exception, a deadlock,
        a crash; not a timeout, which would cost the deadline again) the other tasks run again
        in one more launch, and the run comes back with that task failed and the others graded
        (``tasks.FailedTask``). Only when nothing finished does the launch raise.

        ``online_clock``: keep each rank's virtual clock during the run, for programs that read
        ``comm.now()`` (always on under a fault plan); the graded time is the replay either way.
        ``platform``: model another platform than the session's for this launch (a hidden
        variant, or a scenario's own cluster); ``Task(platform=...)`` does it for one task."""
        first = self._launch(program, tasks, deadline_s, stall_s, online_clock, platform)
        failed_at = first.result.failing_task
        if first.ok or len(tasks) == 1 or failed_at is None or first.result.status == "timeout":
            if not first.ok:
                raise RunFailed(first.result, first_report=True)
            return first
        others = [i for i in range(len(tasks)) if i != failed_at]
        again = self._launch(program, [tasks[i] for i in others], deadline_s, stall_s, online_clock, platform)
        if not again.ok:  # more than one task fails: the first failure tells the story, as one run
            raise RunFailed(first.result, first_report=True)
        finished = dict(zip(others, again.tasks))
        return partial(finished, {failed_at: first.result}, tasks)

    def _launch(self, program: Callable[..., Any], tasks: list[Task], deadline_s: float | None,
                stall_s: float, online_clock: bool, platform: Platform | None) -> Run:
        s = self._session
        done = run(_program_of(program, s.solution_file), [task.for_ranks() for task in tasks],
                   s.options, platform=platform or s.options.platform, online_clock=online_clock,
                   deadline_s=deadline_s, stall_s=stall_s)
        result = done.result
        if not result.ok:
            s.totals.launches += 1
            return Run(result)
        if result.mpi_traffic is not None:
            handed = {rank: outcome.handed for rank, outcome in result.outcomes.items()}
            s.below_proxy.add(unexplained(result.mpi_traffic, handed, result.world_size))
        launched = typed(done, tasks)
        s.totals.add(result, launched.tasks)
        return launched


def _program_of(program: Callable[..., Any], solution: Path) -> Program:
    """Where a rank finds ``program``: a function of a problem package's module, by file and
    module name (the package is registered the same way in every rank)."""
    module = sys.modules[program.__module__]
    if not is_problem_module(program.__module__):
        raise CardError(f"{program.__qualname__} of {program.__module__}: a rank program must be a "
                        "function of the problem's programs.py (docs/problem-format.md)")
    return Program(Path(str(module.__file__)), program.__name__, solution, program.__module__)
