"""Learner code that makes sub-communicators (tests/test_subcomm.py runs it through
tests/programs.py's call_solution, sealed and not)."""

import numpy as np

import distlab


def three_groups_of_four(comm):
    """12 ranks: Split by rank // 4 with the key reversing each group's order; in each group an
    Allreduce, a ring Sendrecv, the same Allreduce on a Dup; a Create_group of world ranks 0, 5
    and 11; a Split that leaves the even ranks out."""
    r = comm.Get_rank()
    sub = comm.Split(r // 4, -r)
    x = np.arange(5, dtype=np.float64) * (r + 1)
    total = np.empty_like(x)
    sub.Allreduce(x, total)
    me, p = sub.Get_rank(), sub.Get_size()
    left = np.empty(1)
    sub.Sendrecv(np.array([float(r)]), (me + 1) % p, recvbuf=left, source=(me - 1) % p)
    dup = sub.Dup()
    again = np.empty_like(x)
    dup.Allreduce(x, again)
    dup.Free()
    trio = None
    if r in (0, 5, 11):
        group = comm.Get_group().Incl([0, 5, 11])
        made = comm.Create_group(group)
        ranks = np.array([r], dtype=np.int64)
        summed = np.empty(1, dtype=np.int64)
        made.Allreduce(ranks, summed)
        trio = [made.Get_rank(), made.Get_size(), int(summed[0])]
        made.Free()
    odd = comm.Split(0 if r % 2 else distlab.UNDEFINED, r)
    return {"rank": me, "size": p, "total": total.tolist(), "left": float(left[0]),
            "dup_total": again.tolist(), "trio": trio, "left_out": odd is None,
            "odd_size": odd.Get_size() if odd is not None else 0}


def ring_on_sub(comm):
    return ring_on(comm, True, 1024)


def ring_on_task(comm):
    return ring_on(comm, False, 1024)


def big_ring_on_sub(comm):
    return ring_on(comm, True, 200_000)


def big_ring_on_task(comm):
    return ring_on(comm, False, 200_000)


def ring_on(comm, on_sub, nbytes):
    """A ring of Sendrecv among the even ranks and among the odd ones (8 ranks), on a Split
    communicator (``on_sub``) or on the task's with the same world ranks as peers; the online
    clock's time after it."""
    r = comm.Get_rank()
    mine = [q for q in range(comm.Get_size()) if q % 2 == r % 2]
    i = mine.index(r)
    out = np.full(nbytes // 8, float(r))
    got = np.empty_like(out)
    if on_sub:
        sub = comm.Split(r % 2, r)
        for _ in range(3):
            sub.Sendrecv(out, (i + 1) % 4, recvbuf=got, source=(i - 1) % 4)
    else:
        for _ in range(3):
            comm.Sendrecv(out, mine[(i + 1) % 4], recvbuf=got, source=mine[(i - 1) % 4])
    return comm.now(), float(got[0])


def bad_calls(comm):
    """Each misuse of a communicator call, and what it raised (two ranks, the same on both)."""
    said = {}

    def attempt(name, call):
        try:
            call()
            said[name] = "no error"
        except Exception as error:  # noqa: BLE001 - the message is what the test reads
            said[name] = f"{type(error).__name__}: {error}"

    attempt("negative color", lambda: comm.Split(-3))
    attempt("color not an int", lambda: comm.Split("red"))
    attempt("rank out of range", lambda: comm.Get_group().Incl([0, 2]))
    attempt("rank twice", lambda: comm.Get_group().Incl([1, 1]))
    attempt("not a group", lambda: comm.Create_group([0, 1]))
    if comm.Get_rank() == 1:
        attempt("not a member", lambda: comm.Create_group(comm.Get_group().Incl([0])))
    attempt("free the task's", comm.Free)
    dup = comm.Dup()
    dup.Free()
    attempt("use after free", dup.Barrier)
    comm.Barrier()
    return said


def deadlock_across_groups(comm):
    """4 ranks, the evens and the odds each a communicator: 0 and 1 enter their group's
    Allreduce while their partners 2 and 3 wait for a message from the other group's, which
    never comes (0 -> 2 -> 1 -> 3 -> 0)."""
    r = comm.Get_rank()
    sub = comm.Split(r % 2, r)
    x = np.zeros(1)
    if r < 2:
        sub.Allreduce(x.copy(), x)
    else:
        comm.Recv(x, source=3 - r)


def partitioned_tokens(comm):
    """4 ranks, the evens and the odds each a communicator: each step world rank 0 sends a token
    to world rank 2 on the evens' communicator, which waits at most 0.3 s (wall) for it; the
    steps whose token arrived, on rank 2."""
    import time

    r = comm.Get_rank()
    sub = comm.Split(r % 2, r)
    token, arrived = np.zeros(1), []
    for step in range(7):
        comm.mark("step")  # on the task's communicator: the step is the rank's
        if r == 0:
            sub.Send(np.array([float(step)]), dest=1, tag=step)
        elif r == 2:
            request = sub.Irecv(token, source=0, tag=step)
            deadline = time.monotonic() + 0.3
            while not request.Test():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)
            else:
                arrived.append(step)
    return arrived


def split_and_free_often(comm, rounds=60):
    """Splits and frees a communicator (and its online clock's side channel) every round, as
    code that makes its groups per call does; the gloo groups still held and this process's
    threads after the rounds (unsealed, the rank's own process)."""
    from pathlib import Path

    from distlab.runtime.engines import gloo

    for _ in range(rounds):
        sub = comm.Split(comm.rank % 2, comm.rank)
        sub.Allreduce(np.ones(1), np.zeros(1))
        sub.Free()
    threads = int(next(line for line in Path("/proc/self/status").read_text().splitlines()
                       if line.startswith("Threads:")).split()[1])
    return len(gloo._SUB_GROUPS), threads
