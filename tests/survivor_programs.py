"""Learner code that carries on after a peer's death (tests/test_survivors.py)."""

import time

import numpy as np

import distlab


def allreduce_through_a_death(comm, steps=6):
    """Every rank adds its ones each step; the plan kills rank 2 as step 3 starts. The others
    catch PeerFailed, revoke, acknowledge, agree and shrink, then redo the step and finish over
    the survivors: each sum is the number of ranks alive."""
    sums, failure = [], None
    for _ in range(steps):
        comm.mark("step")
        while True:
            out = np.zeros(2)
            started = time.monotonic()
            try:
                comm.Allreduce(np.ones(2), out)
                break
            except distlab.PeerFailed as error:
                waited = time.monotonic() - started
                comm.Revoke()
                failed = comm.Get_failed().Get_size()
                comm.Ack_failed()
                agreed = comm.Agree(1)
                comm = comm.Shrink()
                failure = {"call": error.call, "ranks": list(error.ranks), "failed": failed,
                           "agreed": agreed, "size": comm.size, "rank": comm.rank,
                           "message": str(error), "waited": waited}
        sums.append(float(out[0]))
    return {"sums": sums, "failure": failure}


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
