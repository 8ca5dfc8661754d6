"""Problem 09, reading the runs: a wrong sum named by what it holds instead (one data center's sum,
one shard right, the rank's own input), the bytes that crossed data centers on the virtual clock,
why there were too many, and the cost answers against the bill's closed forms."""

from __future__ import annotations

import numpy as np

from distlab import grading

from .cases import MODEL_SIZES, Bill, Buffer, Cluster
from .programs import sample

RTOL = {"float32": 1e-5, "float64": 1e-12, "int64": 0.0}  # a sum's rounding in another order
COST_RTOL = 1e-6  # the cost answers are closed forms: GiB for GB alone is 7% off


def _close(got: np.ndarray, want: np.ndarray, buffer: Buffer) -> np.ndarray:
    return grading.agreement(got, want, rtol=RTOL[buffer.dtype], atol=RTOL[buffer.dtype] * buffer.cluster.p)


def wrong_sums(buffer: Buffer, values: list[np.ndarray]) -> str | None:
    """None when every rank holds the sum, else the first symptom: seen across every rank (each
    shard finished somewhere, never spread) or on one rank."""
    want = sample(buffer.expected())
    right = [_close(got, want, buffer) for got in values]
    if all(r.all() for r in right):
        return None
    own = [got == sample(buffer.input(rank)) for rank, got in enumerate(values)]
    if (buffer.n == want.size and np.logical_or.reduce(right).all()
            and all((r | o).all() for r, o in zip(right, own))):
        return (f"{buffer.label()}: every element is summed on some rank but each rank holds the sum "
                "only on its own shard and its input elsewhere: the allgather inside the data "
                "center is missing")
    return next(wrong for rank, got in enumerate(values) if (wrong := wrong_sum(buffer, rank, got)))


def wrong_sum(buffer: Buffer, rank: int, got: np.ndarray) -> str | None:
    """None when ``rank`` holds the sum over every rank, else what it holds, named."""
    want = sample(buffer.expected())
    mismatch = grading.first_mismatch(got, want, rtol=RTOL[buffer.dtype], atol=RTOL[buffer.dtype] * buffer.cluster.p)
    if mismatch is None:
        return None
    head, cluster = f"{buffer.label()}: rank {rank}", buffer.cluster
    dc_of = cluster.datacenter_of()
    own_dc = [r for r in range(cluster.p) if dc_of[r] == dc_of[rank]]
    in_dc = sample(np.sum([buffer.input(r).astype(np.float64) for r in own_dc], axis=0))
    if _close(got, in_dc, buffer).all():
        return (f"{head} holds the sum over its own data center only (ranks {own_dc}): the step "
                "between data centers is missing, or its groups were split by data center instead "
                "of by the rank's index inside its data center")
    if np.array_equal(got, sample(buffer.input(rank))):
        return f"{head} still holds its own input: nothing was summed into buf (it works in place)"
    return f"{head} {mismatch.describe()}"


def wan_bytes(task: grading.TaskRun, platform: grading.Platform) -> int:
    """Bytes that crossed a priced (WAN) link on the virtual clock, both directions."""
    return sum(nbytes for link, nbytes in task.timeline().link_bytes.items() if platform.link_price(link) > 0)


def too_many_wan_bytes(buffer: Buffer, seen: int, contiguous_passed: bool) -> str:
    """Why ``seen`` WAN bytes exceed the optimum, named only where the evidence says which."""
    cluster, nbytes = buffer.cluster, buffer.n * 4
    best, flat = cluster.optimal_wan_bytes(nbytes), cluster.flat_ring_wan_bytes(nbytes)
    head = (f"{buffer.label()}: {seen / 2**20:.2f} MiB crossed data centers, "
            f"{seen / best:.2f}x the hierarchical optimum 2(D-1) n = {best / 2**20:.2f} MiB")
    if abs(seen - flat) <= 0.02 * flat:
        return (f"{head}: exactly what one ring over all {cluster.p} ranks sends across them "
                f"({flat / 2**20:.2f} MiB): the allreduce did not follow the data centers")
    if cluster.round_robin and contiguous_passed:
        return (f"{head}, on the cluster whose ranks are numbered round-robin across data centers "
                "only (the card's, numbered in blocks, was at the optimum): the groups were built "
                "from rank numbers (rank // per_dc), not from datacenter_of")
    return head


def wrong_costs(bill: Bill, answer: dict[str, object]) -> str | None:
    """None when the bytes and dollars per step and per epoch match the bill's closed forms, else
    the first one off."""
    for params in MODEL_SIZES:
        wan_step, compute_step = bill.per_step(params)
        steps = bill.steps_per_epoch
        want = {f"wan_bytes {params:g}": bill.wan_bytes_per_step(params),
                f"step {params:g}": (wan_step, compute_step),
                f"epoch {params:g}": (wan_step * steps, compute_step * steps)}
        for key, expected in want.items():
            if not np.allclose(answer[key], expected, rtol=COST_RTOL, atol=0):  # type: ignore[arg-type]
                return _named(bill, key, answer[key], expected)
    return None


def wrong_breakeven(bill: Bill, answer: dict[str, object]) -> str | None:
    """None when breakeven_params(bill, 0.4) is the bill's closed form, else what it is."""
    got, want = float(answer["breakeven"]), bill.breakeven_params(0.4)  # type: ignore[arg-type]
    if np.isclose(got, want, rtol=COST_RTOL, atol=0):
        return None
    why = (": that is where the WAN is 40% of the whole bill (WAN + compute), not of the compute "
           "bill" if np.isclose(got, bill.breakeven_params(0.4 / 0.6), rtol=1e-3) else "")
    return (f"{bill.label()}: breakeven_params(bill, 0.4) = {got:.4g} parameters, expected "
            f"{want:.4g} (WAN dollars per step = 40% of compute dollars per step){why}")


def _named(bill: Bill, key: str, got: object, want: object) -> str:
    ratio = float(np.ravel(got)[0]) / float(np.ravel(want)[0]) if np.ravel(want)[0] else float("nan")
    hint = {round(2**30 / 1e9, 3): ": a GB is 1e9 bytes here, not 2^30",
            round(1e9 / 2**30, 3): ": a GB is 1e9 bytes here, not 2^30",
            0.5: ": both phases cross the WAN, 2 (D-1) n, not (D-1) n",
            round(bill.dcs / (bill.dcs - 1), 3): ": it crosses D - 1 of D data centers' links twice, "
                                                 "2 (D-1) n, not 2 D n"}.get(round(ratio, 3), "")
    return f"{bill.label()}: {key.split()[0]} for {float(key.split()[1]):.3g} parameters is {got}, expected {want}{hint}"


def rounds_of(cluster: Cluster) -> str:
    """The WAN latencies a hierarchical allreduce pays at best, for messages."""
    return f"2 (D-1) = {2 * (cluster.dcs - 1)} WAN latencies (a ring over all p ranks pays {2 * (cluster.p - 1)})"
