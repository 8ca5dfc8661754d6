"""One front door for runs: ``run(program, tasks, options) -> Run``.

Every command that starts ranks goes through here: a check (grading/api.py), ``distlab run``,
``tune`` and ``report`` (freerun.py), and ``calibrate``. A run is a program (a function of a module
file, run on every rank as ``program(comm, solution, *args)``) over a batch of tasks in one launch;
what comes back is the launch's result and, per task, every rank's return value, counters and
events, with the replay on the virtual clock and its metrics computed on demand.

The options are checked once, here (``run_options``), before anything starts: the backend, the
clock and the deadline (with options.py's messages, the same the commands use), the platform and
the world it must hold, the fault plan. The commands only pass on what the user gave.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from . import options as opts
from .platforms import Platform
from .platforms import resolve as resolve_platform
from .runtime.clock.metrics import RunMetrics, summarize
from .runtime.clock.replay import Replay, ReplayError, replay
from .runtime.comm.stats import CommStats
from .runtime.faults.plans import FaultPlan, load_fault_plan
from .runtime.jobspec import Limits, Task, TaskOutcome, make_job, problem_programs
from .runtime.supervisor import LaunchResult, launch
from .runtime.supervisor.memory import budget as memory_budget
from .runtime.trace.events import COLL, Event


@dataclass(frozen=True)
class Program:
    """What every rank runs: the function ``name`` of ``file`` (imported as ``module``, by default a
    name unique to the file), handed the learner's ``solution`` module when there is one."""

    file: Path
    name: str
    solution: Path | None = None
    module: str | None = None


def problem_program(folder: Path, name: str, solution: Path | None = None) -> Program:
    """The rank program ``name`` of the problem in ``folder`` (its ``main``: the free run)."""
    file, module = problem_programs(folder)
    return Program(file, name, solution, module)


@dataclass(frozen=True)
class RunOptions:
    """How a run is made; build it with ``run_options``, which checks every field."""

    backend: str
    platform: Platform
    clock: str = "virtual"  # "wall": performance is graded on measured time (real clusters)
    faults: FaultPlan | None = None  # for every task (a task's own plan wins)
    deadline_s: float = 60.0
    limits: Limits = Limits()
    # Count what MPI carries below the proxy (Open MPI's monitoring), for exam grading; MPI only.
    mpi_monitoring: bool = False
    # Learner code in a process of its own per rank (runtime/seal/): what check and exam grade.
    seal: bool = False
    private: tuple[str, ...] = ()  # paths sealed learner code must not see (the exam's own state)


def run_options(
    backend: str = "mpi",
    platform: str | Path | Platform | None = None,
    *,
    default_platform: str = "laptop",
    allowed_backends: Sequence[str] = opts.BACKENDS,
    problem: str = "",
    clock: str = "virtual",
    faults: Path | FaultPlan | None = None,
    seed: int | None = None,
    world: int | None = None,
    deadline_s: float | None = None,
    default_deadline_s: float = 60.0,
    limits: Limits = Limits(),
    mpi_monitoring: bool = False,
    seal: bool = False,
    private: tuple[str, ...] = (),
) -> RunOptions:
    """The options of a run, checked: raises UsageError (or the platform's and the fault plan's
    own errors, which name the file and the entry) before any process starts.

    ``allowed_backends``/``problem``: the card's backends, for "problem 03 runs on mpi, not gloo";
    ``world``: the rank count the platform and the plan must hold, when it is known up front."""
    opts.backend(backend, allowed_backends, problem)
    opts.clock(clock)
    deadline_s = opts.time_limit(deadline_s)
    if isinstance(platform, Platform):
        resolved = platform
    else:
        resolved = resolve_platform(str(platform) if platform is not None else default_platform)
    if world is not None:
        resolved.check_world(world)
    plan = load_fault_plan(faults, seed=seed) if isinstance(faults, Path) else faults
    if plan is not None and world is not None:
        plan = plan.validate_for(world)
    return RunOptions(backend, resolved, clock, plan, deadline_s or default_deadline_s, limits,
                      mpi_monitoring and backend == "mpi", seal, private)


@dataclass
class TaskRun:
    """One task of a run: what every rank returned, counted and did."""

    task: Task
    outcomes: list[TaskOutcome]
    platform: Platform
    _replay: Replay | None = None
    newcomers: int = 0  # ranks that joined the task while it ran (a join fault, restart = "rank")

    @property
    def values(self) -> list[Any]:
        return [o.value for o in self.outcomes]

    @property
    def stats(self) -> list[CommStats]:
        return [o.stats for o in self.outcomes]

    @property
    def traces(self) -> dict[int, list[Event]]:
        """Rank -> its events; the task's ranks are the job's first ``task.ranks`` ranks."""
        return {rank: o.trace or [] for rank, o in enumerate(self.outcomes)}

    def replay(self) -> Replay:
        """The task on the virtual clock of its platform (computed once)."""
        if len(self.outcomes) < self.task.ranks:
            # A rank died in a task that lets the others go on (Task(survivors=True)): its events
            # died with it, and the others' collectives with it cannot be lined up.
            raise ReplayError(f"{self.task.ranks - len(self.outcomes)} of the task's "
                              f"{self.task.ranks} ranks died in it, with their events: a task "
                              "with a death has no replay (comm.now() is its online clock)")
        if self.newcomers:
            raise ReplayError(f"{self.newcomers} rank(s) joined the task's {self.task.ranks} while "
                              "it ran: a task whose ranks changed has no replay (comm.now() is "
                              "its online clock)")
        if self._replay is None:
            self._replay = replay(self.traces, self.platform)
        return self._replay

    def metrics(self) -> RunMetrics:
        return summarize(self.replay(), self.traces)

    def wall_span(self) -> float:
        """Wall seconds from the first communication call of any rank to the last one's end:
        the communication the learner wrote, without the program's own set-up around it."""
        events = [e for trace in self.traces.values() for e in trace]
        if not events:
            return max((o.wall_s for o in self.outcomes), default=0.0)
        return max(e[-1] for e in events) - min(e[-2] for e in events)


@dataclass
class Run:
    """A launch: its result (``result.ok``, or how it ended) and, when it ended well, its tasks."""

    result: LaunchResult
    tasks: list[TaskRun] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def wall_s(self) -> float:
        return self.result.wall_s


def run(
    program: Program,
    tasks: Sequence[Task],
    options: RunOptions,
    *,
    platform: Platform | None = None,
    online_clock: bool = False,
    deadline_s: float | None = None,
    stall_s: float = 3.0,
) -> Run:
    """Runs ``program`` on real ranks, one task after another; never leaves a process behind.

    ``platform``: model another platform than the options' for this run (a hidden variant, a
    scenario's own cluster); ``Task(platform=...)`` does it for one task. ``online_clock``: keep
    each rank's virtual clock during the run, for programs that read ``comm.now()`` (always on
    under a fault plan); the graded time is the replay either way. ``deadline_s``: this run's
    own deadline instead of the options'."""
    tasks = list(tasks)
    platform = platform or options.platform
    platform.check_world(max(task.ranks for task in tasks))
    for task in tasks:
        if task.platform is not None:
            task.platform.check_world(task.ranks)
    job = make_job(
        program.file, program.name, tasks, options.backend, program.solution,
        program_module=program.module, platform=platform,
        limits=memory_budget(options.limits, max(task.ranks for task in tasks)),
        faults=options.faults, online_clock=online_clock, mpi_monitoring=options.mpi_monitoring,
        seal=options.seal, private=options.private, wall_clock=options.clock == "wall",
    )
    result = launch(job, deadline_s=deadline_s or options.deadline_s, stall_s=stall_s)
    if not result.ok:
        return Run(result)
    joined = result.world_size - job.world_size  # a launch with newcomers has one task
    return Run(result, [
        TaskRun(task, result.task_outcomes(i), platform if task.platform is None else task.platform,
                newcomers=joined)
        for i, task in enumerate(tasks)
    ])


def collective_time(platform: Platform, op: str, ranks: int, nbytes: int) -> float:
    """The virtual time of one built-in collective (``op``, ``nbytes`` per rank) over the first
    ``ranks`` ranks of ``platform``: its standard algorithm (runtime/clock/collectives_cost.py)
    replayed through the platform's links, shared links included. On a platform where a formula's
    alpha and beta hide contention, this is what a hand-written version of that algorithm can
    reach there."""
    group = tuple(range(ranks))
    event = (COLL, op, group, 0, nbytes, -1, 0.0, 0.0)
    return replay({rank: [event] for rank in group}, platform).makespan
