"""Learner code that carries on after a peer's death (tests/test_survivors.py)."""

import time

import numpy as np

import distlab


def allreduce_through_a_death(comm, steps=6):
    """Every rank adds its ones each step; the plan kills rank 2 as step 3 starts. The others
    catch PeerFailed, revoke, acknowledge, agree and shrink, then go back to the last step every
    survivor finished and carry on over the survivors: each sum is the number of ranks alive.

    Going back is what makes the recovery right, not a nicety: a collective that a member dies in
    may end at some ranks and fail at others (a rank leaves its last Allreduce once it has its
    result, and what it was still sending to a peer may die with it), so survivors can find out
    one step apart."""
    sums, failure = [], None
    while len(sums) < steps:
        comm.mark("step")
        out = np.zeros(2)
        started = time.monotonic()
        try:
            comm.Allreduce(np.ones(2), out)
        except distlab.PeerFailed as error:
            waited = time.monotonic() - started
            comm.Revoke()
            agreed = acknowledged_agreement(comm)
            failed = comm.Get_failed().Get_size()  # after the agreement: known to all alike
            comm = comm.Shrink()
            finished_by_all = np.zeros(1)
            comm.Allreduce(np.array([float(len(sums))]), finished_by_all, op=distlab.MIN)
            del sums[int(finished_by_all[0]):]
            failure = {"call": error.call, "ranks": list(error.ranks), "failed": failed,
                       "agreed": agreed, "size": comm.size, "rank": comm.rank,
                       "message": str(error), "waited": waited}
            continue
        sums.append(float(out[0]))
    return {"sums": sums, "failure": failure}


def acknowledged_agreement(comm):
    """Agree(1) once every survivor has acknowledged every failure: a rank that learnt of the
    death only from the revocation acknowledges nothing the first time, and Agree then raises
    PeerFailed at every survivor alike; each acknowledges what it knows now and they agree again."""
    while True:
        comm.Ack_failed()
        try:
            return comm.Agree(1)
        except distlab.PeerFailed:
            continue


def calls_without_survivors(comm):
    try:
        comm.Shrink()
    except RuntimeError as error:
        return str(error)
    return "nothing raised"


def a_rank_leaves_by_itself(comm, steps=6):
    """As allreduce_through_a_death, but rank 2 ends its own process as step 3 starts (no fault
    plan: a crash, an os._exit, the OOM killer)."""
    import os

    if comm.rank == 2:
        for step in range(steps):
            if step == 3:
                os._exit(3)
            comm.mark("step")
            comm.Allreduce(np.ones(2), np.zeros(2))
    return allreduce_through_a_death(comm, steps)


def a_revocation_reaches_every_waiter(comm):
    """Rank 0 waits for a message from rank 1, which waits for one from rank 2, which the plan
    kills as step 1 starts; rank 3 waits in a Barrier. Rank 1 learns of the death, revokes, and
    the revocation ends rank 0's wait (rank 3's Barrier fails by itself); the survivors shrink and meet once more."""
    comm.mark("step")
    if comm.rank == 2:
        comm.mark("step")  # killed here
    buf = np.zeros(1)
    try:
        if comm.rank == 0:
            comm.Recv(buf, source=1)
        elif comm.rank == 1:
            comm.Recv(buf, source=2)
        else:
            comm.Barrier()
        raise AssertionError("the wait ended without a failure")
    except distlab.PeerFailed as error:
        if comm.rank == 1:  # the one rank that saw the death itself
            comm.Revoke()
        call, revoked = error.call, error.revoked
    acknowledged_agreement(comm)
    comm = comm.Shrink()
    comm.Barrier()
    return {"call": call, "revoked": revoked, "survivors": comm.size}


def elastic(comm, steps=6):
    """An elastic loop: every step starts with comm.Admit() (the membership barrier: ranks waiting
    to join enter there, and rank 0 tells them the step), then an Allreduce of ones, the size of
    the group. A rank that dies is survived as in allreduce_through_a_death. A newcomer's task
    starts on the communicator that admitted it, where the others are just out of their Admit:
    it learns the step from rank 0, then does that step's work with them."""
    import os

    joined = os.environ.get("DISTLAB_JOINED") == "1"
    sizes, step = {}, 0  # step -> the group's size then
    if joined:
        where = np.zeros(1)
        comm.Bcast(where, root=0)
        step = int(where[0])
    entering = joined  # a newcomer starts where the others are, just out of their Admit
    while step < steps:
        out = np.zeros(1)
        try:
            if not entering:
                comm.mark("step")
                grown = comm.Admit()
                if grown is not comm:
                    comm = grown
                    comm.Bcast(np.array([float(step)]), root=0)
            entering = False
            comm.Allreduce(np.ones(1), out)
        except distlab.PeerFailed:
            comm.Revoke()
            acknowledged_agreement(comm)
            comm = comm.Shrink()
            finished_by_all = np.zeros(1)
            comm.Allreduce(np.array([float(step)]), finished_by_all, op=distlab.MIN)
            step = int(finished_by_all[0])
            sizes = {s: n for s, n in sizes.items() if s < step}
            continue
        sizes[step] = int(out[0])
        step += 1
    return {"joined": joined, "restarted": os.environ.get("DISTLAB_RESTARTED_RANK"),
            "sizes": [sizes[s] for s in sorted(sizes)], "first": min(sizes),
            "rank": comm.rank, "size": comm.size}


def admit_alone(comm):
    """comm.Admit() in a task whose plan adds no ranks: the same communicator, on every rank."""
    return comm.Admit() is comm
