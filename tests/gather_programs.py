"""Learner code calling Gather, Scatter, Allgatherv and Alltoall (tests/test_gathers.py)."""

import numpy as np


def blocks_of(rank, n, dtype="float64"):
    return (np.arange(n) + 100 * rank).astype(dtype)


def every_call(comm):
    """Each call once, with a root that is not 0 and blocks of different sizes for Allgatherv;
    what every rank got."""
    r, p = comm.Get_rank(), comm.Get_size()
    out = {}
    mine = blocks_of(r, 3)
    gathered = np.full(3 * p, -1.0) if r == 2 else None
    comm.Gather(mine, gathered, root=2)
    out["gather"] = gathered.tolist() if gathered is not None else None
    piece = np.empty(2, dtype=np.int64)
    comm.Scatter(np.arange(2 * p, dtype=np.int64) * 10 if r == p - 1 else None, piece, root=p - 1)
    out["scatter"] = piece.tolist()
    counts = [k + 1 for k in range(p)]
    displs = [sum(counts[:k]) + k for k in range(p)]  # a gap of one element after each block
    whole = np.full(sum(counts) + p, -1, dtype=np.int32)
    comm.Allgatherv(blocks_of(r, counts[r], "int32"), [whole, (counts, displs)])
    out["allgatherv"] = whole.tolist()
    swapped = np.empty(2 * p)
    comm.Alltoall(np.repeat(np.arange(p, dtype=np.float64) + 10 * r, 2), swapped)
    out["alltoall"] = swapped.tolist()
    return out


def one_collective(comm, op, n):
    """One call of ``op`` with blocks of n float64 (Allgatherv: rank r's block n(r + 1)); the
    online clock's time after it."""
    r, p = comm.Get_rank(), comm.Get_size()
    block = np.ones(n)
    if op == "Gather":
        comm.Gather(block, np.empty(n * p) if r == 0 else None, root=0)
    elif op == "Scatter":
        comm.Scatter(np.ones(n * p) if r == 1 else None, block, root=1)
    elif op == "Allgatherv":
        counts = [n * (k + 1) for k in range(p)]
        comm.Allgatherv(np.ones(counts[r]), [np.empty(sum(counts)), counts])
    elif op == "Allgatherv equal":
        comm.Allgatherv(block, [np.empty(n * p), [n] * p])
    else:
        comm.Alltoall(np.ones(n * p), np.empty(n * p))
    return comm.now()


def misuse(comm):
    said = {}

    def attempt(name, call):
        try:
            call()
            said[name] = "no error"
        except Exception as error:  # noqa: BLE001 - the message is what the test reads
            said[name] = f"{type(error).__name__}: {error}"

    p = comm.Get_size()
    if comm.Get_rank() == 0:  # checked before any rank enters: the others are not left waiting
        attempt("gather recvbuf", lambda: comm.Gather(np.ones(2), np.empty(3), root=0))
    attempt("alltoall blocks", lambda: comm.Alltoall(np.ones(2 * p + 1), np.empty(2 * p + 1)))
    attempt("allgatherv counts", lambda: comm.Allgatherv(np.ones(1), [np.empty(4), [1]]))
    attempt("allgatherv past", lambda: comm.Allgatherv(np.ones(1), [np.empty(2), ([1] * p, [0, 5])]))
    attempt("gather in place", lambda: comm.Gather(__import__("distlab").IN_PLACE, np.empty(2 * p)))
    comm.Barrier()
    return said


def nonblocking_ones(comm):
    """Ibcast, Iallgather and Ireduce_scatter_block posted together, completed by one Waitall."""
    import distlab

    r, p = comm.Get_rank(), comm.Get_size()
    told = np.arange(4.0) if r == 1 else np.zeros(4)
    everyone = np.empty(2 * p, dtype=np.int64)
    mine = np.empty(3)
    requests = [comm.Ibcast(told, root=1),
                comm.Iallgather(np.array([r, -r], dtype=np.int64), everyone),
                comm.Ireduce_scatter_block(np.arange(3.0 * p) * (r + 1), mine)]
    distlab.Request.Waitall(requests)
    return told.tolist(), everyone.tolist(), mine.tolist()


def one_nonblocking(comm, op, n):
    """One nonblocking collective of blocks of n float64, waited for at once; comm.now() after."""
    p = comm.Get_size()
    if op == "Bcast":
        request = comm.Ibcast(np.ones(n), root=0)
    elif op == "Allgather":
        request = comm.Iallgather(np.ones(n), np.empty(n * p))
    else:
        request = comm.Ireduce_scatter_block(np.ones(n * p), np.empty(n))
    request.Wait()
    return comm.now()


def uneven_exchange(comm):
    """Alltoallv: rank i sends i + j + 1 elements (valued 100 i + j) to rank j, the received
    blocks laid out in reverse rank order with a gap of one element between them."""
    r, p = comm.Get_rank(), comm.Get_size()
    send_counts = [r + j + 1 for j in range(p)]
    send = np.concatenate([np.full(c, 100.0 * r + j) for j, c in enumerate(send_counts)])
    recv_counts = [i + r + 1 for i in range(p)]
    recv_at, at = [0] * p, 0
    for i in reversed(range(p)):
        recv_at[i] = at
        at += recv_counts[i] + 1
    recv = np.full(at, -1.0)
    comm.Alltoallv([send, send_counts], [recv, (recv_counts, recv_at)])
    return recv.tolist()


def timed_alltoallv(comm, n, circulant):
    """Alltoallv with blocks of n (1 + (j - i) mod p) float64 from rank i to rank j when
    ``circulant`` (every step's blocks alike), else n (1 + i + 2j); comm.now() after."""
    r, p = comm.Get_rank(), comm.Get_size()
    counts = [n * (1 + (j - r) % p) if circulant else n * (1 + r + 2 * j) for j in range(p)]
    came = [n * (1 + (r - i) % p) if circulant else n * (1 + i + 2 * r) for i in range(p)]
    comm.Alltoallv([np.ones(sum(counts)), counts], [np.empty(sum(came)), came])
    return comm.now()
