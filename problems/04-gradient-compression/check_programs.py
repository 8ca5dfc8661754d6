"""Problem 04's rank programs: what runs on every rank, and the free run.

run_case is the one program of the checks' launch (launch_all, shared by every check): it runs
one case of any kind (check_cases.py) against the learner's solution and returns plain data, never
objects of the learner's module. A codec call that raises comes back as Raised, so one failing
call does not end the run. main is the free run (distlab run 04, mpirun, torchrun); check.py
exposes it as its own ``main``.
"""

from __future__ import annotations

import csv
import os
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np

from distlab.grading import CheckContext, CommStats, Task, check_part, parse_fault_plan

models = check_part(__file__, "models")
cases = check_part(__file__, "cases")

# -- what runs on every rank ----------------------------------------------------------------------


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


@dataclass(frozen=True)
class Raised:
    """A codec call that raised: the codec is pure, so one failing call need not end the run."""

    what: str  # "ValueError: ... (file.py, line 12, in decompress)"

    def __str__(self) -> str:
        return f"raised {self.what}"


def _attempt(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported to the learner with its line
        frames = traceback.extract_tb(exc.__traceback__)
        last = frames[-1] if frames else None
        where = (f" ({os.path.basename(last.filename)}, line {last.lineno}, in {last.name})"
                 if last else "")
        return Raised(f"{type(exc).__name__}: {exc}{where}")


def run_codec(solution: Any, case: cases.CodecCase) -> cases.CodecResult:
    result = cases.CodecResult()
    for x, chunks, _ in case.vectors:
        packed = _attempt(solution.compress, x.copy(), chunks)
        result.compressed.append(packed if isinstance(packed, Raised) else _pair(packed))
        if isinstance(packed, (tuple, list)) and len(packed) == 2:
            rebuilt = _attempt(solution.decompress, packed[0], packed[1], x.size)
            result.roundtrip.append(rebuilt if isinstance(rebuilt, Raised) else _plain(rebuilt))
        else:
            result.roundtrip.append(None)
    signs, scales, n = case.given
    rebuilt = _attempt(solution.decompress, signs.copy(), scales.copy(), n)
    result.decompressed = rebuilt if isinstance(rebuilt, Raised) else _plain(rebuilt)
    x, error0, chunks = case.feedback
    error = error0.copy()
    for _ in range(3):
        packed = _attempt(solution.compress_with_feedback, x.copy(), error, chunks)
        rebuilt = packed if isinstance(packed, Raised) else None
        if isinstance(packed, (tuple, list)) and len(packed) == 2:
            rebuilt = _attempt(solution.decompress, packed[0], packed[1], x.size)
            rebuilt = rebuilt if isinstance(rebuilt, Raised) else _plain(rebuilt)
        result.feedback.append((rebuilt, error.copy()))
    return result


def run_wire(comm: Any, solution: Any, case: cases.WireCase) -> dict[str, cases.OpResult]:
    rank, p, n = comm.Get_rank(), comm.Get_size(), case.n
    results: dict[str, cases.OpResult] = {}

    def measured(name: str, reducer: Any, buf: np.ndarray, *state: Any) -> None:
        """Runs one reducer call on buf; keeps the result, the state after it, and its bytes."""
        before = comm.stats.snapshot()
        reducer(comm, buf, *state)
        kept = tuple(s.copy() if isinstance(s, np.ndarray) else s for s in state)
        results[name] = cases.OpResult(buf.copy(), kept, comm.stats.since(before))

    for what in ("fp16", "fp16 large"):
        measured(what, solution.fp16_allreduce, cases.wire_input(case.seed, rank, n, what))

    bounds = models.chunk_bounds(n, p)
    werr = np.zeros(n, np.float32)
    serr = np.zeros(bounds[rank + 1] - bounds[rank], np.float32)
    for round_ in (1, 2):
        measured(f"onebit {round_}", solution.onebit_allreduce,
                 cases.wire_input(case.seed, rank, n, f"onebit {round_}"), werr, serr)

    for keep in case.keeps:
        error = np.zeros(n, np.float32)
        for round_ in (1, 2):
            measured(f"topk {keep} ef {round_}", solution.topk_allreduce,
                     cases.wire_input(case.seed, rank, n, f"topk {keep} {round_}"), keep, error)
        measured(f"topk {keep} plain", solution.topk_allreduce,
                 cases.wire_input(case.seed, rank, n, f"topk {keep} 1"), keep, None)
    return results


def run_adam(comm: Any, solution: Any, case: cases.AdamCase) -> list[Any]:
    rank = comm.Get_rank()
    grads = cases.adam_gradients(case)
    params = np.random.default_rng([case.seed, 8]).standard_normal(case.n).astype(np.float32)
    optimizer = solution.OneBitAdam(params, lr=case.lr, warmup_steps=case.warmup)
    trajectory = []
    for t in range(case.steps):
        comm.mark("step")
        optimizer.step(comm, grads[t][rank].copy())
        trajectory.append(_plain(optimizer.params))
    return trajectory


def _step_bytes(comm: Any, before: CommStats) -> float:
    return models.wire_bytes(comm.stats.since(before), comm.Get_size())


def run_training(comm: Any, solution: Any, case: cases.TrainCase) -> cases.TrainResult:
    """FP16 Adam, then 1-bit Adam, each from the same start on this rank's shard."""
    rank = comm.Get_rank()
    x, clicks = models.examples(case.seed, rank, case.steps * models.BATCH)

    theta = models.init_params(case.seed)
    adam, fp16_bytes = models.Adam(theta, models.LR), []
    for t in range(case.steps):
        batch = slice(t * models.BATCH, (t + 1) * models.BATCH)
        grad = models.gradient(theta, x[batch], clicks[batch])
        before = comm.stats.snapshot()
        solution.fp16_allreduce(comm, grad)
        fp16_bytes.append(_step_bytes(comm, before))
        adam.step(grad)
    fp16_params = theta.copy()

    theta = models.init_params(case.seed)
    optimizer = solution.OneBitAdam(theta, lr=models.LR, warmup_steps=case.warmup)
    onebit_bytes = []
    for t in range(case.steps):
        batch = slice(t * models.BATCH, (t + 1) * models.BATCH)
        grad = models.gradient(optimizer.params, x[batch], clicks[batch])
        before = comm.stats.snapshot()
        optimizer.step(comm, grad)
        onebit_bytes.append(_step_bytes(comm, before))
    return cases.TrainResult(fp16_params, _plain(optimizer.params), fp16_bytes, onebit_bytes)


def run_timed(comm: Any, solution: Any, case: cases.TimedCase) -> Any:
    rank = comm.Get_rank()
    buf = cases.wire_input(case.seed, rank, case.n, "timed")
    if case.method == "fp16":
        solution.fp16_allreduce(comm, buf)
    else:
        bounds = models.chunk_bounds(case.n, case.p)
        solution.onebit_allreduce(comm, buf, np.zeros(case.n, np.float32),
                                  np.zeros(bounds[rank + 1] - bounds[rank], np.float32))
    return buf[:: max(1, case.n // 4096)].copy()


def run_case(comm: Any, solution: Any, case: Any) -> Any:
    """The one program of the checks' launch: runs one case of any kind."""
    if isinstance(case, cases.CodecCase):
        return run_codec(solution, case)
    if isinstance(case, cases.WireCase):
        return run_wire(comm, solution, case)
    if isinstance(case, cases.AdamCase):
        return run_adam(comm, solution, case)
    if isinstance(case, cases.TrainCase):
        return run_training(comm, solution, case)
    return run_timed(comm, solution, case)


# -- one launch for every check: the tasks --------------------------------------------------------


def launch_all(t: CheckContext) -> tuple[cases.Plan, Any]:
    """One launch for every check (identical launches are cached): the tasks, in order."""
    plan = cases.plan_for(t.seed)
    slow = parse_fault_plan({"format_version": 1, "seed": t.seed, "fault": [
        {"kind": "delay", "src": plan.slow_worker, "latency_s": cases.SLOW_WORKER_DELAY_S,
         "wall": True, "note": "a straggling worker: its sends leave 5 ms late"},
    ]}, where="04 slow-worker case")
    tasks = [Task(ranks=1, args=(plan.codec,), label="the compressor unit cases")]
    tasks += [Task(ranks=w.p, args=(w,), label=f"the reducers with p = {w.p}, n = {w.n}")
              for w in plan.wires]
    tasks.append(Task(ranks=plan.adam.p, args=(plan.adam,), faults=slow,
                      label=f"1-bit Adam on known gradients (rank {plan.slow_worker} slow)"))
    tasks.append(Task(ranks=plan.train.p, args=(plan.train,), label="the training runs"))
    tasks += [Task(ranks=c.p, args=(c,), label=f"the timed {c.method} allreduce")
              for c in plan.timed]
    world = max(task.ranks for task in tasks)
    run = t.launch(run_case, tasks, platform=cases.slow_link(world))
    return plan, run


# -- the free run -------------------------------------------------------------------------------


def _begin_step(comm: Any) -> None:
    """Marks a training step and declares its forward and backward pass to the virtual clock
    (about 6 flops per parameter and example), so the free run shows sync against compute."""
    comm.mark("step")
    try:
        comm.compute(flops=6 * models.BATCH * models.N_PARAMS, label="forward+backward")
    except ValueError:  # a platform without device profiles: no compute on its clock
        pass


def _train_with(comm: Any, solution: Any, seed: int, steps: int, how: str, keep: float = 1.0,
                feedback: bool = True, warmup: int = 0) -> tuple[np.ndarray, float]:
    """Trains on this rank's shard; returns the parameters and the wire bytes this rank sent."""
    rank, p = comm.Get_rank(), comm.Get_size()
    x, clicks = models.examples(seed, rank, steps * models.BATCH)
    theta = models.init_params(seed)
    start = comm.stats.snapshot()
    if how == "onebit":
        optimizer = solution.OneBitAdam(theta, lr=models.LR, warmup_steps=warmup)
        for t in range(steps):
            _begin_step(comm)
            batch = slice(t * models.BATCH, (t + 1) * models.BATCH)
            optimizer.step(comm, models.gradient(optimizer.params, x[batch], clicks[batch]))
        return optimizer.params, models.wire_bytes(comm.stats.since(start), p)
    if how == "topk":
        # Momentum SGD, as Deep Gradient Compression trains with top-k: Adam's per-element
        # normalisation would blow up the rare large values that error feedback releases.
        error = np.zeros(models.N_PARAMS, np.float32) if feedback else None
        velocity = np.zeros(models.N_PARAMS, np.float32)
        for t in range(steps):
            _begin_step(comm)
            batch = slice(t * models.BATCH, (t + 1) * models.BATCH)
            grad = models.gradient(theta, x[batch], clicks[batch])
            if keep < 1:
                solution.topk_allreduce(comm, grad, keep, error)
            else:
                solution.fp32_allreduce(comm, grad)
            velocity = 0.9 * velocity + grad
            theta -= (SWEEP_LR * velocity).astype(np.float32)
        return theta, models.wire_bytes(comm.stats.since(start), p)
    adam = models.Adam(theta, models.LR)
    reduce = solution.fp16_allreduce if how == "fp16" else solution.fp32_allreduce
    for t in range(steps):
        _begin_step(comm)
        batch = slice(t * models.BATCH, (t + 1) * models.BATCH)
        grad = models.gradient(theta, x[batch], clicks[batch])
        reduce(comm, grad)
        adam.step(grad)
    return theta, models.wire_bytes(comm.stats.since(start), p)


SWEEP_LR = 0.05


def main(comm: Any, solution: Any, sweep: str = "0", out: str = "04-sweep.csv", keep: str = "",
         feedback: str = "1", seed: str = "1", steps: str = str(cases.STEPS),
         warmup: str = "0.2") -> Any:
    """The free run (distlab run 04, mpirun, torchrun). Three modes:

    * default: trains the ranking model with FP32, FP16 and 1-bit Adam (warmup fraction
      ``warmup``), and reports each one's held-out AUC and bytes as a fraction of FP32's, plus
      the virtual time (comm.now(), the online clock) of one 4 MiB allreduce per method;
    * ``sweep=1``: the Tune step: top-k at 50 / 80 / 90 / 99 / 99.9 % compression, with and
      without error feedback, plus the dense baseline; rank 0 writes CSV rows
      ``keep_fraction,error_feedback,auc`` to ``out``;
    * ``keep=F``: one top-k run at keep fraction F (``feedback=0`` turns error feedback off);
      returns a dict with ``auc``, for ``distlab tune``.

        distlab run 04 --solution reference
        distlab run 04 --solution reference --param sweep=1 --param out=sweep.csv
        distlab tune 04 --param keep=0.5,0.2,0.1,0.01,0.001 --fixed feedback=0 --metric auc
    """
    rank, p = comm.Get_rank(), comm.Get_size()
    seed_, steps_ = int(seed), int(steps)
    if keep:
        fraction, with_feedback = float(keep), feedback not in ("0", "no", "false")
        theta, sent = _train_with(comm, solution, seed_, steps_, "topk", fraction, with_feedback)
        if rank != 0:
            return None
        return {"auc": models.held_out_auc(seed_, theta), "keep_fraction": fraction,
                "error_feedback": int(with_feedback), "bytes_per_step": sent / steps_}
    if sweep not in ("", "0"):
        rows = []
        dense, _ = _train_with(comm, solution, seed_, steps_, "topk", keep=1.0)
        rows.append((1.0, "none", models.held_out_auc(seed_, dense) if rank == 0 else 0.0))
        for fraction in cases.SWEEP_KEEPS:
            for with_feedback in (True, False):
                theta, _ = _train_with(comm, solution, seed_, steps_, "topk", fraction,
                                       with_feedback)
                if rank == 0:
                    label = "yes" if with_feedback else "no"
                    rows.append((fraction, label, models.held_out_auc(seed_, theta)))
        if rank != 0:
            return None
        path = os.path.abspath(out)
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["keep_fraction", "error_feedback", "auc"])
            for fraction, fb, value in rows:
                writer.writerow([fraction, fb, f"{value:.4f}"])
        worst = {fb: min(v for k, f, v in rows if f == fb and k >= 0.01) for fb in ("yes", "no")}
        return (f"wrote {len(rows)} rows to {path}: dense AUC {rows[0][2]:.4f}; down to keep 1%, "
                f"the worst AUC is {worst['yes']:.4f} with error feedback, "
                f"{worst['no']:.4f} without")

    w = round(float(warmup) * steps_)
    results = {}
    for how in ("fp32", "fp16", "onebit"):
        theta, sent = _train_with(comm, solution, seed_, steps_, how, warmup=w)
        results[how] = (models.held_out_auc(seed_, theta) if rank == 0 else 0.0, sent)
    timed = {}
    bounds = models.chunk_bounds(cases.TIMED_N, p)
    for how in ("fp32", "fp16", "onebit"):
        buf = cases.wire_input(seed_, rank, cases.TIMED_N, "timed")
        comm.Barrier()
        start = comm.now()
        if how == "onebit":
            solution.onebit_allreduce(comm, buf, np.zeros(cases.TIMED_N, np.float32),
                                      np.zeros(bounds[rank + 1] - bounds[rank], np.float32))
        else:
            getattr(solution, f"{how}_allreduce")(comm, buf)
        timed[how] = comm.now() - start
    if rank != 0:
        return None
    base = results["fp32"][1] or 1.0
    parts = [f"{how} AUC {a:.4f} ({b / base:.3f} of fp32's bytes)"
             for how, (a, b) in results.items()]
    times = (", ".join(f"{how} {t * 1e3:.2f} ms" for how, t in timed.items())
             if any(timed.values()) else "n/a (no virtual clock in this run)")
    return (f"{'; '.join(parts)}; w = {w / steps_:.2f}: volume formula w + (1-w)/32 = "
            f"{models.volume_ratio(w / steps_):.3f}. One 4 MiB allreduce, virtual: {times}")
