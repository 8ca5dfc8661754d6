"""What runs on the ranks of problem 15, and the same model on one process (the expected values,
computed in the supervisor). The model is a small stand-in for the team's classifier, trained for
real in float64: image features through a linear layer, hashtags through an EmbeddingBag and/or
the image's spectrum (an FFT), ReLU, a linear head. The virtual clock charges each rank its batch
over its device's samples per second: the lab's measured rate for the real model."""

import traceback
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .cases import (
    CLASSES,
    HOST_EXTRA,
    IMAGE,
    LEARNING_RATE,
    MODELS,
    STEPS,
    VOCAB,
    Job,
    Table,
    Training,
    by_kind,
    equal_split,
    idle_share,
    lab_device,
    largest_remainder,
    needless_host,
)

WIDTH = 8  # the features of each input before the head (a sample's sizes are in cases.py)


class Classifier(nn.Module):
    """16 image features, and 4 hashtags of 40 and/or the image's spectrum -> 4 classes."""

    def __init__(self, arch: str, seed: int):
        super().__init__()
        self.spectrum = arch != "tags"
        self.image = nn.Linear(IMAGE, WIDTH, dtype=torch.float64)
        self.tags = nn.EmbeddingBag(VOCAB, WIDTH, mode="mean", dtype=torch.float64) if arch != "spectrum" else None
        width = WIDTH + (WIDTH if self.tags is not None else 0) + (IMAGE // 2 + 1 if self.spectrum else 0)
        self.head = nn.Linear(width, CLASSES, dtype=torch.float64)
        rng = np.random.default_rng([seed, 1])  # the same start on every rank and in the checker (the shared key)
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.from_numpy(0.3 * rng.standard_normal(tuple(param.shape))))

    def forward(self, image: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
        parts = [self.image(image)]  # [b, 8]
        if self.tags is not None:
            parts.append(self.tags(tags))  # [b, 8]: a row of tags is one bag
        if self.spectrum:
            parts.append(torch.fft.rfft(image, norm="ortho").abs())  # [b, 9], about 1 each
        return self.head(torch.relu(torch.cat(parts, dim=1)))


def samples(training: Training, step: int, rank: int, count: int) -> list[torch.Tensor]:
    """Rank ``rank``'s first ``count`` samples of a step: image, tags, label. They come from the
    rank's own stream, each field from its own generator, so that sample j is the same whatever
    count is (a split that adds samples draws more). A rank's view of the training holds its own
    samples only, drawn by its agent (cases.Training.for_rank), and no key of them."""
    return [torch.from_numpy(a) for a in training.samples(step, rank, count)]


def global_samples(training: Training, step: int, split: list[int]) -> list[torch.Tensor]:
    """The global batch of a step under ``split``: every rank's batch, rank 0's first (the
    checker's: it needs every rank's stream)."""
    parts = [samples(training, step, rank, max(int(b), 0)) for rank, b in enumerate(split)]
    return [torch.cat([part[i] for part in parts]) for i in range(3)]


def mean_loss(model: Classifier, batch: list[torch.Tensor]) -> torch.Tensor:
    """The mean loss over a batch; with no sample, a zero that still gives zero gradients."""
    if len(batch[0]) == 0:
        return sum(param.sum() for param in model.parameters()) * 0.0
    image, tags, label = batch
    return F.cross_entropy(model(image, tags), label)


def local_loss(model: Classifier, training: Training, step: int, rank: int, count: int) -> torch.Tensor:
    """The mean loss over rank ``rank``'s ``count`` samples of the step."""
    return mean_loss(model, samples(training, step, rank, max(count, 0)))


def sgd_step(model: Classifier) -> None:
    """Plain SGD by hand: torch.optim's first use imports torch._dynamo, about 2 s per rank."""
    with torch.no_grad():
        for param in model.parameters():
            param -= LEARNING_RATE * param.grad
            param.grad = None


def arrays(model: Classifier, grads: bool = False) -> dict[str, Any]:
    """Every parameter (or its .grad) as a plain array, or why there is none."""
    got = {name: param.grad if grads else param for name, param in model.named_parameters()}
    return {name: t.detach().numpy().copy() if isinstance(t, torch.Tensor) else f"{name}.grad is {t!r:.40}"
            for name, t in got.items()}


# == the learner's answers, as plain data ===========================================================


def call(solution: Any, name: str, *args: Any) -> tuple[Any, str | None]:
    """solution.name(*args), or the exception it raised with the line of the learner's file."""
    try:
        return getattr(solution, name)(*args), None
    except Exception as exc:  # noqa: BLE001 - reported as this case's answer
        path = Path(getattr(solution, "__file__", "") or "").resolve()
        lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path]
        where = f" ({path.name}, line {lines[-1]})" if lines else ""
        return None, f"{name} raised {type(exc).__name__}: {exc}{where}"


def ask_split(solution: Any, job: Job) -> tuple[list[int] | None, str | None]:
    """The learner's split of the job as whole numbers >= 0, or why there is none."""
    value, error = call(solution, "split_batch", job.global_batch, [dict(d) for d in job.devices])
    try:
        split = [int(x) for x in value]
        if not error and len(split) == job.p and all(x == y >= 0 for x, y in zip(split, value)):
            return split, None
    except (TypeError, ValueError):
        pass
    return None, error or f"split_batch returned {value!r:.80}, not a list of {job.p} whole numbers >= 0"


def ask_place(solution: Any, layers: tuple, device: dict) -> tuple[dict | None, str | None]:
    """The learner's placement of the layers on the device, or why there is none."""
    value, error = call(solution, "place", list(layers), dict(device))
    names = [name for name, _ in layers]
    if not error and isinstance(value, dict) and all(value.get(n) in ("accelerator", "host") for n in names):
        return {n: value[n] for n in names}, None
    return None, error or f"place returned {value!r:.80}, not {{layer name: 'accelerator' or 'host'}} for {names}"


class Answers(NamedTuple):
    splits: list[tuple[list[int] | None, str | None]]
    places: list[tuple[dict | None, str | None]]


# == what the ranks run =============================================================================


class Trained(NamedTuple):
    split: list[int] | None  # as this rank's split_batch gave it
    split_error: str | None
    placement: dict | None  # this rank's
    losses: list[float]  # this rank's local mean loss, per step
    weights: dict[str, Any]  # after the last step


def train_steps(comm, solution, model: Classifier, training: Training, split: list[int], placement: dict | None,
                first_step: int, steps: int, policy: str = "your") -> list[float]:
    """Data-parallel SGD steps, each rank on its slice of the global batch."""
    rank, job = comm.Get_rank(), training.job
    device, batch = job.devices[rank], split[rank]
    slowdown = 1 + HOST_EXTRA * len(needless_host(training.layers, device, placement))
    losses = []
    for step in range(first_step, first_step + steps):
        comm.mark("step")
        loss = local_loss(model, training, step, rank, batch)
        loss.backward()
        comm.compute(seconds=batch * slowdown / device["samples_per_s"],
                     label=f"{policy} split: forward and backward, {batch} samples")
        solution.sync_gradients(comm, model, batch, job.global_batch)
        sgd_step(model)
        losses.append(loss.item())
    return losses


def train(comm, solution, training: Training) -> Trained:
    """STEPS steps with the learner's split (asked on every rank), placement and sync."""
    job, rank = training.job, comm.Get_rank()
    split, error = ask_split(solution, job)
    placement = ask_place(solution, training.layers, job.devices[rank])[0]
    if split is None or sum(split) > 2 * job.global_batch:
        return Trained(split, error or f"the split sums to {sum(split or [])}: not trained", placement, [], {})
    model = Classifier(training.arch, training.shared_key)
    losses = train_steps(comm, solution, model, training, split, placement, 0, STEPS)
    comm.mark("trained")
    return Trained(split, None, placement, losses, arrays(model))


def gradient(comm, solution, training: Training) -> dict[str, Any]:
    """One backward with the case's split, then the learner's sync: every parameter's .grad."""
    rank, split = comm.Get_rank(), list(training.given_split or ())
    model = Classifier(training.arch, training.shared_key)
    local_loss(model, training, 0, rank, split[rank]).backward()
    comm.mark("sync")  # the phase whose messages must carry the other ranks' gradients
    solution.sync_gradients(comm, model, split[rank], training.job.global_batch)
    comm.mark("synced")
    return arrays(model, grads=True)


def ask_table(comm, solution, table: Table) -> Answers | None:
    """split_batch and place on every case of the table: pure calls, on rank 0 only."""
    if comm.Get_rank() != 0:
        return None
    return Answers([ask_split(solution, job) for job in table.jobs],
                   [ask_place(solution, case.layers, case.device) for case in table.places])


def run_cases(comm, solution, cases: list[Any]) -> list[Any]:
    torch.set_num_threads(1)  # ranks share the cores, as torchrun's OMP_NUM_THREADS=1
    return [ask_table(comm, solution, case) if isinstance(case, Table) else
            gradient(comm, solution, case) if case.given_split else train(comm, solution, case) for case in cases]


# == the same on one process: the expected values ===================================================


def one_process(training: Training, ranges: list[tuple[int, int]]) -> list[dict[str, np.ndarray]]:
    """The gradient at the start of the mean loss over each range of step 0's global batch (under
    the case's given split: rank 0's samples, then rank 1's ...)."""
    batch, grads = global_samples(training, 0, list(training.given_split or ())), []
    for start, stop in ranges:
        model = Classifier(training.arch, training.shared_key)
        mean_loss(model, [t[start:stop] for t in batch]).backward()
        grads.append(arrays(model, grads=True))
    return grads


def one_process_training(training: Training, split: list[int]) -> tuple[list[float], dict[str, np.ndarray]]:
    """STEPS SGD steps on the global batch that ``split`` gives (every rank's samples together): each
    step's loss, and the final weights."""
    model, losses = Classifier(training.arch, training.shared_key), []
    for step in range(STEPS):
        loss = mean_loss(model, global_samples(training, step, split))
        loss.backward()
        sgd_step(model)
        losses.append(loss.item())
    return losses, arrays(model)


# == the free run ===================================================================================


def free_job(ranks: int, mix: str, global_batch: str, arch: str) -> Job:
    kinds = [kind.strip() for kind in mix.split(",")]
    if arch not in MODELS:
        raise ValueError(f"arch must be one of {', '.join(MODELS)}; got {arch!r}")
    if unknown := set(kinds) - set(by_kind()):
        raise ValueError(f"mix: no profile {', '.join(unknown)} in the lab (it has {', '.join(by_kind())})")
    devices = tuple(lab_device(by_kind()[kinds[r % len(kinds)]][0], f"rank{r}") for r in range(ranks))
    return Job(devices, int(global_batch))


def policy_split(policy: str, job: Job, solution: Any) -> list[int]:
    policies = {"equal": equal_split, "flops": lambda j: largest_remainder(j.shares("flops")),
                "card": lambda j: largest_remainder(j.shares()),
                "yours": lambda j: ask_split(solution, j)[0]}
    if policy not in policies:
        raise ValueError(f"split must be both, {', '.join(policies)}; got {policy!r}")
    if (split := policies[policy](job)) is None:
        raise ValueError(f"split_batch: {ask_split(solution, job)[1]}")
    return split


def main(comm, solution, global_batch="1200", steps="3", split="both", mix="a100,a100,v100,ascend910", arch="tags"):
    """Rank r models the lab's device mix[r] (cycled); ``steps`` training steps per policy (both: the
    equal split, then yours), so the timeline shows their idle time side by side. Rank 0 returns
    each policy's idle share and the loss before and after:

        distlab tune 15 --param split=equal,flops,yours --metric idle_share"""
    torch.set_num_threads(1)
    job, rank = free_job(comm.Get_size(), mix, global_batch, arch), comm.Get_rank()
    training = Training(job, arch, seed=15)
    placements = [ask_place(solution, training.layers, device)[0] for device in job.devices]
    slowdown = [1 + HOST_EXTRA * len(needless_host(training.layers, d, pl)) for d, pl in zip(job.devices, placements)]
    model, done, idle = Classifier(arch, training.shared_key), 0, {}
    measured = largest_remainder(job.shares())  # the global batch the loss is measured on
    before = mean_loss(model, global_samples(training, 0, measured)).item()
    for policy in ["equal", "yours"] if split == "both" else [split]:
        shares = policy_split(policy, job, solution)
        label = "your" if policy == "yours" else policy
        train_steps(comm, solution, model, training, shares, placements[rank], done, int(steps), label)
        done, idle[policy] = done + int(steps), idle_share(job, shares, slowdown)
    after = mean_loss(model, global_samples(training, done, measured)).item()
    return {"idle_share": round(idle[list(idle)[-1]], 4), **{f"idle_{k}": round(v, 4) for k, v in idle.items()},
            "loss_before": round(before, 4), "loss": round(after, 4)} if rank == 0 else None


def bounds(platform, ranks, global_batch="1200", steps="3", split="both", mix="a100,a100,v100,ascend910", arch="tags"):
    """The idle share of the card's split on the same mix (or of the policy asked for, when it is not
    yours): the dashed line of `distlab tune 15`."""
    job = free_job(ranks, mix, global_batch, arch)
    return {"idle_share": idle_share(job, policy_split("card" if split in ("both", "yours") else split, job, None))}
