"""Checks for problem 05, data parallel or model parallel?

The story, in two parts. First the plan: the learner's plan(model, devices, batch) answers a
table of cases (eight named ones that each teach one thing, then hidden random ones), and each
answer is compared with this file's own rule (best_plan), with the memory of the learner's layout
worked out to say why it is wrong. Then the tensor-parallel MLP: blocks of the learner's
ParallelMLP run on p = 2, 3 and 4 real ranks, forward and backward; the output, the input gradient
and every weight-gradient shard are compared with the single-device torch module computed here,
with the same weights. The same run shows how many parameters each rank keeps (1/p of the whole),
how many allreduces went out around forward and around backward (one each per block, of
tokens x hidden values), and what that communication costs on the virtual clock.

Hidden variants: the random plan cases; the MLP sizes, batch shapes, block counts and values.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from distlab.grading import CheckContext, Checklist, Task
from distlab.grading.api import RunFailed, TaskRun
from distlab.runtime.stats import COLLECTIVES, POINT_TO_POINT, CommStats

GIB = 2**30
BYTES_PER_PARAM = 16  # fp16 weights 2 + fp16 grads 2 + fp32 master weights 4 + Adam m 4 + v 4
STATE_WITHOUT_OPTIMIZER = 4  # fp16 weights + fp16 grads: what is left if Adam's state is forgotten
MLP_RANKS = (2, 3, 4)
MEMORY_TOLERANCE = 0.01  # per-rank parameter elements within 1% of whole / p
TIME_TOLERANCE = 0.05
RTOL, ATOL = 1e-7, 1e-9  # float64 all through: only the order of the sums differs


# == part 1: the memory model and the planning rule (pure functions, unit-tested) =================


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Memory:
    """Bytes per device of one layout, exactly (Fractions), split as the card splits them."""

    state: Fraction  # weights, gradients and optimizer state
    activations: Fraction

    @property
    def total(self) -> Fraction:
        return self.state + self.activations


def memory_per_device(model: dict[str, Any], batch: int, dp: int, tp: int, pp: int,
                      bytes_per_param: int = BYTES_PER_PARAM) -> Memory:
    """The card's memory model: bytes_per_param * params / (tp * pp) of model state, plus
    (batch / dp) * seq_len * (layers / pp) * hidden * (10 + 24 / tp) bytes of activations."""
    state = Fraction(bytes_per_param * model["params"], tp * pp)
    per_token_layer = model["hidden"] * (10 + Fraction(24, tp))
    activations = Fraction(batch, dp) * model["seq_len"] * Fraction(model["layers"], pp) * per_token_layer
    return Memory(state, activations)


def layout_faults(model: dict[str, Any], devices: dict[str, int], batch: int,
                  layout: dict[str, int]) -> list[str]:
    """Why ``layout`` is not a legal layout at all (empty when it is)."""
    dp, tp, pp = layout["dp"], layout["tp"], layout["pp"]
    faults = []
    if min(dp, tp, pp) < 1:
        return [f"every degree must be at least 1, saw dp={dp}, tp={tp}, pp={pp}"]
    if dp * tp * pp != devices["count"]:
        faults.append(f"dp * tp * pp = {dp * tp * pp}, but there are {devices['count']} devices")
    if devices["per_node"] % tp:
        faults.append(f"tp = {tp} does not divide the {devices['per_node']} devices of a node "
                      "(a TP group must stay inside one node)")
    if model["layers"] % pp:
        faults.append(f"pp = {pp} does not divide the {model['layers']} layers")
    if batch % dp:
        faults.append(f"dp = {dp} does not divide the batch of {batch}")
    return faults


def best_plan(model: dict[str, Any], devices: dict[str, int], batch: int,
              bytes_per_param: int = BYTES_PER_PARAM, activations: bool = True,
              tp_first: bool = True) -> dict[str, int] | None:
    """The rule: the least model parallelism tp * pp that fits, and for it the widest tp.

    The keyword arguments give the rule's usual misreadings, for the diagnosis: another cost per
    parameter, no activations, PP before TP."""
    n = devices["count"]
    for mp in divisors(n):
        for tp in (reversed(divisors(mp)) if tp_first else divisors(mp)):
            layout = {"dp": n // mp, "tp": tp, "pp": mp // tp}
            if layout_faults(model, devices, batch, layout):
                continue
            if fits(model, devices, batch, layout, bytes_per_param, activations):
                return layout
    return None


def fits(model: dict[str, Any], devices: dict[str, int], batch: int, layout: dict[str, int],
         bytes_per_param: int = BYTES_PER_PARAM, activations: bool = True) -> bool:
    m = memory_per_device(model, batch, layout["dp"], layout["tp"], layout["pp"], bytes_per_param)
    return (m.total if activations else m.state) <= devices["memory_bytes"]


def gpt(name: str, layers: int, hidden: int, seq_len: int, vocab: int = 50304) -> dict[str, Any]:
    """A GPT-style model: 12 L h^2 in the blocks, 13 L h in biases and norms, the embedding."""
    params = 12 * layers * hidden**2 + 13 * layers * hidden + vocab * hidden
    return {"name": name, "params": params, "layers": layers, "hidden": hidden, "seq_len": seq_len}


def cluster(count: int, per_node: int, memory_gib: int) -> dict[str, int]:
    return {"count": count, "per_node": per_node, "memory_bytes": memory_gib * GIB}


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
                f"on {nodes} node(s) x {d['per_node']} x {d['memory_bytes'] / GIB:g} GiB, batch {self.batch}")


# Each named case teaches one thing; the expected layouts are this file's rule's answers (the
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

SHAPES = ((12, 768), (24, 1024), (24, 1536), (24, 2048), (32, 2560), (32, 4096), (40, 5120),
          (48, 6144), (48, 7168), (64, 8192), (80, 8192), (96, 12288))


def margin_ok(case: PlanCase, margin: float = 0.005) -> bool:
    """No legal layout sits within ``margin`` of the memory limit, so float arithmetic is safe."""
    devices, limit = case.devices, case.devices["memory_bytes"]
    for mp in divisors(devices["count"]):
        for tp in divisors(mp):
            layout = {"dp": devices["count"] // mp, "tp": tp, "pp": mp // tp}
            if layout_faults(case.model, devices, case.batch, layout):
                continue
            for bpp in (BYTES_PER_PARAM, STATE_WITHOUT_OPTIMIZER):
                total = memory_per_device(case.model, case.batch, layout["dp"], tp, layout["pp"], bpp).total
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
        answer = best_plan(model, devices, batch)
        # Keep a few "nothing fits", most cases where some layout fits.
        if answer is None and rng.random() < 0.8:
            continue
        cases.append(case)
    return cases


@dataclass
class PlanAnswer:
    layout: dict[str, int] | None = None  # a well-formed answer
    other: str | None = None  # anything else, as repr
    error: str | None = None  # the exception plan raised


def normalize(value: Any) -> tuple[dict[str, int] | None, str | None]:
    """The learner's answer as plain data: ({dp, tp, pp} or None, None), or (None, its repr)."""
    if value is None:
        return None, None
    try:
        if set(value.keys()) == {"dp", "tp", "pp"}:
            layout = {k: int(value[k]) for k in ("dp", "tp", "pp")}
            if all(layout[k] == value[k] for k in layout):
                return layout, None
    except (AttributeError, TypeError, ValueError):
        pass
    return None, repr(value)[:200]


def where_in(exc: BaseException, solution: Any) -> str:
    """', line N of your file' for the deepest frame of the learner's file, if any."""
    path = str(Path(getattr(solution, "__file__", "") or "").resolve())
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if str(Path(frame.filename).resolve()) == path:
            line = frame.lineno
    return f" ({Path(path).name}, line {line})" if line else ""


def run_plans(comm, solution, cases):
    """Asks the learner's plan for each case; an exception is kept per case, not fatal."""
    answers = []
    for case in cases:
        try:
            # Copies: a plan that edits its arguments must not change the next case.
            value = solution.plan(dict(case.model), dict(case.devices), case.batch)
        except Exception as exc:  # noqa: BLE001 - reported for this case, the others still run
            answers.append(PlanAnswer(error=f"{type(exc).__name__}: {exc}{where_in(exc, solution)}"))
            continue
        layout, other = normalize(value)
        answers.append(PlanAnswer(layout=layout, other=other))
    return answers


def show(layout: dict[str, int] | None) -> str:
    if layout is None:
        return "None (nothing fits)"
    return f"dp={layout['dp']} tp={layout['tp']} pp={layout['pp']}"


def gib(x: Fraction | float) -> str:
    return f"{float(x) / GIB:.1f} GiB"


MISREADINGS: dict[str, tuple[dict[str, Any], str]] = {
    "4 bytes": ({"bytes_per_param": STATE_WITHOUT_OPTIMIZER},
                ("the rule's answer at 4 bytes per parameter (fp16 weights and gradients only): the "
                 "optimizer state is missing (fp32 master weights and Adam's two moments, 12 more "
                 "bytes per parameter)")),
    "no activations": ({"activations": False},
                       "the rule's answer without activations: the activations are missing"),
    "PP first": ({"tp_first": False},
                 ("the rule's answer with PP tried before TP: for the same tp*pp the rule takes the "
                  "widest TP that fits (TP inside a node on fast links, PP's bubbles last)")),
}


def misreading_of(cases: list[PlanCase], answers: list[PlanAnswer]) -> str | None:
    """The misreading whose answers the learner gave on every case, where one fits them all."""
    for name, (kwargs, _) in MISREADINGS.items():
        theirs = [best_plan(c.model, c.devices, c.batch, **kwargs) for c in cases]
        ours = [best_plan(c.model, c.devices, c.batch) for c in cases]
        if theirs != ours and all(a.error is None and a.other is None and a.layout == w
                                  for a, w in zip(answers, theirs)):
            return name
    return None


def diagnose_plan(case: PlanCase, answer: PlanAnswer, misreading: str | None = None) -> str | None:
    """None when the answer is the rule's; else what was expected, what was seen, and why.
    ``misreading``: the rule's misreading seen on every case (misreading_of), if any."""
    want = best_plan(case.model, case.devices, case.batch)
    head = f"{case.describe()}: expected {show(want)}"
    if answer.error:
        return f"{head}; plan raised {answer.error}"
    if answer.other is not None:
        return f"{head}; plan returned {answer.other}, not a dict with keys dp, tp, pp (or None)"
    got = answer.layout
    if got == want:
        return None
    seen = f"; saw {show(got)}"
    if got is None:
        assert want is not None
        m = memory_per_device(case.model, case.batch, want["dp"], want["tp"], want["pp"])
        return f"{head}{seen}, but {show(want)} fits: it needs {gib(m.total)} of {gib(case.devices['memory_bytes'])}"
    faults = layout_faults(case.model, case.devices, case.batch, got)
    if faults:
        return f"{head}{seen}, which is not a legal layout: {'; '.join(faults)}"
    m = memory_per_device(case.model, case.batch, got["dp"], got["tp"], got["pp"])
    limit = case.devices["memory_bytes"]
    need = (f"{show(got)} needs {gib(m.total)} per device ({gib(m.state)} of weights, gradients and "
            f"Adam state at 16 bytes per parameter, {gib(m.activations)} of activations) and a "
            f"device has {gib(limit)}")
    # The usual misreadings of the rule, recognised by giving exactly their answer: the one seen
    # on every case if there is one, else all those that match this case.
    names = [misreading] if misreading else [
        name for name, (kwargs, _) in MISREADINGS.items()
        if got == best_plan(case.model, case.devices, case.batch, **kwargs)]
    if names:
        why = "; or ".join(MISREADINGS[name][1] for name in names)
        return f"{head}{seen}, {why}. {need}"
    if m.total > limit:
        return f"{head}{seen}, which does not fit: {need}"
    assert want is not None  # the learner's layout fits, so some layout does
    got_mp, want_mp = got["tp"] * got["pp"], want["tp"] * want["pp"]
    if got_mp > want_mp:
        return (f"{head}{seen}: it fits, but so does {show(want)} with less model parallelism "
                f"(tp*pp = {want_mp} < {got_mp}); model parallelism puts communication on the "
                "critical path of every layer, so use as little as memory allows")
    if got_mp == want_mp and got["tp"] < want["tp"]:
        return (f"{head}{seen}: same tp*pp = {got_mp}, but the rule takes the widest TP that fits: "
                "TP inside a node (fast links) before PP (bubbles)")
    return f"{head}{seen}"


def diagnose_all_dp(cases: list[PlanCase], answers: list[PlanAnswer]) -> str | None:
    """The starter's placeholder, or a plan that never looks at memory."""
    all_dp = all(a.layout == {"dp": c.devices["count"], "tp": 1, "pp": 1} for c, a in zip(cases, answers))
    need_mp = sum(best_plan(c.model, c.devices, c.batch) != {"dp": c.devices["count"], "tp": 1, "pp": 1}
                  for c in cases)
    if all_dp and need_mp:
        return (f"plan answered pure DP (dp = the device count) for all {len(cases)} cases, but "
                f"{need_mp} of them need model parallelism or cannot fit at all: apply the memory "
                "model (16 bytes per parameter plus activations) and the card's rule")
    return None


# == part 2: the tensor-parallel MLP ===============================================================


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


GRAD_NAMES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
SPLIT = {  # what rank r of p keeps, for the messages
    "fc1.weight": "rank r keeps rows (output features) r*ffn/p .. (r+1)*ffn/p of W1",
    "fc1.bias": "rank r keeps entries r*ffn/p .. (r+1)*ffn/p of b1",
    "fc2.weight": "rank r keeps columns (input features) r*ffn/p .. (r+1)*ffn/p of W2",
    "fc2.bias": "every rank keeps the whole b2",
}


@dataclass
class MlpResult:
    out: np.ndarray | str
    x_grad: np.ndarray | str
    grads: list[dict[str, np.ndarray | str]]  # per block: name -> gradient, or why there is none
    param_counts: list[int]  # per block: elements in module.parameters()
    forward: CommStats
    backward: CommStats


def _plain(t: Any, what: str) -> np.ndarray | str:
    if t is None:
        return f"{what} is None"
    if not isinstance(t, torch.Tensor):
        return f"{what} is a {type(t).__name__}, not a tensor"
    return t.detach().to(torch.float64).numpy().copy()


def _grads(block: Any) -> dict[str, np.ndarray | str]:
    grads: dict[str, np.ndarray | str] = {}
    for name in GRAD_NAMES:
        obj = block
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is None:
            grads[name] = f"ParallelMLP has no {name}"
        else:
            grads[name] = _plain(getattr(obj, "grad", None), f"{name}.grad")
    return grads


def run_mlp(comm, solution, cases):
    """Blocks of the learner's ParallelMLP, forward then backward; counts comm around each."""
    results = []
    for case in cases:
        x0, gout, weights = mlp_inputs(case)
        blocks = [solution.ParallelMLP(comm, *(torch.from_numpy(w.copy()) for w in ws)) for ws in weights]
        x = torch.from_numpy(x0.copy()).requires_grad_(True)
        before = comm.stats.snapshot()
        out = x
        for block in blocks:
            out = block(out)
        middle = comm.stats.snapshot()
        if isinstance(out, torch.Tensor) and out.requires_grad:
            (out * torch.from_numpy(gout)).sum().backward()
        after = comm.stats.snapshot()
        results.append(MlpResult(
            out=_plain(out, "the output"),
            x_grad=_plain(x.grad, "x.grad"),
            grads=[_grads(block) for block in blocks],
            param_counts=[sum(p.numel() for p in block.parameters()) for block in blocks],
            forward=middle.since(before),
            backward=after.since(middle),
        ))
    return results


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


def one_thread() -> None:
    """One torch thread per process, as torchrun sets OMP_NUM_THREADS=1: ranks share the cores,
    and idle intra-op threads spinning on tiny matrices would only steal them from each other."""
    torch.set_num_threads(1)


def run_cases(comm, solution, kind, cases):
    """The program of every launch: the plan cases (on one rank) or the MLP cases."""
    one_thread()
    return run_plans(comm, solution, cases) if kind == "plan" else run_mlp(comm, solution, cases)


def plan_cases(seed: int) -> list[PlanCase]:
    return list(NAMED_CASES) + random_plan_cases(np.random.default_rng([seed, 51]))


def all_tasks(t: CheckContext) -> list[Task]:
    """One launch for every check: the plan cases on rank 0, then the MLP on 2, 3 and 4 ranks.
    (Each rank imports torch, which costs more than everything the checks then run.)"""
    tasks = [Task(ranks=1, args=("plan", plan_cases(t.seed)), label="the plan cases")]
    for cases in mlp_cases(t.seed):
        tasks.append(Task(ranks=cases[0].p, args=("mlp", cases), label=f"the MLP cases with p = {cases[0].p}"))
    return tasks


def failed_in_mlp(exc: RunFailed) -> bool:
    """The shared launch failed in an MLP task (task 0 is the plan cases)."""
    return exc.result.failing_task is not None and exc.result.failing_task >= 1


def mlp_runs(t: CheckContext, first: bool = False) -> list[TaskRun]:
    """The MLP tasks of the shared launch. The plan check, which runs first, catches a failed
    launch to grade plan on its own; the first MLP check then reports the failure in full."""
    try:
        return t.launch(run_cases, all_tasks(t)).tasks[1:]
    except RunFailed as exc:
        if first and not exc.first_report and failed_in_mlp(exc):
            raise RunFailed(exc.result, first_report=True) from None
        raise


@dataclass
class Expected:
    out: np.ndarray
    x_grad: np.ndarray
    grads: list[dict[str, np.ndarray]] = field(default_factory=list)  # whole gradients per block
    weights: list[Weights] = field(default_factory=list)


def single_device(case: MlpCase) -> Expected:
    """The same blocks as one plain torch module on one device, forward and backward."""
    one_thread()
    x0, gout, weights = mlp_inputs(case)
    layers: list[nn.Module] = []
    linears: list[tuple[nn.Linear, nn.Linear]] = []
    for w1, b1, w2, b2 in weights:
        fc1, fc2 = nn.Linear(case.hidden, case.ffn).double(), nn.Linear(case.ffn, case.hidden).double()
        with torch.no_grad():
            fc1.weight.copy_(torch.from_numpy(w1))
            fc1.bias.copy_(torch.from_numpy(b1))
            fc2.weight.copy_(torch.from_numpy(w2))
            fc2.bias.copy_(torch.from_numpy(b2))
        layers += [fc1, nn.GELU(), fc2]
        linears.append((fc1, fc2))
    model = nn.Sequential(*layers)
    x = torch.from_numpy(x0.copy()).requires_grad_(True)
    out = model(x)
    (out * torch.from_numpy(gout)).sum().backward()

    def grad(t: torch.Tensor) -> np.ndarray:
        assert t.grad is not None
        return t.grad.numpy()

    grads = [{"fc1.weight": grad(fc1.weight), "fc1.bias": grad(fc1.bias),
              "fc2.weight": grad(fc2.weight), "fc2.bias": grad(fc2.bias)} for fc1, fc2 in linears]
    return Expected(out.detach().numpy(), grad(x), grads, weights)


def shard(name: str, whole: np.ndarray, rank: int, p: int) -> np.ndarray:
    """Rank ``rank``'s part of a whole gradient, by the card's split."""
    if name == "fc2.bias":
        return whole  # replicated
    if name == "fc2.weight":
        size = whole.shape[1] // p
        return whole[:, rank * size:(rank + 1) * size]
    size = whole.shape[0] // p
    return whole[rank * size:(rank + 1) * size]


def close(got: np.ndarray | str, want: np.ndarray) -> bool:
    return (isinstance(got, np.ndarray) and got.shape == want.shape
            and bool(np.allclose(got, want, rtol=RTOL, atol=ATOL)))


def worst(got: np.ndarray, want: np.ndarray) -> str:
    i = np.unravel_index(int(np.argmax(np.abs(got - want))), want.shape)
    return f"at index {tuple(int(k) for k in i)} expected {want[i]:.6g}, saw {got[i]:.6g}"


def diagnose_output(case: MlpCase, results: list[MlpResult], want: Expected) -> str | None:
    for rank, r in enumerate(results):
        if isinstance(r.out, str):
            return f"{case.label()}: on rank {rank} {r.out}"
        if r.out.shape != want.out.shape:
            return f"{case.label()}: rank {rank}'s output has shape {r.out.shape}, expected {want.out.shape}"
    outs = [r.out for r in results if isinstance(r.out, np.ndarray)]  # all of them, checked above
    if all(close(out, want.out) for out in outs):
        return None
    head = f"{case.label()}: the output differs from the single-device module"
    b2 = want.weights[-1][3]
    total = np.sum(outs, axis=0)
    if case.blocks == 1:
        if all(close(out, want.out + (case.p - 1) * b2) for out in outs):
            return (f"{head} by exactly (p - 1) * b2 on every rank: the bias of the row-parallel layer "
                    "was added on every rank, so the allreduce counted it p times; add it once, after the sum")
        if close(total, want.out) or close(total - (case.p - 1) * b2, want.out):
            return (f"{head}, but the ranks' outputs add up to it: each rank holds only its own partial "
                    "sum; the row-parallel output must be allreduced in forward (g)")
    for rank, out in enumerate(outs):
        if not close(out, want.out):
            return f"{head} on rank {rank}, {worst(out, want.out)}"
    return head


def diagnose_input_grad(case: MlpCase, results: list[MlpResult], want: Expected) -> str | None:
    for rank, r in enumerate(results):
        if isinstance(r.x_grad, str):
            return (f"{case.label()}: on rank {rank} {r.x_grad}: no gradient reached the input; "
                    "does the forward keep the autograd graph (autograd.Function, not .detach())?")
        if r.x_grad.shape != want.x_grad.shape:
            return f"{case.label()}: rank {rank}'s x.grad has shape {r.x_grad.shape}, expected {want.x_grad.shape}"
    grads = [r.x_grad for r in results if isinstance(r.x_grad, np.ndarray)]  # all, checked above
    if all(close(g, want.x_grad) for g in grads):
        return None
    head = f"{case.label()}: the input gradient dL/dx differs from the single-device module"
    total = np.sum(grads, axis=0)
    if case.blocks == 1 and close(total, want.x_grad):
        return (f"{head}, but the ranks' input gradients add up to it: each rank holds only its own "
                "shard's part; f (in front of the column-parallel layer) must allreduce in backward")
    if all(close(g, case.p * want.x_grad) for g in grads):
        return (f"{head}: it is p = {case.p} times too large on every rank: a gradient that was "
                "already whole was allreduced again")
    for rank, g in enumerate(grads):
        if not close(g, want.x_grad):
            return f"{head} on rank {rank}, {worst(g, want.x_grad)}"
    return head


def diagnose_weight_grads(case: MlpCase, results: list[MlpResult], want: Expected) -> str | None:
    for block in range(case.blocks):
        for name in GRAD_NAMES:
            whole = want.grads[block][name]
            for rank, r in enumerate(results):
                got = r.grads[block][name]
                mine = shard(name, whole, rank, case.p)
                where = f"{case.label()}: block {block}, rank {rank}, {name}.grad"
                if isinstance(got, str):
                    return f"{case.label()}: block {block}, rank {rank}: {got}"
                if got.shape != mine.shape:
                    return (f"{where} has shape {got.shape}, expected {mine.shape}: {SPLIT[name]}")
                if not close(got, mine):
                    if close(got, case.p * mine):
                        return (f"{where} is p = {case.p} times too large: a gradient that was already "
                                "whole was allreduced again")
                    return f"{where} differs from the single-device module's, {worst(got, mine)}"
    return None


CHECKS = Checklist()


@CHECKS.check("plan picks the rule's layout on a table of cases", points=4)
def plan_table(t: CheckContext) -> None:
    tasks = all_tasks(t)
    cases = tasks[0].args[1]
    t.say(f"{len(NAMED_CASES)} named cases and {len(cases) - len(NAMED_CASES)} hidden ones; 16 bytes "
          "per parameter plus activations, least model parallelism first, TP before PP")
    try:
        run = t.launch(run_cases, tasks)
    except RunFailed as exc:
        if not failed_in_mlp(exc):
            raise
        # The MLP part failed (its checks say how); ask plan on its own, so this check still grades.
        t.say("the MLP run failed (see the checks below): asking plan on its own")
        run = t.launch(run_cases, tasks[:1])
    answers = run.tasks[0].values[0]
    if message := diagnose_all_dp(cases, answers):
        t.fail(message)
    misreading = misreading_of(cases, answers)
    wrong = [msg for case, answer in zip(cases, answers) if (msg := diagnose_plan(case, answer, misreading))]
    t.metric("cases", len(cases))
    t.metric("wrong", len(wrong))
    if wrong:
        more = f" (and {len(wrong) - 1} more wrong case(s))" if len(wrong) > 1 else ""
        t.fail(wrong[0] + more)
    kinds = {"DP": 0, "TP": 0, "PP": 0, "none": 0}
    for case in cases:
        layout = best_plan(case.model, case.devices, case.batch)
        kinds["none" if layout is None else "PP" if layout["pp"] > 1 else "TP" if layout["tp"] > 1 else "DP"] += 1
    t.say(f"all {len(cases)} agree ({kinds['DP']} pure DP, {kinds['TP']} with TP, {kinds['PP']} with PP, "
          f"{kinds['none']} with nothing that fits)")


@CHECKS.check("TP MLP: output and every gradient equal the single-device module", points=4)
def mlp_matches(t: CheckContext) -> None:
    t.say("p = 2, 3, 4; one block, then a stack of 2-3; float64; output, dL/dx and the "
          "gradient shards of W1, b1, W2, b2 against torch on one device")
    checked = 0
    for task_run in mlp_runs(t, first=True):
        for i, case in enumerate(task_run.task.args[1]):
            want = single_device(case)
            results = [rank_results[i] for rank_results in task_run.values]
            for diagnose in (diagnose_output, diagnose_input_grad, diagnose_weight_grads):
                message = diagnose(case, results, want)
                if message:
                    t.fail(message)
            checked += 1
    t.metric("cases", checked)
    t.say(f"{checked} cases agree on every rank")


@CHECKS.check("each rank keeps 1/p of the weights (within 1%)", points=2)
def weights_split(t: CheckContext) -> None:
    worst_ratio = 0.0
    for task_run in mlp_runs(t):
        for i, case in enumerate(task_run.task.args[1]):
            share = case.whole_params / case.p
            for rank, rank_results in enumerate(task_run.values):
                for block, count in enumerate(rank_results[i].param_counts):
                    ratio = count / share
                    worst_ratio = max(worst_ratio, abs(ratio - 1))
                    hint = (": the whole block, unsplit" if count == case.whole_params else "")
                    t.expect(abs(ratio - 1) <= MEMORY_TOLERANCE,
                             f"about {share:.0f} parameter elements per rank per block (1/p of "
                             f"{case.whole_params}, within 1%)",
                             f"{case.label()}: block {block} on rank {rank} keeps {count} "
                             f"({ratio:.2f}x the share){hint}")
    t.metric("worst_deviation", round(worst_ratio, 5))
    t.say(f"every rank keeps its share, at most {worst_ratio:.2%} over (the replicated bias b2)")


def allreduce_calls(stats: CommStats) -> int:
    return stats.calls.get("Allreduce", 0)  # Iallreduce counts here too


def allreduce_bytes(stats: CommStats) -> int:
    return stats.op_bytes.get("Allreduce", 0)


def other_calls(stats: CommStats) -> list[str]:
    """Communication besides Allreduce: point-to-point calls and the other collectives."""
    return sorted(op for op, n in stats.calls.items()
                  if n and op != "Allreduce" and (op in POINT_TO_POINT or op in COLLECTIVES))


@CHECKS.check("one allreduce of tokens x hidden values in forward, one in backward, per block", points=2)
def one_allreduce_each_way(t: CheckContext) -> None:
    for task_run in mlp_runs(t):
        for i, case in enumerate(task_run.task.args[1]):
            size = case.tokens * case.hidden * 8  # float64 activations of one block
            for rank, rank_results in enumerate(task_run.values):
                r: MlpResult = rank_results[i]
                for phase, stats in (("forward", r.forward), ("backward", r.backward)):
                    calls, others = allreduce_calls(stats), other_calls(stats)
                    head = f"{case.label()}: rank {rank}, {phase}"
                    if others:
                        t.fail(f"{head} called {', '.join(others)}: a TP block needs one Allreduce "
                               f"each way and nothing else")
                    if calls != case.blocks:
                        why = ""
                        if phase == "forward" and calls == 2 * case.blocks:
                            why = (": two per block; f's forward must be the identity (its input is "
                                   "already the same on every rank), only g allreduces in forward")
                        elif phase == "forward" and calls == 0:
                            why = ": none at all; the row-parallel partial sums must be added (g)"
                        elif phase == "backward" and calls == 0:
                            why = ": none at all; f's backward must add the input-gradient parts"
                        elif phase == "backward" and calls == 2 * case.blocks:
                            why = ": two per block; g's backward must be the identity"
                        t.fail(f"{head} made {calls} allreduce call(s), expected exactly {case.blocks} "
                               f"(one per block){why}")
                    moved = allreduce_bytes(stats)
                    t.expect(moved == case.blocks * size,
                             f"{case.blocks} x {size} bytes (tokens x hidden float64 per block)",
                             f"{head} allreduced {moved} bytes: the allreduce carries the "
                             "activations (or their gradient), not the weights")
    t.say("one forward and one backward allreduce of tokens x hidden per block, on every rank")


def ring_time(t: CheckContext, p: int, nbytes: int) -> float:
    """The ring allreduce bound 2(p-1) alpha + 2(p-1)/p n beta, with the slowest ring link."""
    routes = [t.platform.route(r, (r + 1) % p) for r in range(p)]
    alpha = max(r.alpha_s for r in routes)
    beta = max(r.beta_s_per_byte for r in routes)
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta


@CHECKS.check("TP communication time within 5% of two ring allreduces per block", points=2)
def tp_time(t: CheckContext) -> None:
    worst_ratio = 0.0
    for task_run in mlp_runs(t):
        cases = task_run.task.args[1]
        p = cases[0].p
        for i, case in enumerate(cases):
            for rank, rank_results in enumerate(task_run.values):
                r: MlpResult = rank_results[i]
                t.expect(allreduce_calls(r.forward) == allreduce_calls(r.backward) == case.blocks
                         and not other_calls(r.forward) and not other_calls(r.backward),
                         "one allreduce each way per block before the time is graded",
                         f"{case.label()}: rank {rank} made {allreduce_calls(r.forward)} in forward "
                         f"and {allreduce_calls(r.backward)} in backward (see the check above)")
        bound = sum(2 * c.blocks * ring_time(t, p, c.tokens * c.hidden * 8) for c in cases)
        measured = t.measured_time(task_run)
        t.say(f"p = {p}: {measured * 1e6:.1f} us {t.clock} for {sum(2 * c.blocks for c in cases)} "
              f"allreduces, bound {bound * 1e6:.1f} us ({measured / bound:.3f}x)")
        if measured / bound >= worst_ratio:
            worst_ratio = measured / bound
            t.performance(measured, bound, task_run)
        t.expect(measured <= (1 + TIME_TOLERANCE) * bound,
                 f"at most {(1 + TIME_TOLERANCE) * bound * 1e6:.1f} us (5% over the bound)",
                 f"{measured * 1e6:.1f} us for p = {p}, {measured / bound:.2f}x: more communication "
                 "than one allreduce of the activations each way per block")
    t.metric("worst_time_over_bound", round(worst_ratio, 4))


# == the free run =================================================================================


def main(comm, solution, hidden="512", tokens="256", blocks="2"):
    """A free run (distlab run, mpirun, torchrun): a stack of TP MLP blocks, forward and backward,
    with the matmuls declared on the virtual clock; rank 0 compares with one device and asks plan
    about a 7B model on one 8 x 80 GiB server."""
    one_thread()
    p, rank = comm.Get_size(), comm.Get_rank()
    h, n, k = int(hidden), int(tokens), int(blocks)
    ffn = 4 * h
    if ffn % p:
        return f"ffn = 4 * hidden = {ffn} must be a multiple of the {p} ranks" if rank == 0 else None
    case = MlpCase(p, 1, n, h, ffn, k, 12345)
    x0, gout, weights = mlp_inputs(case)
    mlp = [solution.ParallelMLP(comm, *(torch.from_numpy(w.astype(np.float32)) for w in ws)) for ws in weights]
    x = torch.from_numpy(x0.astype(np.float32)).requires_grad_(True)
    flops = 2 * 2 * n * h * ffn / p  # two matmuls per block, this rank's share
    comm.mark("forward")
    out = x
    for block in mlp:
        comm.compute(flops=flops, label="block forward")
        out = block(out)
    comm.mark("backward")
    comm.compute(flops=2 * flops * k, label="backward")
    (out * torch.from_numpy(gout.astype(np.float32))).sum().backward()
    if rank != 0:
        return None
    want = single_device(case)
    err = float(np.max(np.abs(out.detach().numpy() - want.out)))
    verdict = "matches" if err < 1e-3 * max(1.0, float(np.max(np.abs(want.out)))) else "DIFFERS FROM"
    tp_bytes = 2 * n * h * 4
    dp_bytes = case.whole_params * 4
    layout = solution.plan(dict(NAMED_CASES[2].model), dict(NAMED_CASES[2].devices), NAMED_CASES[2].batch)
    return (f"p={p}, {k} block(s), hidden {h}, {n} tokens: output {verdict} one device (max err {err:.1e}); "
            f"TP moves {tp_bytes / 2**20:.2f} MiB per block per step (DP would move {dp_bytes / 2**20:.2f} MiB "
            f"of gradients); plan(7B, 8 x 80 GiB, batch 8) = {layout}")
