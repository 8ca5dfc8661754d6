"""How problem 15 reads a run and names what went wrong (each *_message is None when all is well).

Only the checker imports this module (the sandbox hides it from the learner's process): the card's
split and placement (the expected answers) live here, not in cases.py, which a rank imports. What
the ranks returned comes from the learner's process, so it is read as evidence: first checked for
its form (a malformed value fails the check that reads it, naming what was wrong), then against
what the agents recorded: the bytes each rank moved while it synced, and the compute it declared
on the virtual clock, which must be what the harness declares for its batch on its device.
"""

from typing import Any

import numpy as np

from distlab.grading import TaskRun, collective_time

from . import cases, programs
from .cases import Job, PlaceCase, Table, Training

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


def card_split(job: Job) -> list[int]:
    """The card's split: every share rounded down, then the largest remainders one more each."""
    return cases.largest_remainder(job.shares())


def card_placement(layers: tuple, device: dict) -> dict[str, str]:
    return {name: "host" if op in device["unsupported_ops"] else "accelerator" for name, op in layers}


def worst_error(got: dict, want: dict[str, np.ndarray]) -> tuple[float, str]:
    """The largest relative error (norm of the difference over the norm) over the parameters."""
    def error(g: object, w: np.ndarray) -> float:
        if not isinstance(g, np.ndarray) or g.shape != w.shape or g.dtype.kind not in "biuf":
            return float("inf")  # missing, or not an array (why: the rank's text)
        with np.errstate(all="ignore"):
            value = float(np.linalg.norm(g.astype(np.float64) - w) / max(np.linalg.norm(w), 1e-300))
        return value if np.isfinite(value) else float("inf")
    got = got if isinstance(got, dict) else {}
    return max(((error(got.get(name), w), name) for name, w in want.items()), default=(0.0, ""))


# == the ranks' values, as evidence: their form ======================================================


def _whole(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 0


def _split_or_none(value: Any, p: int) -> bool:
    return value is None or (isinstance(value, list) and len(value) == p and all(_whole(x) for x in value))


def _placement_or_none(value: Any, layers: tuple) -> bool:
    # isinstance first: an array's `in` asks for its truth value, which crashed this once.
    return value is None or (isinstance(value, dict) and all(isinstance(value.get(n), str)
                                                             and value.get(n) in ("accelerator", "host") for n, _ in layers))


def _error_or_none(value: Any) -> bool:
    return value is None or isinstance(value, str)


def shown(value: Any) -> str:
    return f"{value!r:.80}" if isinstance(value, (int, float, str, list, tuple, dict, type(None))) else type(value).__name__


def table_answers(table: Table, value: Any) -> tuple[programs.Answers | None, str | None]:
    """Rank 0's answers to the table, or why they are not answers (its process built them)."""
    why = f"rank 0 returned {shown(value)} for the table, not its split_batch and place answers"
    if not (isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, list) for v in value)):
        return None, why
    splits, places = value
    if len(splits) != len(table.jobs) or len(places) != len(table.places):
        return None, f"{why} ({len(splits)} splits and {len(places)} placements for {len(table.jobs)} and {len(table.places)})"
    for job, answer in zip(table.jobs, splits):
        if not (isinstance(answer, tuple) and len(answer) == 2 and _split_or_none(answer[0], job.p)
                and _error_or_none(answer[1]) and (answer[0] is None) != (answer[1] is None)):
            return None, f"{why}: for {job.label()}, {shown(answer)}"
    for case, answer in zip(table.places, places):
        if not (isinstance(answer, tuple) and len(answer) == 2 and _placement_or_none(answer[0], case.layers)
                and _error_or_none(answer[1]) and (answer[0] is None) != (answer[1] is None)):
            return None, f"{why}: for {case.label()}, {shown(answer)}"
    return programs.Answers(list(splits), list(places)), None


def trained_values(training: Training, values: list[Any]) -> tuple[list[programs.Trained] | None, str | None]:
    """Every rank's Trained, or why one is not (its process built it)."""
    job, out = training.job, []
    for rank, value in enumerate(values):
        why = f"{training.label()}: rank {rank} returned {shown(value)}, not its training's record"
        if not (isinstance(value, tuple) and len(value) == len(programs.Trained._fields)):
            return None, why
        split, error, placement, losses, weights = value
        if not (_split_or_none(split, job.p) and _error_or_none(error) and _placement_or_none(placement, training.layers)
                and isinstance(losses, list) and all(isinstance(x, (int, float)) for x in losses)
                and isinstance(weights, dict) and all(isinstance(k, str) and isinstance(w, np.ndarray)
                                                      and w.dtype.kind == "f" for k, w in weights.items())):
            return None, f"{why} (split, split_error, placement, losses, weights of the wrong kinds)"
        if error is None and (split is None or len(losses) != cases.STEPS or sum(split) > 2 * job.global_batch
                              or not weights):
            return None, (f"{why}: trained without a split or weights, on more than twice the global batch, or "
                          f"with {len(losses)} losses, not {cases.STEPS}")
        out.append(programs.Trained(split, error, placement, [float(x) for x in losses], weights))
    return out, None


def gradient_values(training: Training, values: list[Any]) -> tuple[list[dict] | None, str | None]:
    """Every rank's {parameter: .grad}, or why one is not."""
    for rank, value in enumerate(values):
        if not (isinstance(value, dict) and all(isinstance(k, str) for k in value)):
            return None, (f"{training.label()}: rank {rank} returned {shown(value)}, not its parameters' gradients "
                          "after sync_gradients")
    return values, None


def split_message(jobs: tuple[Job, ...], answers: list) -> str | None:
    wrong = [f"{job.label()}: expected {card_split(job)} (or any whole numbers within 1 of each share that sum "
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
    want = card_placement(case.layers, case.device)
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
        f"on rank {rank} {got:.200}; expected the global batch's gradient" if isinstance(got, str) else
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
    if sum(split) == 0:
        return f"{training.label()}: the split {split} gives no sample to any rank: nothing was trained", []
    if problem := weightless_split(split):
        return f"{training.label()}: the split {split} {problem} (see the split_batch check)", []
    losses = [sum(b * v.losses[k] for b, v in zip(split, values)) / sum(split) for k in range(cases.STEPS)]
    want_losses, want = programs.one_process_training(training, split)
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


def weightless_split(split: list[int]) -> str | None:
    """Why ``split``, the learner's own, cannot show a sync's weighting (one rank holding every
    sample makes a plain sum of the ranks' gradients right, equal batches a plain mean), or None."""
    plain = "sum" if sum(b > 0 for b in split) < 2 else "mean" if len(set(split)) == 1 else None
    return plain and (f"{'gives every sample to one rank' if plain == 'sum' else 'gives every rank as many samples'}: "
                      f"a plain {plain} of the ranks' gradients is then the global batch's, so the training cannot "
                      "show whether sync_gradients weights each rank by local_batch / global_batch")


def fmt(losses: list[float]) -> str:
    return " -> ".join(f"{x:.4f}" for x in losses)


def compute_per_step(task: TaskRun, p: int) -> np.ndarray | None:
    """Each rank's compute in each training step, from the replay on the virtual clock: [p, steps]."""
    timeline = task.timeline()
    spans = [[s.seconds for s in timeline.events(r, "compute") if "forward and backward" in s.name]
             for r in range(p)]
    return np.array(spans) if spans[0] and all(len(s) == len(spans[0]) for s in spans) else None


def gradient_nbytes(training: Training) -> int:
    """The bytes of the model's gradients (float64), as the checker's own model has them."""
    return sum(param.numel() * 8 for param in programs.Classifier(training.arch, 0).parameters())


def moved_bytes(task: TaskRun, rank: int, phase: str) -> list[int]:
    """What the rank sent, received and handed to collectives in each of its phases ``phase``, as
    its agent counted them."""
    return [counts.bytes_sent + counts.bytes_received + sum(counts.op_bytes.values())
            for counts in task.phases(rank, phase)]


def exchange_message(training: Training, task: TaskRun, phase: str, where: str) -> str | None:
    """None if every rank moved, in every phase ``phase``, at least the model's gradients as float32:
    the global batch's gradient needs every other rank's samples' part, which only the other ranks
    hold. Else the first rank and phase that moved less."""
    need = gradient_nbytes(training) // 2
    want = cases.STEPS if phase == "step" else 1
    for rank in range(training.job.p):
        moved = moved_bytes(task, rank, phase)
        if len(moved) != want:
            return (f"{training.label()}: rank {rank} set {len(moved)} mark(s) {phase!r} on its agent's record, "
                    f"expected {want} (the harness's)")
        for k, nbytes in enumerate(moved):
            if nbytes < need:
                return (f"{training.label()}: rank {rank} sent, received or reduced {nbytes} bytes in {where}"
                        f"{f' {k}' if want > 1 else ''}, expected at least {need} (the model's gradients as float32): the global batch's "
                        "gradient needs every other rank's part, and only the other ranks hold their samples, so "
                        "the gradients must travel between the ranks")
    return None


def compute_message(training: Training, values: list[programs.Trained], task: TaskRun) -> str | None:
    """None if each rank's compute in its training steps, as the replay has it, is what the harness
    declares for its batch on its device (its batch over its samples_per_s, +30% per needless host
    layer). The rank's process declares it, so a patched comm could declare anything."""
    timeline, job = task.timeline(), training.job
    for rank, device in enumerate(job.devices):
        split = values[rank].split or [0] * job.p  # the rank's own answer: its batch is split[rank]
        slowdown = 1 + cases.HOST_EXTRA * len(cases.needless_host(training.layers, device, values[rank].placement))
        want = split[rank] * slowdown / device["samples_per_s"]
        spans = [s.seconds for s in timeline.events(rank, "compute") if "forward and backward" in s.name]
        if len(spans) != cases.STEPS or any(abs(s - want) > 1e-9 + 1e-6 * want for s in spans):
            saw = ", ".join(f"{s * 1e3:.3f}" for s in spans) or "none"
            return (f"{training.label()}: the declared compute differs from the harness's: rank {rank} "
                    f"({device['profile']}) declared [{saw}] ms of forward and backward; its {split[rank]} samples at "
                    f"{device['samples_per_s']:g} samples/s (x{slowdown:g} for host layers) take {want * 1e3:.3f} ms, "
                    f"in each of the {cases.STEPS} steps")
    return None


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
