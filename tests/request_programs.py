"""Learner code waiting on several requests at once (tests/test_waitany.py)."""

import numpy as np

import distlab


def first_come_first_served(comm):
    """Rank 0 waits for whichever of ranks 1 and 2 sends first; rank 1 sends only once rank 0
    has seen rank 2's message and found the pair not all done."""
    r = comm.Get_rank()
    if r == 0:
        late, early = np.zeros(2), np.zeros(2)
        requests = [comm.Irecv(late, source=1, tag=5), comm.Irecv(early, source=2, tag=6)]
        status = distlab.Status()
        first = distlab.Request.Waitany(requests, status)
        seen = [(first, status.Get_source(), status.Get_tag(), early.tolist(), late.tolist())]
        all_done_early = distlab.Request.Testall(requests)
        comm.Send(np.zeros(1), dest=1, tag=9)  # now rank 1 may send
        second = distlab.Request.Waitany(requests, status)
        seen.append((second, status.Get_source(), status.Get_tag(), early.tolist(), late.tolist()))
        return {"seen": seen, "testall_early": all_done_early,
                "testall_late": distlab.Request.Testall(requests),
                "none_left": distlab.Request.Waitany(requests) == distlab.UNDEFINED}
    if r == 1:
        comm.Recv(np.zeros(1), source=0, tag=9)
    comm.Send(np.full(2, float(r)), dest=0, tag=4 + r)
    return None


def sized_by_probe(comm):
    """Rank 0 learns the size of rank 1's message by probing, then receives exactly it; an
    Iprobe before rank 1 may send finds nothing."""
    r = comm.Get_rank()
    if r == 0:
        early = comm.Iprobe(source=1)
        comm.Send(np.zeros(1), dest=1, tag=9)  # now rank 1 may send
        status = distlab.Status()
        comm.Probe(source=distlab.ANY_SOURCE, tag=distlab.ANY_TAG, status=status)
        n = status.Get_count(np.float64)
        got = np.empty(n)
        comm.Recv(got, source=status.Get_source(), tag=status.Get_tag())
        late = distlab.Status()
        comm.Send(np.zeros(1), dest=1, tag=9)
        while not comm.Iprobe(source=1, tag=4, status=late):
            pass
        comm.Recv(np.empty(2, dtype=np.int32), source=1, tag=4)
        return {"early": early, "source": status.Get_source(), "tag": status.Get_tag(),
                "bytes": status.Get_count(), "got": got.tolist(), "late": late.Get_count(np.int32)}
    comm.Recv(np.zeros(1), source=0, tag=9)
    comm.Send(np.arange(5.0), dest=0, tag=3)
    comm.Recv(np.zeros(1), source=0, tag=9)
    comm.Send(np.arange(2, dtype=np.int32), dest=0, tag=4)
    return None
