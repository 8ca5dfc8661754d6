"""How problem 15 reads a run and names what went wrong (each *_message is None when all is well)."""

import numpy as np

from distlab.grading import TaskRun, collective_time

from . import cases, programs
from .cases import Job, PlaceCase, Training

TOLERANCE = 1e-6  # relative error of a gradient or weight tensor: float32 communication passes
SPLIT_SAYS = {  # cases.MISREADINGS, named when every answer of the table shows one
    "equal": "an equal split: a V100 computes its B/p samples 2.5x slower than an A100, and every other rank waits "
             "for it; split in proportion to samples_per_s",
    "flops": "a split in proportion to peak FLOP/s: a V100 has 72% of an A100's FLOP/s but does 39% of its samples "
             "per second on this workload; split by samples_per_s, the measured rate",
    "floor": "every share rounded down: the fractions are lost (up to p - 1 samples a step); hand the samples left "
             "over out one each, to the largest remainders",
    "round": "every share rounded to the nearest: roundings need not cancel (1.6, 1.6 and 1.8 make 2, 2 and 2, "
             "one sample too many); round down, then hand out what is left",
}
GRADIENT_SAYS = {  # what a wrong synced gradient equals (candidates)
    "mean": "the plain mean of the ranks' gradients, each weighted 1/p (DDP's average): with uneven batches a "
            "rank's gradient must count local_batch / global_batch",
    "sum": "the sum of the ranks' local mean gradients: weight each by local_batch / global_batch first",
    "times B": "global_batch times the global batch's gradient: weighted by local_batch, never divided by global_batch",
    "local": "the rank's own local gradient: nothing was summed across the ranks",
    "weighted": "the rank's own gradient times local_batch / global_batch: weighted, never summed across the ranks",
}


def worst_error(got: dict, want: dict[str, np.ndarray]) -> tuple[float, str]:
    """The largest relative error (norm of the difference over the norm) over the parameters."""
    def error(g: object, w: np.ndarray) -> float:
        if not isinstance(g, np.ndarray) or g.shape != w.shape:
            return float("inf")  # missing, or not an array (why: the rank's text)
        return float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-300))
    return max((error(got.get(name), w), name) for name, w in want.items())


def split_message(jobs: tuple[Job, ...], answers: list) -> str | None:
    wrong = [f"{job.label()}: expected {cases.card_split(job)} (or any whole numbers within 1 of each share that sum "
             f"to {job.global_batch}); saw {error or f'{split}: {faults[0]}'}"
             for job, (split, error) in zip(jobs, answers) if error or (faults := cases.split_faults(job, split))]
    if not wrong:
        return None
    named = cases.misreading(list(jobs), [split for split, _ in answers])
    return (wrong[0] + (f" ({len(wrong) - 1} more of {len(jobs)} cases wrong)" if len(wrong) > 1 else "")
            + (f". Every answer of the table is {SPLIT_SAYS[named]}" if named else ""))


def place_message(case: PlaceCase, placement: dict | None, error: str | None) -> str | None:
    if placement is None:
        return f"{case.label()}: {error}"
    want = cases.card_placement(case.layers, case.device)
    for name, op in case.layers:
        if placement[name] != want[name]:
            head = f"{case.label()}: expected {name!r} ({op}) on the {want[name]}; saw it on the {placement[name]}"
            return (f"{head}, but {case.device['profile']} lacks {op}: on the lab the step would fail there"
                    if want[name] == "host" else
                    f"{head}, but {case.device['profile']} runs {op}: a layer leaves the accelerator only when this "
                    f"device's unsupported_ops lists its op (each needless host layer costs {cases.HOST_EXTRA:.0%} of "
                    "a sample's time)")
    return None


def gradient_message(training: Training, values: list[dict]) -> tuple[str | None, float]:
    """The first rank whose synced gradient is not the global batch's (and what it is, when one
    usual mistake alone gives every rank's gradient); and the worst relative error."""
    split, batch = list(training.given_split or ()), training.job.global_batch
    ends = np.cumsum([0, *split])
    want, *local = programs.one_process(training, [(0, batch), *zip(ends, ends[1:])])
    errors = [worst_error(grads, want) for grads in values]
    if (worst := max(errors)[0]) <= TOLERANCE:
        return None, worst
    rank = next(r for r, (error, _) in enumerate(errors) if error > TOLERANCE)
    (error, name), got = errors[rank], values[rank].get(errors[rank][1])
    message = f"{training.label()}, batches {split}: " + (
        f"on rank {rank} {got}; expected the global batch's gradient" if isinstance(got, str) else
        f"rank {rank}'s {name}.grad is {error:.3g} away (relative) from the global batch's gradient; expected "
        f"within {TOLERANCE:g}")

    def mix(weights: list[float]) -> dict[str, np.ndarray]:
        return {n: sum(w * g[n] for w, g in zip(weights, local)) for n in want}
    candidates = [{"mean": mix([1 / len(split)] * len(split)), "sum": mix([1.0] * len(split)), "times B": mix(split),
                   "local": local[r], "weighted": {n: split[r] / batch * g for n, g in local[r].items()}}
                  for r in range(len(split))]
    fits = [name for name in GRADIENT_SAYS
            if all(worst_error(grads, candidates[r][name])[0] <= TOLERANCE for r, grads in enumerate(values))]
    return message + (f": it is {GRADIENT_SAYS[fits[0]]}" if len(fits) == 1 else ""), worst


def training_message(training: Training, values: list[programs.Trained]) -> tuple[str | None, list[float]]:
    """Whether every rank ends with one process's weights; and the global batch's loss per step."""
    split, job = values[0].split or [], training.job
    if values[0].split_error:
        return f"{training.label()}: not trained: {values[0].split_error} (see the split_batch check)", []
    if any(v.split != split for v in values):
        return f"{training.label()}: the ranks' split_batch answers differ: {[v.split for v in values]}", []
    losses = [sum(b * v.losses[k] for b, v in zip(split, values)) / sum(split) for k in range(cases.STEPS)]
    want_losses, want = programs.one_process_training(training)
    error, name = max(worst_error(v.weights, want) for v in values)
    if error <= TOLERANCE:
        return None, losses
    head = (f"{training.label()}: after {cases.STEPS} steps expected one process's weights (trained on the global "
            f"batch, within {TOLERANCE:g}); {name} is {error:.3g} away; losses {fmt(losses)}, one process "
            f"{fmt(want_losses)}")
    if sum(split) != job.global_batch:
        return f"{head}: each step trained on {sum(split)} samples, not {job.global_batch} (the split's sum)", losses
    if max(worst_error(v.weights, values[0].weights)[0] for v in values) > TOLERANCE:
        return f"{head}: the ranks' weights differ: sync_gradients must leave the same gradient on every rank", losses
    return f"{head}: the split sums to {job.global_batch}, so the synced gradients are not the global batch's", losses


def fmt(losses: list[float]) -> str:
    return " -> ".join(f"{x:.4f}" for x in losses)


def compute_per_step(task: TaskRun, p: int) -> np.ndarray | None:
    """Each rank's compute in each training step, from the replay on the virtual clock: [p, steps]."""
    timeline = task.timeline()
    spans = [[s.seconds for s in timeline.events(r, "compute") if "forward and backward" in s.name]
             for r in range(p)]
    return np.array(spans) if spans[0] and all(len(s) == len(spans[0]) for s in spans) else None


def time_bound(training: Training, nbytes: int) -> float:
    """The job's task at best: per step, the global batch at the devices' summed speed (a fractional
    split) and one Allreduce of every gradient; and one Allreduce more, the gradient case's."""
    job = training.job
    allreduce = collective_time(job.platform(), "Allreduce", job.p, nbytes)
    return cases.STEPS * job.global_batch / sum(d["samples_per_s"] for d in job.devices) + (cases.STEPS + 1) * allreduce


def idle_of(compute: np.ndarray) -> float:
    """Sum over ranks and steps of (slowest - own compute), over p times the slowest's."""
    slowest = compute.max(axis=0)
    return float((slowest - compute).sum() / (len(compute) * slowest.sum()))


def idle_message(training: Training, values: list[programs.Trained], compute: np.ndarray, idle: float,
                 limit: float) -> str:
    """The slowest and the fastest rank, and why, where the split or the placement shows it."""
    job, split, per_step = training.job, values[0].split or [], compute.mean(axis=1)
    slow, fast = int(np.argmax(per_step)), int(np.argmin(per_step))
    kind = [d["profile"] for d in job.devices]
    text = (f"{training.label()}: expected at most {limit:.0%} idle; saw {idle:.1%}: rank {slow} ({kind[slow]}) "
            f"computes {per_step[slow] * 1e3:.1f} ms a step on {split[slow]} samples, rank {fast} ({kind[fast]}) "
            f"{per_step[fast] * 1e3:.1f} ms on {split[fast]}, then waits")
    causes = [SPLIT_SAYS[name] for name in ("equal", "flops") if cases.MISREADINGS[name][1](job, split)]
    if not causes and split[slow] >= job.shares()[slow] + 1:
        causes.append(f"rank {slow}'s batch is above its share of {float(job.shares()[slow]):.1f} samples")
    if needless := cases.needless_host(training.layers, job.devices[slow], values[slow].placement):
        causes.append(f"rank {slow} runs {', '.join(needless)} on the host, although its accelerator can "
                      f"(+{cases.HOST_EXTRA:.0%} of a sample's time each)")
    return text + (": " + "; and ".join(causes) if causes else "")
