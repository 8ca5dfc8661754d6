"""The cases of problem 12 and what they should give, computed here in the supervisor.

A case is one pipeline: a schedule (GPipe or 1F1B), m micro-batches of MICRO samples, and the
seconds each stage's forward and backward of one micro-batch cost on the virtual clock. The
expected bubble is the critical path of the schedule's canonical order of operations, replayed
here with the platform's message latency: with equal stages it is (p-1)/(m+p-1) (plus a few
microseconds of messages); with unequal stages no closed form holds, so this replay is the bound.

A rank is handed its stage's view of a case (``Pipe.for_rank``): its own layers' starting weights,
the features on stage 0, the labels on the last stage, all materialized, and never the case's seed,
from which one process could compute every stage's gradients alone (an outside tester passed every
check so, without running a pipeline), nor any per-stage key: a key is a few bytes that a rank could
smuggle to the others inside a message of the right size, and from the keys one process would
rebuild every stage. The checker keeps the whole case and draws everything from the seed.
"""

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from distlab.grading import Widener

STAGES = 4  # p: one stage per rank
MICRO = 4  # samples per micro-batch
FEATURES, WIDTH, CLASSES = 6, 8, 3  # the model: 6 -> 8 -> 8 -> 8 -> 3
STEPS = 2  # training steps per case: the second starts from the weights SGD made of the first
LEARNING_RATE = 0.3
GPIPE, ONE_F_ONE_B = "gpipe", "1f1b"
NAMES = {GPIPE: "GPipe", ONE_F_ONE_B: "1F1B"}


@dataclass(frozen=True, eq=False)
class Own:
    """What a stage's view of a case holds of the model and the data: its own part only, as the
    arrays themselves (no key any process could rebuild them, or another stage's, from)."""

    stage: int
    weights: tuple[np.ndarray, ...]  # this stage's starting weights: its linear layer's weight, then bias
    inputs: np.ndarray | None  # stage 0: the batch's features (batch x FEATURES)
    labels: tuple[int, ...] | None  # the last stage: the batch's classes


@dataclass(frozen=True)
class Pipe:
    schedule: str  # GPIPE or ONE_F_ONE_B
    m: int  # micro-batches per step
    forward_s: tuple[float, ...]  # per stage: one micro-batch's forward on the virtual clock
    backward_s: tuple[float, ...]  # per stage: its backward
    seed: int  # the checker's: the model's start and the data; -1 in a stage's view
    own: Own | None = field(default=None, compare=False)  # a stage's view: its own data instead of the seed

    @property
    def p(self) -> int:
        return len(self.forward_s)

    @property
    def equal(self) -> bool:
        return len(set(self.forward_s)) == 1 and len(set(self.backward_s)) == 1

    @property
    def batch(self) -> int:
        return self.m * MICRO

    def label(self) -> str:
        times = (f"equal stages, forward {self.forward_s[0] * 1e3:.1f} ms, backward {self.backward_s[0] * 1e3:.1f} ms"
                 if self.equal else "unequal stages, forward " + "/".join(f"{f * 1e3:.1f}" for f in self.forward_s)
                 + " ms, backward " + "/".join(f"{b * 1e3:.1f}" for b in self.backward_s) + " ms")
        return f"{NAMES[self.schedule]}, p = {self.p}, m = {self.m}, {times}"

    def _holds(self, stage: int, what: str) -> Own:
        assert self.own is not None
        if stage != self.own.stage:
            raise ValueError(f"stage {self.own.stage}'s view of the pipeline holds no {what} of stage {stage}")
        return self.own

    def start_weights(self, stage: int) -> tuple[np.ndarray, ...]:
        """Stage ``stage``'s starting weights: its linear layer's weight (out x in), then its bias."""
        if self.own is None:
            return start_weights(weights_key(self.seed, stage), *layer_shape(self.p, stage))
        return tuple(w.copy() for w in self._holds(stage, "weights").weights)

    def batch_features(self) -> np.ndarray:
        """The batch's features (batch x FEATURES), which stage 0 reads."""
        if self.own is None:
            return features(inputs_key(self.seed), self.batch)
        if self.own.inputs is None:
            raise ValueError(f"stage {self.own.stage}'s view of the pipeline holds no features (stage 0 reads them)")
        return self.own.inputs.copy()

    def labels(self) -> tuple[int, ...]:
        """The batch's classes, which the last stage's loss reads."""
        if self.own is None:
            return labels_of(self.seed, self.batch)
        if self.own.labels is None:
            raise ValueError(f"stage {self.own.stage}'s view of the pipeline holds no labels (the last stage reads "
                             "them)")
        return self.own.labels

    def for_rank(self, rank: int) -> "Pipe":
        """What stage ``rank``'s process is handed: its own layers' starting weights, the features on
        stage 0, the labels on the last stage, made here by its agent; no seed (with it, one process
        could compute every stage alone) and no key (a rank could smuggle it to the others). Of the
        stage times, its own only (NaN for the others): with all of them, a schedule replayed the
        pipeline's bubble and hid its spans only where the bubble would fail anyway."""
        own = Own(rank, self.start_weights(rank), self.batch_features() if rank == 0 else None,
                  self.labels() if rank == self.p - 1 else None)
        return replace(self, forward_s=only(self.forward_s, rank), backward_s=only(self.backward_s, rank), seed=-1,
                       own=own)


# -- the model's start and the data: every stage's here, only its own in a rank --------------------


def only(times: tuple[float, ...], stage: int) -> tuple[float, ...]:
    """``times`` with every stage's but ``stage``'s NaN: unknown there."""
    return tuple(t if s == stage else math.nan for s, t in enumerate(times))


def weights_key(seed: int, stage: int) -> int:
    return int(np.random.default_rng([seed, 12, 1, stage]).integers(2**62))


def inputs_key(seed: int) -> int:
    return int(np.random.default_rng([seed, 12, 2]).integers(2**62))


def layer_shape(p: int, stage: int) -> tuple[int, int]:
    """Stage ``stage``'s linear layer of ``p``: (fan_in, fan_out)."""
    return FEATURES if stage == 0 else WIDTH, CLASSES if stage == p - 1 else WIDTH


def start_weights(key: int, fan_in: int, fan_out: int) -> tuple[np.ndarray, np.ndarray]:
    """A linear layer's starting weight (fan_out x fan_in) and bias, in torch's parameter order."""
    rng = np.random.default_rng([key])
    weight = rng.normal(0.0, 0.6, (fan_out, fan_in))
    return weight, rng.normal(0.0, 0.6, (fan_out,))


def features(key: int, batch: int) -> np.ndarray:
    """The batch's features (batch x FEATURES): micro-batch i is rows i*MICRO... The same every step."""
    return np.random.default_rng([key]).standard_normal((batch, FEATURES))


@lru_cache(maxsize=64)
def labels_of(seed: int, batch: int) -> tuple[int, ...]:
    """The batch's classes: a hidden linear teacher of the features, with noise."""
    x = features(inputs_key(seed), batch)
    rng = np.random.default_rng([seed, 12, 3])
    teacher = rng.standard_normal((FEATURES, CLASSES))
    return tuple(int(c) for c in np.argmax(x @ teacher + 0.3 * rng.standard_normal((batch, CLASSES)), axis=1))


@dataclass(frozen=True)
class Session:
    gpipe: tuple[Pipe, ...]  # m >= p: two with equal stages, one with unequal
    one_f_one_b: tuple[Pipe, ...]
    small: tuple[Pipe, ...] = field(default=())  # m < p: GPipe on 2 or 3, 1F1B on 2 and on 3


def formula_bubble(p: int, m: int) -> float:
    """The idle share of an ideal pipeline of equal stages: (p-1)/(m+p-1), for GPipe and 1F1B."""
    return (p - 1) / (m + p - 1)


def operations(schedule: str, p: int, m: int, stage: int) -> list[tuple[str, int]]:
    """The canonical order of one stage's operations, ("F" or "B", micro-batch).

    GPipe: every forward, then every backward. 1F1B: a warm-up of min(p-1-stage, m) forwards, then
    one forward and one backward in turn, then the backwards left; backwards go oldest first."""
    if schedule == GPIPE:
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(p - 1 - stage, m)
    ops = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        ops += [("F", warmup + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warmup, m)]


def replay(pipe: Pipe, message_s: float = 0.0, order: list[list[tuple[str, int]]] | None = None,
           ) -> tuple[float, list[list[tuple[str, int, float, float]]]]:
    """The makespan of the schedule on the virtual clock, and each stage's (kind, micro, begin, end).

    Each stage runs its operations in ``order`` (the canonical one by default) as soon as its input
    is in: a forward needs the previous stage's activation, a backward the next stage's gradient
    (the last stage's its own forward), each ``message_s`` after it was sent. Sends are eager."""
    p, order = pipe.p, order or [operations(pipe.schedule, pipe.p, pipe.m, s) for s in range(pipe.p)]
    done: dict[tuple[str, int, int], float] = {}  # (kind, stage, micro) -> end
    clock, position = [0.0] * p, [0] * p
    spans: list[list[tuple[str, int, float, float]]] = [[] for _ in range(p)]
    while any(position[s] < len(order[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while position[s] < len(order[s]):
                kind, i = order[s][position[s]]
                need = (("F", s - 1, i) if s else None) if kind == "F" else (("B", s + 1, i) if s < p - 1 else ("F", s, i))
                if need is not None and need not in done:
                    break
                ready = 0.0 if need is None else done[need] + (message_s if need[1] != s else 0.0)
                begin = max(clock[s], ready)
                clock[s] = begin + (pipe.forward_s[s] if kind == "F" else pipe.backward_s[s])
                done[(kind, s, i)] = clock[s]
                spans[s].append((kind, i, begin, clock[s]))
                position[s] += 1
                moved = True
        if not moved:
            raise ValueError(f"{pipe.label()}: the order deadlocks")
    return max(clock), spans


def bubble_of(pipe: Pipe, makespan: float) -> float:
    """Idle over total: 1 - (every stage's compute) / (p x makespan)."""
    work = pipe.m * (sum(pipe.forward_s) + sum(pipe.backward_s))
    return 1.0 - work / (pipe.p * makespan)


def expected_bubble(pipe: Pipe, message_s: float) -> float:
    """The bubble the schedule reaches on the virtual clock: the critical path of its canonical order."""
    return bubble_of(pipe, replay(pipe, message_s)[0])


def peak_stash(ops: list[tuple[str, int]]) -> int:
    """The most activations a stage holds at once: forwards done minus backwards done, at its peak."""
    held = peak = 0
    for kind, _ in ops:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def hidden(seed: int) -> Session:
    """Two equal-stage pipelines and one unequal per schedule (m >= p), and one of m < p each.

    The stage times are hidden: equal stages cost f and b = 2f (a backward is about two forwards);
    unequal ones get a random order of four different costs."""
    rng, widen = np.random.default_rng([seed, 12]), Widener(seed, 12)

    def equal(schedule: str, m: int) -> Pipe:
        f = round(float(rng.uniform(2e-3, 6e-3)), 5)
        return Pipe(schedule, m, (f,) * STAGES, (2 * f,) * STAGES, widen(int(rng.integers(1 << 30))))

    def unequal(schedule: str, m: int) -> Pipe:
        scale = rng.permutation([1.0, 1.5, 2.5, 4.0])  # the slowest stage about 4x the fastest
        f = [round(float(2e-3 * s * rng.uniform(0.9, 1.1)), 5) for s in scale]
        b = [round(float(x * rng.uniform(1.6, 2.4)), 5) for x in f]
        return Pipe(schedule, m, tuple(f), tuple(b), widen(int(rng.integers(1 << 30))))

    sizes = (int(rng.integers(STAGES + 1, STAGES + 3)), int(rng.integers(8, 11)), int(rng.integers(STAGES + 1, 9)))
    pipes = {s: (equal(s, sizes[0]), equal(s, sizes[1]), unequal(s, sizes[2])) for s in (GPIPE, ONE_F_ONE_B)}
    # m < p: 1F1B on m = 2 and 3 both, where stage 0 and then stage 1 must cut their warm-up to m.
    small = (equal(GPIPE, int(rng.integers(2, 4))), equal(ONE_F_ONE_B, 2), equal(ONE_F_ONE_B, 3))
    return Session(pipes[GPIPE], pipes[ONE_F_ONE_B], small)

