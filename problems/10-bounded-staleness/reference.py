"""Problem 10, reference solution: a stale-synchronous parameter server.

The server keeps a clock table: for each worker, how many gradients it has pushed. A worker at
clock c (it has pushed c gradients and wants the model for its step c) may read only when the
slowest worker is at clock c - s or later, so no model it computes on misses more than s of any
worker's steps. Gradients apply the moment they arrive: the server never waits to sum them.

  s = 0    every read waits for every worker's previous gradient: synchronous training, the
           same models as gradient descent in one process;
  s > 0    a fast worker runs up to s steps ahead of the slowest, so a straggler's slow step
           costs the others nothing until it falls s steps behind.

A worker that has sent its last gradient will never move its clock again. Left in the table at
its last clock, it would hold back every read past that clock + s forever; it counts as
infinitely far ahead instead.

The harness's mailbox hands the server each worker's messages (box.next(): a Push with the
worker's clock, its gradient, and whether it is its last) and sends the replies (box.reply).
"""

import math

import numpy as np


def server(comm, box, workers, weights, staleness, lr):
    """Serves the workers until each has sent its last gradient; returns the final model."""
    model = np.array(weights, dtype=np.float64)
    clock = {w: 0 for w in workers}  # gradients pushed by each worker: its clock
    waiting = {}  # worker -> the clock it reads at, for reads not yet answered

    while (push := box.next()) is not None:
        if push.gradient is not None:
            model -= lr * push.gradient  # pushes apply at once, in the order they arrive

        if push.last:
            clock[push.worker] = math.inf  # done: never the slowest again
        else:
            clock[push.worker] = push.clock
            waiting[push.worker] = push.clock  # every push but the last asks for the next model

        # A push can move the slowest clock: answer every read the bound now allows.
        slowest = min(clock.values())
        for worker, at in list(waiting.items()):
            if slowest >= at - staleness:
                box.reply(worker, model)
                del waiting[worker]

    return model
