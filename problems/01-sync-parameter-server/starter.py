"""Problem 01: a synchronous parameter server.

S server ranks hold the model, one contiguous key range each; W worker ranks hold the click logs.
Write the three functions below so that after `steps` steps the servers hold exactly the model
that plain gradient descent reaches on all the workers' examples together:

    w  <-  w - lr * (sum over every example of its log-loss gradient) / (number of examples)

The harness calls, on every rank (servers are ranks 0 .. S-1, workers S .. S+W-1):

    server(comm, servers, workers, weights, steps, lr)   on the server ranks
    worker(comm, servers, workers, batch, steps)          on the worker ranks

    servers, workers   lists of ranks, e.g. [0, 1] and [2, 3, 4]
    weights            the whole initial model (float64, length D); a server keeps its keys only
    batch              the worker's examples: batch.X (n x D), batch.y (n clicks), batch.size (n),
                       and batch.gradient(w), which returns the SUM over the n examples of the
                       gradient at the full model w (float64, length D)
    server returns     (lo, shard): its first key, and the final weights of its keys lo .. hi-1

Rules of the game:

* point-to-point messages only (Send, Recv, Isend, Irecv, Sendrecv; Request.Waitall);
* each step, each worker pulls the model once and pushes one slice to each server, no more;
* each server holds about D/S keys (key_range), whatever S, W and D are;
* a worker that is late must not make a server mix two steps (tag messages with the step).

Check it with `distlab check 01`; ask for a nudge with `distlab hint 01`.
"""

import numpy as np

from distlab import Request


def key_range(num_keys, num_servers, index):
    """Keys [lo, hi) held by server number `index` (0 .. num_servers-1)."""
    # TODO: split 0 .. num_keys-1 into num_servers nearly equal contiguous ranges.
    # For now server 0 holds every key and the others none.
    if index == 0:
        return 0, num_keys
    return num_keys, num_keys


def server(comm, servers, workers, weights, steps, lr):
    """Holds one shard of the model; returns (lo, final weights of keys lo .. hi-1)."""
    lo, hi = key_range(len(weights), len(servers), servers.index(comm.Get_rank()))
    shard = np.array(weights[lo:hi], dtype=np.float64)

    for step in range(steps):
        # Pull: send this step's shard to every worker (tag=step).
        # TODO

        # Push: receive exactly one gradient slice from each worker (tag=step), add them up,
        # then update: shard -= lr * summed slices / number of examples behind them.
        # TODO
        pass

    return lo, shard


def worker(comm, servers, workers, batch, steps):
    """Pulls the model, computes the gradient of its batch and pushes the slices, `steps` times."""
    num_keys = batch.X.shape[1]
    w = np.empty(num_keys)

    for step in range(steps):
        # Pull: receive every server's shard into its place in w.
        # TODO

        # grad = batch.gradient(w)  # summed over this worker's examples

        # Push: send each server the slice of grad for its keys (and what it needs to average).
        # TODO
        pass
