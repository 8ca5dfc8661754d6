"""Problem 11, reference solution: a ring that follows the server's tree, and each rank pinned to
its GPU's socket.

A ring allreduce is as fast as its slowest hop, and every rank sends at once: hops that cross the
same physical link share it. On a server of 2 sockets x 2 PCIe switches x 2 GPUs the slow link is
the one between the sockets (peer-to-peer traffic goes through both root complexes). Any ring must
cross it once each way; a ring that visits the GPUs switch by switch, socket by socket, crosses it
exactly that often, and each PCIe uplink once each way, so no link carries two of its hops: the
bottleneck is the socket link alone, the best any ring can do. Numbering follows nothing: the ring
is read off the tree in the topology file, never off rank or device numbers.
"""

import os
import tomllib


def tree(topology):
    """(ranks' devices, parent of each node) of a platform file's text."""
    server = tomllib.loads(topology)
    return server["ranks"], {node["name"]: node.get("in") for node in server["node"]}


def above(node, parent, kind, kinds):
    """The nearest ancestor of ``node`` of ``kind`` (``kinds``: each node's kind)."""
    while node is not None and kinds.get(node) != kind:
        node = parent.get(node)
    return node


def placement(topology):
    """For each rank, (its socket, its PCIe switch), read off the tree."""
    devices, parent = tree(topology)
    kinds = {node["name"]: node["kind"] for node in tomllib.loads(topology)["node"]}
    return [(above(d, parent, "socket", kinds), above(d, parent, "pcie_switch", kinds)) for d in devices]


def best_ring(topology):
    """The ranks in ring order: socket by socket, switch by switch inside each."""
    where = placement(topology)
    return sorted(range(len(where)), key=lambda rank: (where[rank], rank))


def pin_to_numa_node(rank, topology, numa_cpus):
    """Runs this process on the CPUs of its GPU's socket (``numa_cpus``: socket -> CPUs), so that
    its host memory and the data it feeds the GPU stay on that socket's memory controller."""
    socket, _ = placement(topology)[rank]
    os.sched_setaffinity(0, numa_cpus[socket])
