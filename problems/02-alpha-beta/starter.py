"""Problem 02: measure the network, then predict the collectives.

A message of n bytes over a link takes alpha + n * beta seconds: alpha is the latency, beta the
time per byte (one over the bandwidth). Write three functions:

* measure(comm, sizes): every rank calls it. Each rank measures the link to its right neighbour,
  (rank + 1) % p, with a ping-pong at each of the given sizes (in bytes), reading the virtual
  clock comm.now(). Then it fits alpha and beta by least squares and returns (alpha, beta) in
  seconds and seconds per byte.
* predict(algorithm, p, n, alpha, beta): the textbook time of an allreduce of n bytes over p ranks
  for "ring", "recursive_doubling", "binomial_tree" (a reduce, then a broadcast) and
  "rabenseifner".
* choose(p, n, alpha, beta): the name of the fastest one.

Check it with `distlab check 02`; ask for a nudge with `distlab hint 02`.
"""

import numpy as np

ALGORITHMS = ("ring", "recursive_doubling", "binomial_tree", "rabenseifner")


def measure(comm, sizes):
    """Returns (alpha, beta) of the link from this rank to (rank + 1) % p."""
    p, rank = comm.Get_size(), comm.Get_rank()
    right, left = (rank + 1) % p, (rank - 1) % p
    buf = np.zeros(max(sizes), dtype=np.uint8)  # buf[:n] is an n-byte message

    # TODO: take turns, one pair at a time. In turn k, rank k pings `right` at every size
    # (comm.Send, then comm.Recv of the echo) and reads comm.now() around each round trip,
    # while rank k + 1 echoes every message back to `left`. A round trip crosses the link twice.

    # TODO: fit one-way time = alpha + n * beta over the sizes by least squares.
    return 0.0, 0.0


def predict(algorithm, p, n, alpha, beta):
    """Seconds for an allreduce of n bytes over p ranks with the given algorithm."""
    # TODO: one formula per name in ALGORITHMS. lg p means ceil(log2 p): (p - 1).bit_length().
    return 0.0


def choose(p, n, alpha, beta):
    """The name of the fastest algorithm (recursive doubling and Rabenseifner need p a power of two)."""
    # TODO
    return None
