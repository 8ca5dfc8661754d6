"""The cases of problem 10 and what each must end with.

Every case is one run of the parameter server: one server (rank 0) and three workers training a
logistic regression on batches they draw from their own stream. A case fixes the staleness bound
s, each worker's number of steps, and each worker's compute time per step (a straggler's steps
take 2-5x the base). A rank is handed only its part (``Case.for_rank``: the server the bound, the
rate and the initial model; a worker its own batches and step times, never the seed); the
expected values (synchronous training, the card's server simulated event by event, the loss) are
computed in the checker.
"""

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from distlab.grading import Widener

FEATURES = 16  # weights of the model, the last one a bias
BATCH = 32  # examples a worker draws per step
BASE_S = 1e-3  # a worker's compute per step at full speed, declared on the virtual clock
SLOW = (2.0, 5.0)  # a straggler's step takes this many times the base
WORKERS = 3
STEPS = 24
SSP_STALENESS = 3  # the bound of the throughput and loss checks
DRIFT = SSP_STALENESS + 2  # with no bound, some read of the s = 3 case is at least this stale
FIRST_DONE = 6  # the steps of the worker that finishes first
RTOL = 1e-9  # s = 0 against gradient descent in one process: float64, only the summation order differs


@dataclass(frozen=True)
class Case:
    what: str  # which check reads it
    staleness: int  # s
    slow: tuple[tuple[float, ...], ...]  # slow[j][c]: worker j's step c takes slow[j][c] x BASE_S
    lr: float
    seed: int  # the data

    @property
    def workers(self) -> int:
        return len(self.slow)

    @property
    def steps(self) -> tuple[int, ...]:
        return tuple(len(row) for row in self.slow)

    def compute_s(self, worker: int, step: int) -> float:
        return BASE_S * self.slow[worker][step]

    def label(self) -> str:
        steps = f"{self.steps[0]} steps" if len(set(self.steps)) == 1 else \
            "steps " + ", ".join(map(str, self.steps))
        slow = sum(f > 1 for row in self.slow for f in row)
        return f"{self.what}: s = {self.staleness}, {self.workers} workers, {steps}, {slow} straggling steps"

    def for_rank(self, rank: int) -> "ServerView | WorkerView":
        """What rank ``rank`` is handed (the server rank 0, worker j rank j + 1): never the seed, which
        would give any process every worker's batches and the whole run to simulate."""
        if rank == 0:
            return ServerView(self.what, self.workers, self.staleness, self.lr, initial_weights(self))
        j = rank - 1
        return WorkerView(self.what, j, self.workers, tuple(self.compute_s(j, c) for c in range(self.steps[j])),
                          tuple(batch(self, j, c) for c in range(self.steps[j])))


@dataclass(frozen=True)
class ServerView:
    """The server's part of a case: the bound, the rate and the initial model; no worker's data."""

    what: str
    workers: int
    staleness: int
    lr: float
    weights: np.ndarray


@dataclass(frozen=True)
class WorkerView:
    """Worker ``index``'s part of a case: its own step times and batches, nothing of the others'."""

    what: str
    index: int
    workers: int
    seconds: tuple[float, ...]  # the compute of each of its steps, declared on the virtual clock
    batches: tuple[tuple[np.ndarray, np.ndarray], ...]  # (X, y) of each of its steps

    @property
    def steps(self) -> int:
        return len(self.seconds)

    def compute_s(self, step: int) -> float:
        return self.seconds[step]


class Training(Case):
    """A case of equal steps: s = 0, s = 3 under the card's stragglers, the hidden bound."""


class Finishing(Case):
    """Workers with different numbers of steps: its own task, so that a deadlock there costs only its check."""


# -- the data: a logistic regression the workers learn from their own streams -----------------------


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # the logistic function, without overflow warnings


def _teacher(seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 1]).normal(0.0, 1.5, FEATURES)


def examples(seed: int, stream: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n examples of one stream: X (n x FEATURES, the last column 1, the bias), y (0 or 1)."""
    rng = np.random.default_rng([seed, 2, stream])
    X = np.hstack([rng.normal(0.0, 1.0, (n, FEATURES - 1)), np.ones((n, 1))])
    y = (rng.random(n) < sigmoid(X @ _teacher(seed))).astype(np.float64)
    return X, y


def batch(case: Case, worker: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker ``worker``'s batch of step ``step``: its own stream, so every process draws the same."""
    return examples(case.seed, 1000 * (worker + 1) + step, BATCH)


def gradient(w: np.ndarray, X: np.ndarray, y: np.ndarray, workers: int) -> np.ndarray:
    """The batch's share of the global batch's mean log-loss gradient (divided by all workers' examples)."""
    return X.T @ (sigmoid(X @ w) - y) / (workers * len(y))


def initial_weights(case: Case) -> np.ndarray:
    return np.random.default_rng([case.seed, 3]).normal(0.0, 0.01, FEATURES)


@lru_cache(maxsize=8)
def held_out(seed: int) -> tuple[np.ndarray, np.ndarray]:
    return examples(seed, 7, 4000)


def loss(case: Case, w: np.ndarray) -> float:
    """The mean log loss of the model on held-out examples."""
    X, y = held_out(case.seed)
    z = X @ np.asarray(w, dtype=np.float64)
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def synchronous(case: Case) -> list[np.ndarray]:
    """The models of synchronous training in one process, after 0 .. K steps: every worker's step-c
    gradient taken at the same model, all of them applied before step c + 1 (equal steps only)."""
    models = [initial_weights(case)]
    for c in range(min(case.steps)):
        w = models[-1].copy()
        for j in range(case.workers):
            w -= case.lr * gradient(models[-1], *batch(case, j, c), case.workers)
        models.append(w)
    return models


# -- the hidden cases --------------------------------------------------------------------------------


def rounds(rng: np.random.Generator, workers: int, steps: int) -> tuple[tuple[float, ...], ...]:
    """The card's stragglers: in every round of W steps each worker straggles once, at a random step
    of the round, by a random factor in 2-5x. Synchronous training waits for one straggler every step."""
    slow = np.ones((workers, steps))
    for start in range(0, steps, workers):
        for j, at in enumerate(rng.permutation(workers)):
            if start + at < steps:
                slow[j, start + at] = rng.uniform(*SLOW)
    return tuple(tuple(float(f) for f in row) for row in slow)


def long_straggler(rng: np.random.Generator, workers: int, steps: int) -> tuple[tuple[float, ...], ...]:
    """One worker slow for a long stretch: the others run into the bound again and again."""
    slow = np.ones((workers, steps))
    who, start = int(rng.integers(workers)), int(rng.integers(1, 4))
    slow[who, start:start + 9] = rng.uniform(3.0, SLOW[1], 9)
    return tuple(tuple(float(f) for f in row) for row in slow)


def finishing(rng: np.random.Generator, workers: int, staleness: int) -> tuple[tuple[float, ...], ...]:
    """Workers that finish at different times, in two acts. One worker, slow (3-5x) at every step,
    stops after FIRST_DONE steps while the others, at full speed, wait on it: its last push is what
    frees their reads at clock FIRST_DONE + s, and a server that does not re-check then deadlocks
    (every other worker is blocked). Then one of the two left is slow for a stretch, so the other
    runs into the bound again and again: a server that stops bounding once a worker is done goes
    past s. The card's stragglers after that."""
    lengths = [int(n) for n in rng.choice(np.arange(13, 19), workers, replace=False)]
    first = int(rng.integers(workers))
    lengths[first] = FIRST_DONE
    slow = np.array(rounds(rng, workers, max(lengths)))
    held = FIRST_DONE + staleness  # the others' clock when the first one finishes: all blocked on it
    slow[:, :held] = 1.0
    slow[first, :FIRST_DONE] = rng.uniform(3.0, SLOW[1], FIRST_DONE)
    rest = [j for j in range(workers) if j != first]
    laggard = max(rest, key=lambda j: (lengths[j], j))  # the longer of the two: its stretch fits
    stretch = min(6, lengths[laggard] - held)
    slow[rest, held:held + stretch] = 1.0
    slow[laggard, held:held + stretch] = rng.uniform(3.0, SLOW[1], stretch)
    return tuple(tuple(float(f) for f in row[:n]) for row, n in zip(slow, lengths))


@dataclass(frozen=True)
class Session:
    synchronous: Case  # s = 0 under the card's stragglers
    stragglers: Case  # s = 3, the same stragglers
    bound: Case  # a hidden s in 1-2, one worker slow for a long stretch
    finish: Case  # workers with different numbers of steps

    def all(self) -> list[Case]:
        return [self.synchronous, self.stragglers, self.bound, self.finish]


def drifting(rng: np.random.Generator, seed: int) -> tuple[tuple[float, ...], ...]:
    """The card's stragglers of the s = 0 and s = 3 cases, drawn again (from the seed's own streams)
    until the workers drift apart: with no bound at all, some read would be DRIFT or more steps
    stale, so the s = 3 case tells a bound from none on every seed (a draw as it comes left such a
    server within s = 3 on two seeds in five). About one draw in four drifts that far; the first comes
    from ``rng``, so the later cases' draws stay what they were."""
    slow = rounds(rng, WORKERS, STEPS)
    for attempt in itertools.count(1):
        free = simulate(Training("", SSP_STALENESS, slow, 1.0, 0), gate=lambda c, clock, s: True)
        if max(r.staleness for r in free.reads) >= DRIFT:
            return slow
        slow = rounds(np.random.default_rng([seed, 10, attempt]), WORKERS, STEPS)
    raise AssertionError("unreachable")


def session(seed: int) -> Session:
    rng = np.random.default_rng([seed, 10])
    lr, data = round(float(rng.uniform(1.0, 2.0)), 3), Widener(seed, 10)(int(rng.integers(1 << 30)))
    sync = Training("s = 0 is synchronous", 0, drifting(rng, seed), lr, data)
    bound = Training("the bound under a long straggler", int(rng.integers(1, 3)), long_straggler(rng, WORKERS, 16),
                 lr, data)
    s = int(rng.integers(1, 3))
    finish = Finishing("workers that finish at different times", s, finishing(rng, WORKERS, s), lr, data)
    return Session(sync, replace(sync, what="s = 3 under stragglers", staleness=SSP_STALENESS), bound, finish)


PUSH, ANNOUNCE, MODEL = 11, 12, 13  # the tags of the harness's messages (programs.py)
# The two causes of reads left waiting after a worker's last push (the mailbox's Stuck, check 5).
KEPT_CLOCK = "does your server still count its last clock as the slowest?"
NOT_RECHECKED = ("the waiting reads it frees were not answered: re-check the waiting reads on every push, the last "
                 "one too")
STUCK_MARK = "mailbox stuck"  # the mark the mailbox sets in the server's trace before it raises Stuck
Gate = Callable[[int, list[float], int], bool]  # (the reader's clock c, the clock table, s) -> may it read?


def ssp_gate(c: int, clock: list[float], s: int) -> bool:
    return min(clock) >= c - s  # the rule of the card: the slowest worker at c - s or later


@dataclass(frozen=True)
class Read:
    worker: int  # index 0 .. W-1
    clock: int  # the reader's clock: the read is for its step `clock`
    staleness: float  # the reader's clock minus the slowest worker's pushes then
    pushes: tuple[int, ...] = ()  # the gradients in from each worker then (from a trace)


# -- the parameter server simulated here: the times to compare with, and the models it trains --------


@dataclass
class Simulated:
    makespan: float  # seconds until the last push (messages taken as free)
    reads: list[Read] = field(default_factory=list)
    model: np.ndarray | None = None
    stuck: bool = False  # every worker left waits for a read that never comes


def simulate(case: Case, gate: Gate = ssp_gate, train: bool = False, done_counts: bool = True,
             recheck_last: bool = True) -> Simulated:
    """The server of the card, event by event, in the order the harness's mailbox hands the messages
    over (by the time they leave, then by worker): a gradient applies at once, a read is answered as
    soon as the gate lets it. Two bugs: ``done_counts=False``, a finished worker keeps its last clock;
    ``recheck_last=False``, the kept reads are not re-checked after a worker's last push."""
    W, steps = case.workers, case.steps
    clock: list[float] = [0.0] * W  # gradients in from each worker (inf: it finished)
    leaves = {j: (0.0, 0) for j in range(W)}  # worker -> (when its next message leaves, its clock then)
    waiting: dict[int, int] = {}  # worker -> the clock it reads at
    w = initial_weights(case) if train else None
    read_at: dict[int, np.ndarray] = {}  # the model each worker computes its gradient on
    out = Simulated(0.0)
    while leaves:
        j = min(leaves, key=lambda k: (leaves[k], k))
        now, c = leaves.pop(j)
        out.makespan = max(out.makespan, now)
        if c > 0 and w is not None:  # the gradient of step c - 1, applied at once
            w = w - case.lr * gradient(read_at[j], *batch(case, j, c - 1), W)
        clock[j] = math.inf if c == steps[j] and done_counts else c
        if c < steps[j]:
            waiting[j] = c
        slowest = min(clock)
        for k, ck in sorted(waiting.items()) if c < steps[j] or recheck_last else ():
            if gate(ck, clock, case.staleness):
                del waiting[k]
                out.reads.append(Read(k, ck, ck - slowest))
                if w is not None:
                    read_at[k] = w.copy()
                leaves[k] = (now + case.compute_s(k, ck), ck + 1)
    out.stuck, out.model = bool(waiting), w
    return out
