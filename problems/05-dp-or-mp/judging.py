"""Problem 05's checker side: the memory model and the rule that answer a plan case, the hidden plan
cases (drawn with the rule), the MLP on one device (the expected values), and how each wrong answer is
named (each diagnose_* gives the first difference, or None). Here, not in cases.py: the learner's
process imports cases.py (the rank program does) and can read it; it cannot read this file."""

import math
from collections.abc import Iterator
from fractions import Fraction
from itertools import product
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from distlab.grading import (
    COLLECTIVE,
    COLLECTIVES,
    POINT_TO_POINT,
    CaseRun,
    CheckContext,
    Counts,
    cost,
)

from . import cases
from .cases import (
    NAMED_CASES,
    Devices,
    Layout,
    MlpCase,
    Model,
    PlanCase,
    Weights,
    cluster,
    gpt,
    mlp_inputs,
)
from .programs import GRAD_NAMES, MlpResult, PlanAnswer, one_device

BYTES_PER_PARAM = 16  # fp16 weights 2 + fp16 grads 2 + fp32 master weights 4 + Adam m 4 + v 4
STATE_WITHOUT_OPTIMIZER = 4  # fp16 weights + fp16 grads: what is left if Adam's state is forgotten
WRONG_BYTES = (2, 4, 8, 12, 18, 20)  # the other bytes per parameter people count (BYTES_SAY says why)


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


# == the hidden plan cases ========================================================================


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


# == the diagnoses ================================================================================



RTOL, ATOL = 1e-7, 1e-9  # float64 all through: only the order of the sums differs
TWICE = "a gradient that was already whole was allreduced again"


# == the plan ====================================================================================


def show(layout: Layout | None) -> str:
    return "None (nothing fits)" if layout is None else "dp={dp} tp={tp} pp={pp}".format(**layout)


def gib(x: Fraction | float) -> str:
    return f"{float(x) / cases.GIB:.1f} GiB"


def layout_kind(layout: Layout | None) -> str:
    return "none" if layout is None else "PP" if layout["pp"] > 1 else "TP" if layout["tp"] > 1 else "DP"


Bounds = tuple[Fraction, Fraction | None]  # lo < bytes per parameter <= hi; hi None: no upper bound

# What a memory model of so many bytes per parameter leaves out or adds (16 = 2 + 2 + 4 + 4 + 4); the plan
# cases tell these counts apart (MISREADINGS).
BYTES_SAY = {
    2: "fp16 weights only: the gradients (2) and Adam's state (12) are missing",
    4: "fp16 weights and gradients only: the optimizer state is missing (fp32 master weights and Adam's "
       "two moments, 12 more bytes per parameter)",
    8: "fp32 weights and gradients (4 + 4) with no optimizer state: Adam's m and v and the fp32 master "
       "weights are missing",
    12: "one 4-byte term is missing: the fp32 master weights (2 + 2 + 4 + 4), or the fp16 weights and "
        "gradients (4 + 4 + 4)",
    18: "fp32 gradients (4 bytes, not 2): in mixed precision the gradients are fp16",
    20: "fp32 weights and gradients besides the fp32 master copy: in mixed precision the working copies "
        "are fp16",
}


def implied_bytes(case: PlanCase, layout: Layout | None, activations: bool = True) -> Bounds | None:
    """The bytes per parameter at which the rule answers ``layout`` for ``case`` (every legal layout before
    it does not fit, it does), or None if no value gives it (an illegal layout, or one out of order)."""
    low, limit = Fraction(0), case.devices["memory_bytes"]
    for legal in legal_layouts(case.model, case.devices, case.batch):
        m = memory_per_device(case.model, case.batch, **legal, bytes_per_param=1)
        edge = (limit - (m.activations if activations else 0)) / m.state  # fits iff bytes <= edge
        if legal == layout:
            return (low, edge) if edge > low else None
        low = max(low, edge)
    return (low, None) if layout is None else None


def bytes_fitting(table: list[PlanCase], answers: list[PlanAnswer], activations: bool = True) -> Bounds | None:
    """The bytes per parameter at which the rule gives every well-formed answer of the table, or None."""
    low, high = Fraction(0), None
    for case, answer in zip(table, answers):
        if answer.error or answer.other is not None:
            continue  # no layout: no evidence either way
        if (bounds := implied_bytes(case, answer.layout, activations)) is None:
            return None
        low = max(low, bounds[0])
        if bounds[1] is not None:
            high = bounds[1] if high is None else min(high, bounds[1])
        if high is not None and high <= low:
            return None
    return low, high


def holds(bounds: Bounds | None, value: int) -> bool:
    return bounds is not None and bounds[0] < value and (bounds[1] is None or value <= bounds[1])


def wrong_bytes(bounds: Bounds) -> str | None:
    """The bytes per parameter the answers imply, and what that count leaves out, as a message; None unless
    a count people use (BYTES_SAY) other than 16 gives every answer."""
    common = [k for k in BYTES_SAY if holds(bounds, k)]
    if not common or holds(bounds, BYTES_PER_PARAM):
        return None
    low, high = (f"{math.floor(x * 100) / 100:.2f}" if x is not None else "" for x in bounds)  # rounded down
    shown = f"more than {low} and at most {high}" if high else f"more than {low}"
    return (f"the rule's answer at {' or '.join(map(str, common))} bytes per parameter, not 16 (every answer "
            f"of the table is the rule's for {shown} bytes per parameter): "
            + "; or ".join(BYTES_SAY[k] for k in common))


NO_ACTIVATIONS = "the rule's answer without activations: the activations are missing"
PP_FIRST = ("the rule's answer with PP tried before TP: for the same tp*pp the rule takes the widest TP that "
            "fits (TP inside a node on fast links, PP's bubbles last)")


def misreading_of(table: list[PlanCase], answers: list[PlanAnswer]) -> str | None:
    """Why plan differs from the rule, where one misreading of the memory model or of the rule gives every
    well-formed answer of the table: the bytes per parameter solved for from the answers, no activations, PP
    before TP. All those that fit are named (joined by "; or "), none if none fits every case."""
    ours = [PlanAnswer(layout=best_plan(c.model, c.devices, c.batch)) for c in table]
    if all(a == o for a, o in zip(answers, ours) if not (a.error or a.other is not None)):
        return None
    said = []
    if (bounds := bytes_fitting(table, answers)) and (wrong := wrong_bytes(bounds)):
        said.append(wrong)
    if holds(bytes_fitting(table, answers, activations=False), BYTES_PER_PARAM):
        said.append(NO_ACTIVATIONS)
    if all(a.layout == best_plan(c.model, c.devices, c.batch, tp_first=False)
           for c, a in zip(table, answers) if not (a.error or a.other is not None)):
        said.append(PP_FIRST)
    return "; or ".join(said) or None


def diagnose_plan(case: PlanCase, answer: PlanAnswer, misreading: str | None = None) -> str | None:
    """None when the answer is the rule's; else what was expected, what was seen, and why.
    ``misreading``: what misreading_of says of the whole table, if anything (a cause is named only where
    every answer shows it: one case alone fits too many)."""
    want = best_plan(case.model, case.devices, case.batch)
    head = f"{case.describe()}: expected {show(want)}"
    if answer.error:
        return f"{head}; plan raised {answer.error}"
    if answer.other is not None:
        return f"{head}; plan returned {answer.other}, not a dict with keys dp, tp, pp (or None)"
    got = answer.layout
    if got == want:
        return None
    head = f"{head}; saw {show(got)}"
    if got is None:  # and want is not: got == want returned above
        m = memory_per_device(case.model, case.batch, **want)
        return f"{head}, but {show(want)} fits: it needs {gib(m.total)} of {gib(case.devices['memory_bytes'])}"
    if faults := layout_faults(case.model, case.devices, case.batch, got):
        return f"{head}, which is not a legal layout: {'; '.join(faults)}"
    m, limit = memory_per_device(case.model, case.batch, **got), case.devices["memory_bytes"]
    need = (f"{show(got)} needs {gib(m.total)} per device ({gib(m.state)} of weights, gradients and "
            f"Adam state at 16 bytes per parameter, {gib(m.activations)} of activations) and a "
            f"device has {gib(limit)}")
    if misreading:  # one misreading gives every answer of the table: named, with the memory at 16 bytes
        return f"{head}, {misreading}. {need}"
    if m.total > limit:
        return f"{head}, which does not fit: {need}"
    # The learner's layout fits, so some layout does: want is not None.
    got_mp, want_mp = got["tp"] * got["pp"], want["tp"] * want["pp"]
    if got_mp > want_mp:
        return (f"{head}: it fits, but so does {show(want)} with less model parallelism "
                f"(tp*pp = {want_mp} < {got_mp}); model parallelism puts communication on the "
                "critical path of every layer, so use as little as memory allows")
    if got_mp == want_mp and got["tp"] < want["tp"]:
        return (f"{head}: same tp*pp = {got_mp}, but the rule takes the widest TP that fits: "
                "TP inside a node (fast links) before PP (bubbles)")
    return head


def wrong_plans(table: list[PlanCase], answers: list[PlanAnswer]) -> list[str]:
    """The message of each case that plan got wrong (a misreading seen on every case named so)."""
    misreading = misreading_of(table, answers)
    return [msg for case, answer in zip(table, answers) if (msg := diagnose_plan(case, answer, misreading))]


def diagnose_all_dp(table: list[PlanCase], answers: list[PlanAnswer]) -> str | None:
    """The starter's placeholder, or a plan that never looks at memory."""
    pure_dp = [{"dp": c.devices["count"], "tp": 1, "pp": 1} for c in table]
    need_mp = sum(best_plan(c.model, c.devices, c.batch) != dp for c, dp in zip(table, pure_dp))
    if all(a.layout == dp for a, dp in zip(answers, pure_dp)) and need_mp:
        return (f"plan answered pure DP (dp = the device count) for all {len(table)} cases, but "
                f"{need_mp} of them need model parallelism or cannot fit at all: apply the memory "
                "model (16 bytes per parameter plus activations) and the card's rule")
    return None


# == the tensor-parallel MLP: values ==============================================================


class Expected(NamedTuple):
    out: np.ndarray
    x_grad: np.ndarray
    grads: list[dict[str, np.ndarray]]  # whole gradients per block
    weights: list[Weights]


def single_device(case: MlpCase) -> Expected:
    """The same blocks on one device, with the whole weights (every rank's shard, which only the
    checker holds), forward and backward, as nn.Linear and nn.GELU compute them."""
    x0, gout, weights = mlp_inputs(case)
    out, x_grad, grads = one_device(x0, gout, weights)
    return Expected(out, x_grad, grads, weights)


def malformed_plan(value: Any) -> str | None:
    """Why a rank's value is not what ask_plan returns (a PlanAnswer of plain data), or None."""
    if type(value) is not PlanAnswer:
        return f"a {type(value).__name__}, not the harness's PlanAnswer"
    layout, other, error = value
    if layout is not None and not (type(layout) is dict and set(layout) == {"dp", "tp", "pp"}
                                   and all(type(v) is int for v in layout.values())):
        return f"a PlanAnswer whose layout is {str(layout)[:80]}, not {{dp, tp, pp}} of ints"
    if any(v is not None and type(v) is not str for v in (other, error)):
        return "a PlanAnswer whose other or error is not a string"
    return None


def malformed_mlp(case: MlpCase, value: Any) -> str | None:
    """Why a rank's value is not what run_mlp returns (an MlpResult of plain data), or None."""
    if type(value) is not MlpResult:
        return f"a {type(value).__name__}, not the harness's MlpResult"

    def plain(v: Any) -> bool:
        return type(v) is str or (type(v) is np.ndarray and v.dtype == np.float64)

    if not (plain(value.out) and plain(value.x_grad)):
        return "an MlpResult whose output or x.grad is neither a float64 array nor a string"
    if (type(value.grads) is not list or len(value.grads) != case.blocks
            or any(type(g) is not dict or set(g) != set(GRAD_NAMES) or not all(map(plain, g.values()))
                   for g in value.grads)):
        return f"an MlpResult whose gradients are not {case.blocks} dict(s) of {', '.join(GRAD_NAMES)}"
    if (type(value.param_counts) is not list or len(value.param_counts) != case.blocks
            or any(type(n) is not int for n in value.param_counts)):
        return f"an MlpResult whose parameter counts are not {case.blocks} int(s)"
    return None


SPLIT = {  # what rank r of p keeps, for the messages
    "fc1.weight": "rank r keeps rows (output features) r*ffn/p .. (r+1)*ffn/p of W1",
    "fc1.bias": "rank r keeps entries r*ffn/p .. (r+1)*ffn/p of b1",
    "fc2.weight": "rank r keeps columns (input features) r*ffn/p .. (r+1)*ffn/p of W2",
    "fc2.bias": "every rank keeps the whole b2",
}


def shard(name: str, whole: np.ndarray, rank: int, p: int) -> np.ndarray:
    """Rank ``rank``'s part of a whole gradient, by the card's split."""
    # b2 is replicated; W2 is split by columns, W1 and b1 by rows.
    return whole if name == "fc2.bias" else np.split(whole, p, axis=1 if name == "fc2.weight" else 0)[rank]


def close(got: np.ndarray | str, want: np.ndarray) -> bool:
    return (isinstance(got, np.ndarray) and got.shape == want.shape
            and bool(np.allclose(got, want, rtol=RTOL, atol=ATOL)))


def worst(got: np.ndarray, want: np.ndarray) -> str:
    i = np.unravel_index(int(np.argmax(np.abs(got - want))), want.shape)
    return f"at index {tuple(int(k) for k in i)} expected {want[i]:.6g}, saw {got[i]:.6g}"


def unusable(case: MlpCase, values: list[Any], want: np.ndarray, name: str, missing: str = "") -> str | None:
    """The first rank whose value is no array of the expected shape, as a message."""
    for rank, value in enumerate(values):
        if isinstance(value, str):
            return f"{case.label()}: on rank {rank} {value}{missing}"
        if value.shape != want.shape:
            return f"{case.label()}: rank {rank}'s {name} has shape {value.shape}, expected {want.shape}"
    return None


def first_wrong_rank(head: str, values: list[np.ndarray], want: np.ndarray) -> str:
    return next((f"{head} on rank {rank}, {worst(value, want)}"
                 for rank, value in enumerate(values) if not close(value, want)), head)


def diagnose_output(case: MlpCase, results: list[MlpResult], want: Expected) -> str | None:
    outs = [r.out for r in results]
    if message := unusable(case, outs, want.out, "output"):
        return message
    if all(close(out, want.out) for out in outs):
        return None
    head = f"{case.label()}: the output differs from the single-device module"
    b2 = want.weights[-1][3]
    if case.blocks == 1:
        if all(close(out, want.out + (case.p - 1) * b2) for out in outs):
            return (f"{head} by exactly (p - 1) * b2 on every rank: the bias of the row-parallel layer "
                    "was added on every rank, so the allreduce counted it p times; add it once, after the sum")
        total = np.sum(outs, axis=0)
        if close(total, want.out) or close(total - (case.p - 1) * b2, want.out):
            return (f"{head}, but the ranks' outputs add up to it: each rank holds only its own partial "
                    "sum; the row-parallel output must be allreduced in forward (g)")
    return first_wrong_rank(head, outs, want.out)


def diagnose_input_grad(case: MlpCase, results: list[MlpResult], want: Expected) -> str | None:
    grads = [r.x_grad for r in results]
    if message := unusable(case, grads, want.x_grad, "x.grad", (
            ": no gradient reached the input; does the forward keep the autograd graph "
            "(autograd.Function, not .detach())?")):
        return message
    if all(close(g, want.x_grad) for g in grads):
        return None
    head = f"{case.label()}: the input gradient dL/dx differs from the single-device module"
    if case.blocks == 1 and close(np.sum(grads, axis=0), want.x_grad):
        return (f"{head}, but the ranks' input gradients add up to it: each rank holds only its own "
                "shard's part; f (in front of the column-parallel layer) must allreduce in backward")
    if all(close(g, case.p * want.x_grad) for g in grads):
        return f"{head}: it is p = {case.p} times too large on every rank: {TWICE}"
    return first_wrong_rank(head, grads, want.x_grad)


def diagnose_grad_shapes(case: MlpCase, results: list[MlpResult], want: Expected) -> str | None:
    """The first gradient shard of the wrong shape (the split, read before any value)."""
    for block, name, (rank, r) in product(range(case.blocks), GRAD_NAMES, enumerate(results)):
        got, mine = r.grads[block][name], shard(name, want.grads[block][name], rank, case.p)
        if not isinstance(got, str) and got.shape != mine.shape:
            return (f"{case.label()}: block {block}, rank {rank}, {name}.grad has shape {got.shape}, "
                    f"expected {mine.shape}: {SPLIT[name]}")
    return None


def diagnose_weight_grads(case: MlpCase, results: list[MlpResult], want: Expected) -> str | None:
    for block, name, (rank, r) in product(range(case.blocks), GRAD_NAMES, enumerate(results)):
        got, mine = r.grads[block][name], shard(name, want.grads[block][name], rank, case.p)
        where = f"{case.label()}: block {block}, rank {rank}, {name}.grad"
        if isinstance(got, str):
            return f"{case.label()}: block {block}, rank {rank}: {got}"
        if got.shape != mine.shape:
            return f"{where} has shape {got.shape}, expected {mine.shape}: {SPLIT[name]}"
        if not close(got, mine):
            if close(got, case.p * mine):
                return f"{where} is p = {case.p} times too large: {TWICE}"
            return f"{where} differs from the single-device module's, {worst(got, mine)}"
    return None


# == the tensor-parallel MLP: communication =======================================================


def allreduce_calls(counts: Counts) -> int:
    return counts.calls.get("Allreduce", 0)  # Iallreduce counts here too


def other_calls(counts: Counts) -> list[str]:  # point-to-point calls and the other collectives
    return sorted(op for op, n in counts.calls.items()
                  if n and op != "Allreduce" and (op in POINT_TO_POINT or op in COLLECTIVES))


WRONG_COUNT = {  # (phase, allreduce calls per block) -> what that count says
    ("forward", 2): (": two per block; f's forward must be the identity (its input is "
                     "already the same on every rank), only g allreduces in forward"),
    ("forward", 0): ": none at all; the row-parallel partial sums must be added (g)",
    ("backward", 0): ": none at all; f's backward must add the input-gradient parts",
    ("backward", 2): ": two per block; g's backward must be the identity",
}


def wrong_calls(head: str, phase: str, counts: Counts, blocks: int) -> str | None:
    """What one phase on one rank did besides one Allreduce per block, as a message."""
    others, calls = other_calls(counts), allreduce_calls(counts)
    if others:
        return f"{head} called {', '.join(others)}: a TP block needs one Allreduce each way and nothing else"
    if calls != blocks:
        why = WRONG_COUNT.get((phase, calls / blocks), "")
        return f"{head} made {calls} allreduce call(s), expected exactly {blocks} (one per block){why}"
    return None


def ring_time(t: CheckContext, p: int, nbytes: int) -> float:
    """The ring allreduce bound 2(p-1) alpha + 2(p-1)/p n beta, with the slowest ring link; off the card's
    platform, where ring neighbours may share links, the built-in Allreduce replayed there if slower."""
    routes = [t.platform.route(r, (r + 1) % p) for r in range(p)]
    alpha, beta = max(r.alpha_s for r in routes), max(r.beta_s_per_byte for r in routes)
    formula = cost.ring_allreduce_time(p, nbytes, alpha, beta)
    return formula if t.on_card_setting else max(formula, t.collective_time("Allreduce", p, nbytes))


# == the tensor-parallel MLP: what the allreduces carry ===========================================
# The counters say how many bytes each allreduce moved; the record of what each rank sent (the MLP tasks
# ask for it: Task(record_sent=True)) says what they were. Each is recomputed here from the whole case,
# block after block, from what the earlier blocks' allreduces carried: a forward allreduce carries the
# rank's partial sum of the row-parallel layer (b2 in it or not: one rank may add it before the sum), a
# backward one the rank's part of dL/dx. Junk of the right size (zeros, the block's own input) fails.

CARRIED = "carried something else"
B2_ONCE = "add b2 once, after the sum (or on one rank only)"
CARRIES = {
    "forward": "its partial sum of the row-parallel layer, gelu(x W1_r^T + b1_r) W2_r^T with its own shard "
               "(b2 added once: after the sum, or into it by one rank)",
    "backward": "its part of the block's input gradient, ((dL/dy W2_r) * gelu'(x W1_r^T + b1_r)) W1_r with its "
                "own shard (f's backward sums these parts)",
}


def allreduced(result: CaseRun[MlpCase], rank: int, phase: str) -> list[np.ndarray] | str:
    """What ``rank`` contributed to each Allreduce of this case's ``phase``, as its agent copied it when the call
    started, in call order; a string when the record cannot tell (it overflowed: no evidence, no pass)."""
    task = result.task
    log = task.sent(rank)
    if log.overflowed:
        return (f"the record of what rank {rank} sent overflowed (it keeps 64 MiB): no evidence of "
                "what its allreduces carried")
    nth = next(i for i, case in enumerate(task.spec.cases or ()) if case is result.case)
    starts = [i + 1 for i, (name, _) in enumerate(task.outcomes[rank].marks) if name == phase]
    return [item.data for item in log.items
            if item.after_marks == starts[nth] and item.op == "Allreduce" and item.peer == COLLECTIVE]


def partials(case: MlpCase, a: np.ndarray, g: np.ndarray | None, weights: Weights) -> list[np.ndarray]:
    """Per rank, its forward partial sum (``g`` None) or its part of dL/da for the output gradient ``g``: one
    block on its input ``a``, with the rank's own shard of ``weights``, as nn.Linear and nn.GELU compute it."""
    n, (w1, b1, w2, _) = case.ffn // case.p, weights
    out = []
    for rank in range(case.p):
        cut = slice(rank * n, (rank + 1) * n)
        x = torch.from_numpy(a).requires_grad_(g is not None)
        partial = F.linear(F.gelu(F.linear(x, torch.from_numpy(w1[cut]), torch.from_numpy(b1[cut]))),
                           torch.from_numpy(np.ascontiguousarray(w2[:, cut])))
        if g is None:
            out.append(partial.detach().numpy())
        else:
            out.append(torch.autograd.grad(partial, x, torch.from_numpy(g))[0].numpy())
    return out


def diagnose_carried(case: MlpCase, sent: dict[str, list[list[np.ndarray] | str]]) -> str | None:
    """The first allreduce that did not carry what it must (None if all did). ``sent[phase][rank]``: what the
    rank allreduced in that phase, in call order (backward: the last block first), or why there is no record."""
    x0, gout, weights = mlp_inputs(case)
    shape = x0.shape

    def wrong(phase: str, block: int, rank: int, got: np.ndarray, want: np.ndarray) -> str | None:
        head = f"{case.label()}: rank {rank}'s {phase} allreduce of block {block}"
        if got.dtype != np.float64 or got.size != want.size:
            return (f"{head} carried {got.size} {got.dtype} values, expected tokens x hidden = {want.size} float64: "
                    f"{CARRIES[phase]}")
        if close(got.reshape(shape), want):
            return None
        return f"{head} {CARRIED}: it must carry {CARRIES[phase]}; {worst(got.reshape(shape), want)}"

    for phase, per_rank in sent.items():
        for rank, items in enumerate(per_rank):
            if isinstance(items, str):
                return f"{case.label()}: {items}"
            if len(items) != case.blocks:
                return (f"{case.label()}: rank {rank}'s record holds {len(items)} allreduce(s) in {phase}, "
                        f"expected {case.blocks}")
    a, inputs = x0, []
    for block, ws in enumerate(weights):  # forward: b2 in a partial sum, whole, on one rank at most
        inputs.append(a)
        bias, with_b2 = np.broadcast_to(ws[3], shape), []
        parts = partials(case, a, None, ws)
        for rank, want in enumerate(parts):
            got = np.asarray(sent["forward"][rank][block])
            if (got.dtype == np.float64 and got.size == want.size and not close(got.reshape(shape), want)
                    and close(got.reshape(shape), want + bias)):
                want = want + bias
                with_b2.append(rank)
            if message := wrong("forward", block, rank, got, want):
                return message
        if len(with_b2) > 1:
            who = "every rank" if len(with_b2) == case.p else f"ranks {', '.join(map(str, with_b2))} each"
            return (f"{case.label()}: {who} put b2 into its partial sum before the forward allreduce of block "
                    f"{block}, so the sum counts it {len(with_b2)} times: {B2_ONCE}")
        a = np.sum(parts, axis=0) + ws[3]  # the next block's input: b2 once
    g = gout
    for i, block in enumerate(reversed(range(case.blocks))):  # backward: the last block first
        parts = partials(case, inputs[block], g, weights[block])
        for rank, want in enumerate(parts):
            if message := wrong("backward", block, rank, np.asarray(sent["backward"][rank][i]), want):
                return message
        g = np.sum(parts, axis=0)
    return None


def wrong_carried(result: CaseRun[MlpCase]) -> str | None:
    """diagnose_carried on what each rank of the case sent, as its agent recorded it."""
    sent = {phase: [allreduced(result, rank, phase) for rank in range(result.ranks)]
            for phase in ("forward", "backward")}
    return diagnose_carried(result.case, sent)


def carried_in_short(message: str) -> str:
    """What a message of diagnose_carried says, in a few words, for the time check."""
    return ("b2 went into the forward allreduce on more than one rank" if B2_ONCE in message
            else f"an allreduce {CARRIED}")


# == the tensor-parallel MLP: what reached each rank ================================================
# A rank that received the other ranks' shards (their zero-padded weights allreduced at set-up) holds the
# whole block and can run the MLP alone: its values and its share then say nothing of tensor parallelism.
# What TP brings a rank is one forward and one backward allreduce of tokens x hidden per block, several
# times less than the other shards hold (test_problem05 pins it over the hidden cases). Counted over the
# whole task (set-up, phases, read back: a rank's view holds all its cases at once), each op's data and
# MESSAGE_BYTES per message, call or probe, so that zero-byte messages, which carry a tag, are not free.

MESSAGE_BYTES = 8
# The collectives whose result fits the rank's own buffer; what any other brings is at most what every
# rank of the task put into that operation.
OWN_SIZE = frozenset({"Allreduce", "Bcast", "Reduce", "Reduce_scatter", "Scatter", "Barrier"})


def tp_budget(cases: list[MlpCase]) -> int:
    """What the TP allreduces of a task's cases bring each rank, counted as ``received`` counts."""
    return sum(2 * case.blocks * (case.activation_bytes + MESSAGE_BYTES) for case in cases)


def echoed(task: Any, rank: int) -> int:
    """The bytes (and charge) of the rank's allreduces to which every member gave the same values, as their
    agents recorded them: the sum holds nothing the rank did not (f's needless forward allreduce of x)."""
    logs = [task.sent(r) for r in range(task.spec.ranks)]
    if any(log.overflowed for log in logs):
        return 0

    def calls(r: int, group: tuple[int, ...]) -> list[np.ndarray]:
        return [i.data for i in logs[r].items if i.op == "Allreduce" and i.peer == COLLECTIVE and i.group == group]

    total = 0
    for group in {i.group for i in logs[rank].items if i.op == "Allreduce" and i.peer == COLLECTIVE}:
        if not all(0 <= s < len(logs) for s in group):
            continue
        others = [calls(s, group) for s in group if s != rank]
        for n, data in enumerate(calls(rank, group)):
            if all(n < len(o) and o[n].dtype == data.dtype and np.array_equal(o[n], data) for o in others):
                total += data.nbytes + MESSAGE_BYTES
    return total


def received(task: Any, rank: int) -> int:
    """What reached ``rank`` over the task, by its agents' counters: bytes of the messages it received, of
    the collectives' results (at most its buffer, or every rank's contributions), MESSAGE_BYTES each."""
    every = [task.counts(r) for r in range(task.spec.ranks)]
    mine = every[rank]
    total = mine.bytes_received + MESSAGE_BYTES * sum(mine.recv_msgs.values())
    for op, n in mine.calls.items():
        if op in COLLECTIVES:
            data = mine.op_bytes.get(op, 0) if op in OWN_SIZE else sum(c.op_bytes.get(op, 0) for c in every)
            total += data + MESSAGE_BYTES * n
        elif op in ("Probe", "Iprobe"):
            total += MESSAGE_BYTES * n
    return total - echoed(task, rank)


def received_too_much(task: Any) -> str | None:
    """The first rank of an MLP task that received more than its TP allreduces bring, as a message."""
    budget = tp_budget(list(task.spec.cases or ()))
    for rank in range(task.spec.ranks):
        if (got := received(task, rank)) > budget:
            return (f"{task.spec.label}: rank {rank} received {got} bytes over the task (set-up, forward, backward "
                    f"and read back, {MESSAGE_BYTES} more per message), more than its blocks' TP allreduces "
                    f"bring ({budget}: one of tokens x hidden each way per block): it could hold the other "
                    "ranks' weights and run the MLP alone")
    return None


def unproven_share(case: MlpCase, results: list[MlpResult], want: Expected) -> str | None:
    """Why the gradients handed back do not show that each rank's parameters are its shard: shapes in every
    case; values in the one-block case, whose weight gradients need only x and dL/dy (b2 counted p times, no g
    in forward or no f in backward leaves them right), as diagnose_weight_grads judges them."""
    if message := diagnose_grad_shapes(case, results, want):
        return message
    return diagnose_weight_grads(case, results, want) if case.blocks == 1 else None
