"""The built-in collectives as message schedules, and their textbook costs on an alpha-beta network.

Two kinds of pure functions live here, kept apart from the simulator so both can be tested alone:

- **Schedules** (``collective_schedule``): the flows of each collective's standard algorithm, as
  ``sends[i][s]`` = the messages group rank ``i`` sends at step ``s``, each ``(dst, nbytes)``.
  A message sent at step ``s`` is received at step ``s`` by its destination. The replay
  (``replay.py``) runs every group rank as a sequence of Sendrecv-like steps: at step ``s`` a rank
  posts its sends, then waits until its own sends and the receives addressed to it at step ``s``
  have finished, then moves on. So a rank never waits for a step it takes no part in, exactly
  like the ring written by hand with Sendrecv (problem 03).
- **Costs** (``*_time``): the closed forms on a uniform network (every route alpha seconds
  plus beta seconds per byte, no two flows of one step sharing a link). Problems quote them as
  bounds and tests compare the replay against them.

Sizes follow the ``nbytes`` of the trace's "coll" event, which is the caller's *send buffer*:
the whole vector for Allreduce, Reduce_scatter, Reduce and Bcast, and one rank's block for
Allgather, Allgatherv and Gather; for Scatter the caller's *receive* block, for Alltoall the
whole send buffer (p blocks).

Algorithms (p ranks, L = ceil(log2 p)):

- Allreduce: ring reduce-scatter then ring allgather, 2(p-1) steps; the vector is cut into p
  nearly equal chunks (the first n mod p chunks one byte longer) and every step moves one chunk
  from each rank to its right neighbour in group order.
- Reduce_scatter: the ring reduce-scatter alone (p-1 steps). Allgather: the ring allgather alone.
- Bcast: binomial tree from the root, L rounds of n bytes. Reduce: the same tree upside down.
- Barrier: dissemination, L rounds; in round k rank i sends 0 bytes to i + 2^k (mod p).
- Gather: binomial tree to the root, L rounds; in round k a rank sends every block of its
  subtree (up to 2^k of them) to its parent: L alpha + (p-1) n beta for blocks of n bytes
  (exact for p a power of two, an upper bound otherwise, as for Reduce).
- Scatter: the same tree from the root down, the largest subtree first: L alpha + (p-1) n beta.
- Allgatherv: the ring allgather with each rank's own block size: (p-1)(alpha + b beta) with
  equal blocks b, at most (p-1)(alpha + max b beta) otherwise.
- Alltoall: pairwise shifts, p-1 steps; at step s rank i sends its block for i + s and receives
  the block from i - s: (p-1)(alpha + b beta) for blocks of b = n/p bytes.
- Alltoallv: the same shifts with each pair's own block (the event carries the bytes for each
  destination): sum over the steps s of alpha + (the largest block of step s) beta, exact
  when each step's blocks are equal, an upper bound otherwise; the online clock charges
  (p-1)(alpha + b beta) with b the largest block of any rank.
"""

from __future__ import annotations

from collections.abc import Sequence

Send = tuple[int, int]  # (destination group rank, nbytes)
Schedule = tuple[tuple[tuple[Send, ...], ...], ...]  # schedule[group rank][step] -> sends

COLLECTIVE_OPS = ("Barrier", "Bcast", "Reduce", "Allreduce", "Reduce_scatter", "Allgather",
                  "Gather", "Scatter", "Allgatherv", "Alltoall", "Alltoallv")
ALIASES = {"Reduce_scatter_block": "Reduce_scatter"}


def rounds(p: int) -> int:
    """ceil(log2 p): rounds of a binomial tree or a dissemination barrier over p ranks."""
    return (p - 1).bit_length() if p > 1 else 0


def chunk_sizes(n: int, p: int) -> list[int]:
    """n bytes cut into p nearly equal chunks, as problem 03's reference cuts its buffer."""
    base, extra = divmod(n, p)
    return [base + (1 if i < extra else 0) for i in range(p)]


# -- analytic costs on a uniform alpha-beta network ---------------------------------------------


def p2p_time(n: float, alpha: float, beta: float) -> float:
    """One uncontended message of n bytes."""
    return alpha + n * beta


def ring_allreduce_time(p: int, n: float, alpha: float, beta: float) -> float:
    """Ring reduce-scatter + ring allgather of an n-byte vector: 2(p-1)alpha + 2(p-1)/p n beta."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta


def ring_reduce_scatter_time(p: int, n: float, alpha: float, beta: float) -> float:
    """Ring reduce-scatter of an n-byte vector: (p-1)alpha + (p-1)/p n beta."""
    if p <= 1:
        return 0.0
    return (p - 1) * alpha + (p - 1) / p * n * beta


def ring_allgather_time(p: int, block: float, alpha: float, beta: float) -> float:
    """Ring allgather where every rank contributes ``block`` bytes: (p-1)(alpha + block beta)."""
    if p <= 1:
        return 0.0
    return (p - 1) * (alpha + block * beta)


def binomial_bcast_time(p: int, n: float, alpha: float, beta: float) -> float:
    """Binomial-tree broadcast of n bytes: ceil(log2 p)(alpha + n beta)."""
    return rounds(p) * (alpha + n * beta)


def binomial_reduce_time(p: int, n: float, alpha: float, beta: float) -> float:
    """Binomial-tree reduce of n bytes: ceil(log2 p)(alpha + n beta). Exact when p is a power
    of two; an upper bound otherwise (some subtrees are shallower and finish early)."""
    return rounds(p) * (alpha + n * beta)


def dissemination_barrier_time(p: int, alpha: float) -> float:
    """Dissemination barrier: ceil(log2 p) rounds of empty messages."""
    return rounds(p) * alpha


def binomial_gather_time(p: int, block: float, alpha: float, beta: float) -> float:
    """Binomial gather (or scatter) of p blocks of ``block`` bytes: the root's rounds carry
    2^(L-1), ..., 2, 1 blocks (the first fewer when p is no power of two), p - 1 in all:
    ceil(log2 p) alpha + (p-1) block beta. Exact when p is a power of two; an upper bound
    otherwise (the ranks of the shallow subtree send while the first rounds run)."""
    return rounds(p) * alpha + (p - 1) * block * beta


def pairwise_alltoallv_time(blocks: Sequence[Sequence[int]], alpha: float, beta: float) -> float:
    """Pairwise shifts where ``blocks[i][j]`` bytes go from rank i to rank j: each step as long
    as its largest block."""
    p = len(blocks)
    return sum(alpha + max(blocks[i][(i + s) % p] for i in range(p)) * beta for s in range(1, p))


def pairwise_alltoall_time(p: int, n: float, alpha: float, beta: float) -> float:
    """Pairwise-shift alltoall of an n-byte send buffer (p blocks): (p-1)(alpha + n/p beta)."""
    if p <= 1:
        return 0.0
    return (p - 1) * (alpha + n / p * beta)


def collective_time(op: str, p: int, nbytes: float, alpha: float, beta: float) -> float:
    """The cost of a built-in collective whose trace event carries ``nbytes`` (the caller's send
    buffer; one block for Allgather), on a uniform network."""
    op = ALIASES.get(op, op)
    if op == "Barrier":
        return dissemination_barrier_time(p, alpha)
    if op == "Bcast":
        return binomial_bcast_time(p, nbytes, alpha, beta)
    if op == "Reduce":
        return binomial_reduce_time(p, nbytes, alpha, beta)
    if op == "Allreduce":
        return ring_allreduce_time(p, nbytes, alpha, beta)
    if op == "Reduce_scatter":
        return ring_reduce_scatter_time(p, nbytes, alpha, beta)
    if op in ("Allgather", "Allgatherv"):  # Allgatherv: nbytes is the largest block
        return ring_allgather_time(p, nbytes, alpha, beta)
    if op in ("Gather", "Scatter"):
        return binomial_gather_time(p, nbytes, alpha, beta) if p > 1 else 0.0
    if op == "Alltoall":
        return pairwise_alltoall_time(p, nbytes, alpha, beta)
    if op == "Alltoallv":  # nbytes: the largest block (the online clock's bound)
        return (p - 1) * (alpha + nbytes * beta) if p > 1 else 0.0
    raise ValueError(f"no cost model for collective '{op}' (known: {', '.join(COLLECTIVE_OPS)})")


# -- schedules: the flows of each algorithm -----------------------------------------------------


def _empty(p: int, steps: int) -> list[list[list[Send]]]:
    return [[[] for _ in range(steps)] for _ in range(p)]


def _freeze(sends: list[list[list[Send]]]) -> Schedule:
    return tuple(tuple(tuple(step) for step in rank) for rank in sends)


def ring_reduce_scatter_steps(p: int, n: int) -> list[list[list[Send]]]:
    """At step s rank i sends chunk (i - s) mod p to i + 1 (problem 03's first loop)."""
    sizes = chunk_sizes(n, p)
    sends = _empty(p, p - 1)
    for i in range(p):
        for s in range(p - 1):
            sends[i][s].append(((i + 1) % p, sizes[(i - s) % p]))
    return sends


def ring_allgather_steps(blocks: Sequence[int]) -> list[list[list[Send]]]:
    """At step s rank i forwards block (i + 1 - s) mod p to i + 1; ``blocks`` are their sizes,
    indexed so that rank i starts out owning block (i + 1) mod p (as after a reduce-scatter)."""
    p = len(blocks)
    sends = _empty(p, p - 1)
    for i in range(p):
        for s in range(p - 1):
            sends[i][s].append(((i + 1) % p, blocks[(i + 1 - s) % p]))
    return sends


def binomial_bcast_steps(p: int, n: int, root: int) -> list[list[list[Send]]]:
    """Round k: every rank that has the data (relative rank v < 2^k) sends it to v + 2^k."""
    sends = _empty(p, rounds(p))
    for k in range(rounds(p)):
        for v in range(min(1 << k, p)):
            if v + (1 << k) < p:
                sends[(v + root) % p][k].append(((v + (1 << k) + root) % p, n))
    return sends


def binomial_reduce_steps(p: int, n: int, root: int) -> list[list[list[Send]]]:
    """Round k: relative rank v with v mod 2^(k+1) == 2^k sends its partial result to v - 2^k.
    A rank has received from all its children (rounds < k) before it sends."""
    sends = _empty(p, rounds(p))
    for k in range(rounds(p)):
        for v in range(p):
            if v % (2 << k) == (1 << k):
                sends[(v + root) % p][k].append(((v - (1 << k) + root) % p, n))
    return sends


def binomial_gather_steps(blocks: Sequence[int], root: int) -> list[list[list[Send]]]:
    """Round k: relative rank v with v mod 2^(k+1) == 2^k sends the blocks of its subtree
    (relative ranks v .. v + 2^k - 1 that exist) to v - 2^k; ``blocks[i]``: group rank i's."""
    p = len(blocks)
    sends = _empty(p, rounds(p))
    for k in range(rounds(p)):
        for v in range(p):
            if v % (2 << k) == (1 << k):
                subtree = sum(blocks[(u + root) % p] for u in range(v, min(v + (1 << k), p)))
                sends[(v + root) % p][k].append(((v - (1 << k) + root) % p, subtree))
    return sends


def binomial_scatter_steps(blocks: Sequence[int], root: int) -> list[list[list[Send]]]:
    """The gather's tree from the top: at step s (round k = L-1-s) relative rank v with
    v mod 2^(k+1) == 0 sends the blocks of the subtree of v + 2^k to it."""
    p = len(blocks)
    levels = rounds(p)
    sends = _empty(p, levels)
    for s in range(levels):
        k = levels - 1 - s
        for v in range(0, p, 2 << k):
            child = v + (1 << k)
            if child < p:
                subtree = sum(blocks[(u + root) % p] for u in range(child, min(child + (1 << k), p)))
                sends[(v + root) % p][s].append(((child + root) % p, subtree))
    return sends


def pairwise_alltoall_steps(p: int, n: int) -> list[list[list[Send]]]:
    """At step s (1 .. p-1) rank i sends its block for i + s; blocks of n/p bytes (the first
    n mod p one byte longer, as chunk_sizes)."""
    sizes = chunk_sizes(n, p)
    sends = _empty(p, p - 1)
    for i in range(p):
        for s in range(1, p):
            sends[i][s - 1].append(((i + s) % p, sizes[(i + s) % p]))
    return sends


def pairwise_alltoallv_steps(blocks: Sequence[Sequence[int]]) -> list[list[list[Send]]]:
    """At step s (1 .. p-1) rank i sends blocks[i][i + s] to i + s."""
    p = len(blocks)
    sends = _empty(p, p - 1)
    for i in range(p):
        for s in range(1, p):
            sends[i][s - 1].append(((i + s) % p, blocks[i][(i + s) % p]))
    return sends


def dissemination_steps(p: int) -> list[list[list[Send]]]:
    sends = _empty(p, rounds(p))
    for k in range(rounds(p)):
        for i in range(p):
            sends[i][k].append(((i + (1 << k)) % p, 0))
    return sends


def collective_schedule(op: str, nbytes: Sequence[int], root: int) -> Schedule:
    """The flows of ``op`` over ``len(nbytes)`` ranks; ``nbytes[i]`` is group rank i's send
    buffer as recorded in its event (for Alltoallv a tuple: its bytes for each rank). A collective over one rank, or of 0 bytes (other than a
    Barrier), moves nothing and has no steps.

    The vector size of Allreduce, Reduce_scatter and Reduce is the largest recorded one (they
    are equal in a correct program); Bcast uses the root's; Allgather uses each owner's block.
    Raises ValueError for an op without an algorithm here or a root outside the group.
    """
    op = ALIASES.get(op, op)
    p = len(nbytes)
    if op not in COLLECTIVE_OPS:
        raise ValueError(f"no algorithm for collective '{op}' (known: {', '.join(COLLECTIVE_OPS)})")
    if op in ("Bcast", "Reduce", "Gather", "Scatter") and not 0 <= root < p:
        raise ValueError(f"{op} root {root} is not a rank of a group of {p}")
    if op == "Alltoallv":
        blocks: list[tuple[int, ...]] = [tuple(b) for b in nbytes]  # type: ignore[arg-type]
        if p <= 1 or not any(map(any, blocks)):
            return tuple(() for _ in range(p))
        return _freeze(pairwise_alltoallv_steps(blocks))
    n = max(nbytes, default=0)
    if p <= 1 or (op != "Barrier" and n == 0):
        return tuple(() for _ in range(p))
    if op == "Barrier":
        return _freeze(dissemination_steps(p))
    if op == "Bcast":
        return _freeze(binomial_bcast_steps(p, nbytes[root], root))
    if op == "Reduce":
        return _freeze(binomial_reduce_steps(p, n, root))
    if op == "Reduce_scatter":
        return _freeze(ring_reduce_scatter_steps(p, n))
    if op in ("Allgather", "Allgatherv"):
        # Rank i starts out owning its own block; the ring formula above numbers blocks so that
        # rank i owns block i + 1, hence the shift by one.
        return _freeze(ring_allgather_steps([nbytes[(j - 1) % p] for j in range(p)]))
    if op == "Gather":
        return _freeze(binomial_gather_steps(nbytes, root))
    if op == "Scatter":
        return _freeze(binomial_scatter_steps(nbytes, root))
    if op == "Alltoall":
        return _freeze(pairwise_alltoall_steps(p, n))
    # Allreduce: after the reduce-scatter rank i owns chunk i + 1, as the allgather expects.
    reduce_scatter = ring_reduce_scatter_steps(p, n)
    allgather = ring_allgather_steps(chunk_sizes(n, p))
    return _freeze([reduce_scatter[i] + allgather[i] for i in range(p)])


def flow_count(schedule: Schedule) -> int:
    return sum(len(step) for rank in schedule for step in rank)

