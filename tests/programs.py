"""Small rank programs for launcher tests: each is ``program(comm, solution, *args)``."""

from __future__ import annotations

import os
import time

import numpy as np


def ring_sum(comm, solution, n):
    """Passes a buffer once around the ring with Sendrecv and returns what arrived."""
    rank, size = comm.Get_rank(), comm.Get_size()
    out = np.full(n, float(rank))
    got = np.empty(n)
    comm.Sendrecv(out, dest=(rank + 1) % size, recvbuf=got, source=(rank - 1) % size)
    return got


def call_solution(comm, solution, name, *args):
    """Calls solution.<name>(comm, *args) and returns its result."""
    return getattr(solution, name)(comm, *args)


def send_send_deadlock(comm, solution, n):
    """Every rank sends to its right neighbour first: deadlocks once n is past the eager limit."""
    rank, size = comm.Get_rank(), comm.Get_size()
    buf = np.zeros(n)
    comm.Send(buf, dest=(rank + 1) % size)
    comm.Recv(buf, source=(rank - 1) % size)
    return buf.sum()


def shared_memory_segments(comm, solution):
    """What the job's folder for Open MPI's shared-memory segments holds once ranks have talked."""
    comm.Barrier()
    return sorted(os.listdir(os.environ["OMPI_MCA_btl_sm_backing_directory"]))


def recv_from_finished(comm, solution):
    """Rank 0 waits for a message that rank 1 never sends; rank 1 just returns."""
    if comm.Get_rank() == 0:
        comm.Recv(np.zeros(1), source=1)
    return comm.Get_rank()


def spin(comm, solution, rank_that_spins):
    if comm.Get_rank() == rank_that_spins:
        while True:
            pass
    comm.Barrier()


def os_abort(comm, solution):
    if comm.Get_rank() == 1:
        os.abort()
    comm.Barrier()


def sleep_then_return(comm, solution, seconds):
    time.sleep(seconds)
    return comm.Get_rank()


def allocate(comm, solution, megabytes):
    block = np.ones(megabytes * 1024 * 1024 // 8)
    return float(block.sum())


def burn_cpu(comm, solution):
    x = 0
    while True:
        x += 1


def write_file(comm, solution, path, megabytes):
    with open(f"{path}.{comm.Get_rank()}", "wb") as f:
        for _ in range(megabytes):
            f.write(b"x" * 1024 * 1024)
    return megabytes


def slow_big_allreduce(comm, solution, n):
    """All ranks sit in one big collective: slow but not stuck."""
    buf = np.ones(n)
    out = np.empty_like(buf)
    comm.Allreduce(buf, out)
    return float(out[0])


def token_steps(comm, solution, steps, pause_s):
    """A token goes round the ring once per step, marked with ``comm.mark("step")``.

    Rank 0 holds the token ``pause_s`` before passing it on, so the other ranks spend nearly every
    step blocked in Recv: a rank stopped by a fault then looks exactly like a stuck one, and a
    fault "at step N" finds its rank sitting at step N. Returns the attempt number the launcher
    gave the ranks (DISTLAB_ATTEMPT), to show a restart happened.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    token = np.zeros(1)
    for step in range(steps):
        comm.mark("step")
        if rank == 0:
            time.sleep(pause_s)
            token[0] = step
            comm.Send(token, dest=1 % size)
            comm.Recv(token, source=size - 1)
        else:
            comm.Recv(token, source=rank - 1)
            comm.Send(token, dest=(rank + 1) % size)
    return int(os.environ.get("DISTLAB_ATTEMPT", "-1"))


def mpi_idle_strategy(comm, solution):
    """How Open MPI's ranks give the core away while they wait (unsealed: the rank's own env)."""
    return os.environ.get("OMPI_MCA_threads_pthreads_yield_strategy", "sched_yield")


def address_space_limit(comm, solution):
    """The soft address-space limit the rank runs under, in MiB."""
    import resource

    return resource.getrlimit(resource.RLIMIT_AS)[0] >> 20


def leftover_message(comm, solution, leave):
    """Rank 0 sends rank 1 one float with tag 7: ``leave`` (1.0) it is never received; otherwise
    (2.0) rank 1 receives a float with tag 7 from rank 0 and returns it."""
    rank = comm.Get_rank()
    if rank == 0:
        comm.Send(np.array([1.0 if leave else 2.0]), dest=1, tag=7)
    if rank == 1 and not leave:
        got = np.zeros(1)
        comm.Recv(got, source=0, tag=7)
        return float(got[0])
    return None


def threads_until_refused(comm, solution):
    """Starts threads that wait, until one cannot start."""
    import threading

    done = threading.Event()
    try:
        while True:
            threading.Thread(target=done.wait, daemon=True).start()
    finally:
        done.set()


def task_group_path(comm, solution, leave):
    """The path of the engine group the task runs on (unsealed: the proxy itself); ``leave``:
    rank 0 first sends rank 1 a message it never receives."""
    if leave and comm.Get_rank() == 0:
        comm.Send(np.array([1.0]), dest=1, tag=7)
    return comm._engine.path


def threads_that_allocate(comm, solution, threads):
    """How much address space (MiB) ``threads`` threads take that each malloc while all live."""
    import ctypes
    import threading

    def vm_size_mib():
        status = open("/proc/self/status").read()
        return int(status.split("VmSize:")[1].split()[0]) >> 10

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    before = vm_size_mib()
    all_in, measured = threading.Barrier(threads + 1), threading.Event()

    def allocate():
        libc.malloc(4096)  # a thread's first malloc is where glibc gives it an arena
        all_in.wait()
        measured.wait()

    workers = [threading.Thread(target=allocate) for _ in range(threads)]
    for worker in workers:
        worker.start()
    all_in.wait()
    grown = vm_size_mib() - before
    measured.set()
    for worker in workers:
        worker.join()
    return grown


def marked_phases(comm, solution, n):
    """Three phases: a ring exchange ("ring"), an Allreduce ("reduce"), then two "step"s of one
    Send each to the right neighbour's matching Recv."""
    rank, size = comm.Get_rank(), comm.Get_size()
    comm.mark("ring")
    got = np.empty(n)
    comm.Sendrecv(np.full(n, float(rank)), dest=(rank + 1) % size, recvbuf=got, source=(rank - 1) % size)
    comm.mark("reduce")
    comm.compute(seconds=1e-3, label="work")
    comm.Allreduce(np.ones(n), got)
    for _ in range(2):
        comm.mark("step")
        if rank % 2 == 0:
            comm.Send(np.zeros(2 * n), dest=rank + 1)
        else:
            comm.Recv(np.empty(2 * n), source=rank - 1)
    return float(got[0])


def call_forms(comm, solution, args):
    """solution.<name>(comm[, MPI]): the learner-style call forms of tests/test_mpi4py_forms.py."""
    name, *more = args
    if more:
        from mpi4py import MPI

        return getattr(solution, name)(comm, MPI)
    return getattr(solution, name)(comm)


def process_facts(comm, solution):
    """How this rank's process was started: (pid, parent pid, session id, its /proc name, whether
    torch is imported)."""
    with open("/proc/self/comm") as f:
        name = f.read().strip()
    comm.Barrier()
    return os.getpid(), os.getppid(), os.getsid(0), name, "torch" in __import__("sys").modules


def environment_seen(comm, solution, name):
    """The rank's value of the environment variable ``name`` (None where it is not set)."""
    comm.Barrier()
    return os.environ.get(name)


class PerRank:
    """A task argument that rank r may only see its own entry of (runtime/rank/views.py)."""

    def __init__(self, values: tuple[int, ...]) -> None:
        self.values = values

    def for_rank(self, rank: int) -> PerRank:
        return PerRank(tuple(v if r == rank else -1 for r, v in enumerate(self.values)))


def values_seen(comm, solution, cut):
    """What this rank was handed: the entries of each PerRank in a list."""
    return [list(item.values) for item in cut]


def sends_of_every_kind(comm, solution):
    """One send of each kind the sent log copies, each buffer changed right after its call (the
    log keeps what was sent, not what the buffer later held); rank 0 is the Bcast's root. Then
    two that leave no trace there."""
    import numpy as np

    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    buf = np.full(3, 10.0 * rank)
    got = np.empty(3)
    comm.Sendrecv(buf, right, 0, got, left, 0)
    buf += 1
    comm.mark("collectives")
    total = np.empty(3)
    comm.Allreduce(buf, total)
    buf += 1
    root = np.arange(4, dtype=np.int32) if rank == 0 else np.zeros(4, dtype=np.int32)
    comm.Bcast(root, root=0)
    if rank == 0:
        comm.Send(np.array([7], dtype=np.int64), 1)
    elif rank == 1:
        comm.Recv(np.empty(1, dtype=np.int64), 0)
    # What reaches no other rank is not logged: a communicator of one, a message to itself.
    alone = comm.Split(rank, 0)
    alone.Allgather(np.full(2, 5.0), np.empty(2))
    comm.Sendrecv(np.ones(1), rank, 9, np.empty(1), rank, 9)
    return None


def short_messages(comm, solution):
    """Rank 1 sends rank 0 four 8-byte messages, each received into a 1 KiB buffer (Recv, Irecv
    and Wait, Sendrecv, a Recv with a timeout); then every rank sends itself 64 bytes."""
    import numpy as np

    rank, big = comm.Get_rank(), np.empty(128)
    if rank == 1:
        for tag in range(4):
            if tag == 2:
                comm.Sendrecv(np.ones(1), 0, tag, np.empty(1), 0, tag)
            else:
                comm.Send(np.ones(1), 0, tag)
    elif rank == 0:
        comm.Recv(big, 1, 0)
        comm.Irecv(big, 1, 1).Wait()
        comm.Sendrecv(np.ones(1), 1, 2, big, 1, 2)
        comm.Recv(big, 1, 3, timeout=30)
    comm.Sendrecv(np.ones(8), rank, 9, np.empty(8), rank, 9)
    return None


def touched_while_pending(comm, solution, n):
    """Nonblocking collectives whose buffers the program writes before their Wait (MPI leaves the
    result undefined): what each one delivers, sealed or not. Large enough that MPI reads the
    inputs during the Wait, not at the post."""
    from distlab import IN_PLACE, Request

    rank, p = comm.Get_rank(), comm.Get_size()
    in_place = np.full(n, rank + 1.0)
    send, total = np.full(n, rank + 1.0), np.zeros(n)
    block, gathered = np.full(n, float(rank)), np.zeros(n * p)
    shared = np.full(n, 7.0 if rank == 0 else 0.0)
    whole, part = np.tile(np.arange(p, dtype=np.float64), (n, 1)).T.ravel().copy(), np.zeros(n)
    requests = [comm.Iallreduce(IN_PLACE, in_place), comm.Iallreduce(send, total),
                comm.Iallgather(block, gathered), comm.Ibcast(shared, root=0),
                comm.Ireduce_scatter_block(whole, part)]
    for written in (in_place, send, block, shared, whole):
        written[:] = -1.0
    for result in (total, gathered, part):
        result[:] = -2.0
    Request.Waitall(requests)
    return [float(a.min()) for a in (in_place, total, shared, part)] + [float(a.max()) for a in (
        in_place, total, shared, part)] + [gathered[::n].tolist()]


def negative_compute(comm, solution, seconds):
    """Declares ``seconds`` of work (a negative amount would move the virtual clock back)."""
    comm.compute(seconds=seconds)
    return comm.now()


def threads_at_once(comm, solution, rounds):
    """Calls from several threads at once, as mpi4py's threads make them: two threads exchange
    with the neighbours on tags of their own while a third allreduces on a communicator of its
    own; a fourth waits for a receive the main thread posted; and the main thread of rank 1 sends
    what rank 0 waits for first only once a thread of its is waiting in a Recv that needs it
    (one channel to the agent would hold that Send up behind the Recv: a deadlock sealed only)."""
    import threading
    import time

    rank, p = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % p, (rank - 1) % p
    own = comm.Dup()  # collectives on one communicator are not made from two threads at once
    done, wrong = {}, []

    def exchange(tag):
        got = np.empty(3)
        for i in range(rounds):
            comm.Sendrecv(np.full(3, 100.0 * rank + 10 * tag + i), right, tag, got, left, tag)
            if got[0] != 100.0 * left + 10 * tag + i:
                wrong.append((tag, i, float(got[0])))
        done[f"tag {tag}"] = rounds

    def allreduce():
        total = np.empty(1)
        for i in range(rounds):
            own.Allreduce(np.array([float(rank + i)]), total)
            if total[0] != p * (p - 1) / 2 + p * i:
                wrong.append(("sum", i, float(total[0])))
        done["sum"] = rounds

    posted = np.zeros(2)
    request = comm.Irecv(posted, left, 11)

    def wait_posted():
        request.Wait()
        done["posted"] = float(posted[0])

    waiting = threading.Event()

    def wait_for_rank_0():
        waiting.set()
        comm.Recv(np.empty(1), 0, 13)
        done["after rank 0"] = 1

    threads = [threading.Thread(target=exchange, args=(tag,)) for tag in (1, 2)]
    threads += [threading.Thread(target=allreduce), threading.Thread(target=wait_posted)]
    if rank == 1:
        threads.append(threading.Thread(target=wait_for_rank_0))
    for thread in threads:
        thread.start()
    comm.Send(np.full(2, float(rank)), right, 11)
    if rank == 1:
        waiting.wait()
        time.sleep(0.2)  # the thread is in its Recv by now
        comm.Send(np.ones(1), 0, 12)
    elif rank == 0:
        comm.Recv(np.empty(1), 1, 12)
        comm.Send(np.ones(1), 1, 13)
    for thread in threads:
        thread.join()
    own.Free()
    return sorted(done.items()), wrong


def large_allreduce(comm, solution, mib):
    """An Allreduce of ``mib`` MiB of float64 a buffer, then a small one: the first and last
    element of each sum."""
    n = (mib << 20) // 8
    total = np.empty(n)
    comm.Allreduce(np.full(n, comm.Get_rank() + 1.0), total)
    small = np.empty(4)
    comm.Allreduce(np.ones(4), small)
    return float(total[0]), float(total[-1]), float(small[0])
