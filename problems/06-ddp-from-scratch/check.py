"""Checks for problem 06, DDP from scratch: buckets and overlap.

The story: a small MLP (built here, its init seeded differently on every rank) is handed to the
learner's ``DataParallel`` and trained with plain SGD for a few steps, every rank on its own shard
of a synthetic regression batch. Each layer declares its work on the virtual clock (forward, and
twice that in backward, in proportion to its parameters), so the replay shows whether the
gradient allreduces run while backward computes. Four cases run in one launch: caps giving one
bucket, two buckets, many buckets (a cap below the largest tensor) and the overlap case (4-6
buckets, backward compute about equal to the communication). The checks read that launch:
weights equal single-process SGD on the global batch (computed here, with torch); every rank
started from rank 0's weights and ends with the same ones; one allreduce per bucket per step; at
least half of the communication hidden behind backward. A second launch trains a model whose
side head is skipped in some steps: the wrapper must cope or say clearly why not.

Hidden variants: layer widths, seeds (weights, data), caps, rank counts, learning rate, step count
and which steps skip the side head all come from the session seed.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from distlab.grading import CheckContext, CheckFailed, Checklist, Task

PER_RANK_BATCH = 8
HIDDEN_TARGET = 0.5  # the catalog's "at least half of the communication hidden"
RTOL, ATOL = 2e-4, 2e-5  # float32 SGD: summation order differs between p ranks and one process


@dataclass(frozen=True)
class Case:
    label: str
    p: int
    widths: tuple[int, ...]  # input, hidden..., output
    seed: int
    cap_bytes: int
    steps: int
    lr: float
    forward_s_per_param: float  # declared forward seconds per parameter; backward is twice that
    side_after: int | None = None  # a side head hangs after this layer (None: no side head)
    side_used: tuple[bool, ...] = ()  # per step: does the loss use the side head

    def uses_side(self, step: int) -> bool:
        return self.side_after is not None and self.side_used[step]


@dataclass(frozen=True)
class StepCount:
    collectives: int  # calls of built-in collectives (Allreduce, Iallreduce, Bcast, ...)
    calls: dict[str, int]
    allreduce_bytes: int


@dataclass
class RankResult:
    start: np.ndarray  # flat weights right after DataParallel(...) returned
    final: np.ndarray  # flat weights after the last step
    steps: list[StepCount] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


# -- the model: each layer declares its work on the virtual clock --------------------------------


class _BackwardWork(torch.autograd.Function):
    """Identity; its backward declares the layer's backward work. It sits on the layer's output,
    so autograd runs it just before the layer's own backward, whose gradients come right after."""

    @staticmethod
    def forward(ctx, x, comm, seconds):  # type: ignore[override]
        ctx.comm, ctx.seconds = comm, seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        ctx.comm.compute(seconds=ctx.seconds, label="backward")
        return grad, None, None


class Net(torch.nn.Module):
    """Linear layers with ReLU between; optionally a one-output side head after one layer,
    registered right after it (so its parameters sit in the middle of the parameter order)."""

    def __init__(self, widths: tuple[int, ...], side_after: int | None = None) -> None:
        super().__init__()
        self.depth = len(widths) - 1
        self.side_after = side_after
        for i in range(self.depth):
            setattr(self, f"fc{i}", torch.nn.Linear(widths[i], widths[i + 1]))
            if i == side_after:
                self.side = torch.nn.Linear(widths[i + 1], 1)
        self.comm = None  # set on the ranks: layers then declare their work
        self.forward_s_per_param = 0.0

    def _timed(self, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        y = layer(x)
        if self.comm is not None:
            seconds = self.forward_s_per_param * sum(p.numel() for p in layer.parameters())
            self.comm.compute(seconds=seconds, label="forward")
            y = _BackwardWork.apply(y, self.comm, 2 * seconds)
        return y

    def forward(self, x: torch.Tensor, use_side: bool = False):  # type: ignore[override]
        side_out = None
        for i in range(self.depth):
            x = self._timed(getattr(self, f"fc{i}"), x)
            if i < self.depth - 1:
                x = torch.relu(x)
            if i == self.side_after and use_side:
                side_out = self._timed(self.side, x)
        return x, side_out


def build_model(case: Case, rank: int) -> Net:
    """Every rank starts from its own random weights; rank 0's are the single-process model's."""
    torch.manual_seed(case.seed + 7919 * rank)
    return Net(case.widths, case.side_after)


def global_batch(case: Case, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s batch over all ranks: rows [r*b, (r+1)*b) are rank r's shard."""
    d_in, d_out = case.widths[0], case.widths[-1]
    teacher = np.random.default_rng([case.seed, 5]).standard_normal((d_in, d_out)) / math.sqrt(d_in)
    rng = np.random.default_rng([case.seed, 17, step])
    x = rng.standard_normal((case.p * PER_RANK_BATCH, d_in))
    y = np.tanh(x @ teacher) + 0.1 * rng.standard_normal((x.shape[0], d_out))
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32))


def loss_of(out: torch.Tensor, side_out: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    loss = torch.nn.functional.mse_loss(out, y)
    if side_out is not None:
        loss = loss + 0.5 * torch.nn.functional.mse_loss(side_out, y[:, :1])
    return loss


def zero_grad(model: torch.nn.Module) -> None:
    """optimizer.zero_grad(set_to_none=True): a parameter left out of a step has no gradient."""
    for p in model.parameters():
        p.grad = None


def sgd_step(model: torch.nn.Module, lr: float) -> None:
    """Plain SGD, as torch.optim.SGD without momentum (whose first use costs seconds of imports):
    a parameter without a gradient stays put."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)


def flat_weights(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def layout(case: Case) -> list[tuple[str, int, int]]:
    """(name, number of elements, bytes) of every parameter, in parameter order."""
    return [(name, p.numel(), p.numel() * p.element_size())
            for name, p in Net(case.widths, case.side_after).named_parameters()]


# -- what runs on every rank ----------------------------------------------------------------------


def train(comm, solution, case):
    """Wraps a fresh model in the learner's DataParallel and trains it for case.steps steps."""
    torch.set_num_threads(1)
    rank = comm.Get_rank()
    model = build_model(case, rank)
    model.comm, model.forward_s_per_param = comm, case.forward_s_per_param
    ddp = solution.DataParallel(comm, model, bucket_cap_bytes=case.cap_bytes)
    result = RankResult(flat_weights(model), np.empty(0))
    for step in range(case.steps):
        x, y = global_batch(case, step)
        shard = slice(rank * PER_RANK_BATCH, (rank + 1) * PER_RANK_BATCH)
        comm.mark("step")
        zero_grad(model)
        out, side_out = model(x[shard], use_side=case.uses_side(step))
        loss = loss_of(out, side_out, y[shard])
        before = comm.stats.snapshot()
        comm.mark("backward")
        loss.backward()
        ddp.finish_gradient_sync()
        comm.mark("synced")
        delta = comm.stats.since(before)
        used = delta.collectives_used()
        result.steps.append(StepCount(sum(delta.calls[op] for op in used), dict(delta.calls),
                                      int(delta.op_bytes.get("Allreduce", 0))))
        result.losses.append(float(loss.detach()))
        sgd_step(model, case.lr)
    result.final = flat_weights(model)
    return result


def main(comm, solution, steps="40", cap_kib="64", width="128", lr="0.5"):
    """A free run (distlab run 06 --param cap_kib=16): trains the MLP on every rank; rank 0
    reports the loss over the global batch, the collectives per step and whether replicas agree.

    Each layer declares 1 ns of forward work per parameter (2 ns backward): change cap_kib and
    watch the step time (P50) in the metrics."""
    from distlab import MAX, SUM

    p, rank = comm.Get_size(), comm.Get_rank()
    w = int(width)
    case = Case("free run", p, (32, w, w, w, 8), 606, int(float(cap_kib) * 1024), int(steps),
                float(lr), 1e-9)
    result = train(comm, solution, case)
    # The loss over the global batch: the mean of the ranks' shard losses (equal shards).
    losses = np.array(result.losses)
    comm.Allreduce(comm.IN_PLACE, losses, SUM)
    losses /= p
    digest = float(np.abs(result.final).sum())
    spread = np.array([digest, -digest])  # max and -min of the ranks' digests in one call
    comm.Allreduce(comm.IN_PLACE, spread, MAX)
    if rank != 0:
        return None
    same = math.isclose(spread[0], -spread[1], rel_tol=1e-6)
    buckets = len(plan_buckets([n for _, _, n in reversed(layout(case))], case.cap_bytes))
    k = max(1, min(5, case.steps // 4))
    return (f"{case.steps} steps on {p} ranks: global-batch loss {losses[:k].mean():.4f} (first "
            f"{k} steps) -> {losses[-k:].mean():.4f} (last {k}); {buckets} bucket(s) by the card's "
            f"rule, {result.steps[-1].collectives} collective(s) in the last step; weights "
            f"{'agree' if same else 'DIFFER'} across ranks")


# -- pure helpers (unit-tested) -------------------------------------------------------------------


def plan_buckets(nbytes: list[int], cap_bytes: int) -> list[list[int]]:
    """The bucket rule of the card: consecutive tensors (``nbytes`` in reverse parameter order),
    a new bucket when the next one would pass the cap; a tensor over the cap gets its own."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i, n in enumerate(nbytes):
        if current and filled + n > cap_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(i)
        filled += n
    if current:
        buckets.append(current)
    return buckets


def caps_giving(nbytes: list[int], count: int) -> list[tuple[int, int]]:
    """Ranges [lo, hi) of caps for which ``plan_buckets`` makes exactly ``count`` buckets.

    The count only changes where the cap crosses the size of a run of consecutive tensors."""
    sums = sorted({sum(nbytes[i:j]) for i in range(len(nbytes)) for j in range(i + 1, len(nbytes) + 1)})
    edges = sums + [2 * sums[-1] + 1]
    return [(lo, hi) for lo, hi in itertools.pairwise(edges)
            if len(plan_buckets(nbytes, lo)) == count]


def pick_cap(nbytes: list[int], count: int, rng: np.random.Generator) -> int:
    """A cap strictly inside a range giving ``count`` buckets (never equal to a bucket's size)."""
    ranges = [(lo, hi) for lo, hi in caps_giving(nbytes, count) if hi - lo > 2]
    if not ranges:
        raise ValueError(f"no cap gives {count} buckets for sizes {nbytes}")
    lo, hi = ranges[int(rng.integers(len(ranges)))]
    return int(rng.integers(lo + 1, hi))


def ring_time(p: int, nbytes: int, alpha: float, beta: float) -> float:
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta if p > 1 else 0.0


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals."""
    total, end = 0.0, -math.inf
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


@dataclass(frozen=True)
class Window:
    """One rank's backward + gradient sync of one step, on the virtual clock."""

    begin: float  # mark "backward"
    end: float  # mark "synced"
    compute_s: float  # declared backward work inside
    compute_end: float  # when the last backward work ended
    launches: tuple[float, ...]  # when each allreduce was called
    blocked_in_backward: float  # time blocked in waits before compute_end


def windows(events: list[tuple], spans: tuple[tuple[float, float], ...]) -> list[Window]:
    """Per step, the window from mark "backward" to mark "synced" of one rank's replayed events."""
    found, cur = [], None
    for e, (t0, t1) in zip(events, spans):
        kind = e[0]
        if kind == "mark" and e[1] == "backward":
            cur = {"begin": t0, "compute": 0.0, "compute_end": t0, "launches": [], "waits": []}
        elif cur is None:
            continue
        elif kind == "mark" and e[1] == "synced":
            blocked = sum(max(0.0, min(b, cur["compute_end"]) - a) for a, b in cur["waits"])
            found.append(Window(cur["begin"], t0, cur["compute"], cur["compute_end"],
                                tuple(cur["launches"]), blocked))
            cur = None
        elif kind == "compute":
            cur["compute"] += t1 - t0
            cur["compute_end"] = t1
        elif (kind == "coll" and e[1] == "Allreduce") or (kind == "icoll" and e[2] == "Allreduce"):
            cur["launches"].append(t0)
            if kind == "coll":
                cur["waits"].append((t0, t1))
        elif kind == "wait":
            cur["waits"].append((t0, t1))
    return found


def hidden_fraction(exposed_s: float, comm_s: float) -> float:
    """Share of the communication time that did not add to the step."""
    if comm_s <= 0:
        return 0.0
    return min(max(1.0 - exposed_s / comm_s, 0.0), 1.0)


# -- the cases ------------------------------------------------------------------------------------


def _widths(rng: np.random.Generator, depth: tuple[int, int] = (4, 7)) -> tuple[int, ...]:
    """A narrow input, ``depth`` (low, high inclusive) hidden layers of similar width, a narrow
    output."""
    hidden = [int(rng.integers(8, 13)) * 16 for _ in range(int(rng.integers(depth[0], depth[1] + 1)))]
    return (int(rng.integers(2, 5)) * 8, *hidden, int(rng.integers(1, 3)) * 8)


def _reverse_sizes(widths: tuple[int, ...], side_after: int | None = None) -> list[int]:
    case = Case("", 1, widths, 0, 0, 1, 0.0, 0.0, side_after)
    return [n for _, _, n in reversed(layout(case))]


def _timed(case: Case, t: CheckContext, alpha_beta: tuple[float, float], ratio: float) -> Case:
    """The case with forward work per parameter set so that backward work = ratio x the buckets'
    allreduce time alone."""
    sizes = _reverse_sizes(case.widths, case.side_after)
    comm_s = sum(ring_time(case.p, sum(sizes[i] for i in b), *alpha_beta)
                 for b in plan_buckets(sizes, case.cap_bytes))
    params = sum(n for _, n, _ in layout(case))
    return Case(case.label, case.p, case.widths, case.seed, case.cap_bytes, case.steps, case.lr,
                ratio * comm_s / (2 * params), case.side_after, case.side_used)


def ring_alpha_beta(t: CheckContext, p: int) -> tuple[float, float]:
    routes = [t.platform.route(r, (r + 1) % p) for r in range(p)]
    return max(r.alpha_s for r in routes), max(r.beta_s_per_byte for r in routes)


def main_cases(t: CheckContext) -> list[Case]:
    """The cases of the main launch: the same for every check that reads it."""
    rng = np.random.default_rng([t.seed, 6])
    steps, lr = int(rng.integers(3, 6)), float(rng.choice([0.05, 0.08, 0.1]))

    def case(label: str, p: int, count: int | str) -> Case:
        widths = _widths(rng)
        sizes = _reverse_sizes(widths)
        if count == "below":  # a cap below the largest tensor: that tensor is a bucket alone
            cap = int(rng.integers(max(sizes) // 3, max(sizes) * 2 // 3))
        else:
            cap = pick_cap(sizes, int(count), rng)
        plain = Case(label, p, widths, int(rng.integers(1 << 30)), cap, steps, lr, 0.0)
        return _timed(plain, t, ring_alpha_beta(t, p), float(rng.uniform(0.9, 1.1)))

    # Many layers of similar size and 6-8 buckets: the last bucket, which nothing can hide, is a
    # small part of the traffic.
    overlap_widths = _widths(rng, depth=(7, 9))
    overlap_sizes = _reverse_sizes(overlap_widths)
    count = int(rng.integers(6, 9))
    overlap = _timed(
        Case("the overlap case (p = 4)", 4, overlap_widths, int(rng.integers(1 << 30)),
             pick_cap(overlap_sizes, count, rng), steps, lr, 0.0),
        t, ring_alpha_beta(t, 4), float(rng.uniform(0.95, 1.05)))
    one = case("one bucket (p = 2)", 2, 1)
    p = int(rng.choice([2, 3]))
    two = case(f"two buckets (p = {p})", p, 2)
    p = int(rng.choice([3, 4]))
    many = case(f"a cap below the largest tensor (p = {p})", p, "below")
    return [one, two, many, overlap]


def side_case(t: CheckContext) -> Case:
    """A side head used in some steps only; its bucket holds other gradients too."""
    rng = np.random.default_rng([t.seed, 66])
    steps = int(rng.integers(3, 5))
    used = [bool(b) for b in rng.integers(0, 2, size=steps)]
    used[0], used[int(rng.integers(1, steps))] = True, False  # both kinds of step occur
    widths = _widths(rng)
    side_after = int(rng.integers(0, len(widths) - 2))
    sizes = _reverse_sizes(widths, side_after)
    side = [i for i, (name, _, _) in enumerate(reversed(layout(Case("", 1, widths, 0, 0, 1, 0, 0,
                                                                      side_after))))
            if name.startswith("side.")]
    for _ in range(100):
        cap = pick_cap(sizes, int(rng.integers(2, 4)), rng)
        if all(len(b) > len(side) for b in plan_buckets(sizes, cap) if set(side) & set(b)):
            break
    p = 2  # a launch of its own (a hang or an error ends it): kept small
    plain = Case(f"a side head skipped in steps {[s for s in range(steps) if not used[s]]} (p = {p})",
                 p, widths, int(rng.integers(1 << 30)), cap, steps, 0.05, 0.0, side_after,
                 tuple(used))
    return _timed(plain, t, ring_alpha_beta(t, p), 1.0)


def launch_main(t: CheckContext):
    cases = main_cases(t)
    return cases, t.launch(train, [Task(ranks=c.p, args=(c,), label=c.label) for c in cases])


# -- judging --------------------------------------------------------------------------------------


def single_process(case: Case, lr_scale: float = 1.0) -> np.ndarray:
    """Rank 0's model trained by one process on every step's global batch, with plain SGD."""
    torch.set_num_threads(1)
    model = build_model(case, 0)
    for step in range(case.steps):
        x, y = global_batch(case, step)
        zero_grad(model)
        out, side_out = model(x, use_side=case.uses_side(step))
        loss_of(out, side_out, y).backward()
        sgd_step(model, case.lr * lr_scale)
    return flat_weights(model)


def start_weights(case: Case) -> np.ndarray:
    return flat_weights(build_model(case, 0))


def close(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=RTOL, atol=ATOL))


def worst_parameter(case: Case, got: np.ndarray, want: np.ndarray) -> str:
    """Names the parameter with the largest difference."""
    offset, worst, name_of = 0, -1.0, ""
    for name, n, _ in layout(case):
        diff = float(np.max(np.abs(got[offset:offset + n] - want[offset:offset + n]))) if n else 0.0
        if diff > worst:
            worst, name_of = diff, name
        offset += n
    return f"largest difference {worst:.3g} in {name_of}"


def diagnose_weights(case: Case, results: list[RankResult]) -> str | None:
    """None if every rank's final weights are single-process SGD's; else the symptom."""
    want = single_process(case)
    bad = [r for r, res in enumerate(results) if not close(res.final, want)]
    if not bad:
        return None
    rank = bad[0]
    head = f"{case.label}, after {case.steps} steps of SGD (lr {case.lr}): rank {rank}'s weights"
    if all(s.collectives == 0 for res in results for s in res.steps):
        return (f"{head} are not those of one process training on the global batch: no collective "
                "ran in any step, so each rank followed its own shard's gradients only")
    start = start_weights(case)
    diverged = [r for r, res in enumerate(results) if not np.array_equal(res.start, start)]
    if diverged:
        return (f"{head} are wrong: rank {diverged[0]} still held its own initial weights when "
                "DataParallel(...) returned; broadcast rank 0's weights to every rank first")
    got = results[rank].final
    total = sum(n for _, _, n in layout(case))
    for step, count in enumerate(results[rank].steps):
        if count.allreduce_bytes > total:
            return (f"{head} are wrong: its allreduces carried {count.allreduce_bytes} bytes in "
                    f"step {step}, more than the {total} bytes of gradients; a bucket reduced "
                    "twice comes out summed over the ranks twice")
    if case.p > 1 and close(got, single_process(case, lr_scale=case.p)):
        return (f"{head} moved {case.p} times too far each step: the gradients were summed over "
                f"the ranks, not averaged (divide by the world size, p = {case.p})")
    return f"{head} differ from single-process SGD on the global batch ({worst_parameter(case, got, want)})"


CHECKS = Checklist()


@CHECKS.check("weights after several steps equal single-process SGD on the global batch", points=4)
def weights_match(t: CheckContext) -> None:
    cases, run = launch_main(t)
    t.say(f"{len(cases)} cases, {cases[0].steps} SGD steps each, {PER_RANK_BATCH} samples per rank "
          "per step; expected weights computed here by one process on the global batch")
    for case, task_run in zip(cases, run.tasks):
        problem = diagnose_weights(case, task_run.values)
        if problem:
            t.fail(problem)
        t.say(f"{case.label}: every rank matches (widths {list(case.widths)})")


@CHECKS.check("every rank starts from rank 0's weights and ends with the same weights", points=2)
def replicas_agree(t: CheckContext) -> None:
    cases, run = launch_main(t)
    for case, task_run in zip(cases, run.tasks):
        results: list[RankResult] = task_run.values
        want = start_weights(case)
        for rank, res in enumerate(results):
            t.expect(np.array_equal(res.start, want),
                     "every rank to hold rank 0's initial weights once DataParallel(...) returns",
                     f"{case.label}: rank {rank} still held different weights (largest difference "
                     f"{float(np.max(np.abs(res.start - want))):.3g}): were they broadcast from rank 0?")
        for rank, res in enumerate(results[1:], start=1):
            t.expect(res.final.shape == results[0].final.shape
                     and bool(np.allclose(res.final, results[0].final, rtol=1e-6, atol=1e-7)),
                     f"rank {rank}'s weights after {case.steps} steps to equal rank 0's",
                     f"{case.label}: they differ ({worst_parameter(case, res.final, results[0].final)}): "
                     "the replicas drifted apart")
    t.say("every case: all ranks started from rank 0's weights and ended in agreement")


@CHECKS.check("one allreduce per bucket per step, for caps giving 1, 2 and 3+ buckets", points=3)
def one_collective_per_bucket(t: CheckContext) -> None:
    cases, run = launch_main(t)
    for case, task_run in zip(cases, run.tasks):
        sizes = [n for _, _, n in reversed(layout(case))]
        buckets = plan_buckets(sizes, case.cap_bytes)
        total = sum(sizes)
        where = (f"{case.label}: cap {case.cap_bytes} bytes over {len(sizes)} gradients of "
                 f"{total} bytes in all makes {len(buckets)} bucket(s)")
        for rank, res in enumerate(task_run.values):
            for step, count in enumerate(res.steps):
                if count.collectives == len(buckets) and count.allreduce_bytes == total:
                    continue
                seen = (f"{where}, so {len(buckets)} allreduce(s) per step; rank {rank} made "
                        f"{count.collectives} collective call(s) in step {step} "
                        f"({', '.join(f'{op} x{n}' for op, n in sorted(count.calls.items())) or 'none'}), "
                        f"carrying {count.allreduce_bytes} bytes")
                if count.allreduce_bytes > total:
                    t.fail(f"{seen}: more than the gradients hold, so a bucket was launched twice")
                if count.allreduce_bytes < total:
                    t.fail(f"{seen}: fewer bytes than the gradients hold, so some gradients were "
                           "never reduced")
                t.fail(f"{seen}: the gradients are cut into buckets differently; walk the "
                       "parameters in reverse order and start a new bucket only when the next "
                       "gradient would take the current one past the cap")
        t.say(f"{where}: {len(buckets)} allreduce(s) per step on every rank")
    t.metric("buckets", [len(plan_buckets([n for _, _, n in reversed(layout(c))], c.cap_bytes))
                         for c in cases])


@CHECKS.check("at least half of the communication hidden behind backward compute", points=3)
def overlap(t: CheckContext) -> None:
    cases, run = launch_main(t)
    case, task_run = cases[-1], run.tasks[-1]
    played = task_run.replay()
    traces = task_run.traces
    per_rank = {r: windows(traces[r], played.spans[r]) for r in traces}
    sizes = [n for _, _, n in reversed(layout(case))]
    nbuckets = len(plan_buckets(sizes, case.cap_bytes))
    worst, worst_step, slowest = 1.0, 0, 0.0
    for step in range(case.steps):
        ws = [per_rank[r][step] for r in sorted(per_rank) if len(per_rank[r]) > step]
        if len(ws) < case.p:
            t.fail(f"{case.label}: step {step} did not reach the end of finish_gradient_sync on every rank")
        begin, end = min(w.begin for w in ws), max(w.end for w in ws)
        comm_s = union_length([(f.posted, f.end) for f in played.flows
                               if f.op == "Allreduce" and begin <= f.posted <= end])
        exposed = max(w.end - w.begin - w.compute_s for w in ws)
        backward = max(w.compute_s for w in ws)
        head = (f"{case.label}, step {step}: backward computes {backward * 1e6:.1f} us and the "
                f"{nbuckets} buckets' allreduces take {comm_s * 1e6:.1f} us")
        if comm_s <= 0:
            t.fail(f"{head.split(' and ')[0]}, but no allreduce ran between loss.backward() and the "
                   "end of finish_gradient_sync()")
        hidden = hidden_fraction(exposed, comm_s)
        slowest = max(slowest, max(w.end - w.begin for w in ws))
        if hidden < worst:
            worst, worst_step = hidden, step
        if hidden >= HIDDEN_TARGET:
            continue
        w0 = ws[0]
        seen = (f"{head}; the ranks sat {exposed * 1e6:.1f} us in communication after or besides "
                f"it, so only {hidden:.0%} of it was hidden")
        late = [x for x in w0.launches if x < w0.compute_end - 1e-12]
        if not late:
            t.fail(f"expected at least {HIDDEN_TARGET:.0%} hidden; saw {seen}: every allreduce "
                   "started only after backward had ended. Backward produces the gradients of "
                   "the last layer first: put them in the first bucket (reverse parameter "
                   "order) and start each bucket as soon as it is full")
        if w0.blocked_in_backward > 0.5 * comm_s:
            t.fail(f"expected at least {HIDDEN_TARGET:.0%} hidden; saw {seen}: the allreduces "
                   f"start during backward, but rank 0 waited {w0.blocked_in_backward * 1e6:.1f} us "
                   "for them before backward ended (a blocking Allreduce, or a Wait right after "
                   "each launch), so backward stood still. Start each bucket with comm.Iallreduce "
                   "and wait for them all once, at the end of backward (finish_gradient_sync)")
        t.fail(f"expected at least {HIDDEN_TARGET:.0%} hidden; saw {seen}")
    bound = max(w.compute_s for ws in per_rank.values() for w in ws)
    t.performance(slowest, bound, task_run)
    t.metric("hidden_fraction", round(worst, 4))
    t.say(f"{case.label}: {nbuckets} buckets; at worst {worst:.0%} of the communication hidden "
          f"(step {worst_step}); backward + sync {slowest * 1e6:.1f} us against "
          f"{bound * 1e6:.1f} us of backward compute")


@CHECKS.check("a parameter without a gradient in a step: handled, or a clear error", points=2)
def unused_parameter(t: CheckContext) -> None:
    case = side_case(t)
    skipped = [s for s in range(case.steps) if not case.side_used[s]]
    t.say(f"{case.label}: in those steps the side head's parameters get no gradient")
    try:
        run = t.launch(train, [Task(ranks=case.p, args=(case,), label=case.label)], stall_s=3.0)
    except CheckFailed as failed:
        result = getattr(failed, "result", None)
        if result is None:
            raise
        if result.status != "error":
            t.fail(f"{case.label}: the run ended in a {result.status} ({result.message}); when a "
                   "parameter gets no gradient, finish it (count the gradient as zero) or raise "
                   "an error that says so, but never wait for a gradient that cannot come")
        if "NoneType" in result.message or result.message.rstrip().endswith(":"):
            t.fail(f"{case.label}: the run failed with {result.message!r}, an accident rather "
                   "than an explanation: when a parameter gets no gradient in a step, either "
                   "treat its gradient as zero or raise an error naming the problem")
        t.say(f"a clear error: {result.message.splitlines()[0]}")
        t.metric("outcome", "error")
        return
    results: list[RankResult] = run.tasks[0].values
    problem = diagnose_weights(case, results)
    if problem:
        total = sum(n for _, _, n in layout(case))
        short = [(s, c.allreduce_bytes) for s, c in enumerate(results[0].steps)
                 if c.allreduce_bytes < total]
        if short:
            step, carried = short[0]
            problem += (f"; in step {step} the allreduces carried only {carried} of the {total} "
                        "bytes of gradients, so a bucket that never filled was never reduced")
        t.fail(f"{problem}; the side head had no gradient in steps {skipped}: silently wrong "
               "weights are the one outcome that is not allowed")
    t.metric("outcome", "handled")
    t.say(f"handled: the weights equal single-process SGD, with the side head skipped in steps {skipped}")
