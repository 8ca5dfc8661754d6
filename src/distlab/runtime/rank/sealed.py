"""The agent's handle on its learner process: start it, hand it tasks, read its results, end it.

    learner = LearnerProcess.start(seed, job, job_dir, rank, stack_file)  # before the engine joins
    value = learner.run_task(comm, index, task)     # the program's return value, read safely
    learner.finish()                                # the batch is done: the child exits

``run_task`` raises ``ReportedFailure`` when the learner's code failed (its own words: kind,
summary, the line in the learner's file), ``LearnerGone`` when the process died or closed the
channel, and ``ReportedFailure`` of kind "tampered" when the learner sent a request its client
never builds or a result the agent will not rebuild. ``mirror_death`` then ends the agent the way
the learner ended (the same exit status or signal), so that the supervisor's account of a crash
("rank 1 died: exit status 3", a segmentation fault and its stack) reads as it does unsealed.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from ..comm.proxy import Comm
from ..jobspec import (
    Job,
    RankError,
    learner_gone_path,
    learner_pid_path,
    problem_package,
)
from ..seal.agent import AgentEnd
from ..seal.doorbell import spin_for
from ..seal.errors import LearnerGone
from ..seal.lines import FURTHER_ARENA_BYTES, MAX_FURTHER, AgentLines
from ..seal.memgroup import MemoryGroup, learner_memory_bytes
from ..seal.service import FAILURE, Service
from ..seal.values import UnsafeValue, read_failure, read_value
from .failures import ReportedFailure, clipped, worded
from .learner_fork import ForkedChild, LearnerSeed
from .learner_view import hidden_paths, kept_paths
from .memory import MemoryWitness, descendants, held_bytes
from .pause import paused
from .views import for_rank

# How often the agent looks at the learner's memory group for the kernel's kills (a file read).
OOM_LOOK_S = 0.25
# How long the watcher leaves the main thread to report a learner it ended for memory (the main
# thread may be in the engine on the learner's behalf: then the watcher names the death itself).
MEMORY_REPORT_WAIT_S = 2.0

# The launcher's and the engines' variables: without them the learner cannot join the job (nor
# find the zygote that forks ranks, runtime/zygote/, which it could not reach anyway).
_ENGINE_VARIABLES = ("OMPI_", "PMIX_", "PMI_", "OPAL_", "HYDRA_", "MASTER_ADDR", "MASTER_PORT",
                     "TORCHELASTIC_", "GROUP_", "LOCAL_", "ROLE_", "RANK", "WORLD_SIZE", "DISTLAB_ZYGOTE",
                     "DISTLAB_SPAWN")


class LearnerProcess:
    def __init__(self, agent: AgentEnd, lines: AgentLines, child: ForkedChild | subprocess.Popen[bytes],
                 packages: tuple[str, ...], gone_note: Path, memory_probe: bool = False,
                 group: MemoryGroup | None = None) -> None:
        self._agent = agent
        self._group = group  # the memory cgroup of all its processes, where one could be made
        self._child = child
        self._service = Service(agent)
        self._lines = lines  # the further lines its threads open, served by the same service
        lines.start(child.pid, self._service.serve_line, self._service.tampered.append)
        self._packages = packages
        self._gone_note = gone_note
        self._code: int | None = None  # the pid of the learner's code, once looked up
        self.memory = MemoryWitness(self.held_memory, held_at_mark=self._held_at_mark, parked_apart=True)
        if memory_probe:
            self._service.read_before_solution = self._read_before_solution
        self._finishing = threading.Event()
        self._ended_for_memory = False  # by its agent, after the kernel ended one of its processes
        # Held by the first of the two threads that see the learner die (this watcher, the main
        # thread on a closed channel) until the process ends: the second must not truncate the
        # note the first wrote as the first exits (CI saw an empty note).
        self._dying = threading.Lock()
        # The agent may be blocked in the engine on the learner's behalf (a Recv whose sender
        # never comes) when the learner dies: a watcher ends the agent then, as the learner ended.
        threading.Thread(target=self._watch, args=(os.pidfd_open(child.pid),), daemon=True).start()

    def _watch(self, pidfd: int) -> None:
        """Waits for the learner to end, answering meanwhile its threads' asks for lines, and
        looking at its memory group's kills every OOM_LOOK_S."""
        watched: list[Any] = [pidfd, self._lines]
        look = OOM_LOOK_S if self._group is not None else None
        while True:
            try:
                ready = select.select(watched, [], [], look)[0]
            except (ValueError, OSError):  # the opener was closed here (finish)
                watched = [pidfd]
                continue
            if pidfd in ready:
                break
            if not ready:
                self._end_if_out_of_memory()
            elif not self._lines.answer():
                watched = [pidfd]  # the learner closed the opener: only its end is left to see
        if self._finishing.is_set():
            return
        if self._ended_for_memory and self._finishing.wait(MEMORY_REPORT_WAIT_S):
            return  # the main thread reported it (run_task), as at the end of a task
        status = self._agent.learner_status()
        if status and status != "exit status 0":
            self.died(LearnerGone(self._agent.where(), status))

    def _end_if_out_of_memory(self) -> None:
        """Ends the learner once the kernel has ended one of its processes for the group's bound.
        That fails the task anyway (run_task); a learner left waiting on a process that is gone
        (a pool's worker, a child's pipe) would otherwise be named only at the job's deadline."""
        if self._ended_for_memory or self._finishing.is_set() or self._group is None:
            return
        if self._group.oom_kills():
            self._ended_for_memory = True
            self._child.kill()  # its waiter: the namespace's processes die with it

    def died(self, gone: LearnerGone) -> None:
        """Ends the agent as the learner process ended, saying where it was (the supervisor reads it)."""
        self._dying.acquire()  # never released: this process ends below
        if not gone.where.startswith("in ") and not gone.closed:
            # Seen on the first line, between calls: a thread's line may have been in one.
            gone = LearnerGone(self._lines.where(), gone.status)
        try:
            self._gone_note.write_text(where_it_died(gone) + self._out_of_memory())
            mirror_death(gone)
        finally:
            os._exit(1)  # a failure above must not leave the process alive, holding the lock

    @classmethod
    def start(cls, seed: LearnerSeed, job: Job, job_dir: Path, rank: int, stack_file: IO[str]
              ) -> LearnerProcess:
        """Makes the seal's channel and hands it, with the learner's spec, to ``seed`` (forked
        before this process read its job: learner_fork.py)."""
        # A ring into a pipe whose reader the learner closed must fail (EPIPE, and the learner
        # named), not end the agent: Python ignores SIGPIPE from its start, said here as well.
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        # Each rank is an agent and a learner: the two spin before they sleep where every
        # process of the job has a CPU to itself (doorbell.py).
        agent = AgentEnd.create(first_arena_bytes(job.limits.address_space_mb),
                                spin_s=spin_for(2 * job.world_size))
        lines = AgentLines.create(agent)
        group = _memory_group(seed, job.limits.address_space_mb, agent.arena.data_size)
        env = {k: v for k, v in os.environ.items() if not k.startswith(_ENGINE_VARIABLES)}
        env["TMPDIR"] = "/tmp"  # its own /tmp (sandbox.py), not the job folder's
        spec = {
            "program_file": job.program_file, "program_module": job.program_module,
            "program": job.program, "solution_file": job.solution_file, "backend": job.backend,
            "limits": [job.limits.address_space_mb, job.limits.cpu_seconds, job.limits.file_size_mb,
                       job.limits.processes],
            "agent_pid": os.getpid(), "arena_size": agent.arena.data_size, "spin_s": agent.spin_s,
            "hidden": hidden_paths(job, job_dir),
            "kept": kept_paths(job),
            # Its working folder where the sandbox cannot give it a /tmp of its own (no mounts):
            # inside the job folder, which goes with the job.
            "shared_tmp_folder": str(job_dir / f"learner-{rank}"),
            "env": env,
            "memory_probe": job.memory_probe,
        }
        child = seed.plant(spec, (*agent.child_fds, lines.child_fd, stack_file.fileno(), sys.stdout.fileno()))
        agent.watch(child.pid)
        learner_pid_path(job_dir, rank).write_text(str(child.pid))
        package = job.program_module.rpartition(".")[0] or job.program_module
        if package != job.program_module:
            problem_package(Path(job.program_file).parent)  # its classes, for read_value
        return cls(agent, lines, child, (package,), learner_gone_path(job_dir, rank), job.memory_probe, group)

    @property
    def arena_mb(self) -> int:
        """The address space the first line's arena takes in each of the two processes: their
        limits leave it out (rank/limits.py)."""
        return self._agent.arena.size_mb

    def cpus(self) -> tuple[int, ...]:
        """The CPUs the learner's code may run on, as the kernel holds them for its process (not
        as that code says): problem 11 grades the affinity a rank applied."""
        return tuple(sorted(os.sched_getaffinity(_code_pid(self._child.pid))))

    def held_memory(self) -> int:
        """What the learner's processes hold (rank/memory.py)."""
        pids = self._learner_pids()
        return held_bytes(pids, {end.arena.inode for end in self._lines.every()}, scratch_of=pids[0])

    def _learner_pids(self) -> list[int]:
        """Its code's process first, every process that one started, and, in a PID namespace of
        its own, every orphan its first process adopted (the waiter and that first process are
        the harness's, and hold what they held)."""
        if self._code is None:
            self._code = _code_pid(self._child.pid)
        code = self._code
        reaper = _parent(code) if code != self._child.pid else code
        return [code, *(pid for pid in descendants(reaper) if pid != code)]

    def _held_at_mark(self) -> int:
        """At a mark the learner's main thread waits in its call: each line's data region that
        holds nothing a call needs is cleared (every line but one another thread's call is
        passing through), then the learner's processes read, then whatever the arenas hold
        again counts as theirs (an outside tester kept 24 MB of optimizer state there, unread).
        Its processes are stopped meanwhile: a thread of theirs moving that state from an arena
        to their memory between the two reads would be counted in neither."""
        with paused(self._learner_pids):
            ends = self._lines.every()
            for end in ends:
                end.clear_data()
            return self.held_memory() + sum(end.arena.data_held() for end in ends)

    def _read_before_solution(self) -> None:
        self.memory.before_solution = self.held_memory()

    def run_task(self, comm: Comm, index: int, task: Any) -> Any:
        try:
            result = self._service.run_task(comm, index, pickle.dumps((for_rank(task.args, comm.rank), task.kwargs)))
        except LearnerGone:
            if self._ended_for_memory:
                raise self._memory_exceeded(index) from None
            raise
        assert result is not None
        self._refuse_tampering(index)
        if self._out_of_memory():  # one of its processes was ended, and the learner went on
            raise self._memory_exceeded(index)
        if result.kind == FAILURE:
            raise ReportedFailure(_failure(result.data, index))
        try:
            return read_value(result.data, self._packages)
        except UnsafeValue as exc:
            raise ReportedFailure(RankError("tampered", f"the solution tampered with its result: {exc}",
                                            "", "", index)) from None

    def _refuse_tampering(self, index: int) -> None:
        if self._service.tampered:
            reason = self._service.tampered[0]
            raise ReportedFailure(RankError(
                "tampered", f"the solution tampered with the channel to its rank's agent: {reason}",
                "", "", index))

    def _memory_exceeded(self, index: int) -> ReportedFailure:
        ended = ", and its agent then ended the learner" if self._ended_for_memory else ""
        return ReportedFailure(RankError("memory", f"memory limit exceeded: {self._out_of_memory()[2:]}{ended}",
                                         "", "", index))

    def _out_of_memory(self) -> str:
        """Words for the kernel's OOM kills in its memory group ("" where there were none)."""
        kills = self._group.oom_kills() if self._group is not None else 0
        if not kills:
            return ""
        assert self._group is not None
        return (f"; its processes together passed the {self._group.limit_bytes >> 20} MiB a learner's "
                f"processes may hold, and the kernel ended {kills} of them")

    def finish(self, timeout_s: float = 10.0) -> None:
        """Tells the learner the batch is done and reaps it (killed if it does not leave)."""
        self._finishing.set()
        self._service.run_task(None, -1, b"")
        try:
            self._child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        self._lines.close()
        self._agent.close()
        if self._group is not None:
            self._group.remove()

    def kill(self) -> None:
        self._finishing.set()
        if self._child.poll() is None:
            self._child.kill()
            self._child.wait()
        if self._group is not None:
            self._group.remove()


def _memory_group(seed: LearnerSeed, address_space_mb: int, first_arena: int) -> MemoryGroup | None:
    """Puts the seed (idle until it is planted, so nothing of it runs elsewhere first) in a memory
    group of its own, where one can be made (seal/memgroup.py)."""
    limit = learner_memory_bytes(address_space_mb, first_arena, MAX_FURTHER * FURTHER_ARENA_BYTES)
    group = MemoryGroup.make(str(os.getpid()), limit)
    if group is not None:
        try:
            group.add(seed.child.pid)
        except OSError:
            group.remove()
            return None
    return group


def first_arena_bytes(address_space_mb: int) -> int:
    """The first line's data region: half the rank's address space, so that a call whose buffers
    fit in its memory unsealed fits here too (an 80 MiB Allreduce failed sealed in 64 MiB); at
    least FURTHER_ARENA_BYTES. Its pages are touched only as buffers use them (arena.py), and
    both processes' limits leave its address space out."""
    return max(FURTHER_ARENA_BYTES, (address_space_mb << 20) // 2)


def _failure(data: bytes, index: int) -> RankError:
    try:
        f = read_failure(data)
    except UnsafeValue as exc:
        return RankError("tampered", f"the solution tampered with its failure report: {exc}", "", "", index)
    return worded(clipped(f["kind"], 40), f["summary"], f["where"], f["traceback"], index)


def where_it_died(gone: LearnerGone) -> str:
    """Where the learner process was, in the words of the learner's code: a call of the task
    protocol (calls.py) is the harness's, so after it the learner had made no call of its own."""
    if gone.where in ("after next task", "after task arguments", "after result"):
        return "before its first call"
    return gone.where


def mirror_death(gone: LearnerGone) -> None:
    """Ends this process as the learner process ended: its exit status, or its signal."""
    sys.stdout.flush()
    sys.stderr.flush()
    status = gone.status
    if status.startswith("exit status "):
        os._exit(int(status.rsplit(" ", 1)[1]))
    if status.startswith("killed by SIG"):
        signum = signal.Signals[status.removeprefix("killed by ")]
        import faulthandler

        faulthandler.disable()  # the learner's stack is the one in the stack file
        _restore_default_action(signum)
        # At this thread: a signal sent to the process may be taken by another thread (the main
        # one, waiting in the engine), and a core-dumping one (SIGABRT, SIGSEGV) ends the process
        # only when that thread runs, after this one went on to the exit below.
        signal.pthread_kill(threading.get_ident(), signum)
    os._exit(1)


def _restore_default_action(signum: int) -> None:
    """``signal.signal`` works in the main thread only; the watcher thread, which mirrors a
    death while the main thread waits in the engine, resets the handler through libc."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signum, signal.SIG_DFL)
    else:
        import ctypes

        ctypes.CDLL(None).signal(signum, 0)  # 0 is SIG_DFL


def _code_pid(waiter: int) -> int:
    """The process the learner's code runs in: in a PID namespace of its own the waiter's
    grandchild, the namespace's second process (learner_main.py's enter_sandbox); else the
    waiter itself."""
    for first in _children(waiter):
        if _pid_inside(first) == 1:
            for learner in _children(first):
                if _pid_inside(learner) == 2:
                    return learner
    return waiter


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return pid


def _pid_inside(pid: int) -> int:
    """The process's pid in its innermost PID namespace."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return -1
    return int(next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[-1])
