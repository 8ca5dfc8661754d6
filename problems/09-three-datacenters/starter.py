"""Problem 09, starter: a hierarchical allreduce across data centers, and what the WAN costs.

Read the card (`distlab show 09`), then replace each TODO. `comm` follows mpi4py: `comm.Split`,
and on the communicators it makes `Reduce_scatter`, `Allreduce`, `Allgatherv` (built-in
collectives on the groups you form are fine here: this problem is about which ranks talk to
which, not about writing a ring by hand).
"""

from distlab import SUM


def hierarchical_allreduce(comm, buf, datacenter_of):
    """Sums the 1-D array ``buf`` over every rank of ``comm``, in place; ``datacenter_of[r]`` is
    rank r's data center (never assume ranks are numbered by data center).

    TODO: inside each data center reduce-scatter, between data centers allreduce each shard among
    the ranks that hold it (one per data center), inside each data center allgather. This version
    is one flat allreduce over every rank: right, and what the checks measure yours against."""
    comm.Allreduce(buf.copy(), buf, op=SUM)


# A bill has: dcs, per_dc, wan_price_per_gb (per 1e9 bytes), gpu_price_per_hour,
# compute_s_per_step (every GPU, per optimizer step), steps_per_epoch, bytes_per_param.


def wan_bytes_per_step(params, bill):
    """TODO: bytes your allreduce of one gradient sends across data centers, all ranks together."""
    return 0.0


def cost_per_step(params, bill):
    """TODO: (WAN dollars, compute dollars) of one optimizer step."""
    return 0.0, 0.0


def cost_per_epoch(params, bill):
    """TODO: (WAN dollars, compute dollars) of one epoch."""
    return 0.0, 0.0


def breakeven_params(bill, share):
    """TODO: the model size (parameters) whose WAN dollars per step are ``share`` of the compute
    dollars per step."""
    return 0.0
