"""Problem 11, reading a ring: is it one, how fast its slowest hop is against the best ring's, and
which mistake explains a slow one (the naive order, device names taken for the tree, switches
taken in name order across the sockets) where the evidence rules out the others."""

from __future__ import annotations

from typing import Any

from .cases import NAIVE, Case, Machine, P

GBPS = 8 / 1e9  # bytes per second to Gb/s


def not_a_ring(case: Case, rank: int, ring: list[int]) -> str | None:
    # Ints only: the rank program runs in the learner's process, which could hand back 0.0..7.0
    # (equal to 0..7, and no index into the machine's tables).
    others = sorted({type(r).__name__ for r in ring if type(r) is not int})
    if others:
        return f"{case.label()}: rank {rank}'s best_ring returned {ring}: {', '.join(others)} where ranks are ints"
    if sorted(ring) == list(range(P)):
        return None
    return f"{case.label()}: rank {rank}'s best_ring returned {ring}, not every rank 0..{P - 1} once"


def slow_ring(machine: Machine, ring: tuple[int, ...]) -> str | None:
    """None when ``ring``'s bottleneck is the best ring's, else how far off and why."""
    got, best = machine.bottleneck(ring), machine.best
    if got >= best * (1 - 1e-9):
        return None
    head = (f"{machine.label()}: your ring {list(ring)} runs its slowest hop at {got * GBPS:.0f} Gb/s, "
            f"the best ring at {best * GBPS:.0f} Gb/s")
    if ring in (NAIVE, NAIVE[::-1]):
        return f"{head}: that is the naive order 0..7, which crosses the socket link " \
               f"{crossings(machine, ring)} times; read the ring off the tree"
    by_name = tuple(sorted(range(P), key=lambda r: int(machine.gpu_names[machine.slots[r]][3:])))
    if ring in (by_name, by_name[::-1]):
        return (f"{head}: that is the ranks sorted by device name, and on this server the names do "
                "not follow the tree: walk each device up to its switch and socket")
    return f"{head}: it crosses the socket link {crossings(machine, ring)} times (twice is the least)"


def crossings(machine: Machine, ring: tuple[int, ...]) -> int:
    """Hops of ``ring`` that go from one socket to the other."""
    return sum(machine.socket_of(a) != machine.socket_of(b) for a, b in zip(ring, ring[1:] + ring[:1]))


def wrong_pin(case: Case, rank: int, got: tuple[int, ...]) -> str | None:
    """None when the kernel runs ``rank`` on its socket's CPUs, else where it runs it."""
    want, socket = case.cpus_of(rank), case.machine.socket_of(rank)
    if got == want:
        return None
    head = (f"{case.label()}: rank {rank}'s GPU is under {socket} (CPUs {list(want)}), and the kernel "
            f"runs its process on CPUs {list(got)}")
    others = [name for name, cpus in case.numa if name != socket and cpus == got]
    if others:
        return f"{head}: {others[0]}'s, the other socket: read the socket off the tree, not off the rank"
    if set(want) < set(got):
        return f"{head}: every CPU: no affinity was applied (os.sched_setaffinity in this process)"
    return head


def sum_problem(case: Case, ring: list[int], digests: list[Any]) -> str | None:
    """None when every rank's digest is that of the sum of every rank's input (all of it: a
    sample of rank 0's, once, was summed alone), else the first rank whose is not."""
    want = case.digest()
    wrong = next((rank for rank, got in enumerate(digests) if got != want), None)
    if wrong is None:
        return None
    return (f"{case.label()}: the allreduce along rank 0's ring {ring} did not leave rank {wrong} the sum of every "
            "rank's input")


def traffic_problem(case: Case, ring: list[int], pair_bytes: dict[tuple[int, int], int]) -> str | None:
    """None when every rank sent its ring successor what a ring allreduce of case.nbytes sends
    (2(p-1)/p of it) and no other rank more than the ring's broadcast, as the agents recorded it.
    The harness's allreduce runs next to the learner's code, which could replace it."""
    succ = {a: b for a, b in zip(ring, ring[1:] + ring[:1])}
    want = 2 * (P - 1) / P * case.nbytes
    for (a, b), sent in sorted(pair_bytes.items()):
        if succ.get(a) == b and sent >= 0.99 * want or sent <= 1024:
            continue
        return (f"{case.label()}: rank {a} sent rank {b} {sent:,} bytes; the ring allreduce along {ring} sends "
                f"{want:,.0f} to each rank's successor and nothing else: the harness's allreduce did not run as "
                "written (it is the card's, not yours)")
    short = [a for a, b in succ.items() if pair_bytes.get((a, b), 0) < 0.99 * want]
    if short:
        a = short[0]
        return (f"{case.label()}: rank {a} sent its ring successor {succ[a]} {pair_bytes.get((a, succ[a]), 0):,} bytes, "
                f"the ring allreduce sends {want:,.0f}: the harness's allreduce did not run as written (it is the "
                "card's, not yours)")
    return None
