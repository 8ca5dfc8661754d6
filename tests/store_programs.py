"""Learner code using the task's key-value store (tests/test_store.py)."""

import time

import distlab


def membership(comm):
    """Every rank registers, rank 0 waits for them all and counts them; a compare_set elects a
    leader; a get of a key nobody sets times out; each rank says what it saw."""
    r, p = comm.Get_rank(), comm.Get_size()
    store = comm.store()
    store.set(f"alive/{r}", f"rank {r}")
    joined = store.add("joined", 1)
    store.wait([f"alive/{q}" for q in range(p)], timeout=20)
    seen = [store.get(f"alive/{q}").decode() for q in range(p)]
    leader = store.compare_set("leader", "", f"{r}").decode()  # the first to try wins
    comm.Barrier()
    started = time.monotonic()
    try:
        store.get("never-set", timeout=0.4)
        timed_out = None
    except distlab.CommTimeout as error:
        timed_out = (str(error), error.call, error.waited_s, time.monotonic() - started)
    deleted = store.delete_key(f"alive/{r}") if r == 0 else None
    comm.Barrier()
    return {"seen": seen, "joined": joined, "leader": leader, "timed_out": timed_out,
            "deleted": deleted, "keys": store.num_keys(), "final": store.add("joined", 0)}


def bad_store_calls(comm):
    said = {}

    def attempt(name, call):
        try:
            call()
            said[name] = "no error"
        except Exception as error:  # noqa: BLE001 - the message is what the test reads
            said[name] = f"{type(error).__name__}: {error}"

    store = comm.store()
    attempt("key not a str", lambda: store.set(5, "x"))
    attempt("value not bytes", lambda: store.set("k", 3.5))
    attempt("timeout not > 0", lambda: store.get("k", timeout=0))
    return said


def no_store(comm):
    comm.store().set("key", "value")


def heartbeats(comm):
    """Rank 1 beats (its step) into the store every 20 ms until rank 0 says done; rank 0 reads
    the beat for 1.6 s while the fault plan stops rank 1 at step 5 for 0.8 s: each new beat rank
    0 read, with when (seconds from its start)."""
    store = comm.store()
    if comm.Get_rank() == 1:
        step = 0
        while not store.add("done", 0):
            comm.mark("step")
            store.set("beat/1", str(step))
            step += 1
            time.sleep(0.02)
        return None
    seen, start = [], time.monotonic()
    while time.monotonic() < start + 1.6:
        try:
            beat = int(store.get("beat/1", timeout=0.5))
        except distlab.CommTimeout:
            continue
        if not seen or seen[-1][0] != beat:
            seen.append((beat, time.monotonic() - start))
        time.sleep(0.01)
    store.add("done", 1)
    return seen


def cut_off(comm):
    """Each step every rank writes its key and reads rank 0's with a short timeout; a partition
    (the test's plan) cuts ranks 1 and 2 off in steps 1 and 2: which steps each rank got
    through. Every call waits at most 0.3 s (a set from the far side too)."""
    store = comm.store()
    store.set_timeout(0.3)
    got = []
    for step in range(4):
        comm.mark("step")
        try:
            store.set(f"step{step}/{comm.Get_rank()}", "here")
            if comm.Get_rank() == 0:
                store.set(f"ready{step}", "yes")
            store.get(f"ready{step}")
            got.append(step)
        except distlab.CommTimeout as error:
            got.append(error.call)
        comm.Barrier()
    return got
