"""Problem 11 on the ranks: the learner's ring and affinity on a server, then an allreduce along
that ring (rank 0's, on every rank), timed on the virtual clock; and the free run."""

from __future__ import annotations

import numpy as np

from .cases import CARD, RankCase, digest, numa_cpus, values


def run_case(comm, solution, case: RankCase) -> dict:
    """The learner's ring (every rank computes it) and its pinning, applied in its process; then
    a float32 allreduce of ``case.nbytes`` along rank 0's ring, if it is one (mark "allreduce").
    Every rank returns the digest of its whole sum: the checker holds the inputs (each rank only
    its own)."""
    rank, p = comm.Get_rank(), comm.Get_size()
    mine = [int(r) for r in solution.best_ring(case.topology)]
    solution.pin_to_numa_node(rank, case.topology, dict(case.numa))
    order = np.array(mine if len(mine) == p else [-1] * p, dtype=np.int64)
    comm.Bcast(order, root=0)  # one ring for all: ranks that disagree would deadlock each other
    ring = [int(r) for r in order]
    summed = None
    if sorted(ring) == list(range(p)):
        buf = values(case.nbytes, case.key)
        comm.mark("allreduce")
        ring_allreduce(comm, buf, ring)
        summed = digest(buf)
    return {"ring": mine, "sum": summed}


def ring_allreduce(comm, buf: np.ndarray, ring: list[int]) -> None:
    """Problem 03's ring allreduce, each rank sending to the next one of ``ring``: a
    reduce-scatter then an allgather of p chunks, p - 1 steps each."""
    p, at = len(ring), ring.index(comm.Get_rank())
    right, left = ring[(at + 1) % p], ring[(at - 1) % p]
    bounds = np.linspace(0, buf.size, p + 1).astype(int)
    chunk = lambda i: buf[bounds[i % p]:bounds[i % p + 1]]  # noqa: E731
    incoming = np.empty(bounds[1] - bounds[0] + 1, dtype=buf.dtype)
    for step in range(p - 1):
        send, recv = chunk(at - step), chunk(at - step - 1)
        comm.Sendrecv(send, dest=right, recvbuf=incoming[:recv.size], source=left)
        recv += incoming[:recv.size]
    for step in range(p - 1):
        send, recv = chunk(at + 1 - step), chunk(at - step)
        comm.Sendrecv(send, dest=right, recvbuf=recv, source=left)


def main(comm, solution, mib="4", ring="yours"):
    """A free run on the card's server (8 ranks on rack): an allreduce of ``mib`` MiB along the
    learner's ring (``ring=yours``) or the naive one (``ring=naive``), each rank pinned to its
    socket's CPUs. ``distlab tune 11 --param mib=... --fixed ring=...`` draws the replay's time."""
    topology, rank, p = CARD.topology(), comm.Get_rank(), comm.Get_size()
    solution.pin_to_numa_node(rank, topology, dict(numa_cpus()))
    order = [int(r) for r in solution.best_ring(topology)] if ring == "yours" else list(range(p))
    values = np.full(max(1, int(float(mib) * (1 << 20)) // 4), float(rank + 1), dtype=np.float32)
    ring_allreduce(comm, values, order)
    if rank == 0:
        ok = bool(np.all(values == p * (p + 1) / 2))
        return {"ok": ok, "ring": order, "bottleneck_gbps": CARD.bottleneck(tuple(order)) * 8 / 1e9,
                "summary": f"ring {order}: the sum {'is right' if ok else 'DIFFERS FROM the sum of all inputs'}"}
    return None


def figure(summary: dict) -> str:
    """The server's tree with the free run's ring on it (the report draws it in the checker, from
    rank 0's ring: numbers only, checked here): sockets, switches, GPUs, and each hop as an arrow,
    red where it crosses the socket link."""
    ring = summary.get("ring")
    if not isinstance(ring, list) or sorted(ring) != list(range(8)):
        return ""
    slot_x = lambda slot: 60 + slot * 110  # noqa: E731
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="940" height="360" font-size="13">']
    for socket in range(2):
        parts.append(f'<rect x="{slot_x(4 * socket)}" y="20" width="420" height="30" fill="#eee"/>'
                     f'<text x="{slot_x(4 * socket) + 10}" y="40">socket{socket}</text>')
    for slot in range(8):
        x, rank = slot_x(slot), CARD.slots.index(slot)
        if slot % 2 == 0:
            parts.append(f'<rect x="{x}" y="90" width="200" height="26" fill="#f4f4f4"/>'
                         f'<text x="{x + 8}" y="108">{CARD.switch_names[slot // 2]}</text>')
        parts.append(f'<rect x="{x}" y="150" width="90" height="40" fill="#dde8f6"/>'
                     f'<text x="{x + 8}" y="174">{CARD.gpu_names[slot]}: rank {rank}</text>')
    for hop, (a, b) in enumerate(zip(ring, ring[1:] + ring[:1])):
        xa, xb = slot_x(CARD.slots[a]) + 45, slot_x(CARD.slots[b]) + 45
        colour = "#cf222e" if CARD.socket_of(a) != CARD.socket_of(b) else "#4c78a8"
        dip = 195 + 14 * (1 + hop)
        parts.append(f'<path d="M{xa},190 C{xa},{dip + 40} {xb},{dip + 40} {xb},190" fill="none" '
                     f'stroke="{colour}" stroke-width="2"/><text x="{(xa + xb) / 2}" y="{dip + 32}">{hop + 1}</text>')
    return "".join(parts) + "</svg>"
