"""The cases of problem 04: the scenario's numbers, the inputs, what comes back and what should.

The checker makes a case's inputs from its seed; a rank is handed only its view (``for_rank``): its
own inputs, made by its agent, never the seed nor another rank's data, which reach it in messages
only. The expected values (the codec and the reducers simulated in one process) live in judging.py,
hidden from the ranks. Hidden variants (plan_for): the data,
the weights, the inputs, the extra rank count, the lengths, the warmup fraction and the slow worker. The
order of the random draws in plan_for and codec_case is what makes --seed replay a session: keep it.
"""

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from distlab.grading import POINT_TO_POINT, Widener, cost

STEPS = 300  # training steps of each run
WARMUP_FRACTIONS = (0.15, 0.2, 0.25)
AUC_FP16, AUC_ONEBIT = 0.005, 0.01  # catalog: FP16 within 0.005 of FP32's AUC, 1-bit Adam within 0.01
SLOW_ALPHA_S, SLOW_BETA = 50e-6, 8e-9  # the workers' link: 50 us, 1 Gb/s
TIMED_N = 1 << 20  # elements of the timed allreduces (4 MiB of float32)
TIME_SLACK = 1.05  # the 1-bit allreduce within 5% of its bound (a scale sent apart from its signs: 16% over)
FP16_TOLERANCE = 0.02  # FP16 bytes within 2% of half of FP32's
VOLUME_TOLERANCE = 0.05  # 1-bit Adam's total volume within 5% of w + (1-w)/32 of FP32's
TOPK_KEEPS = (0.1, 0.01)  # keep fractions of the top-k check (90% and 99% compression)
SWEEP_KEEPS = (0.5, 0.2, 0.1, 0.01, 0.001)  # the Tune sweep: 50 / 80 / 90 / 99 / 99.9 %
SLOW_WORKER_DELAY_S = 0.005
# A point-to-point message's envelope: its tag carries up to 31 bits that the counters' payload bytes leave
# out (an outside tester's allgather rode in the tags of 300,000 empty messages). Charged on both sides.
ENVELOPE_BYTES = 4
# Allowed per message besides the signs: a float32 scale and the envelope. The byte padding, under a byte a
# message, fits in the n/(120p) a message that 1/30 of float32 leaves over the packed signs.
SCALE_BYTES = 8

# The click model: 32 dense features, one tanh layer of 32 units, trained with Adam.
FEATURES, HIDDEN = 32, 32
N_PARAMS = FEATURES * HIDDEN + HIDDEN + HIDDEN + 1  # 1089
BATCH = 32  # examples per rank and step
LR, BETAS, EPS = 0.003, (0.9, 0.999), 1e-8  # Adam's
TEST_SIZE, TEST_PART = 8000, 10_000  # held-out clicks, and the "rank" they are drawn for


@dataclass(frozen=True)
class CodecCase:
    """Compressor unit cases, run on one rank. The supervisor makes every input."""

    vectors: tuple[tuple[np.ndarray, int, str], ...]  # (x, chunks, what it probes)
    given: tuple[np.ndarray, np.ndarray, int]  # (signs, scales, n) for decompress alone
    feedback: tuple[np.ndarray, np.ndarray, int]  # (x, initial error, chunks), compressed 3 times


def _own(view: tuple[Any, ...] | None, rank: int) -> tuple[Any, ...]:
    """A rank's view's data, refusing another rank's: it reaches a rank in messages only."""
    if view is None or view[0] != rank:
        raise ValueError(f"rank {None if view is None else view[0]}'s view of the case holds no data of rank "
                         f"{rank}: the other ranks' data reach it in messages only")
    return view[1:]


@dataclass(frozen=True)
class WireCase:
    """Each reducer on p ranks; a rank's view (for_rank) holds its own inputs, the checker the seed."""

    p: int
    n: int
    seed: int  # the checker's; -1 in a rank's view
    keeps: tuple[float, ...] = TOPK_KEEPS
    own: tuple[Any, ...] | None = field(default=None, compare=False)  # a rank's view: (rank, {what: input})

    def inputs_named(self) -> tuple[str, ...]:
        """Every input a rank's calls take, by the ``what`` of wire_input."""
        return ("fp16", "fp16 large", "onebit 1", "onebit 2") + tuple(
            f"topk {keep} {call}" for keep in self.keeps for call in (1, 2))

    def for_rank(self, rank: int) -> "WireCase":
        """Rank ``rank``'s view: its own inputs, made by its agent; not the seed they come from."""
        return replace(self, seed=-1, own=(rank, {what: wire_input(self.seed, rank, self.n, what)
                                                  for what in self.inputs_named()}))

    def input(self, rank: int, what: str) -> np.ndarray:
        if self.own is None:
            return wire_input(self.seed, rank, self.n, what)
        return _own(self.own, rank)[0][what].copy()


@dataclass(frozen=True)
class AdamCase:
    p: int
    n: int
    seed: int
    steps: int
    warmup: int
    lr: float = 0.01
    own: tuple[Any, ...] | None = field(default=None, compare=False)  # a view: (rank, start, its gradients)

    def start(self) -> np.ndarray:  # the initial parameters, the same in the ranks and in the checker
        if self.own is not None:
            return self.own[1].copy()
        return np.random.default_rng([self.seed, 8]).standard_normal(self.n).astype(np.float32)

    def for_rank(self, rank: int) -> "AdamCase":
        """Rank ``rank``'s view: the start and its own gradients of every step, not the other ranks'."""
        return replace(self, seed=-1, own=(rank, self.start(), tuple(g[rank] for g in adam_gradients(self))))

    def gradients(self, rank: int) -> list[np.ndarray]:
        """Rank ``rank``'s gradient of every step (a view holds only its own rank's)."""
        if self.own is None:
            return [g[rank] for g in adam_gradients(self)]
        return [g.copy() for g in _own(self.own, rank)[1]]


@dataclass(frozen=True)
class TrainCase:
    p: int
    seed: int
    steps: int
    warmup: int
    own: tuple[Any, ...] | None = field(default=None, compare=False)  # a view: (rank, (x, clicks), start)

    def for_rank(self, rank: int) -> "TrainCase":
        """Rank ``rank``'s view: its own shard of clicks and the start, not the seed they come from."""
        return replace(self, seed=-1, own=(rank, self.shard(rank), self.start()))

    def shard(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """Rank ``rank``'s clicks (features, labels), one batch of BATCH per step."""
        if self.own is None:
            return examples(self.seed, rank, self.steps * BATCH)
        x, clicks = _own(self.own, rank)[0]
        return x.copy(), clicks.copy()

    def start(self) -> np.ndarray:
        return init_params(self.seed) if self.own is None else self.own[2].copy()

    def label(self) -> str:
        return (f"p = {self.p}, {self.steps} steps of {BATCH} clicks per rank, warmup "
                f"{self.warmup} steps (w = {self.warmup / self.steps:.2f}), seed {self.seed}")


@dataclass(frozen=True)
class TimedCase:
    p: int
    n: int
    method: str  # "fp16" or "onebit" (the free run also times "fp32")
    seed: int
    own: tuple[Any, ...] | None = field(default=None, compare=False)  # a rank's view: (rank, its input)

    def for_rank(self, rank: int) -> "TimedCase":
        return replace(self, seed=-1, own=(rank, wire_input(self.seed, rank, self.n, "timed")))

    def input(self, rank: int) -> np.ndarray:
        if self.own is None:  # the free run makes its own case
            return wire_input(self.seed, rank, self.n, "timed")
        return _own(self.own, rank)[0].copy()


# -- what the ranks send back ----------------------------------------------------------------------
@dataclass
class CodecResult:
    compressed: list[Any] = field(default_factory=list)  # (signs, scales) or a description
    roundtrip: list[Any] = field(default_factory=list)  # decompress(compress(x))
    decompressed: Any = None  # decompress(given)
    feedback: list[Any] = field(default_factory=list)  # (decompressed, error) after each call


@dataclass
class OpResult:  # one reducer call's
    value: Any  # what the reducer left in the buffer (or a description)
    state: tuple[Any, ...] = ()  # the arguments after the buffer, after the call


# -- the hidden variants ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """Everything one session launches, derived from the seed."""

    codec: CodecCase
    wires: tuple[WireCase, ...]  # the reducers on 4 and a hidden 2 or 3 ranks
    adam: AdamCase
    slow_worker: int
    train: TrainCase
    timed: tuple[TimedCase, ...]


def plan_for(seed: int) -> Plan:
    rng, widen = np.random.default_rng([seed, 4]), Widener(seed, 4)
    wires = tuple(WireCase(p, int(rng.integers(20_000, 40_000)), widen(int(rng.integers(1 << 31))))
                  for p in (4, int(rng.choice([2, 3]))))
    adam = AdamCase(p=4, n=int(rng.integers(600, 900)), seed=widen(int(rng.integers(1 << 31))), steps=8,
                    warmup=int(rng.integers(2, 4)))
    warmup = round(float(rng.choice(WARMUP_FRACTIONS)) * STEPS)
    train = TrainCase(4, widen(int(rng.integers(1 << 31))), STEPS, warmup)
    timed_n = TIMED_N + int(rng.integers(0, 4096))
    timed = tuple(TimedCase(4, timed_n, method, widen(int(rng.integers(1 << 31)))) for method in ("fp16", "onebit"))
    return Plan(codec_case(rng), wires, adam, int(rng.integers(4)), train, timed)


def codec_case(rng: np.random.Generator) -> CodecCase:
    def vector(n: int, magnitudes: list[float]) -> np.ndarray:
        x = rng.standard_normal(n)
        for part, m in zip(chunks_of(x, len(magnitudes)), magnitudes):
            part *= m
        return x.astype(np.float32)

    n1 = 8 * int(rng.integers(40, 80)) + int(rng.integers(1, 8))  # not a multiple of 8
    n2 = int(rng.integers(13, 40))
    vectors = ((vector(n1, [1e-3, 10.0, 0.1, 1.0]), 4, f"n = {n1}, 4 chunks of very different sizes"),
               (vector(n2, [1.0, 50.0, 1.0]), 3, f"n = {n2}, 3 chunks, not multiples of 8"),
               (vector(64, [1.0]), 1, "n = 64, one chunk"))
    given = chunks_of(vector(n1, [0.5, 2.0, 8.0, 1e-2]), 4)  # compressed here, then the scales moved
    signs = np.concatenate([np.packbits(part >= 0) for part in given])
    scales = np.array([np.abs(part).mean() for part in given], dtype=np.float32)
    scales = (scales * rng.uniform(0.5, 2.0, 4)).astype(np.float32)
    fb_n = int(rng.integers(100, 300))
    feedback = (vector(fb_n, [1.0, 0.01]), (rng.standard_normal(fb_n) * 0.3).astype(np.float32), 2)
    return CodecCase(vectors, (signs, scales, n1), feedback)


def volume_ratio(warmup_fraction: float) -> float:
    """Bytes of 1-bit Adam over bytes of float32 Adam: w + (1-w)/32. Its inverse is the speed-up
    of a bandwidth-bound gradient sync (4.4x at w = 0.2)."""
    return warmup_fraction + (1 - warmup_fraction) / 32


# -- the inputs: the checker's, and each rank's own in its view (made by its agent) ---------------
def wire_input(seed: int, rank: int, n: int, what: str) -> np.ndarray:
    """A rank's input vector for one reducer call (float32)."""
    rng = np.random.default_rng([seed, rank, sum(map(ord, what))])
    x = rng.standard_normal(n) * np.exp(rng.uniform(-3, 1, n))  # magnitudes over 2 decades
    if what == "fp16 large":
        # Same-signed values near 30000 in the first 16 elements: their float16 sum over p ranks
        # passes 65504 unless each rank divides by p first.
        x[:16] = 30000 + rng.uniform(0, 1000, 16)
    return x.astype(np.float32)


def adam_gradients(case: AdamCase) -> list[list[np.ndarray]]:
    """grads[t][r]: a drift shared by the ranks plus rank noise, with per-element scales."""
    rng = np.random.default_rng([case.seed, 7])
    scale = np.exp(rng.uniform(-4, 0, case.n)).astype(np.float32)
    drift = rng.standard_normal(case.n).astype(np.float32)
    return [[((drift + rng.standard_normal(case.n)) * scale).astype(np.float32)
             for _ in range(case.p)] for _ in range(case.steps)]


def examples(seed: int, part: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` clicks (features, labels) of shard ``part`` (a rank's, or TEST_PART's), from a
    hidden tanh network; the features' scales range from 0.1 to 5, as raw CTR features do."""
    rng = np.random.default_rng([seed, 0])
    w_hidden = rng.standard_normal((FEATURES, 16)) / np.sqrt(FEATURES) * 2.0
    w_out = rng.standard_normal(16)
    scales = np.exp(rng.uniform(np.log(0.1), np.log(5.0), FEATURES))
    rng = np.random.default_rng([seed, 1, part])
    z = rng.standard_normal((count, FEATURES))
    logit = np.tanh(z @ w_hidden) @ w_out - 1.0
    clicks = (rng.random(count) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return (z * scales).astype(np.float32), clicks


def init_params(seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 2])
    theta = np.zeros(N_PARAMS, dtype=np.float32)
    w1 = FEATURES * HIDDEN
    theta[:w1] = rng.standard_normal(w1) / np.sqrt(FEATURES)
    theta[w1 + HIDDEN : w1 + 2 * HIDDEN] = rng.standard_normal(HIDDEN) / np.sqrt(HIDDEN)
    return theta


# -- helpers of both sides (the simulations of the codec and the reducers are in judging.py) -------
def chunk_bounds(n: int, p: int) -> list[int]:
    """The reference's chunk_bounds: p chunks of n // p elements, the first n % p one longer."""
    base, extra = divmod(n, p)
    return [0] + [(i + 1) * base + min(i + 1, extra) for i in range(p)]


def chunks_of(x: np.ndarray, k: int) -> list[np.ndarray]:
    """The k chunks of chunk_bounds(x.size, k), as views of x."""
    bounds = chunk_bounds(x.size, k)
    return [x[bounds[c] : bounds[c + 1]] for c in range(k)]


def server_errors(n: int, p: int) -> list[np.ndarray]:
    """Fresh server errors of p ranks: rank j's covers chunk j of chunk_bounds(n, p)."""
    return [np.zeros_like(part) for part in chunks_of(np.zeros(n, np.float32), p)]


def topk_count(n: int, keep_fraction: float) -> int:
    return min(n, max(1, round(keep_fraction * n))) if n else 0


# A collective's op_bytes is the caller's buffer (collectives_cost's header: the whole vector of an
# allreduce, reduce-scatter, bcast, reduce or alltoall, one rank's block of an allgather(v) or gather,
# the received block of a scatter); nonblocking forms count under the blocking name. What it moves per
# rank is its schedule's, the algorithm the replay runs, averaged over p ranks: the tree's total shared
# out for the rooted ones, so no byte vanishes on either side.
def collective_moved(op: str, nbytes: int, p: int) -> tuple[float, float]:
    """(sent, received) per rank by calls of ``op`` whose op_bytes add up to ``nbytes``."""
    if op == "Alltoallv":  # the counters keep no split between the peers and the rank itself
        return float(nbytes), nbytes * (p - 1) / p
    name = cost.ALIASES.get(op, op)
    if name not in cost.COLLECTIVE_OPS:  # no algorithm known (the store, say): all of it, both ways
        return float(nbytes), float(nbytes)
    flows = cost.collective_schedule(name, [nbytes] * p, 0)
    moved = sum(size for sends in flows for step in sends for _, size in step) / max(p, 1)
    return moved, moved


def collectives_moved(counts: Any, p: int) -> tuple[float, float]:
    """(sent, received) per rank by every call besides the point-to-point ones (counted in bytes_sent
    and bytes_received), of a grading ``Counts`` or of ``comm.stats`` in the free run."""
    moved = [collective_moved(op, nbytes, p) for op, nbytes in counts.op_bytes.items()
             if nbytes and op not in POINT_TO_POINT]
    return sum(s for s, _ in moved), sum(r for _, r in moved)


def wire_bytes(counts: Any, p: int, envelopes: bool = True) -> float:
    """Bytes a rank put on the wire: its point-to-point bytes and their envelopes plus its collectives'
    share. ``envelopes=False``: the payload alone, the bytes of the volume formula."""
    payload = float(counts.bytes_sent) + collectives_moved(counts, p)[0]
    return payload + (ENVELOPE_BYTES * counts.messages_sent if envelopes else 0.0)
