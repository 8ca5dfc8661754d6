"""Problem 02, reference solution: measure the network, then model the collectives with it.

The alpha-beta model says a message of n bytes over a link takes alpha + n * beta: a fixed latency
plus a time per byte. To measure it, bounce messages of several sizes between two ranks
(ping-pong) and read the clock. A round trip crosses the link twice, so the one-way time is half
of it. Then fit the line t = alpha + n * beta through the (size, one-way time) points by least
squares: the intercept is alpha, the slope is beta.

Each rank measures the link to its right neighbour, the link a ring uses. The ranks take turns,
one pair at a time, so that nobody is busy elsewhere when its partner pings it. Each size is
repeated, and the fastest round trip is kept: on a shared network, a spike only ever adds time.

With alpha and beta known, each allreduce algorithm costs a closed form in p (ranks) and n
(bytes). Latency-optimal algorithms (recursive doubling) win on small messages, and
bandwidth-optimal ones (the ring, Rabenseifner) win on large ones. `choose` just asks the
formulas.
"""

import numpy as np

ALGORITHMS = ("ring", "recursive_doubling", "binomial_tree", "rabenseifner")
REPEATS = 10  # round trips per size; the fastest is the network without interference


def round_trip(comm, peer, buf):
    """Sends buf to peer and waits for it to come back; returns the virtual seconds it took."""
    start = comm.now()
    comm.Send(buf, dest=peer)
    comm.Recv(buf, source=peer)
    return comm.now() - start


def fit_line(sizes, times):
    """Least squares through (size, time) points: returns (alpha, beta) of t = alpha + n * beta."""
    x = np.asarray(sizes, dtype=float)
    design = np.column_stack([np.ones_like(x), x])  # columns: 1 (for alpha), n (for beta)
    (alpha, beta), *_ = np.linalg.lstsq(design, np.asarray(times, dtype=float), rcond=None)
    return float(alpha), float(beta)


def measure(comm, sizes):
    """Returns (alpha, beta) of the link from this rank to its right neighbour (rank + 1) % p:
    alpha in seconds, beta in seconds per byte. Every rank must call it."""
    p, rank = comm.Get_size(), comm.Get_rank()
    if p == 1:
        return 0.0, 0.0
    right, left = (rank + 1) % p, (rank - 1) % p
    buf = np.zeros(max(sizes), dtype=np.uint8)
    fitted = None
    for turn in range(p):  # in turn `turn`, rank `turn` pings its right neighbour
        # Everybody waits here, so both partners start the turn at the same virtual time: a
        # partner that is still busy would make the first round trip look slower than the link.
        comm.Barrier()
        if rank == turn:
            one_way = [min(round_trip(comm, right, buf[:n]) for _ in range(REPEATS)) / 2
                       for n in sizes]
            fitted = fit_line(sizes, one_way)
        elif (rank - 1) % p == turn:  # my left neighbour pings me: echo every message back
            for n in sizes:
                for _ in range(REPEATS):
                    comm.Recv(buf[:n], source=left)
                    comm.Send(buf[:n], dest=left)
    return fitted


def rounds(p):
    """ceil(log2 p): steps of recursive doubling or of a binomial tree over p ranks."""
    return (p - 1).bit_length()


def predict(algorithm, p, n, alpha, beta):
    """Seconds for an allreduce of n bytes over p ranks, every link costing alpha + n * beta.
    Recursive doubling and Rabenseifner assume p is a power of two."""
    steps = rounds(p)
    if algorithm == "ring":
        # Reduce-scatter then allgather: 2(p-1) steps, each moving one chunk of n/p bytes.
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta
    if algorithm == "recursive_doubling":
        # lg p steps, each exchanging the whole vector with a partner 2^k away.
        return steps * (alpha + n * beta)
    if algorithm == "binomial_tree":
        # A binomial reduce to the root, then a binomial broadcast back: two trees of lg p rounds.
        return 2 * steps * (alpha + n * beta)
    if algorithm == "rabenseifner":
        # Recursive halving then doubling: lg p steps each way, moving n/2 + n/4 + ... = (p-1)/p n.
        return 2 * steps * alpha + 2 * (p - 1) / p * n * beta
    raise ValueError(f"unknown algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")


def choose(p, n, alpha, beta):
    """The fastest algorithm for an allreduce of n bytes over p ranks."""
    power_of_two = p & (p - 1) == 0
    usable = ALGORITHMS if power_of_two else ("ring", "binomial_tree")
    return min(usable, key=lambda algorithm: predict(algorithm, p, n, alpha, beta))
