"""Problem 01, reference solution: a synchronous parameter server over point-to-point messages.

The model (D weights, one per hash bucket) is cut into S contiguous key ranges, one per server.
Every step is the same three moves, in lockstep:

  pull     each server sends its shard to every worker (one Isend per worker, all at once);
  compute  each worker assembles the model and computes the summed gradient of its batch;
  push     each worker sends server s the slice of its gradient for s's keys, plus its
           example count; server s waits for exactly one push per worker, then applies
           w -= lr * (sum of the slices) / (sum of the counts).

Why it cannot mix steps: a server sends the shard of step k only after it has applied step k-1,
and a worker pushes for step k only after it has that shard, so no push of step k can exist
before the last push of step k-1 has been taken. Every message also carries its step as its tag,
so a message could not be taken into the wrong step even if that reasoning were broken.

Bytes per worker per step: the model comes in once (D floats over S shards) and the gradient goes
out once (D floats over S slices, plus one count each): two models, the least a synchronous
parameter server can move.

Ranks: servers are ranks 0 .. S-1 and workers S .. S+W-1 (the harness passes both lists).
"""

import numpy as np

from distlab import Request


def key_range(num_keys, num_servers, index):
    """Keys [lo, hi) held by server number ``index``: S nearly equal contiguous ranges."""
    base, extra = divmod(num_keys, num_servers)
    lo = index * base + min(index, extra)  # the first `extra` ranges hold one key more
    return lo, lo + base + (1 if index < extra else 0)


def server(comm, servers, workers, weights, steps, lr):
    """Holds one shard; returns (lo, final weights of keys lo .. hi-1)."""
    lo, hi = key_range(len(weights), len(servers), servers.index(comm.Get_rank()))
    shard = np.array(weights[lo:hi], dtype=np.float64)  # a copy: this server's keys only
    push = np.empty(hi - lo + 1)  # a worker's gradient slice, then its example count

    for step in range(steps):
        # Pull: every worker gets this step's shard, all sends in flight together, so the
        # server's port carries W shards back to back instead of W round trips.
        Request.Waitall([comm.Isend(shard, dest=w, tag=step) for w in workers])

        # Push: exactly one message per worker, tagged with this step; sum slices and counts.
        total = np.zeros(hi - lo)
        examples = 0.0
        for w in workers:
            comm.Recv(push, source=w, tag=step)
            total += push[:-1]
            examples += push[-1]
        shard -= lr * total / examples  # the mean over the global batch, not over workers

    return lo, shard


def worker(comm, servers, workers, batch, steps):
    """Pulls, computes and pushes ``steps`` times; the servers keep the model."""
    num_keys = batch.X.shape[1]
    ranges = [key_range(num_keys, len(servers), i) for i in range(len(servers))]
    w = np.empty(num_keys)

    for step in range(steps):
        # Pull: each server's shard lands straight in its place in w (slices are views).
        Request.Waitall([comm.Irecv(w[lo:hi], source=s, tag=step)
                         for s, (lo, hi) in zip(servers, ranges)])

        grad = batch.gradient(w)  # summed over this worker's examples

        # Push: server s gets only its keys' slice, and the count it needs to average.
        slices = [np.append(grad[lo:hi], batch.size) for lo, hi in ranges]
        Request.Waitall([comm.Isend(piece, dest=s, tag=step)
                         for s, piece in zip(servers, slices)])
