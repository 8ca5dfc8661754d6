"""Pipeline parallelism: GPipe and 1F1B over point-to-point messages.

Rank r runs stage r of p. ``stage`` is the harness's handle on it:

- ``stage.index``, ``stage.count`` (p), ``stage.micro_batches`` (m)
- ``stage.input_shape``: the activation stage index-1 sends (stage 0 reads its own samples)
- ``stage.output_shape``: the activation to send to stage index+1 (the last stage has a loss instead)
- ``stage.forward(micro, x)``: runs micro-batch ``micro`` (0..m-1) through the stage and stashes what
  its backward needs; returns the activation to send on (a float64 array), or on the last stage
  the micro-batch's mean loss
- ``stage.backward(micro, grad)``: backpropagates micro-batch ``micro`` from its stash, adding into
  the parameters' .grad; ``grad`` is the gradient of the batch's loss with respect to the stage's
  output (as the next stage sent it), or on the last stage the weight of the micro-batch's loss in
  the batch's loss; returns the gradient to send to stage index-1 (None on stage 0)
- ``stage.module``: the stage's torch layers

After a step, every parameter's .grad must be the gradient of the batch's mean loss, as one
process computing the whole batch at once would have it.
"""

import numpy as np  # noqa: F401  (you will want it for the message buffers)


def gpipe(comm, stage):
    """One training step: every micro-batch's forward, then every backward.

    TODO: receive each activation from stage.index - 1 (comm.Recv into a float64 buffer of
    stage.input_shape), call stage.forward, send the result to stage.index + 1; then the backwards,
    receiving gradients from stage.index + 1 and sending stage.backward's result to stage.index - 1."""
    return None


def one_f_one_b(comm, stage):
    """One training step in the 1F1B order: a warm-up of forwards, then one forward and one
    backward in turn, then the backwards left.

    TODO: how many forwards must stage r run before its first backward, and what if m < p?"""
    return None
