"""The cases of problem 05, and the checker's own memory model and rule that they need. Hidden variants:
random plan cases (off the memory limit, so floats cannot tip an answer); the MLP sizes and values."""

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

GIB = 2**30
BYTES_PER_PARAM = 16  # fp16 weights 2 + fp16 grads 2 + fp32 master weights 4 + Adam m 4 + v 4
STATE_WITHOUT_OPTIMIZER = 4  # fp16 weights + fp16 grads: what is left if Adam's state is forgotten
WRONG_BYTES = (2, 4, 8, 12, 18, 20)  # the other bytes per parameter people count (judging.BYTES_SAY says why)
Model, Devices, Layout = dict[str, Any], dict[str, int], dict[str, int]


# == the memory model and the rule ================================================================


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class Memory(NamedTuple):
    """Bytes per device of one layout, exactly (Fractions), split as the card splits them."""

    state: Fraction  # weights, gradients and optimizer state
    activations: Fraction
    total: Fraction


def memory_per_device(model: Model, batch: int, dp: int, tp: int, pp: int,
                      bytes_per_param: int = BYTES_PER_PARAM) -> Memory:
    """The card's memory model: bytes_per_param * params / (tp * pp) of model state, plus
    (batch / dp) * seq_len * (layers / pp) * hidden * (10 + 24 / tp) bytes of activations."""
    state = Fraction(bytes_per_param * model["params"], tp * pp)
    per_token_layer = model["hidden"] * (10 + Fraction(24, tp))
    activations = Fraction(batch, dp) * model["seq_len"] * Fraction(model["layers"], pp) * per_token_layer
    return Memory(state, activations, state + activations)


def layout_faults(model: Model, devices: Devices, batch: int, layout: Layout) -> list[str]:
    """Why ``layout`` is not a legal layout at all (empty when it is)."""
    dp, tp, pp = layout["dp"], layout["tp"], layout["pp"]
    if min(dp, tp, pp) < 1:
        return [f"every degree must be at least 1, saw dp={dp}, tp={tp}, pp={pp}"]
    count, per_node = devices["count"], devices["per_node"]
    rules = [
        (dp * tp * pp != count, f"dp * tp * pp = {dp * tp * pp}, but there are {count} devices"),
        (per_node % tp, f"tp = {tp} does not divide the {per_node} devices of a node "
                        "(a TP group must stay inside one node)"),
        (model["layers"] % pp, f"pp = {pp} does not divide the {model['layers']} layers"),
        (batch % dp, f"dp = {dp} does not divide the batch of {batch}"),
    ]
    return [fault for broken, fault in rules if broken]


def legal_layouts(model: Model, devices: Devices, batch: int, tp_first: bool = True) -> Iterator[Layout]:
    """The legal layouts, least model parallelism tp * pp first, then the widest tp (or narrowest)."""
    n = devices["count"]
    for mp in divisors(n):
        for tp in (reversed(divisors(mp)) if tp_first else divisors(mp)):
            layout = {"dp": n // mp, "tp": tp, "pp": mp // tp}
            if not layout_faults(model, devices, batch, layout):
                yield layout


def best_plan(model: Model, devices: Devices, batch: int, bytes_per_param: int = BYTES_PER_PARAM,
              activations: bool = True, tp_first: bool = True) -> Layout | None:
    """The rule: the first legal layout that fits; the keyword arguments give the rule's usual
    misreadings, for the diagnosis (another cost per parameter, no activations, PP before TP)."""
    for layout in legal_layouts(model, devices, batch, tp_first):
        m = memory_per_device(model, batch, **layout, bytes_per_param=bytes_per_param)
        if (m.total if activations else m.state) <= devices["memory_bytes"]:
            return layout
    return None


# The rule's usual misreadings, as best_plan's keyword arguments; every table of plan cases tells them apart.
MISREADINGS: dict[str, dict[str, Any]] = {
    **{f"{b} bytes": {"bytes_per_param": b} for b in WRONG_BYTES},
    "no activations": {"activations": False},
    "PP first": {"tp_first": False},
}


def tells_apart(table: list["PlanCase"]) -> bool:
    """Whether the rule and each of its MISREADINGS give a different list of answers on ``table``: then the
    answers of one of them fit no other, and the diagnosis can name it (judging.misreading_of)."""
    def answers(**kwargs: Any) -> tuple[tuple[int, ...] | None, ...]:
        return tuple(None if (a := best_plan(c.model, c.devices, c.batch, **kwargs)) is None else tuple(a.values())
                     for c in table)
    seen = [answers(), *(answers(**kwargs) for kwargs in MISREADINGS.values())]
    return len(set(seen)) == len(seen)


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


# Each named case teaches one thing; the expected layouts are the rule's answers (the unit tests
# pin them, so a change of the rule shows).
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
    limit = case.devices["memory_bytes"]
    return all(abs(memory_per_device(case.model, case.batch, **layout, bytes_per_param=bpp).total / limit - 1)
               >= margin for layout in legal_layouts(case.model, case.devices, case.batch)
               for bpp in (BYTES_PER_PARAM, STATE_WITHOUT_OPTIMIZER))


def random_plan_cases(rng: np.random.Generator, count: int = 24, named: tuple[PlanCase, ...] = ()) -> list[PlanCase]:
    """Random models, clusters and batches; the answers spread over DP, TP, TP+PP and None. Drawn again until
    the table (after the ``named`` cases) tells the misreadings apart."""
    while not tells_apart([*named, *(cases := draw_plan_cases(rng, count))]):
        pass
    return cases


def draw_plan_cases(rng: np.random.Generator, count: int) -> list[PlanCase]:
    cases: list[PlanCase] = []
    while len(cases) < count:
        layers, hidden = SHAPES[int(rng.integers(len(SHAPES)))]
        if rng.random() < 0.3:  # an odd layer count, so that not every pp divides it
            layers = int(layers + rng.choice([-2, 2, 6]))
        seq = int(rng.choice([512, 1024, 2048, 4096]))
        model = gpt(f"random model #{len(cases) + 1}", layers, hidden, seq)
        per_node, nodes = int(rng.choice([1, 2, 4, 8, 8])), int(rng.choice([1, 1, 2, 4, 8]))
        devices = cluster(per_node * nodes, per_node, int(rng.choice([16, 24, 32, 40, 48, 80, 96, 141])))
        batch = int(rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64]))
        case = PlanCase(f"hidden case {len(cases) + 1}", model, devices, batch)
        # Keep a few "nothing fits", most cases where some layout fits.
        if margin_ok(case) and (best_plan(model, devices, batch) is not None or rng.random() >= 0.8):
            cases.append(case)
    return cases


def plan_cases(seed: int) -> list[PlanCase]:
    return list(NAMED_CASES) + random_plan_cases(np.random.default_rng([seed, 51]), named=NAMED_CASES)


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


Weights = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # W1, b1, W2, b2 of one block


def mlp_inputs(case: MlpCase) -> tuple[np.ndarray, np.ndarray, list[Weights]]:
    """x, the upstream gradient dL/dy, and (W1, b1, W2, b2) per block: the same on ranks and here."""
    rng, h, ffn = np.random.default_rng(case.seed), case.hidden, case.ffn
    # W1, b1, W2, b2; b2 clearly non-zero: a bias added p times must show.
    blocks = [(rng.standard_normal((ffn, h)) / np.sqrt(h), 0.1 * rng.standard_normal(ffn),
               rng.standard_normal((h, ffn)) / np.sqrt(ffn), 0.5 * rng.standard_normal(h))
              for _ in range(case.blocks)]
    shape = (case.batch, case.seq, h)
    return rng.standard_normal(shape), rng.standard_normal(shape), blocks  # x, dL/dy


def mlp_cases(seed: int) -> list[list[MlpCase]]:
    """Per rank count: a one-block case (symptoms read clearly), then a stack of 2 or 3 blocks."""
    rng = np.random.default_rng([seed, 5])
    return [[random_mlp_case(rng, p, blocks) for blocks in (1, int(rng.integers(2, 4)))] for p in (2, 3, 4)]


def random_mlp_case(rng: np.random.Generator, p: int, blocks: int) -> MlpCase:
    hidden = 8 * int(rng.integers(10, 21))  # 80 .. 160
    ffn = 12 * int(np.ceil(4 * hidden / 12))  # about 4 h, a multiple of 2, 3 and 4
    return MlpCase(p, int(rng.integers(1, 5)), int(rng.integers(2, 10)), hidden, ffn, blocks,
                   int(rng.integers(1 << 31)))
