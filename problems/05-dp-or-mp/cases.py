"""The cases of problem 05, as the ranks import them: the plan cases' models and clusters, the MLP cases and
their data. The rule that answers a plan case, the hidden plan cases' generator and the single-device MLP
are the checker's (judging.py): a rank program imports this module, and the learner's code can read it.

An MLP case's seed never reaches a rank: each rank is handed the case's view (MlpCase.for_rank), which
holds its own data, materialized: x, dL/dy, b2 and its own shard of W1, b1 and W2, as arrays, and no key
they were drawn from. A key would let a rank smuggle its data to the others in a few bytes of a message of
the right size (an outside tester did so in problem 03); the arrays reach another rank only as whole as the
messages that carry them. So no rank can compute the whole MLP alone."""

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from distlab.grading import Widener

GIB = 2**30
Model, Devices, Layout = dict[str, Any], dict[str, int], dict[str, int]


# == the plan cases ===============================================================================


def gpt(name: str, layers: int, hidden: int, seq_len: int, vocab: int = 50304) -> Model:
    """A GPT-style model: 12 L h^2 in the blocks, 13 L h in biases and norms, the embedding."""
    params = 12 * layers * hidden**2 + 13 * layers * hidden + vocab * hidden
    return {"name": name, "params": params, "layers": layers, "hidden": hidden, "seq_len": seq_len}


def cluster(count: int, per_node: int, memory_gib: int) -> Devices:
    return {"count": count, "per_node": per_node, "memory_bytes": memory_gib * GIB}


@dataclass(frozen=True)
class PlanCase:
    label: str
    model: Model
    devices: Devices
    batch: int

    def describe(self) -> str:
        m, d = self.model, self.devices
        return (f"{self.label}: {m['name']} ({m['params'] / 1e9:.2f}B params, {m['layers']} layers, "
                f"hidden {m['hidden']}, seq {m['seq_len']}) on {d['count'] // d['per_node']} node(s) x "
                f"{d['per_node']} x {d['memory_bytes'] / GIB:g} GiB, batch {self.batch}")


# Each named case teaches one thing; the expected layouts are the rule's answers (judging.best_plan; the
# unit tests pin them, so a change of the rule shows).
NAMED_CASES = (
    PlanCase("a small model fits: pure DP", gpt("GPT-2 124M", 12, 768, 1024), cluster(8, 8, 16), 32),
    PlanCase("the optimizer state decides", gpt("GPT 1.3B", 24, 2048, 2048), cluster(8, 8, 24), 16),
    PlanCase("7B on one 8-GPU server", gpt("GPT 6.7B", 32, 4096, 2048), cluster(8, 8, 80), 8),
    PlanCase("activations decide: TP does not split them all, PP does",
             gpt("GPT 1.3B", 24, 2048, 2048), cluster(8, 8, 40), 64),
    PlanCase("70B on four servers: TP fills a node, then PP", gpt("GPT 70B", 80, 8192, 2048),
             cluster(32, 8, 80), 4),
    PlanCase("175B on one server: nothing fits", gpt("GPT 175B", 96, 12288, 2048), cluster(8, 8, 80), 8),
    PlanCase("a batch of 4 on 8 devices: DP can use only 4", gpt("GPT-2 124M", 12, 768, 1024),
             cluster(8, 8, 16), 4),
    PlanCase("one GPU per node: no TP possible", gpt("GPT 2.7B", 32, 2560, 1024), cluster(8, 1, 24), 8),
)

# == the tensor-parallel MLP cases ================================================================


Weights = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # W1, b1, W2, b2 of one block


class RankData(NamedTuple):
    """What a rank's view of an MLP case holds: its own data, drawn by its agent, and no key."""
    rank: int
    x: np.ndarray
    gout: np.ndarray  # dL/dy
    blocks: tuple[Weights, ...]  # per block: this rank's W1 rows, b1 entries, W2 columns, and the whole b2


@dataclass(frozen=True)
class MlpCase:
    p: int
    batch: int
    seq: int
    hidden: int
    ffn: int
    blocks: int
    seed: int  # the checker's; -1 in a rank's view, which holds its own data instead
    own: RankData | None = field(default=None, compare=False)  # a rank's view: its own data, materialized

    @property
    def activation_bytes(self) -> int:
        """What one allreduce carries: the float64 activations of one block, tokens x hidden."""
        return self.batch * self.seq * self.hidden * 8

    @property
    def whole_params(self) -> int:
        """Elements of one whole block: W1 [ffn, h], b1 [ffn], W2 [h, ffn], b2 [h]."""
        return 2 * self.ffn * self.hidden + self.ffn + self.hidden

    def label(self) -> str:
        return (f"p = {self.p}, {self.blocks} block(s), x [{self.batch}, {self.seq}, {self.hidden}], "
                f"ffn {self.ffn}")

    def keys(self, rank: int) -> tuple[int, int]:
        """The key of what every rank shares and the key of ``rank``'s shard of the weights: the
        checker's (a rank's view holds no key, only its data)."""
        if self.own is not None:
            raise ValueError(f"rank {self.own.rank}'s view of the case holds its own data, no keys")
        return mlp_keys(self.seed, rank)

    def for_rank(self, rank: int) -> "MlpCase":
        """What rank ``rank``'s process is handed: x, dL/dy, b2 and its own shard, as arrays, drawn
        here from the seed, and nothing they were drawn from. With the seed, one process could
        compute the whole MLP alone; with a short key, a rank could smuggle its shard to the others
        inside a few bytes of a message."""
        if self.own is not None:  # already a view: of this rank only
            if rank != self.own.rank:
                raise ValueError(f"rank {self.own.rank}'s view of the case holds no weights of rank {rank}")
            return self
        x, gout = self.inputs()
        blocks = tuple((*shard_of(self, self.keys(rank)[1], block), shared_bias(self, block))
                       for block in range(self.blocks))
        return replace(self, seed=-1, own=RankData(rank, x, gout, blocks))

    def inputs(self) -> tuple[np.ndarray, np.ndarray]:
        """x and the upstream gradient dL/dy: the same on every rank."""
        if self.own is not None:
            return self.own.x.copy(), self.own.gout.copy()
        rng = np.random.default_rng([self.keys(0)[0], 0])
        shape = (self.batch, self.seq, self.hidden)
        return rng.standard_normal(shape), rng.standard_normal(shape)

    def handed(self, rank: int) -> list[Weights]:
        """What ParallelMLP receives on ``rank``, per block: W1 [ffn, h], b1 [ffn], W2 [h, ffn], b2 [h]
        in their whole shapes, with only this rank's shard filled in (rows r*ffn/p .. (r+1)*ffn/p of W1
        and b1, those columns of W2, the whole b2); the other ranks' parts are zero."""
        if self.own is not None and rank != self.own.rank:
            raise ValueError(f"rank {self.own.rank}'s view of the case holds no weights of rank {rank}")
        n = self.ffn // self.p
        cut = slice(rank * n, (rank + 1) * n)
        out = []
        for block in range(self.blocks):
            if self.own is not None:
                w1, b1, w2, b2 = self.own.blocks[block]
            else:
                w1, b1, w2 = shard_of(self, self.keys(rank)[1], block)
                b2 = shared_bias(self, block)
            big = (np.zeros((self.ffn, self.hidden)), np.zeros(self.ffn), np.zeros((self.hidden, self.ffn)))
            big[0][cut], big[1][cut], big[2][:, cut] = w1, b1, w2
            out.append((*big, b2.copy()))
        return out


def mlp_keys(seed: int, rank: int) -> tuple[int, int]:
    """The shared key and ``rank``'s shard key, both drawn from the case's seed (which no rank holds)."""
    shared = int(np.random.default_rng([seed, 5, 0]).integers(2**62))
    return shared, int(np.random.default_rng([seed, 5, 1, rank]).integers(2**62))


def shard_of(case: MlpCase, own: int, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One rank's shard of a block, from its key: W1's rows [ffn/p, h], b1's entries, W2's columns [h, ffn/p]."""
    rng, h, n = np.random.default_rng([own, block]), case.hidden, case.ffn // case.p
    return (rng.standard_normal((n, h)) / np.sqrt(h), 0.1 * rng.standard_normal(n),
            rng.standard_normal((h, n)) / np.sqrt(case.ffn))


def shared_bias(case: MlpCase, block: int) -> np.ndarray:
    """b2 of a block, replicated on every rank; clearly non-zero: a bias added p times must show (the
    checker's: a rank finds it in its view, MlpCase.handed)."""
    shared = case.keys(0)[0]
    return 0.5 * np.random.default_rng([shared, 1, block]).standard_normal(case.hidden)


def mlp_inputs(case: MlpCase) -> tuple[np.ndarray, np.ndarray, list[Weights]]:
    """x, dL/dy and the whole (W1, b1, W2, b2) per block, assembled from every rank's shard: the
    checker's (a rank's view raises: it holds only its own shard)."""
    if case.own is not None:
        raise ValueError(f"rank {case.own.rank}'s view of the case holds only its own shard")
    x, gout = case.inputs()
    shards = [[shard_of(case, case.keys(rank)[1], block) for rank in range(case.p)] for block in range(case.blocks)]
    return x, gout, [(np.concatenate([s[0] for s in parts]), np.concatenate([s[1] for s in parts]),
                      np.concatenate([s[2] for s in parts], axis=1), shared_bias(case, block))
                     for block, parts in enumerate(shards)]


def mlp_cases(seed: int) -> list[list[MlpCase]]:
    """Per rank count: a one-block case (symptoms read clearly), then a stack of 2 or 3 blocks."""
    rng, widen = np.random.default_rng([seed, 5]), Widener(seed, 5)
    return [[random_mlp_case(rng, widen, p, blocks) for blocks in (1, int(rng.integers(2, 4)))] for p in (2, 3, 4)]


def random_mlp_case(rng: np.random.Generator, widen: Widener, p: int, blocks: int) -> MlpCase:
    hidden = 8 * int(rng.integers(10, 21))  # 80 .. 160
    ffn = 12 * int(np.ceil(4 * hidden / 12))  # about 4 h, a multiple of 2, 3 and 4
    # The seed of every rank's key 63 bits wide: from 31, a rank could find it from its own key,
    # and so the shared one and every other rank's (distlab.grading.seeds).
    return MlpCase(p, int(rng.integers(1, 5)), int(rng.integers(2, 10)), hidden, ffn, blocks,
                   widen(int(rng.integers(1 << 31))))
