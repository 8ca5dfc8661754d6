"""How problem 13 reads a run: the weights every rank ends with and the mistake behind wrong ones,
each rank's optimizer state against its shard of plain Adam's moments, what each rank's process
kept between steps as its agent read it, the bytes each rank sent on the replay, the calculator's
answers, and the report's picture."""

from dataclasses import dataclass
from functools import lru_cache
from math import ceil
from typing import Any

import numpy as np

from distlab.grading import HeldMemory, SentLog, TaskRun, first_mismatch

from . import cases
from .cases import (
    FP16_GRADS,
    FP16_WEIGHTS,
    GB,
    OPTIMIZER_STATES,
    Memory,
    Training,
)
from .programs import Trained


# The calculator's answers: here, where the learner's process cannot call them (cases.py is read there).
def zero_gb(params: float, ranks: int, stage: int) -> float:
    """The ZeRO paper's closed forms, in GB per rank: 16 psi, 4 psi + 12 psi / Nd, 2 psi + 14 psi / Nd, 16 psi / Nd."""
    whole = FP16_WEIGHTS + FP16_GRADS + OPTIMIZER_STATES
    sharded = (0, OPTIMIZER_STATES, OPTIMIZER_STATES + FP16_GRADS, whole)[stage]
    return params * ((whole - sharded) + sharded / ranks) / GB

# -- plain data-parallel Adam, the answer -------------------------------------------------------------


@dataclass(frozen=True)
class Adam:
    weights: np.ndarray  # after case.steps steps
    m: np.ndarray  # the first moment (momentum) of every parameter
    v: np.ndarray  # the second moment (variance)
    losses: tuple[float, ...]  # the global batch's loss before each step
    path: tuple[np.ndarray, ...]  # the weights after each step, float32 (the last is ``weights``)


@lru_cache(maxsize=8)
def plain_adam(case: Training, first_step: int = 1, average: bool = True) -> Adam:
    """Single-process data-parallel Adam in float64 on the global batch, whose gradient is the mean of
    the ranks' gradients. ``first_step``: the step count the bias correction starts from (1 is
    right); ``average=False`` sums the ranks' gradients instead: the wrong answers the checks name."""
    w = cases.initial_weights(case).astype(np.float64)
    m, v, losses, path = np.zeros_like(w), np.zeros_like(w), [], []
    for step in range(case.steps):
        parts = [cases.local_gradient(case, w.astype(np.float32), r, step) for r in range(case.p)]
        grad = np.sum([g.astype(np.float64) for _, g in parts], axis=0) / (case.p if average else 1)
        losses.append(float(np.mean([loss for loss, _ in parts])))
        m = case.beta1 * m + (1 - case.beta1) * grad
        v = case.beta2 * v + (1 - case.beta2) * grad**2
        t = step + first_step
        w = w - case.lr * (m / (1 - case.beta1**t)) / (np.sqrt(v / (1 - case.beta2**t)) + case.eps)
        path.append(w.astype(np.float32))  # 10^6 parameters a step: what a rank sends is float32
    return Adam(w, m, v, tuple(losses), tuple(path))


WEIGHT_TOL = 1e-3  # |weight - plain Adam's| at most this x lr (float32 ranks sit within 2e-4 x lr)
MOMENT_TOL = 1e-4  # |moment - plain Adam's| at most this x the largest |moment| (ranks: within 4e-7)
STATE_SLACK = 0.01  # a rank's moments at most 1% over 2 N x 4 bytes / p
BYTES_SLACK = 0.05  # bytes per step within 5% of data parallel's
GB_RTOL = 0.005  # the calculator within 0.5% of the closed forms
MOMENT_BYTES = 4  # float32 moments, like the weights
# What a rank's process may keep between steps beyond its shard's moments: pages, the interpreter's
# own objects (measured: within 0.7 MiB, sealed or not, MPI or gloo); whole moments are 3.6 MB
# (p = 2) to 5.4 MB (p = 4) more.
HELD_SLACK = 3 << 19
MARK_NAMES = ("footprint", "rest", "kept", "done")  # the training program's marks (programs.train)


def train_marks(case: Training) -> list[str]:
    """The training program's marks in order: "footprint", then "rest" and "kept" around each step's
    pause, then "done"."""
    return ["footprint", *(["rest", "kept"] * case.steps), "done"]


def weights_close(got: np.ndarray, want: np.ndarray, case: Training) -> bool:
    return first_mismatch(np.asarray(got, np.float64), want, rtol=0.0, atol=WEIGHT_TOL * case.lr) is None


# -- the weights -----------------------------------------------------------------------------------


def weights_problem(case: Training, replicas: list[np.ndarray], shards: list[tuple[int, int] | None]) -> str | None:
    """None if every rank holds plain Adam's weights, else what is wrong, with its cause named where
    the weights are exactly those of one known mistake. ``shards``: each rank's [lo, hi), as its
    state() says (None: the card's ceil(N / p) blocks)."""
    right, initial = plain_adam(case), cases.initial_weights(case)
    if all(weights_close(w, right.weights, case) for w in replicas):
        return None
    if all(np.array_equal(w, initial) for w in replicas):
        return "every rank still holds the initial weights: no update was applied (update `weights` in place)"
    if not all(np.all(np.isfinite(w)) for w in replicas):
        return "the weights hold NaN or inf after training (is a bias correction 1 - beta ** t taken at t = 0?)"
    for r, w in enumerate(replicas):
        if r and not np.array_equal(w, replicas[0]):
            lo, hi = shards[r] or cases.shard_of(case.size, case.p, r)
            outside = np.ones(case.size, bool)
            outside[lo:hi] = False
            if np.array_equal(w[outside], initial[outside]):
                return (f"the ranks drift apart: rank {r}'s weights outside its own shard [{lo}, {hi}) are still the "
                        "initial ones: the updated shards were never allgathered to every rank")
            bad = first_mismatch(w, replicas[0])
            return f"the ranks drift apart: rank {r}'s weights differ from rank 0's, {bad.describe()}"
    got = np.asarray(replicas[0], np.float64)
    kept = (case.size // case.p) * case.p
    if kept < case.size and all(np.array_equal(w[kept:], initial[kept:]) for w in replicas):
        return (f"the last {case.size - kept} parameter(s), [{kept}, {case.size}), still hold their initial values on "
                f"every rank (plain Adam moves the last, the output bias, by about lr a step): shards of N // p = "
                f"{case.size // case.p} drop the remainder of N = {case.size}; pad to p x ceil(N / p)")
    if weights_close(got, plain_adam(case, first_step=2).weights, case):
        return ("the weights are those of Adam whose bias correction counts steps from 2: the first step must "
                "divide by 1 - beta1 ** 1 and 1 - beta2 ** 1 (t = 1), then t = 2, ...")
    if weights_close(got, plain_adam(case, average=False).weights, case):
        return ("the weights are those of Adam on the SUM of the ranks' gradients: divide the reduce-scattered "
                "gradient by p (each rank's gradient is its own batch's mean)")
    bad = first_mismatch(got, right.weights, rtol=0.0, atol=WEIGHT_TOL * case.lr)
    return f"the weights differ from plain data-parallel Adam's, {bad.describe()}"


# -- the optimizer state ---------------------------------------------------------------------------


def trajectory_of(case: Training, weights: np.ndarray) -> Adam | None:
    """The plain Adam run whose weights these are: the right one, or one of a known mistake in the
    arithmetic (the bias correction from t = 2; the gradients summed), with the moments a right
    optimizer would hold along it; None for any other weights."""
    for adam in (plain_adam(case), plain_adam(case, first_step=2)):
        if weights_close(weights, adam.weights, case):
            return adam
    summed = plain_adam(case, average=False)
    if weights_close(weights, summed.weights, case):
        return Adam(summed.weights, summed.m / case.p, summed.v / case.p**2, summed.losses, summed.path)
    return None


def owned(state: dict[str, Any], size: int) -> tuple[int, int]:
    start = state["start"]
    return start, min(size, start + state["m"].size)


def coverage_problem(case: Training, states: list[dict[str, Any]]) -> str | None:
    """None if the ranks' shards cover every parameter once, else what is wrong."""
    count = np.zeros(case.size, int)
    for state in states:
        lo, hi = owned(state, case.size)
        if not 0 <= lo <= case.size:
            return f"a shard starts at {lo}, outside the {case.size} parameters"
        count[lo:hi] += 1
    if np.all(count == case.p):
        return (f"every rank holds moments for all {case.size} parameters: the optimizer state is not sharded "
                "(each rank needs the moments of its own shard only)")
    if np.any(count == 0):
        missing = np.flatnonzero(count == 0)
        floor = case.size // case.p
        # The remainder dropped: the missing ones are the tail, and every shard is N // p long.
        dropped = missing[0] >= floor * case.p and all(s["m"].size <= floor for s in states)
        overlap = (f"; and parameter {int(np.argmax(count > 1))} is in {int(count.max())} ranks' shards: does each "
                   "state()'s start agree with where its shard begins?") if np.any(count > 1) else ""
        return (f"{missing.size} parameter(s) belong to no rank's shard, from {missing[0]}"
                + (f": shards of N // p drop the remainder of N = {case.size}; use ceil(N / p) and pad" if dropped
                   else overlap))
    if np.any(count > 1):
        return f"parameter {int(np.argmax(count > 1))} is in {int(count.max())} ranks' shards: shards must not overlap"
    return None


def state_size_problem(case: Training, rank: int, state: dict[str, Any]) -> str | None:
    whole = 2 * case.size * MOMENT_BYTES
    limit = (1 + STATE_SLACK) * whole / case.p
    held = max(state["nbytes"], MOMENT_BYTES * (state["m"].size + state["v"].size))  # the values came back: count them
    if held <= limit:
        return None
    why = (": the moments are float64; keep them float32 like the weights" if held >= 1.9 * whole / case.p
           and 8 * (state["m"].size + state["v"].size) == held else "")
    return (f"rank {rank} holds {held:,} bytes of moments ({state['m'].size} + {state['v'].size} values); "
            f"1/p of plain Adam's 2 x {case.size} x 4 = {whole:,} bytes is {whole / case.p:,.0f} "
            f"(at most {STATE_SLACK:.0%} over){why}")


def hidden_copies(case: Training, shard: tuple[int, int], reachable: dict[str, np.ndarray], adam: Adam) -> str | None:
    """A whole-size moment kept in the optimizer object (a copy, or an N-long array of which only
    the rank's own slice is used), though state() may return a shard. ``reachable`` is the rank's
    word (its process walked the object): what it shows convicts, what it misses (a module global)
    clears nothing: footprint_problem, on its agent's readings, does."""
    lo, hi = shard
    for path, array in sorted(reachable.items()):
        if array.size < case.size:
            continue
        rows = array.reshape(-1, array.shape[-1])
        for row in rows:  # each row of a stacked (2, n) array on its own
            for name, whole in (("momentum m", adam.m), ("variance v", adam.v)):
                if row.size >= case.size and moments_close(row[lo:hi], whole[lo:hi]):
                    return (f"{path} holds an array of {row.size} values holding the {name} (checked over [{lo}, {hi})): "
                            "a whole-size moment on every rank; allocate the moments of your shard only")
    return None


def footprint_problem(case: Training, rank: int, held: HeldMemory, first: bool) -> str | None:
    """None if rank ``rank``'s process keeps its shard's moments between steps and little else,
    else what it keeps beyond them. ``held``: its memory readings, taken by its agent from /proc:
    what the optimizer keeps is the most held in the pauses after its steps beyond what was held at
    the mark "footprint" (the view's arrays there, the optimizer not yet). In the launch's ``first``
    task, what the process held at "footprint" beyond the view's arrays, since before the learner's
    file was imported, counts too: memory set aside at import would otherwise hold whole moments
    unseen. (Later tasks hold what the harness kept of the ones before.)"""
    shard, whole = case.shard_bytes(), 2 * case.size * MOMENT_BYTES
    kept = kept_between_steps(case, held)
    early = held.at("footprint") - held.before_solution - case.harness_bytes() if first and held.before_solution >= 0 else 0
    if kept < shard - HELD_SLACK:
        return (f"rank {rank}'s process held {mib(kept)} more after the optimizer's steps than before it was "
                f"made, less than its shard's moments (2 x ceil(N / p) x 4 = {mib(shard)}): where does it keep "
                "them? The probe counts every page the process holds in memory, and files on its /tmp")
    if kept + max(early, 0) <= shard + HELD_SLACK:
        return None
    if early > HELD_SLACK:
        return (f"rank {rank}'s process already held {mib(early)} more when the optimizer was about to be made "
                f"than the harness's arrays ({mib(case.harness_bytes())}) and the interpreter account for, then "
                f"{mib(kept)} more after its steps; its shard's moments are {mib(shard)}: memory kept from the "
                "import of your file counts (a module-level array, or a large library such as torch: the "
                "probe cannot tell them apart)")
    as_whole = " as much as plain Adam's whole m and v:" if kept >= 0.9 * whole else ""
    return (f"rank {rank}'s process holds {mib(kept)} more between the optimizer's steps than before it was "
            f"made (as the kernel counts its memory, wherever the optimizer keeps it),{as_whole} {kept / shard:.2f}x "
            f"its shard's moments, 2 x ceil(N / p) x 4 = {mib(shard)}; a sharded Adam keeps nothing whole-size "
            "between steps")


def without_log(held: HeldMemory, sent: SentLog) -> HeldMemory:
    """Unsealed, the copy of what a rank sent (Task(record_sent=True)) is kept in its own process, and
    read as its memory: each reading less the bytes logged before its mark (an unsealed rank's
    readings are as advisory as its counters; sealed, the log is its agent's)."""
    logged = np.cumsum(np.bincount([item.after_marks for item in sent.items],
                                   [item.data.nbytes for item in sent.items], minlength=len(held.marks) + 1))
    marks = tuple((name, at - int(logged[min(i, len(logged) - 1)]), peak - int(logged[min(i, len(logged) - 1)]))
                  for i, (name, at, peak) in enumerate(held.marks))
    return HeldMemory(held.before_solution, marks)


def kept_between_steps(case: Training, held: HeldMemory) -> int:
    """The most the process held in the pauses after the steps (from "rest" to "kept", sampled by the
    agent while no code of the learner's ran) beyond what it held when the optimizer was about to be
    made: what the optimizer keeps between steps, whenever the learner's code would drop it."""
    return max(held.peak_to("kept", k) for k in range(case.steps)) - held.at("footprint")


def evidence_problem(run: Any) -> str | None:
    """None when every rank handed back the program's evidence (a Trained with a float32 weight
    vector of the model's size): the program runs in the solution's process, and a string in its
    place once crashed the checks that read it."""
    for rank, value in enumerate(run.values):
        weights = getattr(value, "weights", None)
        if type(value) is not Trained or not isinstance(weights, np.ndarray) or weights.shape != (run.case.size,):
            return (f"rank {rank}'s program handed back a {type(value).__name__}, not its weights "
                    f"and optimizer state after training: was train replaced?")
    return None


def run_weights_problem(run: Any) -> str | None:
    """weights_problem of a training run (a CaseRun): its ranks' weights against plain Adam's."""
    if problem := evidence_problem(run):
        return problem
    shards = [owned(v.state, run.case.size) if isinstance(v.state, dict) else None for v in run.values]
    return weights_problem(run.case, [v.weights for v in run.values], shards)


def mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


def moments_close(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.max(np.abs(got - want), initial=0.0) <= MOMENT_TOL * max(float(np.max(np.abs(want))), 1e-30))


def values_problem(case: Training, rank: int, state: dict[str, Any], adam: Adam) -> str | None:
    lo, hi = owned(state, case.size)
    m, v = state["m"][: hi - lo], state["v"][: hi - lo]
    if moments_close(m, adam.m[lo:hi]) and moments_close(v, adam.v[lo:hi]):
        return None
    ratio_m = float(np.median(m / np.where(adam.m[lo:hi] == 0, np.nan, adam.m[lo:hi])))
    ratio_v = float(np.median(v / np.where(adam.v[lo:hi] == 0, np.nan, adam.v[lo:hi])))
    head = (f"rank {rank}'s moments over [{lo}, {hi}) differ from plain Adam's there; median ratio m {ratio_m:.3g}, "
            f"v {ratio_v:.3g}")
    if abs(ratio_m / case.p - 1) < 0.05 and abs(ratio_v / case.p**2 - 1) < 0.05:
        return (f"{head}: m is p = {case.p} times plain Adam's and v p^2 times: the gradients were summed, not "
                "averaged; divide the reduce-scattered gradient by p (Adam's step hides it: it is scale-free but for eps)")
    return head


def unshared_update(case: Training, rank: int, shard: tuple[int, int], sent: SentLog, adam: Adam) -> str | None:
    """None if after every step the rank sent its shard of the updated weights (or of the update
    itself) in one message of at most its padded shard: what its peers cannot compute without its
    moments. A rank that updates every parameter itself (a whole-gradient allreduce) holds whole
    moments, whatever its state() reports; its agent's copy of what it sent says so."""
    lo, hi = shard
    if hi <= lo:
        return None
    if sent.overflowed:
        return f"rank {rank} sent more than the harness keeps a copy of: what it sent cannot be read"
    longest = ceil(case.size / case.p)
    before = cases.initial_weights(case).astype(np.float64)
    for step, after in enumerate(adam.path, 1):
        wanted = (after[lo:hi], (after - before)[lo:hi])
        if not any(_carries(item.data, want, case, longest) for item in sent.items for want in wanted):
            return (f"rank {rank} never sent its updated shard of the weights, [{lo}, {hi}), after step {step}: "
                    "ZeRO hands each owner's updated shard to the others (the allgather); a rank whose peers never "
                    "receive it updates every parameter itself, with whole moments")
        before = after
    return None


def _carries(data: np.ndarray, want: np.ndarray, case: Training, longest: int) -> bool:
    n = want.size
    if not n <= data.size <= longest or data.dtype.kind != "f":
        return False
    return first_mismatch(data[:n].astype(np.float64), want, rtol=0.0, atol=WEIGHT_TOL * case.lr) is None


# -- bytes -----------------------------------------------------------------------------------------


def sent_per_step(task: TaskRun, steps: int) -> dict[int, float]:
    """Each rank's bytes on the wire per step, as the replay moved them (every collective's flows)."""
    sent: dict[int, float] = {}
    for (src, _), nbytes in task.timeline().pair_bytes.items():
        sent[src] = sent.get(src, 0.0) + nbytes / steps
    return sent


def bytes_problem(case: Training, rank: int, mine: float, baseline: float) -> str | None:
    ratio = mine / baseline if baseline else float("inf")
    if abs(ratio - 1) <= BYTES_SLACK:
        return None
    head = (f"{case.label()}: rank {rank} sent {mine:,.0f} bytes per step; data parallel's allreduce sends "
            f"{baseline:,.0f} ({ratio:.2f}x, within {BYTES_SLACK:.0%} expected)")
    if mine == 0:
        return head + ": it sent nothing"
    if abs(ratio - 1.5) < 0.1:
        return head + ": an allreduce of the whole gradient AND an allgather; a reduce-scatter is all a shard needs"
    if abs(ratio - 0.5) < 0.1:
        return head + ": half of it, one of the two phases (reduce-scatter, allgather) is missing"
    return head


# -- the calculator --------------------------------------------------------------------------------


def calculator_problems(questions: list[Memory], answers: list[Any]) -> list[str]:
    wrong = []
    for q, a in zip(questions, answers):
        if isinstance(a, str):
            return [a]
        want = zero_gb(q.params, q.ranks, q.stage)
        if not isinstance(a, (int, float, np.integer, np.floating)) or isinstance(a, bool):
            # The rank program runs in the solution's process: a list once crashed this check.
            wrong.append(f"{q.label()}: expected {want:.4g} GB, saw a {type(a).__name__}, not a number")
        elif not np.isfinite(a) or abs(a / want - 1) > GB_RTOL:
            wrong.append(f"{q.label()}: expected {want:.4g} GB, saw {a:.4g}" + calculator_cause(q, a))
    return wrong


def calculator_cause(q: Memory, got: float) -> str:
    near = lambda x: abs(got / x - 1) <= GB_RTOL
    if q.stage == 2 and q.ranks > 1 and near(zero_gb(q.params, q.ranks, 1)):
        return (" (stage 1's figure: stage 2 keeps the fp16 gradients whole here; it shards them too: "
                "2 psi + (2 + 12) psi / Nd)")
    if near(zero_gb(q.params, q.ranks, q.stage) * 1e9 / 2**30):
        return " (GiB: the paper's GB are 1e9 bytes)"
    return ""


# -- the picture -----------------------------------------------------------------------------------


def figure_svg(params: float, gpus: int, learner_gb: Any, stage: Any) -> str:
    """Bars of GB per rank at stages 0-3: weights, gradients, optimizer states, each whole or 1/Nd."""
    parts = {"fp16 weights": 2, "fp16 gradients": 2, "optimizer states (fp32 copy, m, v)": 12}
    colours = ("#4c78a8", "#f58518", "#54a24b")
    tallest = zero_gb(params, gpus, 0)
    svg = ['<svg xmlns="http://www.w3.org/2000/svg" width="720" height="360" font-size="13">',
           f'<text x="20" y="22">{params / 1e9:g}B parameters, mixed-precision Adam, on {gpus} ranks: GB per rank</text>']
    for bar in range(4):
        x, base = 60 + bar * 150, 300.0
        for k, (name, per) in enumerate(parts.items()):
            sharded = k >= 3 - bar if bar else False
            height = 240 * params * per / (gpus if sharded else 1) / 1e9 / tallest
            base -= height
            svg.append(f'<rect x="{x}" y="{base:.1f}" width="80" height="{height:.1f}" fill="{colours[k]}"/>')
        svg.append(f'<text x="{x}" y="320">{"baseline" if bar == 0 else f"stage {bar}"}</text>'
                   f'<text x="{x}" y="{base - 6:.1f}">{zero_gb(params, gpus, bar):.1f} GB</text>')
    for k, name in enumerate(parts):
        svg.append(f'<rect x="470" y="{40 + 18 * k}" width="12" height="12" fill="{colours[k]}"/>'
                   f'<text x="488" y="{51 + 18 * k}">{name}</text>')
    if isinstance(learner_gb, (int, float)) and stage in (0, 1, 2, 3):
        svg.append(f'<text x="20" y="348">your calculator, stage {stage}: {learner_gb:.2f} GB '
                   f'(the closed form: {zero_gb(params, gpus, int(stage)):.2f} GB)</text>')
    return "".join(svg) + "</svg>"
