"""Problem 11, starter: a ring that follows the server's tree, and each rank pinned to its GPU's
socket.

`topology` is the text of a platform file (TOML: `tomllib.loads(topology)`): its `ranks` list
names each rank's device, and each `[[node]]` has a `name`, a `kind` (host, socket, pcie_switch,
device) and the node it sits `in`. Read the card (`distlab show 11`), then replace each TODO.
"""


def best_ring(topology):
    """The ranks in the order of a ring whose slowest hop is as fast as any ring's can be (hops
    that cross one link share it).

    TODO: read the tree; this is the naive ring 0, 1, ..., p-1."""
    import tomllib

    return list(range(len(tomllib.loads(topology)["ranks"])))


def pin_to_numa_node(rank, topology, numa_cpus):
    """Runs this process on the CPUs of its GPU's socket; ``numa_cpus`` maps each socket's name to
    its CPUs on this machine.

    TODO: find this rank's socket in the tree and apply the affinity (os.sched_setaffinity)."""
