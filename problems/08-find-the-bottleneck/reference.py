"""Problem 08, reference solution: instrument a training job and find its bottleneck.

The idea in four moves:

1. Probes read the virtual clock (comm.now()) around each phase and keep the numbers locally.
   Reading a clock costs nothing; sending the numbers every step would (messages, waits), so
   nothing leaves the rank until training is over.
2. One Allgather of fixed-size arrays at the end brings every rank's table to rank 0:
   spans[rank, step] = [compute start, compute end, sync start, sync end].
3. Stragglers and slow links look alike from inside the training loop (everyone waits longer), so
   they are told apart by what they slow down:
   - a straggler *computes* longer: its mean compute time stands far above the median rank's
     (the median, because one straggler would drag a mean towards itself);
   - a slow link *moves bytes* slower: a ping-pong between every pair of ranks, with a message
     large enough that bandwidth dominates latency, shows one pair far above the median pair.
4. The sync/compute ratio is aggregated over all ranks and steps: total time in the gradient
   exchange over total compute time (one rank's view says more about that rank than the job).
"""

import numpy as np

STRAGGLER_RATIO = 1.3  # ranks differ naturally by up to ~1.2x the median; a straggler by 1.5-3x
SLOW_LINK_RATIO = 2.0  # links differ naturally by ~15%; a slow link is 3x slower or worse
PING_BYTES = 1 << 18  # 256 KiB: n*beta dwarfs alpha, so a bandwidth fault shows
COLUMNS = {"compute": 0, "sync": 2}  # where each phase's [start, end] goes in a step's row


class Probes:
    """Times the phases of each training step on this rank, on the virtual clock."""

    def __init__(self, comm):
        self.comm = comm
        self.rows = []  # one [compute start, compute end, sync start, sync end] per step
        self.started = {}

    def start(self, phase):
        if phase == "compute":  # every step begins with its compute
            self.rows.append([0.0, 0.0, 0.0, 0.0])
        self.started[phase] = self.comm.now()

    def stop(self, phase):
        col = COLUMNS[phase]
        self.rows[-1][col : col + 2] = [self.started.pop(phase), self.comm.now()]

    def spans(self):
        """(steps, 4) array of this rank's spans, in seconds of virtual time."""
        return np.array(self.rows, dtype=np.float64).reshape(-1, 4)


def gather_spans(comm, spans):
    """Every rank's spans on rank 0, as a (p, steps, 4) array; None on the other ranks.

    Every rank ran the same steps, so the arrays have the same size and one Allgather of the
    flat buffers does it (comm.Gather does not exist here)."""
    mine = np.ascontiguousarray(spans, dtype=np.float64)
    everyone = np.empty((comm.Get_size(),) + mine.shape, dtype=np.float64)
    comm.Allgather(mine, everyone)
    return everyone if comm.Get_rank() == 0 else None


def durations(spans):
    """(compute, sync) seconds per rank and step, each of shape (p, steps)."""
    return spans[..., 1] - spans[..., 0], spans[..., 3] - spans[..., 2]


def sync_compute_ratio(spans):
    """Total sync time over total compute time, summed over every rank and step."""
    compute, sync = durations(spans)
    return float(sync.sum() / compute.sum())


def find_stragglers(spans):
    """Ranks whose mean compute per step is far above the median rank's."""
    compute, _ = durations(spans)
    per_rank = compute.mean(axis=1)
    typical = np.median(per_rank)
    return [rank for rank, t in enumerate(per_rank) if t > STRAGGLER_RATIO * typical]


def pairings(p):
    """Rounds of disjoint pairs covering every pair once (the circle method; a bye when p is odd)."""
    n = p + p % 2
    circle = list(range(n))
    rounds = []
    for _ in range(n - 1):
        pairs = [(circle[i], circle[n - 1 - i]) for i in range(n // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a < p and b < p])
        circle = [circle[0], circle[-1]] + circle[1:-1]  # rotate all but the first
    return rounds


def ping_matrix(comm, nbytes=PING_BYTES):
    """Round-trip seconds of an nbytes ping-pong between every pair, on rank 0 (None elsewhere).

    Pairs in one round are disjoint, so they ping at the same time without sharing a link. Each
    pair first bounces a tiny message: that lines its two clocks up, so the timed round trip does
    not include one rank waiting for the other to arrive."""
    p, rank = comm.Get_size(), comm.Get_rank()
    row = np.zeros(p)  # round trips this rank started, by partner
    tiny = np.zeros(1)
    ball = np.zeros(max(nbytes // 8, 1))
    for pairs in pairings(p):
        for a, b in pairs:
            if rank not in (a, b):
                continue
            if rank == a:  # the lower rank starts and times
                comm.Send(tiny, dest=b, tag=1)
                comm.Recv(tiny, source=b, tag=1)
                t0 = comm.now()
                comm.Send(ball, dest=b, tag=2)
                comm.Recv(ball, source=b, tag=2)
                row[b] = comm.now() - t0
            else:
                comm.Recv(tiny, source=a, tag=1)
                comm.Send(tiny, dest=a, tag=1)
                comm.Recv(ball, source=a, tag=2)
                comm.Send(ball, dest=a, tag=2)
    rows = np.empty((p, p))
    comm.Allgather(row, rows)
    return rows + rows.T if rank == 0 else None  # each pair was timed by its lower rank


def find_slow_links(rtt):
    """Pairs (i, j), i < j, whose round trip is far above the median pair's."""
    p = rtt.shape[0]
    pairs = [(i, j) for i in range(p) for j in range(i + 1, p)]
    if not pairs:
        return []
    typical = np.median([rtt[i, j] for i, j in pairs])
    return [(i, j) for i, j in pairs if rtt[i, j] > SLOW_LINK_RATIO * typical]


def chrome_trace(spans):
    """The spans in the Chrome trace event format: one process (track) per rank, times in us."""
    events = []
    for rank, steps in enumerate(spans):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        for step, (c0, c1, s0, s1) in enumerate(steps):
            for name, begin, end in (("compute", c0, c1), ("sync", s0, s1)):
                events.append({"name": name, "cat": name, "ph": "X", "pid": rank, "tid": 0,
                               "ts": float(begin) * 1e6, "dur": float(end - begin) * 1e6,
                               "args": {"step": step}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def diagnose(comm, probes):
    """Collective: gathers the probes, pings every pair; rank 0 returns the diagnosis."""
    spans = gather_spans(comm, probes.spans())
    rtt = ping_matrix(comm)
    if comm.Get_rank() != 0:
        return None
    return {
        "stragglers": find_stragglers(spans),
        "slow_links": find_slow_links(rtt),
        "sync_compute_ratio": sync_compute_ratio(spans),
        "spans": spans,
        "pings": rtt,
        "trace": chrome_trace(spans),
    }
