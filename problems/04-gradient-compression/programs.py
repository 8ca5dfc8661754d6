"""What runs on the ranks of problem 04: the click model, one program for every case of the checks'
launch (run_case, plain data back, never objects of the learner's module), and the free run (main).
In the checks a rank is handed its view of each case (Case.for_rank): its own inputs, never the seed."""

import contextlib
import csv
import os
import traceback
from typing import Any

import numpy as np

from . import cases
from .cases import BATCH, BETAS, EPS, FEATURES, HIDDEN, LR, N_PARAMS, OpResult

SWEEP_LR = 0.05  # the top-k runs' momentum SGD


class Raised(str):
    """What a codec call that raised says ("raised ValueError: ... (file.py, line 12, in decompress)"):
    the codec is pure, so one failing call need not end the run."""


# -- the click model -------------------------------------------------------------------------------
def _layers(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    w1 = FEATURES * HIDDEN
    return (theta[:w1].reshape(FEATURES, HIDDEN), theta[w1 : w1 + HIDDEN],
            theta[w1 + HIDDEN : w1 + 2 * HIDDEN], theta[-1:])


def gradient(theta: np.ndarray, x: np.ndarray, clicks: np.ndarray) -> np.ndarray:
    """Gradient of the mean log-loss over the batch, flat like theta (float32)."""
    w1, b1, w2, b2 = _layers(theta)
    h = np.tanh(x @ w1 + b1)
    z = np.clip(h @ w2 + b2[0], -30, 30)
    dz = (1 / (1 + np.exp(-z)) - clicks) / len(clicks)
    dh = np.outer(dz, w2) * (1 - h * h)
    return np.concatenate([(x.T @ dh).ravel(), dh.sum(0), h.T @ dz, [dz.sum()]]).astype(np.float32)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a click outranks a non-click (ties count half)."""
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]  # 1-based, ties averaged
    positive = labels == 1
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return 0.5
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def held_out_auc(seed: int, theta: np.ndarray) -> float:
    x, clicks = cases.examples(seed, cases.TEST_PART, cases.TEST_SIZE)
    theta = np.asarray(theta, dtype=np.float64)
    if theta.shape != (N_PARAMS,) or not np.isfinite(theta).all():
        return float("nan")
    w1, b1, w2, b2 = _layers(theta)
    return auc(np.tanh(x @ w1 + b1) @ w2 + b2[0], clicks)


class Adam:
    """Plain Adam (torch.optim.Adam's update), on a flat float32 vector, in place."""

    def __init__(self, params: np.ndarray, lr: float) -> None:
        self.params, self.lr, self.t = params, lr, 0
        self.m, self.v = np.zeros_like(params), np.zeros_like(params)

    def step(self, grad: np.ndarray) -> None:
        b1, b2 = BETAS
        self.t += 1
        self.m = b1 * self.m + (1 - b1) * grad
        self.v = b2 * self.v + (1 - b2) * grad * grad
        m_hat, v_hat = self.m / (1 - b1**self.t), self.v / (1 - b2**self.t)
        self.params -= (self.lr * m_hat / (np.sqrt(v_hat) + EPS)).astype(np.float32)


def train(comm: Any, solution: Any, shard: tuple[np.ndarray, np.ndarray], start: np.ndarray, steps: int,
          how: str, warmup: int = 0, keep: float = 1.0, feedback: bool = True, free: bool = False) -> np.ndarray:
    """Trains on this rank's ``shard`` (features, clicks) from ``start`` with fp32, fp16, onebit (the
    learner's OneBitAdam) or topk; each step's sync is a phase marked ``how``. ``free``: as the free run
    shows a step. Returns the parameters."""
    x, clicks = shard
    theta = start.copy()
    # Adam for fp32 and fp16 (top-k steps theta itself), the learner's OneBitAdam for onebit.
    optimizer = solution.OneBitAdam(theta, lr=LR, warmup_steps=warmup) if how == "onebit" else Adam(theta, LR)
    # Top-k trains with momentum SGD, as Deep Gradient Compression does: Adam's per-element
    # normalisation would blow up the rare large values that error feedback releases.
    error = np.zeros(N_PARAMS, np.float32) if feedback else None
    velocity = np.zeros(N_PARAMS, np.float32)
    for t in range(steps):
        if free:  # the step marked, its forward and backward pass declared: sync against compute
            comm.mark("step")
            with contextlib.suppress(ValueError):  # a platform without device profiles: no compute
                comm.compute(flops=6 * BATCH * N_PARAMS, label="forward+backward")  # 6 per parameter, example
        batch = slice(t * BATCH, (t + 1) * BATCH)
        grad = gradient(optimizer.params, x[batch], clicks[batch])
        comm.mark(how)  # the sync's phase: it ends at the next step's mark
        if how == "onebit":
            optimizer.step(comm, grad)
        elif how == "topk" and keep < 1:
            solution.topk_allreduce(comm, grad, keep, error)
        else:
            getattr(solution, "fp16_allreduce" if how == "fp16" else "fp32_allreduce")(comm, grad)
        if how == "topk":
            velocity = 0.9 * velocity + grad
            theta -= (SWEEP_LR * velocity).astype(np.float32)
        elif how != "onebit":
            optimizer.step(grad)
    return optimizer.params


# -- the checks' launch: one program for every kind of case ----------------------------------------
def _plain(value: Any) -> Any:
    """A learner's return value as plain data: a NumPy array copy if it is array-like."""
    try:
        array = np.array(value)
    except Exception:  # noqa: BLE001 - anything the learner returns must come back
        return f"a {type(value).__name__}"
    return array if array.dtype != object else f"a {type(value).__name__}"


def _pair(value: Any) -> Any:
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return (_plain(value[0]), _plain(value[1]))
    length = f" of length {len(value)}" if isinstance(value, (tuple, list)) else ""
    return f"a {type(value).__name__}{length}"


def _attempt(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported to the learner with its line
        last = traceback.extract_tb(exc.__traceback__)[-1]  # never empty: it holds this frame at least
        where = f" ({os.path.basename(last.filename)}, line {last.lineno}, in {last.name})"
        return Raised(f"raised {type(exc).__name__}: {exc}{where}")


def _decompressed(solution: Any, packed: Any, n: int) -> Any:
    """decompress of what compress returned, as plain data (None: compress returned no pair)."""
    if not (isinstance(packed, (tuple, list)) and len(packed) == 2):
        return packed if isinstance(packed, Raised) else None
    rebuilt = _attempt(solution.decompress, packed[0], packed[1], n)
    return rebuilt if isinstance(rebuilt, Raised) else _plain(rebuilt)


def run_codec(comm: Any, solution: Any, case: cases.CodecCase) -> cases.CodecResult:
    result = cases.CodecResult()
    for x, chunks, _ in case.vectors:
        packed = _attempt(solution.compress, x.copy(), chunks)
        result.compressed.append(packed if isinstance(packed, Raised) else _pair(packed))
        result.roundtrip.append(_decompressed(solution, packed, x.size))
    signs, scales, n = case.given
    result.decompressed = _decompressed(solution, (signs.copy(), scales.copy()), n)
    x, error0, chunks = case.feedback
    error = error0.copy()
    for _ in range(3):
        packed = _attempt(solution.compress_with_feedback, x.copy(), error, chunks)
        result.feedback.append((_decompressed(solution, packed, x.size), error.copy()))
    return result


def run_wire(comm: Any, solution: Any, case: cases.WireCase) -> dict[str, OpResult]:
    rank, p, n = comm.Get_rank(), comm.Get_size(), case.n
    results: dict[str, OpResult] = {}

    def measured(name: str, what: str, reducer: Any, *state: Any) -> None:
        """One reducer call on this rank's input ``what`` in a phase ``name``: the result, the state after."""
        buf = case.input(rank, what)
        comm.mark(name)
        reducer(comm, buf, *state)
        results[name] = OpResult(buf.copy(), tuple(s.copy() if isinstance(s, np.ndarray) else s for s in state))

    for what in ("fp16", "fp16 large"):
        measured(what, what, solution.fp16_allreduce)
    werr, serr = np.zeros(n, np.float32), cases.server_errors(n, p)[rank]
    for call in (1, 2):
        measured(f"onebit {call}", f"onebit {call}", solution.onebit_allreduce, werr, serr)
    for keep in case.keeps:
        error = np.zeros(n, np.float32)
        for call in (1, 2):
            measured(f"topk {keep} ef {call}", f"topk {keep} {call}", solution.topk_allreduce, keep, error)
        measured(f"topk {keep} plain", f"topk {keep} 1", solution.topk_allreduce, keep, None)
    return results


def run_adam(comm: Any, solution: Any, case: cases.AdamCase) -> list[Any]:
    grads = case.gradients(comm.Get_rank())  # this rank's own, of every step
    optimizer = solution.OneBitAdam(case.start(), lr=case.lr, warmup_steps=case.warmup)
    trajectory = []
    for t in range(case.steps):
        comm.mark("step")
        optimizer.step(comm, grads[t].copy())
        trajectory.append(_plain(optimizer.params))
    return trajectory


def run_training(comm: Any, solution: Any, case: cases.TrainCase) -> dict[str, Any]:
    """FP16 Adam, then 1-bit Adam, each from the same start on this rank's shard: the parameters."""
    shard = case.shard(comm.Get_rank())
    fp16 = train(comm, solution, shard, case.start(), case.steps, "fp16")
    onebit = train(comm, solution, shard, case.start(), case.steps, "onebit", case.warmup)
    return {"fp16": fp16.copy(), "onebit": _plain(onebit)}


def run_timed(comm: Any, solution: Any, case: cases.TimedCase) -> Any:
    """One allreduce by the learner's fp32, fp16 or onebit code (1-bit: from fresh errors). The whole
    1-bit result comes back (a sample of every 256th element was once all that was checked, and
    all that an outside tester's code summed); the others are timed only."""
    rank, n = comm.Get_rank(), case.n
    buf = case.input(rank)
    if case.method == "onebit":
        solution.onebit_allreduce(comm, buf, np.zeros(n, np.float32), cases.server_errors(n, case.p)[rank])
    else:
        getattr(solution, f"{case.method}_allreduce")(comm, buf)
    return buf.copy() if case.method == "onebit" else None


def marks_set(case: Any) -> list[str]:
    """Every mark run_case sets on each rank for ``case``, in order (run_wire's, run_adam's, train's):
    the tasks name them (Task.marks), so that only they begin and end the phases the checks read, and
    the checks count them, so that a mark the learner's code sets of one of these names is caught."""
    if isinstance(case, cases.WireCase):
        names = ["fp16", "fp16 large", "onebit 1", "onebit 2"]
        for keep in case.keeps:
            names += [f"topk {keep} ef 1", f"topk {keep} ef 2", f"topk {keep} plain"]
        return names
    if isinstance(case, cases.AdamCase):
        return ["step"] * case.steps
    if isinstance(case, cases.TrainCase):
        return ["fp16"] * case.steps + ["onebit"] * case.steps
    return []  # the codec and the timed allreduces set none


def task_marks(case: Any) -> tuple[str, ...]:
    """The names of the marks run_case sets for ``case`` (Task.marks)."""
    return tuple(dict.fromkeys(marks_set(case)))


def run_case(comm: Any, solution: Any, case: Any) -> Any:
    program = {cases.CodecCase: run_codec, cases.WireCase: run_wire, cases.AdamCase: run_adam,
               cases.TrainCase: run_training, cases.TimedCase: run_timed}[type(case)]
    return program(comm, solution, case)


# -- the free run ----------------------------------------------------------------------------------
def main(comm: Any, solution: Any, sweep: str = "0", out: str = "04-sweep.csv", keep: str = "",
         feedback: str = "1", seed: str = "1", steps: str = str(cases.STEPS), warmup: str = "0.2") -> Any:
    """The free run (distlab run 04, mpirun, torchrun). By default: the model trained with FP32,
    FP16 and 1-bit Adam (warmup fraction ``warmup``), each one's held-out AUC, and the virtual time
    (comm.now()) of one 4 MiB allreduce per method. ``sweep=1`` (the Tune step): rank 0 writes CSV
    rows keep_fraction,error_feedback,auc to ``out`` for top-k at 50 to 99.9 % compression, with and
    without error feedback. ``keep=F`` (``feedback=0``): one top-k run, a dict with ``auc`` for
    ``distlab tune 04 --param keep=0.5,0.1 --metric auc``."""
    rank, seed_, steps_ = comm.Get_rank(), int(seed), int(steps)

    sent: dict[str, float] = {}  # each training's wire bytes per step (the free run grades nothing)

    def auc_of(how: str, **options: Any) -> float:  # trains; rank 0 knows the held-out AUC
        before = comm.stats.snapshot()
        shard = cases.examples(seed_, rank, steps_ * BATCH)
        theta = train(comm, solution, shard, cases.init_params(seed_), steps_, how, free=True, **options)
        sent[how] = cases.wire_bytes(comm.stats.since(before), comm.Get_size()) / steps_
        return held_out_auc(seed_, theta) if rank == 0 else 0.0

    if keep:
        fraction, with_feedback = float(keep), feedback not in ("0", "no", "false")
        auc = auc_of("topk", keep=fraction, feedback=with_feedback)
        return {"auc": auc, "keep_fraction": fraction, "error_feedback": int(with_feedback),
                "bytes_per_step": sent["topk"]} if rank == 0 else None
    if sweep not in ("", "0"):
        runs = [(1.0, "none")] + [(k, fb) for k in cases.SWEEP_KEEPS for fb in ("yes", "no")]
        rows = [(k, fb, auc_of("topk", keep=k, feedback=fb != "no")) for k, fb in runs]
        if rank != 0:
            return None
        path = os.path.abspath(out)
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows([("keep_fraction", "error_feedback", "auc")]
                                    + [(k, fb, f"{value:.4f}") for k, fb, value in rows])
        worst = {fb: min(v for k, f, v in rows if f == fb and k >= 0.01) for fb in ("yes", "no")}
        return (f"wrote {len(rows)} rows to {path}: dense AUC {rows[0][2]:.4f}; down to keep 1%, "
                f"the worst AUC is {worst['yes']:.4f} with error feedback, {worst['no']:.4f} without")
    w, methods, timed = round(float(warmup) * steps_), ("fp32", "fp16", "onebit"), {}
    aucs = {how: auc_of(how, warmup=w) for how in methods}
    for how in methods:  # the clock counts only communication, not making the input
        comm.Barrier()
        start = comm.now()
        run_timed(comm, solution, cases.TimedCase(comm.Get_size(), cases.TIMED_N, how, seed_))
        timed[how] = comm.now() - start
    if rank != 0:
        return None
    times = (", ".join(f"{how} {t * 1e3:.2f} ms" for how, t in timed.items())
             if any(timed.values()) else "n/a (no virtual clock in this run)")
    parts = [f"{how} AUC {a:.4f} ({sent[how] / max(sent['fp32'], 1.0):.3f} of fp32's bytes)" for how, a in aucs.items()]
    return (f"{'; '.join(parts)}; w = {w / steps_:.2f}: 1-bit Adam's "
            f"volume by the formula w + (1-w)/32 is {cases.volume_ratio(w / steps_):.3f} of fp32's (distlab "
            f"check 04 measures it). One 4 MiB allreduce, virtual: {times}")
