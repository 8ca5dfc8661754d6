"""Problem 15: a mixed cluster of A100, V100 and Ascend 910 accelerators.

Data-parallel training where the devices differ in speed and in the operators they support. Each
rank gets one dict per device (rank r runs on devices[r]):

    {"name": "n2-gpu1", "profile": "v100", "samples_per_s": 370.0, "flops": 14e12,
     "unsupported_ops": []}

split_batch(global_batch, devices)
    How many of the global batch's samples each rank computes: a list of whole numbers, one per
    rank, proportional to samples_per_s and summing exactly to global_batch.

place(layers, device)
    layers is the model as (name, op) pairs, e.g. [("tags", "embedding_bag"), ("head", "linear")].
    Return {name: "accelerator" or "host"} for this device: the host only for ops it lacks.

sync_gradients(comm, model, local_batch, global_batch)
    Called after loss.backward(), where the loss was the mean over this rank's local_batch
    samples. Afterwards every param.grad must be the gradient of the mean loss over the whole
    global batch, the same on every rank. comm.Allreduce(IN_PLACE, tensor, op=SUM) sums a CPU
    tensor over the ranks, in place.

Check it with `distlab check 15`; see it with `distlab run 15`; ask for a nudge with `distlab hint 15`.
"""

from distlab import IN_PLACE, SUM


def split_batch(global_batch, devices):
    """Per-rank batch sizes, proportional to samples_per_s, summing exactly to global_batch."""
    # TODO: this splits evenly, as if every device were as fast as the others.
    p = len(devices)
    sizes = [global_batch // p] * p
    sizes[0] += global_batch - sum(sizes)
    return sizes


def place(layers, device):
    """{layer name: "accelerator" or "host"}: only the ops this device lacks leave it."""
    # TODO: look at device["unsupported_ops"].
    return {name: "accelerator" for name, op in layers}


def sync_gradients(comm, model, local_batch, global_batch):
    """Turn each rank's local mean gradient into the global batch's, the same on every rank."""
    p = comm.Get_size()
    for param in model.parameters():
        comm.Allreduce(IN_PLACE, param.grad, op=SUM)
        param.grad /= p  # TODO: the mean over ranks, as DDP does: is that the global batch's gradient?
