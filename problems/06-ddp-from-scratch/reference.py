"""Problem 06, reference solution: data parallelism with gradient buckets and overlap.

Every rank holds a whole copy of the model and trains it on its own shard of each batch. Three
things keep the copies one model:

1. The same start: rank 0's initial weights are broadcast to every rank.
2. The same update: after backward every gradient is averaged over the ranks (allreduce, then
   divide by p). With equal shards, the average of the local mean-loss gradients is the gradient
   of the mean loss over the whole global batch: p ranks take exactly the step one process would.
3. Overlap: backward produces gradients from the last layer to the first, so the gradients are
   packed into buckets in *reverse* parameter order, at most ``bucket_cap_bytes`` each. A gradient
   hook counts the arrivals; the moment a bucket's last gradient is in, its nonblocking allreduce
   starts, and backward goes on computing the earlier layers meanwhile. When backward ends only
   the last bucket or so is still on the wire: ``finish_gradient_sync`` waits for all of them and
   divides by p.

One bucket per allreduce, not one per tensor: each collective pays latency, so a few large
messages beat many small ones; but one bucket for everything could only start after backward.
The cap trades the two.
"""

import torch

from distlab import IN_PLACE, Request


def plan_buckets(nbytes, cap_bytes):
    """Groups consecutive sizes into buckets of at most cap_bytes; returns lists of indices.

    A new bucket starts when the next tensor would take the current one past the cap; a tensor
    larger than the cap gets a bucket of its own."""
    buckets, current, filled = [], [], 0
    for i, n in enumerate(nbytes):
        if current and filled + n > cap_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(i)
        filled += n
    if current:
        buckets.append(current)
    return buckets


class Bucket:
    """Some parameters' gradients, packed into one flat buffer that is reduced in one call."""

    def __init__(self, params):
        self.params = params
        self.offsets = [0]
        for p in params:
            self.offsets.append(self.offsets[-1] + p.numel())
        self.flat = torch.zeros(self.offsets[-1], dtype=params[0].dtype)
        self.arrived = set()  # ids of the parameters whose gradient is in the buffer this step
        self.request = None

    def slot(self, i):
        """The part of the flat buffer that holds parameter i's gradient (a view)."""
        return self.flat[self.offsets[i]:self.offsets[i + 1]]

    def full(self):
        return len(self.arrived) == len(self.params)


class DataParallel:
    """Keeps a model's replicas in step: call finish_gradient_sync() after each loss.backward()."""

    def __init__(self, comm, model, bucket_cap_bytes):
        self.comm = comm
        self.params = [p for p in model.parameters() if p.requires_grad]

        # 1. The same start: one broadcast of all the weights, packed flat (one latency, not one
        # per tensor).
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in self.params])
            comm.Bcast(flat, root=0)
            offset = 0
            for p in self.params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

        # 2. Buckets in reverse parameter order: the order backward produces the gradients.
        backward_order = self.params[::-1]
        sizes = [p.numel() * p.element_size() for p in backward_order]
        self.buckets = [Bucket([backward_order[i] for i in group])
                        for group in plan_buckets(sizes, bucket_cap_bytes)]
        self.where = {}  # parameter id -> (bucket index, position in the bucket)
        for b, bucket in enumerate(self.buckets):
            for i, p in enumerate(bucket.params):
                self.where[id(p)] = (b, i)
                # Runs when p.grad holds this step's whole gradient.
                p.register_post_accumulate_grad_hook(self._gradient_ready)
        self.next_launch = 0  # buckets start in index order, the same on every rank

    def _gradient_ready(self, param):
        b, i = self.where[id(param)]
        bucket = self.buckets[b]
        bucket.slot(i).copy_(param.grad.reshape(-1))
        bucket.arrived.add(id(param))
        # 3. Start every bucket that is full, in order: collectives must be called in the same
        # order on every rank, and backward fills bucket 0 first, so this rarely waits.
        while self.next_launch < len(self.buckets) and self.buckets[self.next_launch].full():
            self._launch(self.buckets[self.next_launch])

    def _launch(self, bucket):
        bucket.request = self.comm.Iallreduce(IN_PLACE, bucket.flat)
        self.next_launch += 1

    def finish_gradient_sync(self):
        """Waits for every bucket's allreduce and leaves the averaged gradient in each p.grad."""
        # A parameter that got no gradient this step (a branch the forward pass skipped) leaves
        # its bucket short. Count its gradient as zero and start what is left, in order, so that
        # every rank still runs the same collectives.
        for bucket in self.buckets[self.next_launch:]:
            for i, p in enumerate(bucket.params):
                if id(p) not in bucket.arrived:
                    bucket.slot(i).zero_()
            self._launch(bucket)
        Request.Waitall([bucket.request for bucket in self.buckets])

        p_count = self.comm.Get_size()
        with torch.no_grad():
            for bucket in self.buckets:
                bucket.flat /= p_count  # the sum over ranks becomes the average
                for i, p in enumerate(bucket.params):
                    averaged = bucket.slot(i).view_as(p)
                    if p.grad is None:
                        p.grad = averaged.clone()
                    else:
                        p.grad.copy_(averaged)
                bucket.arrived.clear()
                bucket.request = None
        self.next_launch = 0
