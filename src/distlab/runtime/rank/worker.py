"""The rank entry point: one process of a job.

Started by distlab's launcher (``--job DIR``) or by an external launcher on a real cluster::

    mpirun -n 16 --hostfile hosts python -m distlab.worker --problem 03 --solution my.py
    mpirun --allow-run-as-root --oversubscribe -n 4 python -m distlab.worker --problem 03 ...
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 \\
        -m distlab.worker --problem 03 --solution my.py

Call order inside a rank: note the pid and install the stack dumper, join the engine (MPI_Init or
the gloo rendezvous), load the problem program and the learner's file, apply resource limits, run
each task of the batch (ranks outside a task's group wait at a barrier), write the outcome file
atomically, leave. Any learner failure is written to the outcome file first, then the whole job is
ended, because peers of a failed rank would otherwise wait for it forever.

Sealed (``job.seal``, and ``--sealed`` from the launcher), this process is the rank's agent: the
program and the learner's file load and run in its learner process, forked first thing, before
this process reads its job (rank/learner_fork.py), and handed its spec before the engine joins
(rank/sealed.py); each task's calls are made here on the proxy, as the learner process asks
(runtime/seal/service.py).
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import os
import pickle
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, TypeGuard

from ..comm.proxy import Comm
from ..comm.rankstate import (
    FAILED,
    FINISHED,
    IDLE,
    RUNNING,
    RankSlot,
    communicators_path,
    state_path,
)
from ..comm.stats import CommStats
from ..comm.store import StoreLink
from ..engines.base import Engine, split_off
from ..engines.counted import harness_engine
from ..jobspec import (
    JOB_FILE,
    Job,
    RankOutcome,
    TaskOutcome,
    import_program_module,
    is_problem_module,
    log_path,
    outcome_path,
    pid_path,
    problem_programs,
    stack_path,
    write_pickle_atomically,
)
from ..trace.events import TraceRecorder
from . import limits as rank_limits
from .backend import detect_backend, make_engine
from .failures import error_from
from .guards import finalize_mpi, forbid_finalize, require_completed
from .learner import load_module
from .memory import MemoryWitness, engine_paths, own_held_bytes, steady_malloc
from .survival import JoinedAs, joined, surviving_engine, task_clock
from .views import for_rank

if TYPE_CHECKING:  # imported by sealed ranks only (see _start_learner)
    from ..seal.errors import LearnerGone
    from .learner_fork import LearnerSeed
    from .sealed import LearnerProcess


def _watch_supervisor(pid: int) -> None:
    """Ends this rank if the supervisor dies, so a crashed harness leaves no process behind."""
    while True:
        time.sleep(0.5)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(70)
        except PermissionError:
            pass


def _redirect_output(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)


def run_job(job_dir: Path, sealed: bool = False, joined_as: JoinedAs | None = None) -> int:
    # Sealed, the learner process is forked first, while this process holds nothing of the job.
    seed = _fork_learner() if sealed else None
    with open(job_dir / JOB_FILE, "rb") as f:
        job: Job = pickle.load(f)
    if seed is not None and not job.seal:
        seed.discard()
        seed = None
    backend, rank, size = detect_backend()
    if joined_as is not None:  # spawned by the members' Admit (MPI): the job's next rank
        joined_as.tell(rank)
        rank = joined_as.world_rank(rank)
    pid_path(job_dir, rank).write_text(str(os.getpid()))
    _redirect_output(log_path(job_dir, rank))
    # Sealed, the stack file is the learner process's (its lines are the ones worth showing);
    # the agent's own stack goes beside it.
    stack_file = open(stack_path(job_dir, rank), "w")
    agent_stack = open(stack_path(job_dir, rank).with_suffix(".agent.txt"), "w") if job.seal else stack_file
    faulthandler.enable(file=agent_stack, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=agent_stack, all_threads=True, chain=False)
    if job.supervisor_pid:
        threading.Thread(target=_watch_supervisor, args=(job.supervisor_pid,), daemon=True).start()
    slot = RankSlot(state_path(job_dir, rank), communicators_path(job_dir, rank))
    # Started before the engine joins: it loads the program and the learner's file meanwhile.
    learner = _start_learner(seed, job, job_dir, rank, stack_file) if job.seal else None

    handed = None
    outcome = RankOutcome(rank=rank, tasks=[])
    solution_path = Path(job.solution_file) if job.solution_file else None
    task_index = 0
    try:
        # Inside the try: a rank still meeting its peers when one that already met them dies
        # fails here ("Connection closed by peer"), and reports it like any lost peer, so the
        # supervisor names the rank that died rather than this one.
        engine = surviving_engine(job, job_dir, slot, joined_as) if job.survivors else make_engine(job.backend)
        if job.mpi_monitoring and backend == "mpi":
            # Off MPI_COMM_WORLD, counting every message it hands to MPI: what Open MPI's monitoring
            # counts beyond that was sent around the proxy (runtime/supervisor/mpi_monitoring.py).
            engine, handed = harness_engine(engine)
        witness = learner.memory if learner is not None else None
        if learner is None:
            program = _load_program(Path(job.program_file), job.program_module, job.program)
            forbid_finalize(backend)
            witness = _own_memory(job_dir) if job.memory_probe else None
            solution = load_module(solution_path, "solution") if solution_path else None
            rank_limits.apply(job.limits)
            run = _in_process(program, solution)
        else:
            # The agent keeps the rank's limits too: it holds what the learner sends, receives and
            # parks, and without them a learner's code could fill the machine through it.
            rank_limits.apply(job.limits, mapped_mb=learner.arena_mb)
            run = learner.run_task
        cpus = learner.cpus if learner is not None else _own_cpus
        tasks = pickle.loads(job.tasks_blob)  # its cases are classes of the program's package
        own_context = False  # the first task: nothing came before it
        for task_index, task in enumerate(tasks):
            slot.task = task_index
            outcome.tasks.append(_run_task(engine, slot, job, task, task_index, run, cpus, own_context, witness))
            own_context = task_index + 1 < len(tasks) and engine.unreceived_anywhere()
        if learner is not None:
            learner.finish()
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then the job ends
        if learner is not None and _is_learner_gone(exc) and not exc.closed:
            learner.died(exc)  # no outcome: the supervisor names the death, as for one process
        if learner is not None:
            learner.kill()
        if handed is not None:
            outcome.handed = handed.as_dict()
        slot.set(FAILED)
        outcome.error = error_from(exc, solution_path, task_index, job.limits)
        outcome.marks_at_error = [name for name, _ in slot.marked]
        write_pickle_atomically(outcome_path(job_dir, rank), outcome)
        sys.stdout.flush()
        os._exit(1)  # the supervisor ends the peers; MPI_Finalize would wait for them
    if handed is not None:
        outcome.handed = handed.as_dict()
    write_pickle_atomically(outcome_path(job_dir, rank), outcome)
    slot.set(FINISHED)
    engine.close()
    # The outcome is written: leave without the interpreter's shutdown, which takes seconds for
    # several processes that imported torch at once on a small machine (the supervisor waits for
    # the ranks to exit). MPI ranks first finalize MPI, as mpi4py would at exit.
    if backend == "mpi":
        finalize_mpi()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# How a task's program runs: (comm, task index, task) -> its return value.
TaskRunner = Callable[[Comm, int, Any], Any]


# The seal's modules are imported only by a sealed rank: imports are most of a rank's start-up
# time, which every launch pays once per rank.
def _fork_learner() -> LearnerSeed:
    from .learner_fork import LearnerSeed

    return LearnerSeed.start()


def _start_learner(seed: LearnerSeed | None, job: Job, job_dir: Path, rank: int,
                   stack_file: IO[str]) -> LearnerProcess:
    from .learner_fork import LearnerSeed
    from .sealed import LearnerProcess

    # A sealed job's rank started without --sealed (by hand): this process has read the job,
    # so its learner starts afresh rather than as a fork of it.
    return LearnerProcess.start(seed or LearnerSeed.start(fork=False), job, job_dir, rank, stack_file)


def _is_learner_gone(exc: BaseException) -> TypeGuard[LearnerGone]:
    from ..seal.errors import LearnerGone

    return isinstance(exc, LearnerGone)


def _in_process(program: Callable[..., Any], solution: Any) -> TaskRunner:
    """Unsealed: the program and the learner's code run in this process, on the proxy itself."""
    def run(comm: Comm, index: int, task: Any) -> Any:
        return program(comm, solution, *for_rank(task.args, comm.rank), **task.kwargs)
    return run


def _load_program(path: Path, module_name: str, name: str) -> Callable[..., Any]:
    """``name`` of a problem package's module (``<package>.programs``), or of a module file of
    its own (the harness's test programs, calibration)."""
    module: Any
    if is_problem_module(module_name):
        module = import_program_module(path, module_name)
    else:
        module = load_module(path, module_name)
    program = getattr(module, name, None)
    if not callable(program):
        raise AttributeError(f"{path} has no program function {name!r}")
    return program  # type: ignore[no-any-return]


def _own_cpus() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def _own_memory(job_dir: Path) -> MemoryWitness:
    """Unsealed, the rank reads its own memory, before the learner's file is imported and at
    each mark (as advisory as every other counter of an unsealed rank)."""
    steady_malloc()
    held = functools.partial(own_held_bytes, engine_paths(job_dir))
    return MemoryWitness(held, held())


def _run_task(
    engine: Engine, slot: RankSlot, job: Job, task: Any, index: int, run: TaskRunner,
    cpus: Callable[[], tuple[int, ...]] = _own_cpus, own_context: bool = False,
    witness: MemoryWitness | None = None,
) -> TaskOutcome | None:
    """``own_context``: the task runs on a communicator of its own, a new context even where it
    has every rank (MPI_Comm_dup's reason to be), so that a message an earlier task sent and
    nobody received cannot match a receive of this one. The caller asks for it after a task that
    may have left one (always on MPI, whose senders cannot tell; on gloo only then, as a gloo
    group costs a rendezvous). A launch's first task keeps the world, and so does its only one,
    as a task with process faults or survivors must (their deaths and newcomers change the
    world's members; rank/survival.py): each of those runs alone in its launch."""
    # A rank that joined the running job runs the task on the communicator that admitted it.
    members = list(range(engine.size if joined() else task.ranks))
    own_context = own_context and not joined()
    next_task = index + 1 < len(job.task_labels)
    # Both splits are collective over every rank of the job, members or not.
    group = split_off(engine, members) if own_context or len(members) != engine.size else engine
    plan = task.faults if task.faults is not None else job.faults
    platform = task.platform if task.platform is not None else job.platform
    clocked = platform is not None and (job.online_clock or plan is not None)
    watcher = witness if task.memory else None  # reads the learner's memory during this task
    side = split_off(engine, members) if clocked else None
    result: TaskOutcome | None = None
    if group is not None:
        slot.set(RUNNING)  # it may still say "idle" from the barrier after the previous task
        world_rank = group.world_ranks[group.rank]
        trace = TraceRecorder(world_rank) if job.trace else None
        comm = Comm(
            group,
            slot,
            CommStats(),
            eager_limit=job.eager_limit,
            trace=trace,
            compute_multiplier=_compute_multiplier(job, plan, world_rank),
            device_flops=(
                task.platform.device_of(world_rank).flops if task.platform is not None
                else _per_rank(job.device_flops, world_rank, None)
            ),
            clock=task_clock(platform, side),
            record_sent=task.record_sent,
            memory_probe=watcher.reading if watcher is not None else None,
            **_fault_layers(plan, world_rank),
        )
        # Half the rank's memory limit, which the agent keeps too: refused in words before it is met.
        comm._book.park_limit = job.limits.address_space_mb << 19
        if task.store and job.store_address:
            host, port = job.store_address.rsplit(":", 1)
            comm.attach_store(StoreLink(host, int(port), f"task{index}/"))
        start = time.perf_counter()
        if watcher is not None:
            if watcher.parked_apart:  # sealed: what it sent itself waits in this process
                book = comm._book
                watcher.parked = lambda: book.parked
            watcher.watch(task.memory_sampled, task.memory_named)
        try:
            value = run(comm, index, task)
        finally:
            if watcher is not None:
                watcher.unwatch()
        require_completed(comm.unwaited())
        events = trace.events if trace is not None else None
        result = TaskOutcome(value, comm.total_stats(), time.perf_counter() - start, events,
                             comm.marked, comm.stats_by_communicator(), cpus(), comm.sent,
                             watcher.readings(comm.memory_marks) if watcher is not None else [])
        comm.release_store()
        if group is not engine:
            _release(group, next_task)
        if side is not None:
            _release(side, next_task)  # with the time stamps of messages left unreceived
    if len(members) != engine.size:
        # Ranks outside the group wait here while the group runs the task.
        slot.set(IDLE)
        engine.barrier()
    return result


def _release(group: Engine, next_task: bool) -> None:
    """Frees a group the harness made for a task that has finished, and where a task of the
    launch follows (``next_task``), the messages sent on it that nobody received, which the next
    group could otherwise receive. Its close is collective (a gloo sub-group's is a barrier): a
    peer the fault plan killed fails it, and that is no failure of this rank, whose task is done;
    the group is then kept until the process exits."""
    try:
        if next_task:
            group.drop_unreceived()
        group.close()
    except RuntimeError:  # gloo's "connection closed by peer"; the supervisor judges the death
        pass


# A fault plan's modules are imported only where a task has one (see _start_learner).
def _fault_layers(plan: Any, world_rank: int) -> dict[str, Any]:
    """The proxy's fault arguments: its message faults, and the steps and marks that trigger
    process faults."""
    if plan is None:
        return {"faults": None, "trigger_steps": frozenset()}
    from ..faults.decide import MessageFaults, ProcessFaults

    signals = ProcessFaults(plan)
    return {"faults": MessageFaults(plan, world_rank),
            "trigger_steps": signals.trigger_steps(world_rank),
            "trigger_marks": signals.trigger_marks(world_rank)}


def _compute_multiplier(job: Job, plan: Any, rank: int) -> float:
    if plan is not None:
        from ..faults.decide import ProcessFaults

        return float(ProcessFaults(plan).compute_multiplier(rank))
    return float(_per_rank(job.compute_multiplier, rank, 1.0))


def _per_rank(values: tuple[Any, ...], rank: int, default: Any) -> Any:
    return values[rank] if rank < len(values) else default


# How a problem's main() says that the result is wrong: a dict with "ok" (or "passed") False, or
# the word in capitals, as the shipped programs write it ("DIFFERS FROM the sum of all inputs",
# "replicas DIFFER across ranks"). Either gives exit status 1, so a script around mpirun sees it.
_WRONG = re.compile(r"\bDIFFERS?\b")


def summary_is_wrong(summary: Any) -> bool:
    if isinstance(summary, dict):
        return summary.get("ok") is False or summary.get("passed") is False
    return isinstance(summary, str) and _WRONG.search(summary) is not None


def run_standalone(problem: str, solution_arg: str, params: dict[str, str]) -> int:
    """Runs the problem's ``main`` program under an external launcher; rank 0 prints the summary.

    Returns 1 on rank 0 when the summary says the result is wrong (``summary_is_wrong``): the
    launcher (mpirun, torchrun) then exits non-zero too."""
    from ...bank import Bank, resolve_solution

    bank = Bank.default()
    entry = bank.problem(problem)
    solution_path = resolve_solution(entry, solution_arg)
    backend, rank, size = detect_backend()
    engine = make_engine(backend)
    program_file, module_name = problem_programs(entry.path)
    program = _load_program(program_file, module_name, "main")
    solution = load_module(solution_path, "solution")
    comm = Comm(engine)
    start = time.perf_counter()
    summary = program(comm, solution, **params)
    wall = time.perf_counter() - start
    engine.barrier()
    wrong = rank == 0 and summary_is_wrong(summary)
    if rank == 0:
        print(f"{entry.number} {entry.title}: ranks={size} backend={backend} wall={wall:.3f} s")
        if summary is not None:
            print(summary)
        if wrong:
            print(f"the result is wrong: exit status 1 (check it with `distlab check {entry.number}`)")
        sys.stdout.flush()
    engine.close()
    return 1 if wrong else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distlab.worker")
    parser.add_argument("--job", type=Path, help="job folder written by distlab's launcher")
    parser.add_argument("--sealed", action="store_true",
                        help="the job is sealed: fork its learner process before reading it")
    parser.add_argument("--problem", help="problem number, for a run under mpirun/torchrun")
    parser.add_argument("--solution", default="reference", help="'reference', 'starter' or a path")
    parser.add_argument("--param", action="append", default=[], help="NAME=VALUE for main()")
    # A newcomer that an MPI job's comm.Admit() spawned (rank/survival.py's JoinedAs).
    parser.add_argument("--joined", help=argparse.SUPPRESS)
    parser.add_argument("--members", help=argparse.SUPPRESS)
    parser.add_argument("--replacing", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job:
        joined_as = (JoinedAs.parse(args.joined, args.members, args.replacing) if args.joined
                     else None)
        return run_job(args.job, args.sealed, joined_as)
    if not args.problem:
        parser.error("give --job (from distlab) or --problem")
    params = dict(p.split("=", 1) for p in args.param)
    return run_standalone(args.problem, args.solution, params)


if __name__ == "__main__":
    sys.exit(main())
