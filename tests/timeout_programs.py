"""Learner code that gives up waiting: comm.set_timeout and the calls' timeout= (tests/test_timeouts.py).

Each function returns what it saw; the ranks meet again over a Barrier after a timeout, so a
timed-out call's message (or collective) can still be finished and checked."""

import time

import numpy as np

import distlab


def _timed(call):
    """(message, call, peer, waited, seconds it took) of the CommTimeout ``call()`` raises."""
    started = time.monotonic()
    try:
        call()
    except distlab.CommTimeout as error:
        return str(error), error.call, error.peer, error.waited_s, time.monotonic() - started
    return None


def _said(call):
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the test reads what was raised
        return f"{type(error).__name__}: {error}"
    return "nothing raised"


def receive_late(comm):
    """Rank 0's receive gives up before rank 1 sends; the message, sent after, goes to rank 0's
    next receive from rank 1 (MPI withdrew the first; gloo's orphan hands it over)."""
    got = {}
    if comm.rank == 0:
        buf = np.zeros(4)
        got["timed_out"] = _timed(lambda: comm.Recv(buf, source=1, tag=5, timeout=0.3))
        got["untouched"] = buf.tolist()
        got["now"] = comm.now()
        comm.Barrier()
        comm.Recv(buf, source=1, tag=5)
        got["later"] = buf.tolist()
        got["any"] = _timed(lambda: comm.Recv(buf, timeout=0.2))
    else:
        comm.Barrier()
        comm.Send(np.arange(4.0) + 1, dest=0, tag=5)
    comm.Barrier()
    return got


def collective_left_behind(comm):
    """Ranks 0 and 1 give up on an Allreduce that rank 2 reaches late; their communicator is then
    broken, rank 2 still finishes the collective with their contributions, and a communicator
    made before goes on working."""
    other = comm.Dup()
    got = {}
    values = np.full(3, float(comm.rank + 1))
    out = np.zeros(3)
    if comm.rank < 2:
        got["timed_out"] = _timed(lambda: comm.Allreduce(values, out, timeout=0.3))
        got["broken"] = _said(lambda: comm.Barrier())
        got["broken_send"] = _said(lambda: comm.Send(values, dest=2))
    else:
        time.sleep(0.8)
        comm.Allreduce(values, out, timeout=10)
        got["sum"] = out.tolist()
    check = np.array([float(comm.rank)])
    other.Allreduce(check.copy(), check)
    got["other"] = float(check[0])
    return got


def send_and_wait_give_up(comm):
    """With comm.set_timeout, a rendezvous Send nobody receives yet and a Wait on a receive nobody
    sends give up; the send stays under way and is received later, intact."""
    n = 40_000  # 320 kB: past the eager limit, a rendezvous
    got = {}
    comm.set_timeout(0.25)
    got["timeout"] = comm.get_timeout()
    if comm.rank == 0:
        data = np.arange(n, dtype=np.float64)
        got["send"] = _timed(lambda: comm.Send(data, dest=1, tag=1))
        data[:] = -1  # the learner may reuse its buffer at once: the message is a copy
        request = comm.Irecv(np.zeros(1), source=1, tag=9)
        got["wait"] = _timed(lambda: request.Wait())
        got["wait_all"] = _timed(lambda: distlab.Request.Waitall([request], timeout=0.1))
        comm.set_timeout(None)
        comm.Barrier()
        request.Wait()
    else:
        comm.set_timeout(None)
        comm.Barrier()
        late = np.zeros(n)
        comm.Recv(late, source=0, tag=1)
        got["received"] = bool(np.array_equal(late, np.arange(n, dtype=np.float64)))
        comm.Send(np.ones(1), dest=0, tag=9)
    comm.Barrier()
    return got


def waiting_in_a_cycle(comm):
    """Every rank receives from its right neighbour first, with a timeout: a deadlock without
    one; here every rank gives up, and the supervisor must not end the job before."""
    r, p = comm.rank, comm.size
    buf = np.zeros(2)
    timed_out = _timed(lambda: comm.Recv(buf, source=(r + 1) % p, tag=3, timeout=1.5))
    comm.Sendrecv(np.zeros(2), dest=(r + 1) % p, sendtag=3, recvbuf=buf, source=(r - 1) % p,
                  recvtag=3)
    return {"timed_out": timed_out}


def bad_timeouts(comm):
    buf = np.zeros(1)
    return {
        "zero": _said(lambda: comm.Recv(buf, source=0, timeout=0)),
        "negative": _said(lambda: comm.set_timeout(-1)),
        "text": _said(lambda: comm.Barrier(timeout="soon")),
        "infinite": _said(lambda: comm.Allreduce(buf, buf.copy(), timeout=float("inf"))),
        "unset": comm.get_timeout(),
    }


def _around_a_mark(comm, wait_s, then_wait):
    """Rank 1 sends one message, marks "checkpoint", sends a second; rank 0 takes the first, then
    gives the second ``wait_s``: a rank killed or stopped exactly at the mark never sent it."""
    if comm.rank == 1:
        comm.Send(np.ones(1), dest=0, tag=1)
        comm.mark("checkpoint")
        comm.Send(np.full(1, 2.0), dest=0, tag=2)
        return None
    buf = np.zeros(1)
    comm.Recv(buf, source=1, tag=1)
    missed = _timed(lambda: comm.Recv(buf, source=1, tag=2, timeout=wait_s)) is not None
    if missed and then_wait:  # a stopped rank sends it once continued
        comm.Recv(buf, source=1, tag=2)
    return {"missed": missed, "last": float(buf[0])}


def killed_at_a_mark(comm):
    """Rank 1 notes "before" in the store, marks "checkpoint", notes "after"; rank 0, which
    touches no dead peer, reads the store once rank 1 is gone: killed exactly at the mark, rank 1
    never wrote "after"."""
    store = comm.store()
    if comm.rank == 1:
        store.set("before", "1")
        comm.mark("checkpoint")
        store.set("after", "1")
        return None
    store.wait(["before"], timeout=20)
    time.sleep(1.0)
    return {"after": _timed(lambda: store.get("after", timeout=0.3)) is None}


def stopped_at_a_mark(comm):
    return _around_a_mark(comm, 0.5, then_wait=True)


def noticed_reclaim(comm, steps=60):
    """Rank 1 catches SIGTERM (its instance is reclaimed), notes in the store at which step it
    saw the notice, and works on until the SIGKILL that ends the grace period; rank 0 reads the
    note and never touches rank 1 again."""
    import signal

    store = comm.store()
    if comm.rank == 1:
        noticed = []
        signal.signal(signal.SIGTERM, lambda *_: noticed.append(True))
        for step in range(steps):
            comm.mark("step")
            if noticed and noticed[0] is True:
                store.set("noticed at step", str(step))
                noticed[0] = "noted"
            time.sleep(0.05)
        return "never reclaimed"
    store.wait(["noticed at step"], timeout=20)
    time.sleep(1.5)  # past the grace period: the SIGKILL lands while this rank still runs
    return int(store.get("noticed at step"))
