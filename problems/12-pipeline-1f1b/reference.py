"""Pipeline parallelism: GPipe and 1F1B over point-to-point messages.

The model is cut into p stages, one per rank, and the batch into m micro-batches. A micro-batch's
forward goes stage 0 -> 1 -> ... -> p-1 (each stage sends its activation on), its backward comes
back p-1 -> ... -> 0 (each stage sends the gradient of its input back). A stage keeps what its
backward will need, the stashed activation, from a micro-batch's forward to its backward.

- GPipe runs every forward, then every backward: simple, but each stage holds all m activations.
- 1F1B warms up with p-1-rank forwards (fewer when m is smaller), then alternates one forward and
  one backward, then drains the backwards left. A stage never holds more than p activations.

Both leave the same bubble, (p-1)/(m+p-1) of the time idle with equal stages: the pipeline fills
and drains once per step whatever the order in between. 1F1B buys memory, not time.

Messages stay simple: blocking Send and Recv of float64 arrays, one tag, and every stage handles
its micro-batches oldest first, so each message is the one the receiver expects next (a channel
between two ranks delivers in order).
"""

from collections import deque

import numpy as np


def _send(comm, array, dest):
    comm.Send(np.ascontiguousarray(array, dtype=np.float64), dest=dest)


def _receive(comm, shape, source):
    buf = np.empty(shape, dtype=np.float64)
    comm.Recv(buf, source=source)
    return buf


def _forward(comm, stage, micro, in_flight):
    """Micro-batch ``micro`` through this stage: receive its activation, compute, send it on."""
    x = _receive(comm, stage.input_shape, stage.index - 1) if stage.index > 0 else None
    y = stage.forward(micro, x)
    if stage.index < stage.count - 1:
        _send(comm, y, stage.index + 1)
    in_flight.append(micro)


def _backward(comm, stage, in_flight):
    """The oldest micro-batch in flight back through this stage: it is the one whose gradient the
    next stage sent first."""
    micro = in_flight.popleft()
    if stage.index == stage.count - 1:
        # The batch's loss is the mean of the m micro-batch losses (equal sizes): each weighs 1/m.
        grad = 1.0 / stage.micro_batches
    else:
        grad = _receive(comm, stage.output_shape, stage.index + 1)
    grad_in = stage.backward(micro, grad)
    if stage.index > 0:
        _send(comm, grad_in, stage.index - 1)


def gpipe(comm, stage):
    """One training step's forward and backward: every forward, then every backward."""
    in_flight = deque()
    for micro in range(stage.micro_batches):
        _forward(comm, stage, micro, in_flight)
    while in_flight:
        _backward(comm, stage, in_flight)


def one_f_one_b(comm, stage):
    """One training step's forward and backward in the 1F1B order."""
    m, in_flight = stage.micro_batches, deque()
    # The last stage can start backward at once; each stage before it must first fill the stages
    # after it, one micro-batch each. With m < p there are only m to send.
    warmup = min(stage.count - 1 - stage.index, m)
    for micro in range(warmup):
        _forward(comm, stage, micro, in_flight)
    for micro in range(warmup, m):  # steady state: one forward, one backward
        _forward(comm, stage, micro, in_flight)
        _backward(comm, stage, in_flight)
    while in_flight:  # cool-down
        _backward(comm, stage, in_flight)
