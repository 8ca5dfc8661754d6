"""Problem 06: DDP from scratch, with gradient buckets and overlap.

Write DataParallel(comm, model, bucket_cap_bytes). The checker builds a torch model on every rank
(each from its own random seed), wraps it, and trains it with plain SGD:

    ddp = DataParallel(comm, model, bucket_cap_bytes=cap)
    for each step:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(my_shard_of_the_batch), ...)
        loss.backward()                # your gradient hooks run in here
        ddp.finish_gradient_sync()     # afterwards every p.grad holds the average over the ranks
        optimizer.step()

Rules of the game:

* the constructor broadcasts rank 0's weights, so every replica starts the same;
* gradients are packed in buckets: walk the parameters in *reverse* order, and start a new
  bucket when the next gradient would take the current one past bucket_cap_bytes (a tensor
  larger than the cap gets a bucket of its own); exactly one allreduce per bucket per step;
* each bucket's allreduce is nonblocking, comm.Iallreduce(IN_PLACE, buffer) -> Request, started
  from a gradient hook as soon as the bucket is full, while backward goes on;
* finish_gradient_sync waits for all of them (Request.Waitall) and divides by the world size;
* a parameter that gets no gradient in a step must not hang the run or silently corrupt it.

Check it with `distlab check 06`; ask for a nudge with `distlab hint 06`.
"""

import torch  # noqa: F401 (you will need it)

from distlab import IN_PLACE, Request  # noqa: F401 (you will need them)


def plan_buckets(nbytes, cap_bytes):
    """Groups consecutive sizes (bytes, already in reverse parameter order) into buckets of at
    most cap_bytes; returns the buckets as lists of indices into nbytes."""
    # TODO: a new bucket when the next size would pass the cap; a size over the cap stays alone.
    return [list(range(len(nbytes)))]


class DataParallel:
    """Keeps a model's replicas in step: call finish_gradient_sync() after each loss.backward()."""

    def __init__(self, comm, model, bucket_cap_bytes):
        self.comm = comm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.cap = bucket_cap_bytes

        # TODO 1: broadcast rank 0's weights to every rank (comm.Bcast takes a CPU tensor; one
        #         flat tensor costs one latency instead of one per parameter).

        # TODO 2: buckets over reversed(self.params) with plan_buckets, one flat buffer each
        #         (p.numel() * p.element_size() bytes per parameter).

        # TODO 3: p.register_post_accumulate_grad_hook(self._gradient_ready) for every parameter.

    def _gradient_ready(self, param):
        """Called during backward once param.grad holds this step's gradient."""
        # TODO: copy param.grad into its bucket's buffer; once the bucket is full, start
        #       comm.Iallreduce(IN_PLACE, buffer) and keep the Request (buckets in index order).
        pass

    def finish_gradient_sync(self):
        """Waits for every bucket's allreduce and leaves the averaged gradient in each p.grad."""
        # TODO: start any bucket not started yet (a parameter may have had no gradient), wait for
        #       all requests, divide by comm.Get_size(), copy back into p.grad, reset for the
        #       next step.
        pass
