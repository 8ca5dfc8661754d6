"""Problem 09, reading the runs. The answers first, here in the checker and out of the ranks'
reach (judging.py is hidden from the learner's process): every buffer's sum, the training on one
process, the bills' closed forms. Then a wrong sum named by what it holds instead (one data
center's sum, one shard right, the rank's own input), the bytes that crossed data centers on the
virtual clock, why there were too many or too few, and the cost answers against the closed forms.
Whatever a rank returned is checked for its shape before it is read: a malformed value is a failed
check that says what came back, never a crash of the checker."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from distlab import grading

from .cases import MODEL_SIZES, Bill, Buffer, Cluster, Training

RTOL = {"float32": 1e-5, "float64": 1e-12, "int64": 0.0}  # a sum's rounding in another order
COST_RTOL = 1e-6  # the cost answers are closed forms: GiB for GB alone is 7% off


# -- the answers ---------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def expected_sum(buffer: Buffer) -> np.ndarray:
    """The sum of every rank's input, in float64."""
    return np.sum([buffer.input(r).astype(np.float64) for r in range(buffer.cluster.p)], axis=0)


def trained(training: Training) -> tuple[np.ndarray, list[float]]:
    """The weights after ``steps`` steps and the loss before each, on one process."""
    p = training.cluster.p
    w, losses = np.zeros(training.features), []
    rows = [training.shard(r) for r in range(p)]
    x, y = np.vstack([r[0] for r in rows]), np.concatenate([r[1] for r in rows])
    for _ in range(training.steps):
        losses.append(float(np.mean((x @ w - y) ** 2)))
        w = w - training.lr * sum(training.gradient(w, r) for r in range(p))
    return w, losses


def wan_bytes_per_step(bill: Bill, params: float) -> float:
    """Bytes the hierarchical allreduce of one gradient sends across data centers: 2 (D-1) n."""
    return 2 * (bill.dcs - 1) * bill.bytes_per_param * params


def per_step(bill: Bill, params: float) -> tuple[float, float]:
    """(WAN dollars, compute dollars) of one step with the hierarchical allreduce."""
    gpus = bill.dcs * bill.per_dc
    return (wan_bytes_per_step(bill, params) * bill.wan_price_per_gb / 1e9,
            gpus * bill.compute_s_per_step * bill.gpu_price_per_hour / 3600)


def breakeven_params(bill: Bill, share: float) -> float:
    """The model size whose WAN dollars per step are ``share`` of its compute dollars."""
    return share * per_step(bill, 0.0)[1] / per_step(bill, 1.0)[0]


# -- what the ranks returned, read with care ------------------------------------------------------


def numbers(got: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    """``got`` as an array of real numbers of ``shape``, or None when it is not one."""
    try:
        array = np.asarray(got)
    except Exception:  # an object numpy cannot read: not numbers
        return None
    return array if array.dtype.kind in "biuf" and array.shape == shape else None


def shown(got: Any) -> str:
    """What a rank returned, in a few words (for a message about its shape)."""
    if isinstance(got, np.ndarray):
        return f"an array of shape {got.shape} ({got.dtype})"
    if isinstance(got, (list, tuple, dict)):
        return f"a {type(got).__name__} of {len(got)}"
    text = repr(got) if isinstance(got, (int, float, str, type(None))) else type(got).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def bad_values(buffer: Buffer, values: list[Any]) -> str | None:
    """None when every rank returned an array of the buffer's length, else which did not."""
    size = buffer.n
    for rank, got in enumerate(values):
        if numbers(got, (size,)) is None:
            return (f"{buffer.label()}: rank {rank}'s buffer came back as {shown(got)}, not {size} "
                    "numbers: the harness returns the buffer it summed in place")
    return None


def bad_training(training: Training, rank: int, value: Any) -> str | None:
    """None when ``value`` is (weights, losses) of the training's shapes, else what it is."""
    if (isinstance(value, (list, tuple)) and len(value) == 2
            and numbers(value[0], (training.features,)) is not None
            and numbers(value[1], (training.steps,)) is not None):
        return None
    return (f"{training.label()}: rank {rank} returned {shown(value)}, not its weights "
            f"({training.features} values) and the loss of each of the {training.steps} steps")


# -- the sums --------------------------------------------------------------------------------------


def _close(got: np.ndarray, want: np.ndarray, buffer: Buffer) -> np.ndarray:
    return grading.agreement(got, want, rtol=RTOL[buffer.dtype], atol=RTOL[buffer.dtype] * buffer.cluster.p)


def wrong_sums(buffer: Buffer, values: list[np.ndarray]) -> str | None:
    """None when every rank holds the sum, else the first symptom: seen across every rank (each
    shard finished somewhere, never spread) or on one rank, or a value of the wrong shape."""
    if wrong := bad_values(buffer, values):
        return wrong
    values = [np.asarray(got) for got in values]
    want = expected_sum(buffer)
    right = [_close(got, want, buffer) for got in values]
    if all(r.all() for r in right):
        return None
    own = [got == buffer.input(rank) for rank, got in enumerate(values)]
    if (buffer.n == want.size and np.logical_or.reduce(right).all()
            and all((r | o).all() for r, o in zip(right, own))):
        return (f"{buffer.label()}: every element is summed on some rank but each rank holds the sum "
                "only on its own shard and its input elsewhere: the allgather inside the data "
                "center is missing")
    return next(wrong for rank, got in enumerate(values) if (wrong := wrong_sum(buffer, rank, got)))


def wrong_sum(buffer: Buffer, rank: int, got: np.ndarray) -> str | None:
    """None when ``rank`` holds the sum over every rank, else what it holds, named."""
    want = expected_sum(buffer)
    mismatch = grading.first_mismatch(got, want, rtol=RTOL[buffer.dtype], atol=RTOL[buffer.dtype] * buffer.cluster.p)
    if mismatch is None:
        return None
    head, cluster = f"{buffer.label()}: rank {rank}", buffer.cluster
    dc_of = cluster.datacenter_of()
    own_dc = [r for r in range(cluster.p) if dc_of[r] == dc_of[rank]]
    in_dc = np.sum([buffer.input(r).astype(np.float64) for r in own_dc], axis=0)
    if _close(got, in_dc, buffer).all():
        return (f"{head} holds the sum over its own data center only (ranks {own_dc}): the step "
                "between data centers is missing, or its groups were split by data center instead "
                "of by the rank's index inside its data center")
    if np.array_equal(got, buffer.input(rank)):
        return f"{head} still holds its own input: nothing was summed into buf (it works in place)"
    if every := _stride(_close(got, want, buffer)):
        return (f"{head} holds the sum at every {every}th element only ({mismatch.describe()}): every element "
                "of buf is summed, not a sample of them")
    return f"{head} {mismatch.describe()}"


def _stride(right: np.ndarray) -> int:
    """k when the elements 0, k, 2k, ... are right (k > 1) and almost no other one is (a wrong
    value may equal the sum by chance), else 0."""
    at = np.flatnonzero(right)
    if at.size < 2 or at[0] != 0:
        return 0
    k = int(np.bincount(np.diff(at)).argmax())
    sampled = -(-right.size // k) if k > 1 else 0
    return k if sampled and right[::k].all() and at.size - sampled <= 0.01 * right.size else 0


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


def wan_bytes_into(task: grading.TaskRun, cluster: Cluster) -> list[int]:
    """Bytes each data center's ranks received from ranks of the other data centers, on the
    replay (point-to-point and collectives): the agents' record, not anything a rank returned."""
    dc_of, into = cluster.datacenter_of(), [0] * cluster.dcs
    for (src, dst), nbytes in task.timeline().pair_bytes.items():
        if 0 <= src < cluster.p and 0 <= dst < cluster.p and dc_of[src] != dc_of[dst]:
            into[dc_of[dst]] += nbytes
    return into


def too_few_wan_bytes(what: str, cluster: Cluster, into: list[int], needed: int) -> str | None:
    """None when every data center received at least ``needed`` bytes from the others, the least
    its ranks' sums take (one value per element of the other data centers' part of each sum),
    else the first that did not: its sums cannot have come from the other data centers' data."""
    for dc, got in enumerate(into):
        if got < needed:
            return (f"{what}: data center {dc} received {got} bytes from the other data centers, "
                    f"fewer than the {needed} its ranks' sums need (one value per element of the "
                    "others' part): the other data centers' data never crossed the WAN")
    return None


def wrong_costs(bill: Bill, answer: Any) -> str | None:
    """None when the bytes and dollars per step and per epoch match the bill's closed forms, else
    the first one off (or missing, or not numbers)."""
    for params in MODEL_SIZES:
        wan_step, compute_step = per_step(bill, params)
        steps = bill.steps_per_epoch
        want = {f"wan_bytes {params:g}": wan_bytes_per_step(bill, params),
                f"step {params:g}": (wan_step, compute_step),
                f"epoch {params:g}": (wan_step * steps, compute_step * steps)}
        for key, expected in want.items():
            if wrong := _not_numbers(bill, answer, key, np.shape(expected)):
                return wrong
            if not np.allclose(answer[key], expected, rtol=COST_RTOL, atol=0):
                return _named(bill, key, answer[key], expected)
    return None


def wrong_breakeven(bill: Bill, answer: Any) -> str | None:
    """None when breakeven_params(bill, 0.4) is the bill's closed form, else what it is."""
    if wrong := _not_numbers(bill, answer, "breakeven", ()):
        return wrong
    got, want = float(answer["breakeven"]), breakeven_params(bill, 0.4)
    if np.isclose(got, want, rtol=COST_RTOL, atol=0):
        return None
    why = (": that is where the WAN is 40% of the whole bill (WAN + compute), not of the compute "
           "bill" if np.isclose(got, breakeven_params(bill, 0.4 / 0.6), rtol=1e-3) else "")
    return (f"{bill.label()}: breakeven_params(bill, 0.4) = {got:.4g} parameters, expected "
            f"{want:.4g} (WAN dollars per step = 40% of compute dollars per step){why}")


def _not_numbers(bill: Bill, answer: Any, key: str, shape: tuple[int, ...]) -> str | None:
    """None when the answers hold ``key`` as numbers of ``shape``, else what they hold instead."""
    if not isinstance(answer, dict):
        return f"{bill.label()}: the cost answers came back as {shown(answer)}, not the harness's dict"
    if key not in answer:
        return f"{bill.label()}: the cost answers hold no {key!r}"
    if numbers(answer[key], shape) is None:
        want = "one number" if shape == () else f"{shape[0]} numbers (WAN dollars, compute dollars)"
        return f"{bill.label()}: the answer {key!r} is {shown(answer[key])}, not {want}"
    return None


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
