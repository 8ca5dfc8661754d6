"""Problem 08: instrument a slow training job and find its bottleneck.

The checker runs the training loop; you write the instruments. Each step of the loop is

    comm.mark("step")
    probes.start("compute"); <forward + backward>; probes.stop("compute")
    probes.start("sync");    <gradient exchange>;  probes.stop("sync")

and after the last step every rank calls diagnose(comm, probes). On rank 0 it returns a dict:

    {"stragglers": [ranks], "slow_links": [(i, j), ...] with i < j,
     "sync_compute_ratio": float, "spans": (p, steps, 4) array, "pings": (p, p) array,
     "trace": a Chrome trace dict}

and None on the other ranks. Rules of the game:

* time with comm.now(), the virtual clock (seconds); probes add no message and no compute while
  the job trains (at most 3% on its time): gather once, after the last step;
* comm.Gather does not exist: use Send/Recv, or one Allgather of fixed-size arrays;
* sync/compute is the job's: total sync over total compute, summed over every rank and step;
* no false positives: ranks differ naturally by up to ~1.2x in compute and cables by +-15%;
  a straggler computes 1.5-3x longer, a slow link keeps 15-30% of its bandwidth.

Check it with `distlab check 08`; ask for a nudge with `distlab hint 08`.
"""

import numpy as np


class Probes:
    """Times the phases of each training step on this rank, on the virtual clock."""

    def __init__(self, comm):
        self.comm = comm
        self.rows = []  # one [compute start, compute end, sync start, sync end] per step

    def start(self, phase):
        """phase is "compute" or "sync"; every step starts with "compute"."""
        # TODO: remember when this phase started (self.comm.now()).

    def stop(self, phase):
        # TODO: record the phase's [start, end] in this step's row.
        pass

    def spans(self):
        """(steps, 4) array of this rank's spans, in seconds of virtual time."""
        return np.array(self.rows, dtype=np.float64).reshape(-1, 4)


def gather_spans(comm, spans):
    """Every rank's spans on rank 0, as a (p, steps, 4) array; None on the other ranks."""
    # TODO: bring every rank's table to rank 0 (this placeholder keeps rank 0's own only).
    return spans[np.newaxis] if comm.Get_rank() == 0 else None


def sync_compute_ratio(spans):
    """Total sync time over total compute time, summed over every rank and step."""
    # TODO
    return 0.0


def find_stragglers(spans):
    """Ranks that compute much longer than their peers."""
    # TODO
    return []


def ping_matrix(comm, nbytes=1 << 18):
    """Round-trip seconds of an nbytes ping-pong between every pair, on rank 0 (None elsewhere)."""
    p = comm.Get_size()
    # TODO: ping-pong between every pair of ranks, timed with comm.now(); gather the rows.
    return np.zeros((p, p)) if comm.Get_rank() == 0 else None


def find_slow_links(rtt):
    """Pairs (i, j), i < j, whose round trip is much longer than the others'."""
    # TODO
    return []


def chrome_trace(spans):
    """The spans in the Chrome trace event format: one track per rank, times in microseconds.

    One complete event per phase and step, named "compute" or "sync":
    {"name": "compute", "ph": "X", "ts": start_us, "dur": length_us, "pid": ..., "tid": ...}"""
    # TODO: {"traceEvents": [...]}; validate yours with distlab.grading.validate_chrome_trace
    return {"traceEvents": []}


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
