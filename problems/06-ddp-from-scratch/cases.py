"""Problem 06's cases: the model and data a case describes, the bucket rule, the hidden variants.

A case is a small MLP whose layers declare their work on the virtual clock (forward, and twice that in backward, in
proportion to their parameters), trained on synthetic regression batches sharded by rank. A rank is handed only its
view of a case (``Case.for_rank``): its own initial weights and its own shard of every step, materialized as arrays,
never the case's seed nor any key they were drawn from (a key of a few bytes could travel to the other ranks inside a
message, and each could rebuild every rank's data from them), so rank 0's weights reach the others only by a broadcast
and the global gradient only by the allreduces. Every number of the variants
comes from the session seed in a fixed order of draws, so ``--seed`` replays a failure; each case's work per parameter
makes backward compute about equal to its buckets' allreduce time on the platform.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
import torch

from distlab.grading import CheckContext, Widener, cost

PER_RANK_BATCH = 8


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
    # A rank's view: (its rank, its initial weights flat, its shards' inputs and targets, one per step); no key.
    own: tuple[int, np.ndarray, np.ndarray, np.ndarray] | None = None

    def keys(self, rank: int) -> tuple[int, int, int]:
        """The keys of ``rank``'s own things: its initial weights, what every rank shares (the
        teacher), its batches. The whole case only: a rank's view holds no key, only arrays."""
        self._view_of(rank)
        if self.own is not None:
            raise ValueError(f"rank {rank}'s view of the case holds no keys, only its own initial weights and "
                             "shards, drawn by its agent")
        return rank_keys(self.seed, rank)

    def _view_of(self, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """A view's own arrays (weights, inputs, targets) if ``rank`` is its rank; None for the whole case."""
        if self.own is None:
            return None
        if rank != self.own[0]:
            raise ValueError(f"rank {self.own[0]}'s view of the case holds neither the data nor the initial "
                             f"weights of rank {rank}: what another rank holds comes only by a message")
        return self.own[1], self.own[2], self.own[3]

    def for_rank(self, rank: int) -> Case:
        """What rank ``rank``'s process is handed: its own initial weights and its own shard of every
        step, made here (by its agent) from the whole case, and nothing they were made from: with the
        seed, one process could rebuild rank 0's weights and the whole global batch and take every step
        alone; with a rank's keys (a few bytes each), the ranks could swap them inside a message."""
        if self.own is not None:
            self._view_of(rank)
            return self
        shards = [shard(self, rank, step) for step in range(self.steps)]
        d_in, d_out = self.widths[0], self.widths[-1]
        xs = np.stack([x.numpy() for x, _ in shards]) if shards else np.zeros((0, PER_RANK_BATCH, d_in), np.float32)
        ys = np.stack([y.numpy() for _, y in shards]) if shards else np.zeros((0, PER_RANK_BATCH, d_out), np.float32)
        with torch.random.fork_rng(devices=[]):  # the global generator, seeded with the key, is left as it was
            weights = torch.cat([q.detach().reshape(-1) for q in build_model(self, rank).parameters()]).numpy().copy()
        return replace(self, seed=-1, own=(rank, weights, xs, ys))

    def uses_side(self, step: int) -> bool:
        return self.side_after is not None and self.side_used[step]

    def backward_sizes(self) -> list[int]:
        """The gradients' bytes in the order backward produces them: reverse parameter order."""
        return [n for _, _, n in reversed(layout(self))]

    def buckets(self) -> list[list[int]]:
        return plan_buckets(self.backward_sizes(), self.cap_bytes)


# -- the model: each layer declares its work on the virtual clock --------------------------------


class Net(torch.nn.Module):
    """Linear layers with ReLU between; optionally a one-output side head after one layer,
    registered right after it (so its parameters sit in the middle of the parameter order)."""

    def __init__(self, widths: tuple[int, ...], side_after: int | None = None) -> None:
        super().__init__()
        self.depth, self.side_after = len(widths) - 1, side_after
        for i in range(self.depth):
            setattr(self, f"fc{i}", torch.nn.Linear(widths[i], widths[i + 1]))
            if i == side_after:
                self.side = torch.nn.Linear(widths[i + 1], 1)
        self.forward_s_per_param = 0.0  # set on the ranks: the work a layer declares per parameter

    def forward(self, x: torch.Tensor, use_side: bool = False):  # type: ignore[override]
        return run_model(self, x, use_side)


def run_model(net: Net, x: torch.Tensor, use_side: bool = False, declare: Callable[..., None] | None = None):
    """The model's forward pass; with ``declare`` (train()'s comm.compute, handed here, never kept on the model that
    the learner's DataParallel is handed) each layer declares its forward work and, by a hook on its output that runs
    as backward reaches it, just before its gradients, its backward work (twice that) on the virtual clock."""
    def layer(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        y = module(x)
        if declare is not None:
            seconds = net.forward_s_per_param * sum(p.numel() for p in module.parameters())
            declare(seconds=seconds, label="forward")
            y.register_hook(lambda grad: declare(seconds=2 * seconds, label="backward"))
        return y

    side_out = None
    for i in range(net.depth):
        x = layer(getattr(net, f"fc{i}"), x)
        if i < net.depth - 1:
            x = torch.relu(x)
        if i == net.side_after and use_side:
            side_out = layer(net.side, x)
    return x, side_out


def rank_keys(seed: int, rank: int) -> tuple[int, int, int]:
    """The keys of ``rank``'s initial weights, of what every rank shares (the teacher) and of its
    batches, drawn from the case's seed, which never reaches a rank: no key gives another's."""
    init = int(np.random.default_rng([seed, 6, 1, rank]).integers(2**62))
    shared = int(np.random.default_rng([seed, 6, 2]).integers(2**62))
    return init, shared, int(np.random.default_rng([seed, 6, 3, rank]).integers(2**62))


def build_model(case: Case, rank: int) -> Net:
    """Every rank starts from its own random weights; rank 0's are the single-process model's. A
    rank's view holds its own, drawn by its agent: the model is built, then given them."""
    own = case._view_of(rank)
    if own is None:
        torch.manual_seed(case.keys(rank)[0])
        return Net(case.widths, case.side_after)
    model, flat, offset = Net(case.widths, case.side_after), torch.from_numpy(own[0]), 0
    with torch.no_grad():
        for q in model.parameters():
            q.copy_(flat[offset:offset + q.numel()].view_as(q))
            offset += q.numel()
    return model


def layout(case: Case) -> list[tuple[str, int, int]]:
    """(name, number of elements, bytes) of every parameter, in parameter order."""
    return [(name, p.numel(), p.numel() * p.element_size())
            for name, p in Net(case.widths, case.side_after).named_parameters()]


@lru_cache(maxsize=64)
def _teacher(shared: int, d_in: int, d_out: int) -> np.ndarray:
    return np.random.default_rng([shared, 5]).standard_normal((d_in, d_out)) / math.sqrt(d_in)


def shard(case: Case, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s PER_RANK_BATCH samples of step ``step`` (any case, or its own view's arrays)."""
    view = case._view_of(rank)
    if view is not None:
        if not 0 <= step < len(view[1]):
            raise ValueError(f"rank {rank}'s view of the case holds its shards of steps 0 to {len(view[1]) - 1} only")
        return torch.from_numpy(view[1][step].copy()), torch.from_numpy(view[2][step].copy())
    _, shared, own = case.keys(rank)
    d_in, d_out = case.widths[0], case.widths[-1]
    rng = np.random.default_rng([own, 17, step])
    x = rng.standard_normal((PER_RANK_BATCH, d_in))
    y = np.tanh(x @ _teacher(shared, d_in, d_out)) + 0.1 * rng.standard_normal((PER_RANK_BATCH, d_out))
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32))


def global_batch(case: Case, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s batch over all ranks: rows [r*b, (r+1)*b) are rank r's shard (the whole
    case only: a rank's view holds no other rank's data)."""
    xs, ys = zip(*(shard(case, r, step) for r in range(case.p)))
    return torch.cat(xs), torch.cat(ys)


def loss_of(out: torch.Tensor, side_out: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    loss = torch.nn.functional.mse_loss(out, y)
    if side_out is not None:
        loss = loss + 0.5 * torch.nn.functional.mse_loss(side_out, y[:, :1])
    return loss


# -- the bucket rule of the card, and caps that give a wanted number of buckets -------------------


def plan_buckets(nbytes: list[int], cap_bytes: int) -> list[list[int]]:
    """Consecutive tensors (``nbytes`` in reverse parameter order), a new bucket when the next
    one would pass the cap; a tensor over the cap gets its own."""
    buckets: list[list[int]] = []
    filled = 0
    for i, n in enumerate(nbytes):
        if not buckets or filled + n > cap_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(i)
        filled += n
    return buckets


def caps_giving(nbytes: list[int], count: int) -> list[tuple[int, int]]:
    """Ranges [lo, hi) of caps for which ``plan_buckets`` makes exactly ``count`` buckets.

    The count only changes where the cap crosses the size of a run of consecutive tensors."""
    sums = sorted({sum(nbytes[i:j]) for i in range(len(nbytes)) for j in range(i + 1, len(nbytes) + 1)})
    edges = sums + [2 * sums[-1] + 1]
    return [(lo, hi) for lo, hi in itertools.pairwise(edges) if len(plan_buckets(nbytes, lo)) == count]


def pick_cap(nbytes: list[int], count: int, rng: np.random.Generator) -> int:
    """A cap strictly inside a range giving ``count`` buckets (never equal to a bucket's size)."""
    ranges = [(lo, hi) for lo, hi in caps_giving(nbytes, count) if hi - lo > 2]
    if not ranges:
        raise ValueError(f"no cap gives {count} buckets for sizes {nbytes}")
    lo, hi = ranges[int(rng.integers(len(ranges)))]
    return int(rng.integers(lo + 1, hi))


# -- the hidden variants --------------------------------------------------------------------------


def _widths(rng: np.random.Generator, depth: tuple[int, int] = (4, 7)) -> tuple[int, ...]:
    """A narrow input, ``depth`` (low, high inclusive) hidden layers of like width, a narrow output."""
    hidden = [int(rng.integers(8, 13)) * 16 for _ in range(int(rng.integers(depth[0], depth[1] + 1)))]
    return (int(rng.integers(2, 5)) * 8, *hidden, int(rng.integers(1, 3)) * 8)


def _shape(widths: tuple[int, ...], side_after: int | None = None) -> Case:
    """A case that only says which parameters the model has (for its sizes)."""
    return Case("", 1, widths, 0, 0, 1, 0.0, 0.0, side_after)


def _timed(case: Case, t: CheckContext, ratio: float) -> Case:
    """The case with forward work per parameter set so that backward work = ratio x the buckets'
    allreduce time alone (rings on the platform's slowest neighbour link)."""
    routes = [t.platform.route(r, (r + 1) % case.p) for r in range(case.p)]
    alpha, beta = max(r.alpha_s for r in routes), max(r.beta_s_per_byte for r in routes)
    sizes = case.backward_sizes()
    comm_s = sum(cost.ring_allreduce_time(case.p, sum(sizes[i] for i in b), alpha, beta) for b in case.buckets())
    params = sum(n for _, n, _ in layout(case))
    return replace(case, forward_s_per_param=ratio * comm_s / (2 * params))


def main_cases(t: CheckContext) -> list[Case]:
    """The cases of the main launch: one bucket, two, a cap below the largest tensor, overlap."""
    rng, widen = np.random.default_rng([t.seed, 6]), Widener(t.seed, 6)
    steps, lr = int(rng.integers(3, 6)), float(rng.choice([0.05, 0.08, 0.1]))

    def case(label: str, p: int, buckets: int | str) -> Case:
        widths = _widths(rng)
        sizes = _shape(widths).backward_sizes()
        # "below": a cap below the largest tensor, so that tensor is a bucket alone
        cap = (int(rng.integers(max(sizes) // 3, max(sizes) * 2 // 3)) if buckets == "below"
               else pick_cap(sizes, int(buckets), rng))
        return _timed(Case(label, p, widths, widen(int(rng.integers(1 << 30))), cap, steps, lr, 0.0),
                      t, float(rng.uniform(0.9, 1.1)))

    # Many layers of similar size and 6-8 buckets: the last bucket, which nothing can hide, is a
    # small part of the traffic. (Its seed is drawn before its cap: the order of the draws stays.)
    widths = _widths(rng, depth=(7, 9))
    count, seed = int(rng.integers(6, 9)), widen(int(rng.integers(1 << 30)))
    sizes = _shape(widths).backward_sizes()  # where no cap gives that many buckets (~1 seed in 65), the nearest
    count = next(k for k in (count, 7, 6, 8) if any(hi - lo > 2 for lo, hi in caps_giving(sizes, k)))
    cap = pick_cap(sizes, count, rng)
    plain = Case("the overlap case (p = 4)", 4, widths, seed, cap, steps, lr, 0.0)
    overlap = _timed(plain, t, float(rng.uniform(0.95, 1.05)))
    one = case("one bucket (p = 2)", 2, 1)
    p = int(rng.choice([2, 3]))
    two = case(f"two buckets (p = {p})", p, 2)
    p = int(rng.choice([3, 4]))
    many = case(f"a cap below the largest tensor (p = {p})", p, "below")
    return [one, two, many, overlap]


def side_case(t: CheckContext) -> Case:
    """A side head used in some steps only; its bucket holds other gradients too."""
    rng, widen = np.random.default_rng([t.seed, 66]), Widener(t.seed, 66)
    steps = int(rng.integers(3, 5))
    used = [bool(b) for b in rng.integers(0, 2, size=steps)]
    used[0], used[int(rng.integers(1, steps))] = True, False  # both kinds of step occur
    widths = _widths(rng)
    shape = _shape(widths, int(rng.integers(0, len(widths) - 2)))
    sizes = shape.backward_sizes()
    side = [i for i, (name, _, _) in enumerate(reversed(layout(shape))) if name.startswith("side.")]
    for _ in range(100):
        cap = pick_cap(sizes, int(rng.integers(2, 4)), rng)
        if all(len(b) > len(side) for b in plan_buckets(sizes, cap) if set(side) & set(b)):
            break
    p = 2  # a launch of its own (a hang or an error ends it): kept small
    skipped = [s for s in range(steps) if not used[s]]
    return _timed(replace(shape, label=f"a side head skipped in steps {skipped} (p = {p})", p=p,
                          seed=widen(int(rng.integers(1 << 30))), cap_bytes=cap, steps=steps, lr=0.05,
                          side_used=tuple(used)), t, 1.0)
