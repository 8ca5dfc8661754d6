"""Problem 14: large sparse features, a parameter server or an allreduce?

A click model keeps one embedding table of `table_rows` rows x `dim` (float32). Each impression
has FIELDS ids into it, drawn from a Zipf law: a few rows appear everywhere, most nowhere, and a
batch repeats its popular ids many times. Write both ways of training the table, then the cost
model that says which one is faster:

    worker_step(comm, servers, batch)       a parameter-server worker, one step
    server_step(comm, workers, shard, lr)   a parameter server, one step
    dense_step(comm, table, batch, lr)      the allreduce baseline, one step, on every worker
    step_times(rows, dim, touched, workers, servers, alpha, beta, row_cost)
                                            -> (parameter-server seconds, allreduce seconds)
    choose(rows, dim, touched, workers, servers, alpha, beta, row_cost)
                                            -> "parameter server" or "allreduce"

What the harness hands you:

    servers, workers   lists of ranks: servers are 0 .. S-1, workers S .. S+W-1
    batch.ids          int64 (B, FIELDS): the ids of this worker's B impressions
    batch.dim, batch.table_rows
    batch.gradients(emb)   emb (B, FIELDS, dim), the row of every id occurrence -> the gradient
                       of every occurrence (B, FIELDS, dim) float32, already divided by the
                       global batch: the update is rows -= lr * (sum of the gradients)
    shard              the server's rows: row r lives on server r % S (shard.index, shard.servers,
                       shard.dim, shard.table_rows)
    shard.lookup(ids)  -> the rows of these global ids (len(ids), dim), a copy
    shard.add(ids, deltas)  rows[ids] += deltas (a repeated id gets every delta)
                       both cost row_cost (0.5 us on the card) per id, whatever the dim
    table              dense_step's whole table (table_rows, dim) float32: update it in place

Rules of the game:

* synchronous SGD: after K steps both paths hold the table one process would train on every
  worker's batch; the gradient of a repeated id is the SUM over its occurrences;
* each worker pulls and pushes only the distinct rows its batch touches, from their own server;
* the allreduce baseline moves the whole table's gradient, float32;
* step_times must agree with the measured virtual time of both paths (see the card), and
  choose must pick the faster one.

Check it with `distlab check 14`; ask for a nudge with `distlab hint 14`.
"""


from distlab import IN_PLACE, SUM, Request  # noqa: F401 (you will need them)


def worker_step(comm, servers, batch):
    """Pull the rows the batch touches, compute their gradients, push them back summed by id."""
    # TODO: the distinct ids of the batch (np.unique(..., return_inverse=True)), each sent to
    # server servers[id % len(servers)]: first how many (a server cannot guess), then the ids.
    # TODO: receive the rows, lay them out once per occurrence, call batch.gradients.
    # TODO: sum the gradients of each distinct id and push them to the servers they came from.
    pass


def server_step(comm, workers, shard, lr):
    """Serve every worker's pull, then apply every worker's push: one synchronous step."""
    # TODO: receive each worker's count, then its ids; shard.lookup them; send each worker its rows.
    # TODO: receive each worker's summed gradients and shard.add(ids, -lr * gradients).
    pass


def dense_step(comm, table, batch, lr):
    """The baseline: every worker holds the whole table and allreduces the whole gradient."""
    # TODO: gradients of the rows table[batch.ids], summed into a dense (table_rows, dim) float32
    # gradient, allreduced over the workers, then table -= lr * gradient, in place.
    pass


def step_times(rows, dim, touched, workers, servers, alpha, beta, row_cost):
    """(parameter-server seconds, allreduce seconds) of one step. `touched` is the number of
    distinct rows one worker's batch touches; alpha is seconds per message, beta seconds per
    byte, row_cost the server's seconds per row looked up or updated."""
    # TODO: follow the bytes through the busiest port, and count the rounds of messages.
    return 0.0, 0.0


def choose(rows, dim, touched, workers, servers, alpha, beta, row_cost):
    """The path a step should take: "parameter server" or "allreduce"."""
    # TODO: whichever of your step_times is smaller.
    return "allreduce"
