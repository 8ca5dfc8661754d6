"""Problem 09, reference solution: a hierarchical allreduce across data centers, and what the WAN
costs.

The WAN between data centers is a hundred times slower than the fabric inside one (2 ms against
5 us, 10 Gb/s against 100) and every byte across it is billed, so the allreduce crosses it as
little and as seldom as it can:

1. inside each data center, a reduce-scatter: the L ranks of a data center each end up with the
   data center's sum over one shard (1/L) of the buffer;
2. between data centers, an allreduce of each shard among the ranks that hold the same shard, one
   per data center (the same local index): D ranks, each with n/L values;
3. inside each data center again, an allgather of the finished shards.

Only step 2 crosses the WAN: each shard leaves its data center and comes back (D-1)/D of it at a
time in the ring's two phases, so the whole job sends 2 (D-1) n bytes across, the least any
allreduce can, and pays 2 (D-1) WAN latencies instead of a flat ring's 2 (p-1).
"""

import numpy as np

from distlab import IN_PLACE, SUM


def hierarchical_allreduce(comm, buf, datacenter_of):
    """Sums the 1-D array ``buf`` over every rank of ``comm``, in place; ``datacenter_of[r]`` is
    rank r's data center (never assume ranks are numbered by data center)."""
    rank = comm.Get_rank()
    inside = comm.Split(color=datacenter_of[rank], key=rank)
    index = inside.Get_rank()
    across = comm.Split(color=index, key=datacenter_of[rank])  # same index, one per data center
    counts = shard_counts(buf.size, inside.Get_size())
    shard = np.empty(counts[index], dtype=buf.dtype)
    inside.Reduce_scatter(buf, shard, recvcounts=counts, op=SUM)
    across.Allreduce(IN_PLACE, shard, op=SUM)
    inside.Allgatherv(shard, [buf, counts])
    inside.Free()
    across.Free()


def shard_counts(n, parts):
    """n values cut into ``parts`` shards, the first n % parts one value longer."""
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


# -- what the WAN costs: a bill has dcs, per_dc, wan_price_per_gb, gpu_price_per_hour,
# compute_s_per_step, steps_per_epoch and bytes_per_param ---------------------------------------


def wan_bytes_per_step(params, bill):
    """Bytes the hierarchical allreduce of one gradient sends across data centers, all ranks
    together: each data center's data leaves it and comes back once, 2 (D-1) n."""
    return 2 * (bill.dcs - 1) * bill.bytes_per_param * params


def cost_per_step(params, bill):
    """(WAN dollars, compute dollars) of one optimizer step."""
    wan = wan_bytes_per_step(params, bill) / 1e9 * bill.wan_price_per_gb  # priced per 1e9 bytes
    gpus = bill.dcs * bill.per_dc
    compute = gpus * bill.compute_s_per_step / 3600 * bill.gpu_price_per_hour
    return wan, compute


def cost_per_epoch(params, bill):
    wan, compute = cost_per_step(params, bill)
    return wan * bill.steps_per_epoch, compute * bill.steps_per_epoch


def breakeven_params(bill, share):
    """The model size whose WAN dollars reach ``share`` of the compute dollars: WAN cost grows
    with the parameters, the compute bill of a step does not (the step's compute is fixed)."""
    wan_per_param, compute = cost_per_step(1, bill)
    return share * compute / wan_per_param
