"""What the supervisor hands to each rank (the job) and what each rank hands back (its outcome).

Both travel as pickles in the job folder. A job is a *batch* of tasks run one after the other in
one launch: starting processes costs far more than a test case, so a check that needs runs at
p = 1, 2, 3, 5, 8 starts 8 ranks once and runs the smaller cases on sub-communicators.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import UsageError
from .comm.sent import SentLog
from .comm.stats import CommStats

JOB_FILE = "job.pkl"
RANK_MODULE = "distlab.runtime.rank.worker"  # what every rank runs (python -m)
# Which attempt of the job a rank belongs to: 0, then 1 after a restart, ... (set by the supervisor).
ATTEMPT_ENV = "DISTLAB_ATTEMPT"
# Set to "1" for a rank that joins the running job (a join fault's, or a dead rank started again
# alone), which the survivors let in with comm.Admit(); the second names the rank it replaces.
JOINED_ENV = "DISTLAB_JOINED"
RESTARTED_ENV = "DISTLAB_RESTARTED_RANK"
# How an MPI job's comm.Admit() starts a newcomer (JSON: the command before the worker's own
# arguments): through the zygote's stand-in where the supervisor keeps one, as mpiexec does.
SPAWN_ENV = "DISTLAB_SPAWN"


@dataclass(frozen=True)
class Limits:
    """Resource limits applied to every rank once it has loaded its libraries."""

    address_space_mb: int = 4096
    cpu_seconds: int = 120
    file_size_mb: int = 256
    # Processes and threads at once for a sealed learner that runs as a user of its own (nobody,
    # under root; runtime/seal/sandbox.py): RLIMIT_NPROC counts that user's, so a fork bomb is
    # refused instead of filling the machine. Where the learner runs as the harness's user (no
    # root) or as uid 0 (exempt), it is not set: it would count the user's other processes.
    processes: int = 1024


@dataclass(frozen=True)
class Task:
    """One run of a problem program on the first ``ranks`` ranks of the job."""

    ranks: int
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    # A fault plan for this task alone (runtime/faults); None: the job's plan, if any. Its process
    # faults (kill, stop, reclaim, join, restart) act when the task runs alone in its launch.
    faults: Any = None
    label: str = ""
    # The platform this task alone models (a distlab.platforms.Platform: a hidden variant's own
    # cluster, so one launch can cover several); None: the job's. Its online clock, its devices'
    # FLOP/s and its replay all follow it.
    platform: Any = None
    store: bool = False  # comm.store(): a key-value store of the task's own (runtime/comm/store.py)
    # A rank's death (a kill fault) does not end the task: the others get distlab.PeerFailed
    # and may go on without it (runtime/comm/survivors.py).
    survivors: bool = False
    # Ranks a task with survivors cannot lose (a coordinator): a plan that kills or reclaims one
    # is refused before any process starts.
    needed_ranks: tuple[int, ...] = ()
    # Every rank keeps a copy of what it sends (runtime/comm/sent.py), for checks that read what
    # travelled rather than how much.
    record_sent: bool = False
    # The rank reads what the learner's processes hold in memory at each mark, from /proc
    # (rank/memory.py), and once before the learner's file is imported: TaskOutcome.memory.
    memory: bool = False
    # Marks after which the rank's agent also samples that memory every few milliseconds, until
    # the next mark: each reading then carries the most held since the one before.
    memory_sampled: tuple[str, ...] = ()
    # The program's own marks, where it names them (grading's Task.marks): a mark of another name
    # is the learner's, and neither ends a sampled span nor starts a new peak (rank/memory.py).
    memory_named: tuple[str, ...] = ()


@dataclass(frozen=True)
class Job:
    """A launch. The tasks travel pickled apart (``tasks_blob``): their arguments may be instances
    of classes defined in the program's module, which a rank can only unpickle once it has
    imported that module under the same name as the supervisor (``program_module``)."""

    program_file: str  # the problem's check.py (or another module) holding the program
    program_module: str  # the module name it is imported under, on both sides
    program: str  # name of the function run on every rank: program(comm, solution, *args)
    solution_file: str | None
    tasks_blob: bytes  # pickle of tuple[Task, ...]
    task_labels: tuple[str, ...]
    backend: str
    world_size: int
    limits: Limits = Limits()
    supervisor_pid: int = 0
    eager_limit: int = 64 * 1024
    trace: bool = True  # record events for the virtual clock's replay and the trace file
    device_flops: tuple[float, ...] = ()  # per world rank, from the platform (empty: none)
    compute_multiplier: tuple[float, ...] = ()  # per world rank: slow ranks (fault plans)
    faults: Any = None  # a runtime.faults.FaultPlan, or None
    # The platform the ranks' online clock models (a distlab.platforms.Platform); None: no clock.
    platform: Any = None
    # Keep the online clock (runtime/clock/online.py) even without a fault plan. It costs one small
    # message per message, so it runs only where something reads the time during the run: a fault
    # plan (its windows are in virtual time) or problem code that asks for comm.now().
    online_clock: bool = False
    # Count what MPI itself carries with Open MPI's monitoring (runtime/supervisor/mpi_monitoring.py), to
    # catch code that goes around the proxy. Exam grading only: it moves the harness onto
    # duplicated communicators and counts every message handed to MPI.
    mpi_monitoring: bool = False
    # Performance is graded on measured wall time (--clock wall): MPI ranks then poll for
    # messages without sleeping between polls (runtime/supervisor/start.py, mpi_env).
    wall_clock: bool = False
    # Run the learner's code in a process of its own, a child of the rank, which reaches the
    # engine, the counters and the clock only through the seal (runtime/seal/).
    seal: bool = False
    private: tuple[str, ...] = ()  # paths the learner process must not see, beyond the job's own
    # Some task asks for a store (Task.store): the supervisor hosts a TCPStore for the launch,
    # and ``store_address`` ("host:port") is where, once it runs.
    store: bool = False
    store_address: str = ""
    # Some task lets its ranks survive a peer's death (Task.survivors): MPI runs with Open MPI's
    # user-level failure mitigation (ULFM); gloo meets at the launch's store (``store``), where
    # the supervisor posts each death (engines/surviving_gloo.py).
    survivors: bool = False
    # Some task reads the learner's memory (Task.memory): the learner process keeps glibc's
    # thresholds fixed (a freed large array goes back to the kernel) and waits, before it imports
    # the learner's file, for its agent to read what it holds then (rank/memory.py).
    memory_probe: bool = False


def make_job(
    program_file: Path,
    program: str,
    tasks: Sequence[Task],
    backend: str = "mpi",
    solution_file: Path | None = None,
    program_module: str | None = None,
    **options: Any,
) -> Job:
    """A Job for ``program`` of ``program_file`` over ``tasks``: the derived fields (module name,
    pickled tasks, labels, world size, device FLOP/s of the platform, this process as supervisor)
    filled in; ``options`` are the other Job fields (limits, faults, platform, online_clock, ...)."""
    tasks = tuple(tasks)
    world = max(task.ranks for task in tasks)
    options["faults"] = _supervised_plan(tasks, options.get("faults"))
    _spare_needed_ranks(tasks, options.get("faults"))
    survivors = _survivors(tasks)
    platform = options.get("platform")
    newcomers = _newcomers(tasks, options.get("faults"), platform, world)
    seats = world + newcomers
    if platform is not None and "device_flops" not in options:
        options["device_flops"] = tuple(platform.device_of(r).flops for r in range(seats))
    return Job(
        program_file=str(program_file),
        program_module=program_module or program_module_name(program_file),
        program=program,
        solution_file=str(solution_file) if solution_file else None,
        tasks_blob=pickle.dumps(tasks),
        task_labels=tuple(t.label or f"task {i + 1} on {t.ranks} rank(s)" for i, t in enumerate(tasks)),
        backend=backend,
        world_size=world,
        supervisor_pid=os.getpid(),
        # Survivors on gloo meet at the launch's store, where the supervisor posts each death
        # and announces each rank that joins (on MPI too).
        store=any(task.store for task in tasks) or (survivors and (backend == "gloo" or newcomers > 0)),
        survivors=survivors,
        memory_probe=any(task.memory for task in tasks),
        **options,
    )


# The kinds of fault the supervisor carries out on the launch's processes (the others are the
# ranks' own, from the task's plan or the job's).
SUPERVISED_KINDS = ("kill", "stop", "reclaim", "restart", "join")


def _supervised_plan(tasks: Sequence[Task], job_plan: Any) -> Any:
    """The plan whose process faults the supervisor carries out: the job's, or the own plan of a
    task that runs alone in its launch and has some (a check's kill, reclaim or join). In a batch
    a task's process faults cannot be told apart from the others' ranks: refused."""
    own = [t for t in tasks if t.faults is not None and t.faults.of_kind(*SUPERVISED_KINDS)]
    if not own:
        return job_plan
    if len(tasks) > 1:
        plan = own[0].faults
        raise UsageError(f"{plan.where}: its {plan.of_kind(*SUPERVISED_KINDS)[0].kind} acts on the "
                         "launch's processes, so the task whose plan it is must run in a launch of "
                         f"its own (this one has {len(tasks)} tasks)")
    return own[0].faults


def _spare_needed_ranks(tasks: Sequence[Task], job_plan: Any) -> None:
    """A kill or reclaim of a rank its task cannot lose is a fault-plan error, before any start."""
    for i, task in enumerate(tasks):
        name = f"task {task.label!r}" if task.label else f"task {i + 1}"
        outside = [r for r in task.needed_ranks if not 0 <= r < task.ranks]
        if outside:
            raise UsageError(f"{name}: needed_ranks names rank {outside[0]}, outside its "
                             f"{task.ranks} ranks (0..{task.ranks - 1})")
        plan = task.faults if task.faults is not None else job_plan
        if task.needed_ranks and plan is not None:
            plan.spare(frozenset(task.needed_ranks), name)


def _newcomers(tasks: Sequence[Task], plan: Any, platform: Any, world: int) -> int:
    """How many ranks the job may gain while it runs (joins, ranks started again alone); a
    FaultPlanError (from the plan) when the tasks or the platform cannot take them."""
    if plan is None:
        return 0
    return int(plan.newcomers_for(any(task.survivors for task in tasks), world, platform))


def _survivors(tasks: Sequence[Task]) -> bool:
    """Whether a task lets its ranks outlive a peer; such a task is alone in its launch."""
    if not any(task.survivors for task in tasks):
        if any(task.needed_ranks for task in tasks):
            raise UsageError("Task(needed_ranks=...) names the ranks a task with survivors cannot "
                             "lose; without survivors=True every rank is needed")
        return False
    if len(tasks) > 1:
        raise UsageError("a task with survivors=True runs in a launch of its own: after a death, "
                         "the launch has no whole world left to run the next task on")
    return True


# The name of TaskOutcome.memory's first entry, always there: what the learner process held
# before the learner's file was imported (readers take the first entry, whatever marks follow).
BEFORE_SOLUTION = "(before the solution)"


@dataclass
class TaskOutcome:
    value: Any
    stats: CommStats
    wall_s: float
    trace: list[Any] | None = None  # this rank's events (runtime/trace/events.py) when tracing is on
    marks: list[tuple[str, CommStats]] = field(default_factory=list)  # comm.mark(): name, counters then
    # The counters of each communicator the task made (Split, Dup, Create_group), by the path of
    # its group (engines/base.py); ``stats`` above holds the rank's totals over all of them.
    by_communicator: dict[str, CommStats] = field(default_factory=dict)
    # The CPUs the process of the learner's code may run on at the task's end, read from the
    # kernel by the rank's agent (its own process unsealed): the affinity the code applied.
    cpus: tuple[int, ...] = ()
    sent: SentLog | None = None  # what the rank sent, where its task asked (Task.record_sent)
    # Where the task asked (Task.memory): (mark name, bytes the learner's processes held then, the
    # most they held since the reading before), read by the rank's agent from /proc, the first
    # entry BEFORE_SOLUTION's (rank/memory.py).
    memory: list[tuple[str, int, int]] = field(default_factory=list)


@dataclass
class RankError:
    """The learner's code (or the program around it) failed on this rank."""

    kind: str  # "exception", "import", "abort", "misuse", "exit", "memory", "cpu", "file-size"
    summary: str  # one line: "ValueError: ..." or "the solution called comm.Abort(3)"
    where: str  # "solution.py, line 12, in allreduce" or ""
    traceback: str
    task_index: int


@dataclass
class RankOutcome:
    rank: int
    tasks: list[TaskOutcome | None]
    error: RankError | None = None
    # With Job.mpi_monitoring: point-to-point (messages, bytes) handed to MPI, per world peer.
    handed: dict[int, tuple[int, int]] = field(default_factory=dict)
    # With ``error``: the marks the failing task had set on this rank before it failed, as its
    # agent recorded them (a check can tell where in the program an error came).
    marks_at_error: list[str] = field(default_factory=list)


def program_module_name(program_file: Path) -> str:
    """The one module name a program file outside a problem package gets (the harness's own
    test programs, calibration), in the supervisor and in every rank."""
    folder = "".join(c if c.isalnum() else "_" for c in program_file.parent.name)
    return f"distlab_problem_{folder}_{program_file.stem}"


PACKAGE_PREFIX = "distlab_problem_"


def is_problem_module(module_name: str) -> bool:
    """A module of a problem package (``distlab_problem_03_ring_allreduce.programs``)."""
    return module_name.startswith(PACKAGE_PREFIX) and "." in module_name


def problem_package(folder: Path) -> str:
    """Registers a problem's folder as a package (once per process) and returns its name.

    A problem folder (``problems/03-ring-allreduce/``) is no importable name, and every problem
    has its own ``cases.py``: so the folder gets a package name unique to it,
    ``distlab_problem_03_ring_allreduce``, whose modules import each other as ``from . import
    cases``. The supervisor and every rank register it the same way, so cases and results defined
    in its modules travel between them as pickles."""
    folder = folder.resolve()
    name = PACKAGE_PREFIX + "".join(c if c.isalnum() else "_" for c in folder.name)
    known = sys.modules.get(name)
    if known is None or list(getattr(known, "__path__", [])) != [str(folder)]:
        package = types.ModuleType(name, f"the problem in {folder}")
        package.__path__ = [str(folder)]
        package.__package__ = name
        sys.modules[name] = package
        # list() copies the keys in one step: another thread may import meanwhile (watch mode's
        # file watcher imports watchfiles as the first check starts: "dictionary changed size").
        for stale in [m for m in list(sys.modules) if m.startswith(name + ".")]:
            del sys.modules[stale]  # another folder of the same name was loaded before
    return name


def problem_programs(folder: Path) -> tuple[Path, str]:
    """(file, module name) of the module that holds a problem's rank programs (its ``main``)."""
    return folder / "programs.py", problem_package(folder) + ".programs"


def import_program_module(program_file: Path, module_name: str) -> types.ModuleType:
    """The module of a problem package (``<package>.programs``), imported through its package."""
    package, _, _ = module_name.rpartition(".")
    if problem_package(program_file.parent) != package:
        raise ImportError(f"{program_file} is not in the package {package}")
    return importlib.import_module(module_name)


def write_pickle_atomically(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def outcome_path(job_dir: Path, rank: int) -> Path:
    return job_dir / f"outcome-{rank}.pkl"


def log_path(job_dir: Path, rank: int) -> Path:
    return job_dir / f"rank-{rank}.log"


def stack_path(job_dir: Path, rank: int) -> Path:
    return job_dir / f"stack-{rank}.txt"


def pid_path(job_dir: Path, rank: int) -> Path:
    return job_dir / f"pid-{rank}"


def learner_gone_path(job_dir: Path, rank: int) -> Path:
    """Where a sealed rank's learner process was when it died ("in Sendrecv"), by its agent."""
    return job_dir / f"learner-gone-{rank}"


def learner_pid_path(job_dir: Path, rank: int) -> Path:
    """The pid of a sealed rank's learner process, written by its agent."""
    return job_dir / f"learner-pid-{rank}"
