"""Problem 10, starter: an asynchronous parameter server with no bound at all.

This server answers every read at once, however far behind the slowest worker is: fast, and
unboundedly stale. Keep a clock table (gradients pushed by each worker), and answer a read at
clock c only when the slowest worker is at clock c - s or later. Mind the worker that has sent
its last gradient: it will never move its clock again.

box.next() gives the next Push (worker, clock, gradient or None, last), or None when every worker
has sent its last; box.reply(worker, model) answers that worker's read.
"""

import numpy as np


def server(comm, box, workers, weights, staleness, lr):
    """Serves the workers until each has sent its last gradient; returns the final model."""
    model = np.array(weights, dtype=np.float64)
    while (push := box.next()) is not None:
        if push.gradient is not None:
            model -= lr * push.gradient  # pushes apply at once
        if not push.last:
            # TODO: a clock table; answer this read (and any other waiting one) only when the slowest
            # worker is at push.clock - staleness or later.
            box.reply(push.worker, model)
    return model
