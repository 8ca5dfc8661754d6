"""Problem 14, reference solution: a sparse parameter server, the dense allreduce baseline, and a
cost model that chooses between them.

The embedding table (rows x dim, float32) is sharded by row: row r lives on server r % S, so the
popular low ids spread over every server. One step of the parameter server:

  pull    each worker de-duplicates its batch's ids (np.unique) and sends each server the count,
          then the ids, of the distinct rows it holds; the server looks every worker's rows up in
          one call and sends each worker its rows, in the order asked;
  compute the worker expands its rows to one per id occurrence and gets every occurrence's
          gradient from batch.gradients;
  push    it SUMS the gradients of each distinct id (np.add.at: `summed[where] += grads` keeps one
          occurrence of a repeated id) and sends each server the rows it pulled from it, same order;
          the server applies every worker's gradients in one call (shard.add sums a row two
          workers pushed).

A worker moves 8 bytes per distinct id it asks for and 4*dim per row each way: its bytes follow
the rows its batch touches, not the table. The dense baseline keeps the whole table on every
worker and allreduces the whole table's gradient every step, touched or not.
"""

import numpy as np

from distlab import IN_PLACE, SUM, Request

COUNT, IDS, ROWS, GRADS = 1, 2, 3, 4  # message tags, one per kind of message
ID_BYTES, VALUE_BYTES = 8, 4  # int64 ids, float32 rows and gradients


def sum_by_id(ids, grads):
    """The distinct ids (ascending) and, for each, the sum of the gradients of its occurrences."""
    distinct, where = np.unique(ids, return_inverse=True)
    summed = np.zeros((distinct.size, grads.shape[-1]), dtype=np.float32)
    np.add.at(summed, where.ravel(), grads.reshape(-1, grads.shape[-1]))
    return distinct, summed


def owner_of(ids, servers):
    """The index of the server that holds each id's row: row r lives on server r % S."""
    return ids % len(servers)


def pull(comm, servers, ids, dim):
    """The rows of the distinct `ids`, in their order: each server is sent the count, then the ids,
    of the rows it holds (the count even when it is 0, so that it knows this worker is done asking),
    and answers with those rows in the order asked."""
    owner = owner_of(ids, servers)
    parts = [np.empty((np.count_nonzero(owner == s), dim), dtype=np.float32) for s in range(len(servers))]
    requests = []
    for s, server in enumerate(servers):
        asked = ids[owner == s]
        requests.append(comm.Isend(np.array([asked.size], dtype=np.int64), dest=server, tag=COUNT))
        if asked.size:
            requests.append(comm.Isend(asked, dest=server, tag=IDS))
            requests.append(comm.Irecv(parts[s], source=server, tag=ROWS))
    Request.Waitall(requests)
    rows = np.empty((ids.size, dim), dtype=np.float32)
    for s, part in enumerate(parts):
        rows[owner == s] = part
    return rows


def push(comm, servers, ids, grads):
    """Send each server the gradients of the rows it gave, in the order it gave them."""
    owner = owner_of(ids, servers)
    Request.Waitall([comm.Isend(np.ascontiguousarray(grads[owner == s]), dest=server, tag=GRADS)
                     for s, server in enumerate(servers) if np.any(owner == s)])


def worker_step(comm, servers, batch):
    """Pull the rows the batch touches, compute their gradients, push them back summed by id."""
    distinct, where = np.unique(batch.ids, return_inverse=True)
    rows = pull(comm, servers, distinct, batch.dim)
    grads = batch.gradients(rows[where.reshape(batch.ids.shape)])  # one row per id occurrence
    _, summed = sum_by_id(batch.ids, grads)  # the same distinct ids, in the same order
    push(comm, servers, distinct, summed)


def server_step(comm, workers, shard, lr):
    """Serve every worker's pull, then apply every worker's push: one synchronous step."""
    counts = [np.empty(1, dtype=np.int64) for _ in workers]
    Request.Waitall([comm.Irecv(count, source=w, tag=COUNT) for w, count in zip(workers, counts)])
    asked = [np.empty(int(count[0]), dtype=np.int64) for count in counts]
    Request.Waitall([comm.Irecv(ids, source=w, tag=IDS) for w, ids in zip(workers, asked) if ids.size])

    every_id = np.concatenate(asked)
    rows = shard.lookup(every_id)  # one batched lookup for all the workers
    grads = np.empty_like(rows)
    bounds = np.cumsum([0] + [ids.size for ids in asked])
    requests = []
    for w, lo, hi in zip(workers, bounds[:-1], bounds[1:]):
        if hi > lo:
            requests.append(comm.Isend(rows[lo:hi], dest=w, tag=ROWS))
            requests.append(comm.Irecv(grads[lo:hi], source=w, tag=GRADS))
    Request.Waitall(requests)
    shard.add(every_id, -lr * grads)  # a row pushed by several workers gets all their gradients


def dense_step(comm, table, batch, lr):
    """The baseline: every worker holds the whole table and allreduces the whole gradient."""
    grads = batch.gradients(table[batch.ids])
    distinct, summed = sum_by_id(batch.ids, grads)
    gradient = np.zeros_like(table)  # float32 like the table: the allreduce moves all of it
    gradient[distinct] = summed  # distinct ids: a plain assignment is safe here
    comm.Allreduce(IN_PLACE, gradient, op=SUM)
    table -= lr * gradient


def step_times(rows, dim, touched, workers, servers, alpha, beta, row_cost):
    """(parameter-server seconds, allreduce seconds) of one step; `touched` is the distinct rows
    of one worker's batch, so the touched fraction is touched / rows.

    Parameter server: three rounds of messages (ids, rows, gradients), each paying alpha once; a
    server handles touched * W / S rows, looking each up and updating each at row_cost; its port
    carries their ids in, their rows out, their gradients in, unless a worker's port, with its
    own touched rows each way, is busier (when S > W). Allreduce: the ring over the W workers,
    2(W-1) latencies and 2(W-1)/W of the whole table's gradient through each port."""
    row_bytes = VALUE_BYTES * dim
    served = touched * workers / servers
    busiest = max(served, touched)
    sparse = 3 * alpha + 2 * row_cost * served + (ID_BYTES * served + 2 * row_bytes * busiest) * beta
    dense = 2 * (workers - 1) * alpha + 2 * (workers - 1) / workers * rows * row_bytes * beta
    return sparse, dense


def choose(rows, dim, touched, workers, servers, alpha, beta, row_cost):
    """The path a step should take: "parameter server" or "allreduce", whichever the model finds faster."""
    sparse, dense = step_times(rows, dim, touched, workers, servers, alpha, beta, row_cost)
    return "parameter server" if sparse < dense else "allreduce"
