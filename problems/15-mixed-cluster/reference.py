"""Problem 15, reference solution: data parallelism on a cluster of unequal devices.

Three decisions make a mixed cluster train as fast as it can, and exactly as one big device would:

1. Split by speed. A rank with b samples on a device of s samples/s computes for b / s seconds,
   so nobody waits when b is proportional to s. Measured speed, not the datasheet's: a V100 has
   72% of an A100's peak FLOP/s but does 39% of its ResNet-50 images per second.
2. Weight the gradients. A rank's loss is the mean over its own b_r samples, so the global batch's
   gradient is sum_r (b_r / B) * grad_r. Averaging (dividing by p, as DDP does) is right only
   when every rank has the same batch.
3. Place by device. An operator this accelerator lacks (the Ascend 910 has no embedding_bag or
   fft kernel) runs on the host; every other stays on the accelerator, where it is fast.
"""

from distlab import IN_PLACE, SUM


def split_batch(global_batch, devices):
    """Per-rank batch sizes, proportional to samples_per_s, summing exactly to global_batch.

    Shares are fractions and samples are whole. Round every share down: at most p - 1 samples
    are left, because each share lost less than one. Hand those out one each, to the ranks whose
    shares lost the most (the largest remainders), so that every rank ends within one sample of
    its share. B = 101 over 940, 370, 770 and 770 samples/s:

        shares      33.31  13.11  27.29  27.29     (101 * s / 2850)
        rounded     33     13     27     27        100: one sample left
        remainders   .31    .11    .29    .29      the largest is rank 0's
        split       34     13     27     27        101

    Rounding each share to the nearest is not enough: here it gives 100, one sample short.
    """
    total_speed = sum(device["samples_per_s"] for device in devices)
    shares = [global_batch * device["samples_per_s"] / total_speed for device in devices]
    sizes = [int(share) for share in shares]
    left_over = global_batch - sum(sizes)
    by_remainder = sorted(range(len(devices)), key=lambda rank: shares[rank] - sizes[rank], reverse=True)
    for rank in by_remainder[:left_over]:
        sizes[rank] += 1
    return sizes


def place(layers, device):
    """{layer name: "accelerator" or "host"} for one device: only the ops it lacks leave it.

    The decision is per device and per op: the Ascend sends its embedding_bag to the host, while
    an A100, which runs embedding_bag, keeps it (a needless host layer costs a transfer each way
    and a slow CPU). A layer's name says nothing; its op does.
    """
    lacking = set(device["unsupported_ops"])
    return {name: "host" if op in lacking else "accelerator" for name, op in layers}


def sync_gradients(comm, model, local_batch, global_batch):
    """Turn this rank's local mean gradient into the global batch's, the same on every rank.

    The loss behind param.grad was the mean over local_batch samples. Scaled by
    local_batch / global_batch, it becomes this rank's part of the mean over all global_batch
    samples, and the sum of the parts over the ranks is that mean's gradient. A rank with no
    samples contributes zeros, and still joins every Allreduce.
    """
    weight = local_batch / global_batch  # this rank's share of the samples, not 1 / p
    for param in model.parameters():
        param.grad.mul_(weight)
        comm.Allreduce(IN_PLACE, param.grad, op=SUM)
