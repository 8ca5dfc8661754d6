"""Problem 05's scenario in numbers: the plan cases and the MLP cases, named and hidden.

The plan cases are GPT-style models on clusters of devices with a batch size: eight named ones that
each teach one thing, then random ones drawn from the session seed, kept off the memory limit so
float arithmetic cannot tip an answer. The MLP cases are the sizes, batch shapes and block counts
of the tensor-parallel MLP on p = 2, 3 and 4 ranks, with a seed for the values; mlp_inputs turns
a case into the same x, upstream gradient and weights in every rank and in the supervisor. Hidden
variants come only from the seed, so `distlab check 05 --seed N` replays them exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from distlab.grading import check_part

rule = check_part(__file__, "rule")

MLP_RANKS = (2, 3, 4)


# == the plan cases ===============================================================================


def gpt(name: str, layers: int, hidden: int, seq_len: int, vocab: int = 50304) -> dict[str, Any]:
    """A GPT-style model: 12 L h^2 in the blocks, 13 L h in biases and norms, the embedding."""
    params = 12 * layers * hidden**2 + 13 * layers * hidden + vocab * hidden
    return {"name": name, "params": params, "layers": layers, "hidden": hidden, "seq_len": seq_len}


def cluster(count: int, per_node: int, memory_gib: int) -> dict[str, int]:
    return {"count": count, "per_node": per_node, "memory_bytes": memory_gib * rule.GIB}


@dataclass(frozen=True)
class PlanCase:
    label: str
    model: dict[str, Any]
    devices: dict[str, int]
    batch: int

    def describe(self) -> str:
        d = self.devices
        nodes = d["count"] // d["per_node"]
        return (f"{self.label}: {self.model['name']} ({self.model['params'] / 1e9:.2f}B params, "
                f"{self.model['layers']} layers, hidden {self.model['hidden']}, seq {self.model['seq_len']}) "
                f"on {nodes} node(s) x {d['per_node']} x {d['memory_bytes'] / rule.GIB:g} GiB, batch {self.batch}")


# Each named case teaches one thing; the expected layouts are the rule's answers (check_rule.py;
# the unit tests pin them, so a change of the rule shows).
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

SHAPES = ((12, 768), (24, 1024), (24, 1536), (24, 2048), (32, 2560), (32, 4096), (40, 5120),
          (48, 6144), (48, 7168), (64, 8192), (80, 8192), (96, 12288))


def margin_ok(case: PlanCase, margin: float = 0.005) -> bool:
    """No legal layout sits within ``margin`` of the memory limit, so float arithmetic is safe."""
    devices, limit = case.devices, case.devices["memory_bytes"]
    for mp in rule.divisors(devices["count"]):
        for tp in rule.divisors(mp):
            layout = {"dp": devices["count"] // mp, "tp": tp, "pp": mp // tp}
            if rule.layout_faults(case.model, devices, case.batch, layout):
                continue
            for bpp in (rule.BYTES_PER_PARAM, rule.STATE_WITHOUT_OPTIMIZER):
                total = rule.memory_per_device(case.model, case.batch, layout["dp"], tp, layout["pp"], bpp).total
                if abs(total / limit - 1) < margin:
                    return False
    return True


def random_plan_cases(rng: np.random.Generator, count: int = 24) -> list[PlanCase]:
    """Random models, clusters and batches; the answers spread over DP, TP, TP+PP and None."""
    cases: list[PlanCase] = []
    while len(cases) < count:
        layers, hidden = SHAPES[int(rng.integers(len(SHAPES)))]
        if rng.random() < 0.3:  # an odd layer count, so that not every pp divides it
            layers = int(layers + rng.choice([-2, 2, 6]))
        seq = int(rng.choice([512, 1024, 2048, 4096]))
        model = gpt(f"random model #{len(cases) + 1}", layers, hidden, seq)
        per_node = int(rng.choice([1, 2, 4, 8, 8]))
        nodes = int(rng.choice([1, 1, 2, 4, 8]))
        devices = cluster(per_node * nodes, per_node, int(rng.choice([16, 24, 32, 40, 48, 80, 96, 141])))
        batch = int(rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64]))
        case = PlanCase(f"hidden case {len(cases) + 1}", model, devices, batch)
        if not margin_ok(case):
            continue
        answer = rule.best_plan(model, devices, batch)
        # Keep a few "nothing fits", most cases where some layout fits.
        if answer is None and rng.random() < 0.8:
            continue
        cases.append(case)
    return cases


def plan_cases(seed: int) -> list[PlanCase]:
    return list(NAMED_CASES) + random_plan_cases(np.random.default_rng([seed, 51]))


# == the tensor-parallel MLP cases ================================================================


@dataclass(frozen=True)
class MlpCase:
    p: int
    batch: int
    seq: int
    hidden: int
    ffn: int
    blocks: int
    seed: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def whole_params(self) -> int:
        """Elements of one whole block: W1 [ffn, h], b1 [ffn], W2 [h, ffn], b2 [h]."""
        return 2 * self.ffn * self.hidden + self.ffn + self.hidden

    def label(self) -> str:
        return (f"p = {self.p}, {self.blocks} block(s), x [{self.batch}, {self.seq}, {self.hidden}], "
                f"ffn {self.ffn}")


Weights = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # W1, b1, W2, b2 of one block


def mlp_inputs(case: MlpCase) -> tuple[np.ndarray, np.ndarray, list[Weights]]:
    """x, the upstream gradient dL/dy, and (W1, b1, W2, b2) per block: the same on ranks and here."""
    rng = np.random.default_rng(case.seed)
    h, ffn = case.hidden, case.ffn
    blocks: list[Weights] = []
    for _ in range(case.blocks):
        w1 = rng.standard_normal((ffn, h)) / np.sqrt(h)
        b1 = 0.1 * rng.standard_normal(ffn)
        w2 = rng.standard_normal((h, ffn)) / np.sqrt(ffn)
        b2 = 0.5 * rng.standard_normal(h)  # clearly non-zero: a bias added p times must show
        blocks.append((w1, b1, w2, b2))
    x = rng.standard_normal((case.batch, case.seq, h))
    gout = rng.standard_normal((case.batch, case.seq, h))
    return x, gout, blocks


def mlp_cases(seed: int) -> list[list[MlpCase]]:
    """Per rank count: a one-block case (symptoms read clearly), then a stack of 2 or 3 blocks."""
    rng = np.random.default_rng([seed, 5])
    tasks = []
    for p in MLP_RANKS:
        cases = []
        for blocks in (1, int(rng.integers(2, 4))):
            hidden = 8 * int(rng.integers(10, 21))  # 80 .. 160
            ffn = 12 * int(np.ceil(4 * hidden / 12))  # about 4 h, a multiple of 2, 3 and 4
            cases.append(MlpCase(p, int(rng.integers(1, 5)), int(rng.integers(2, 10)), hidden, ffn,
                                 blocks, int(rng.integers(1 << 31))))
        tasks.append(cases)
    return tasks
