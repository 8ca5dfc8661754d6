"""Checks for problem 07, the gradient sync storm: tensor fusion.

The story: a click-through-rate model with a hundred-odd feature fields has three or four gradient
tensors per field (a float32 embedding table, a float64 wide weight vector, int64 per-row hit
counts) plus a few more: several hundred small tensors per step, in three dtypes. The learner's
``Fusion`` reduces them across the ranks for two training steps on 1 to 5 ranks. Here, outside
the ranks, the same gradients are regenerated and summed tensor by tensor, which is what one
Allreduce per tensor would give; the learner's sums must equal them, and training must follow the
same path as single-process training on the global batch. The same run is then read for how it
got there: the number of collectives per step (at most ceil(bytes / threshold) + dtypes), the size
of every buffer sent (at most threshold + one tensor) and the memory the fusion allocated while it
worked. Last, on a cluster where a collective costs 50 us of latency per hop, one step of the
learner's fusion must be at least 10x faster than one Allreduce per tensor run by this file.

Hidden variants (from the seed): the number of fields (70-110, so 140-340 tensors), table sizes,
embedding width, which dtypes a step carries, one table larger than the threshold, the threshold,
the rank counts (1, 2, 4 and one of 3, 5) and the bandwidth of the 50-us cluster.

One launch runs everything (the training cases, then the timed steps) on ``uniform(p, 50 us,
beta)``; the memory probe is tracemalloc around add() ... flush() on MPI (on gloo it crashes the
rank, so there only the size of every buffer is judged).

``main`` is the free run (``distlab run 07``): real training of the model with fusion, or, with
``--param sweep=1``, the Tune step's sweep of step time against the threshold, as CSV rows
``threshold_bytes,virtual_step_s`` (see ``main``'s docstring).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from distlab import IN_PLACE, MAX
from distlab.grading import CheckContext, Checklist, Task, check_part, uniform

model = check_part(__file__, "model")  # the CTR model, its data and gradients (ranks and here)
cases = check_part(__file__, "cases")  # the hidden variants and their budgets
programs = check_part(__file__, "programs")  # what runs on every rank
expected = check_part(__file__, "expected")  # the expected sums and the diagnosis of wrong ones

ALPHA_S = 50e-6  # per-hop latency of the cluster the speed-up is graded on
SPEEDUP = 10.0  # the fused step must be at least this much faster than one Allreduce per tensor


# -- the one launch -------------------------------------------------------------------------------


def launch_all(t: CheckContext) -> tuple[cases.Plan, list[Any], list[Any]]:
    """One launch on the 50-us cluster: the training cases, then the timed steps (the learner's
    fused step and this file's per-tensor baseline for each timed case). Cached: every check
    reads the same run. Returns (plan, training task runs, timed task runs)."""
    plan = cases.plan_for(t)
    # tracemalloc in a rank whose gloo threads free tensors crashes the process (torch 2.x):
    # the allocation probe runs on MPI only; the size of every buffer is read on both engines.
    probe = t.backend == "mpi"
    tasks = [Task(ranks=c.p, args=("train", c, probe), label=f"training with {c.label()}")
             for c in plan.cases]
    for c in plan.perf:
        tasks.append(Task(ranks=c.p, args=("fusion", c), label=f"the timed fused step, p = {c.p}"))
        tasks.append(Task(ranks=c.p, args=("per-tensor", c),
                          label=f"the timed per-tensor baseline, p = {c.p}"))
    run = t.launch(programs.run_task, tasks, platform=uniform(plan.world, ALPHA_S, plan.beta))
    n = len(plan.cases)
    return plan, run.tasks[:n], run.tasks[n:]


def require_right_sums(t: CheckContext, plan: cases.Plan, train: list[Any]) -> None:
    message = expected.first_wrong(plan, train)
    if message:
        t.fail("not graded until the sums are right: see the first check")


def human(nbytes: float) -> str:
    return f"{nbytes / 1024:.1f} KiB" if nbytes >= 1024 else f"{int(nbytes)} B"


# -- the checks -----------------------------------------------------------------------------------


CHECKS = Checklist()


@CHECKS.check("results equal one Allreduce per tensor", points=4)
def results_match(t: CheckContext) -> None:
    plan, train, _ = launch_all(t)
    t.say("; ".join(c.label() for c in plan.cases))
    message = expected.first_wrong(plan, train)
    if message:
        t.fail(message)
    tensors = sum(len(model.tensor_names(c.spec)) * c.p for c in plan.cases)
    t.metric("tensors_checked", tensors)
    t.say(f"every tensor of step 0 equals its per-tensor sum on every rank ({tensors} in all)")


@CHECKS.check("training with fusion equals single-process training", points=2)
def training_matches(t: CheckContext) -> None:
    plan, train, _ = launch_all(t)
    require_right_sums(t, plan, train)
    for case, task_run in zip(plan.cases, train):
        want = expected.single_process_training(case)
        results: list[programs.CaseResult] = task_run.values
        digests = {r.final_digest for r in results}
        t.expect(len(digests) == 1, "identical parameters on every rank",
                 f"{case.label()}: the ranks end {cases.STEPS} steps with {len(digests)} "
                 "different sets of parameters: did a later step reduce different tensors on "
                 "different ranks?")
        got = results[0].final
        assert got is not None
        for i, (g, w) in enumerate(zip(got, want)):
            if not np.allclose(g, w, rtol=1e-4, atol=1e-6):
                t.fail(f"{case.label()}: after {cases.STEPS} steps parameter #{i} differs from "
                       f"single-process training on the global batch (max difference "
                       f"{float(np.abs(g - w).max()):.2e}): steps after the first were not "
                       "reduced right; does flush() leave the fusion empty for the next step?")
    t.say(f"{cases.STEPS} steps of training land on the single-process parameters in every case")


@CHECKS.check("collectives per step at most ceil(bytes / threshold) + dtypes", points=2)
def collectives_per_step(t: CheckContext) -> None:
    plan, train, _ = launch_all(t)
    require_right_sums(t, plan, train)
    worst = 0.0
    for case, task_run in zip(plan.cases, train):
        budget = cases.collective_budget(case)
        by_dtype = cases.nbytes_by_dtype(case)
        total, n = sum(by_dtype.values()), len(model.tensor_names(case.spec))
        for rank, result in enumerate(task_run.values):
            for s, step in enumerate(result.steps):
                count = sum(step.collectives.values())
                calls = ", ".join(f"{k} x{v}" for k, v in sorted(step.collectives.items()))
                why = (": one collective per tensor; pack tensors into a buffer and reduce it once"
                       if count >= n else ": is each buffer sent as soon as it holds threshold "
                       "bytes (not sooner)?")
                t.expect(count <= budget,
                         f"at most {budget} collectives per step (ceil({total} / {case.threshold}) "
                         f"= {budget - len(by_dtype)} + {len(by_dtype)} dtypes)",
                         f"{case.label()}, step {s}: rank {rank} made {count} ({calls}){why}")
                t.expect(step.p2p_messages == 0 or case.p == 1, "collectives only",
                         f"{case.label()}, step {s}: rank {rank} sent {step.p2p_messages} "
                         "point-to-point messages besides its collectives")
                worst = max(worst, count / budget)
        t.say(f"p = {case.p}: {sum(task_run.values[0].steps[0].collectives.values())} "
              f"collectives per step for {n} tensors ({human(total)}), budget {budget}")
    t.metric("worst_collectives_over_budget", round(worst, 3))


@CHECKS.check("step at least 10x faster than one Allreduce per tensor at 50 us latency", points=3)
def fused_step_is_faster(t: CheckContext) -> None:
    plan, train, timed = launch_all(t)
    require_right_sums(t, plan, train)
    worst = math.inf
    for k, case in enumerate(plan.perf):
        fused_run, base_run = timed[2 * k], timed[2 * k + 1]
        want = expected.first_step(case)[1]
        for rank, sample in enumerate(fused_run.values):
            for i, (g, w) in enumerate(zip(sample, want)):
                t.expect(bool(expected.close(g, w[: len(g)]).all()),
                         "a correct result before its time is graded",
                         f"{case.label()}: rank {rank}'s tensor #{i} is wrong in the timed step")
        fused, base = t.measured_time(fused_run), t.measured_time(base_run)
        n = len(model.tensor_names(case.spec))
        ratio = base / fused if fused > 0 else math.inf
        t.say(f"p = {case.p}, {n} tensors, alpha 50 us, {1 / plan.beta / 1e9:.1f} GB/s: "
              f"per-tensor {base * 1e3:.2f} ms, fused {fused * 1e3:.3f} ms ({ratio:.1f}x) "
              f"{t.clock}")
        if ratio < worst:
            worst = ratio
            t.performance(fused, base / SPEEDUP, fused_run)
        hint = (": about as slow as one Allreduce per tensor; are the tensors fused at all?"
                if ratio < 2 else ": fewer, larger buffers pay the latency fewer times")
        t.expect(ratio >= SPEEDUP,
                 f"the fused step at most {base / SPEEDUP * 1e3:.3f} ms (10x faster than the "
                 f"per-tensor {base * 1e3:.2f} ms)",
                 f"{fused * 1e3:.3f} ms for {case.label()}, {ratio:.1f}x{hint}")
    t.metric("worst_speedup", round(worst, 2))


@CHECKS.check("buffer memory bounded: threshold + one tensor", points=2)
def memory_bounded(t: CheckContext) -> None:
    plan, train, _ = launch_all(t)
    require_right_sums(t, plan, train)
    worst = 0.0
    for case, task_run in zip(plan.cases, train):
        by_dtype = cases.nbytes_by_dtype(case)
        for rank, result in enumerate(task_run.values):
            for s, step in enumerate(result.steps):
                budget = cases.memory_budget(case, sum(step.collectives.values()))
                for dtype, nbytes in step.allreduces:
                    limit = (case.threshold + cases.largest(case, dtype)[1] if dtype in by_dtype
                             else 0)
                    if nbytes <= limit:
                        continue
                    if nbytes >= 0.9 * by_dtype.get(dtype, 0):
                        why = (f"one buffer of all {by_dtype[dtype]} {dtype} bytes of the step: "
                               "the threshold was ignored until flush(); send a buffer as soon "
                               "as it holds threshold_bytes")
                    elif dtype in by_dtype and nbytes > 1.5 * limit:
                        why = (f"{nbytes / case.threshold:.1f}x the threshold: is the threshold "
                               "compared with a number of elements instead of bytes?")
                    else:
                        why = "the buffer grew past the threshold before it was sent"
                    t.fail(f"{case.label()}, step {s}: rank {rank} reduced a {dtype} buffer of "
                           f"{nbytes} bytes in one Allreduce; a buffer may hold at most threshold "
                           f"+ its largest tensor = {limit} bytes: {why}")
                if step.peak_bytes < 0:
                    continue  # not measured on this engine
                t.expect(step.peak_bytes <= budget,
                         f"at most {budget} bytes allocated while add() ... flush() ran (one "
                         "buffer per dtype of threshold + one tensor, one receive copy, "
                         f"{cases.MEMORY_SLACK // 1024} KiB + {cases.SLACK_PER_CALL} B per "
                         "collective of bookkeeping)",
                         f"{case.label()}, step {s}: rank {rank} allocated up to "
                         f"{step.peak_bytes} bytes at once (the step's tensors are "
                         f"{sum(by_dtype.values())} bytes): are tensors copied long before "
                         "their buffer is due, or buffers allocated larger than they need?")
                worst = max(worst, step.peak_bytes / budget)
        first = task_run.values[0].steps[0]
        peak = max(s.peak_bytes for r in task_run.values for s in r.steps)
        budget = cases.memory_budget(case, sum(first.collectives.values()))
        measured = (f"peak allocation {human(peak)} (budget {human(budget)})" if peak >= 0
                    else "allocations not probed on this engine")
        t.say(f"p = {case.p}: largest buffer {max((n for _, n in first.allreduces), default=0)} B "
              f"(threshold {case.threshold} B), {measured}")
    t.metric("worst_memory_over_budget", round(worst, 3))


# -- the free run -------------------------------------------------------------------------------


DEFAULT_SWEEP = "0,1024,4096,16384,65536,262144,1048576,4194304"


def parse_bytes(text: str) -> int:
    """'65536', '64K', '64KiB', '1M' -> bytes (K and M are binary)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if scale > 1 else t) * scale)


def main(comm, solution, sweep="0", thresholds=DEFAULT_SWEEP, out="", threshold="65536",
         steps="30", fields="120", seed="7"):
    """The free run (distlab run 07). Two modes:

    * training (default): trains the CTR model for ``steps`` steps with Fusion(comm, threshold) on
      every rank; rank 0 reports held-out loss and AUC before and after, the collectives per step
      and the virtual time of the gradient sync per step (comm.now(), the online clock).
    * ``sweep=1``: the Tune step. One step's gradients are reduced once per threshold in
      ``thresholds`` (bytes, comma-separated, K/M suffixes allowed; 0 sends every tensor alone,
      i.e. one Allreduce per tensor); the virtual step time is the slowest rank's comm.now()
      difference around add()...flush(). Rank 0 writes CSV rows ``threshold_bytes,virtual_step_s``
      (with that header) to ``out`` when given, and returns a one-line summary.

        distlab run 07 --solution reference --param sweep=1 --param out=sweep.csv
        distlab run 07 --param sweep=1 --param thresholds=0,4K,64K,1M --platform my-cluster.toml
    """
    rank, p = comm.Get_rank(), comm.Get_size()
    spec = model.free_run_spec(int(fields), int(seed))
    names = model.tensor_names(spec)
    if sweep not in ("", "0"):
        values = [parse_bytes(v) for v in thresholds.split(",") if v.strip()]
        grads0 = model.gradients(spec, model.init_params(spec), *model.make_batch(spec, 0, 0, rank))
        total = sum(g.nbytes for g in grads0)
        times = np.zeros(len(values))
        for i, t in enumerate(values):
            grads = [g.copy() for g in grads0]
            fusion = solution.Fusion(comm, t)
            start = comm.now()
            for g in grads:
                fusion.add(g)
            fusion.flush()
            times[i] = comm.now() - start
        comm.Allreduce(IN_PLACE, times, MAX)  # the step ends when its slowest rank is done
        if rank != 0:
            return None
        rows = [f"{t},{float(s)!r}" for t, s in zip(values, times)]
        written = ""
        if out:
            path = os.path.abspath(out)
            with open(path, "w") as f:
                f.write("threshold_bytes,virtual_step_s\n" + "\n".join(rows) + "\n")
            written = f"; wrote {path}"
        best = int(np.argmin(times))
        curve = ", ".join(f"{t}: {s * 1e3:.3f} ms" for t, s in zip(values, times))
        return (f"sweep over {len(names)} tensors ({total / 1024:.1f} KiB, 3 dtypes), p = {p}: "
                f"{curve}; fastest at {values[best]} B{written}")

    params = model.init_params(spec)
    before = model.heldout(spec, params) if rank == 0 else None
    fusion = solution.Fusion(comm, parse_bytes(threshold))
    sync_s, collectives = 0.0, 0
    for step in range(int(steps)):
        comm.mark("step")
        grads = model.gradients(spec, params, *model.make_batch(spec, 0, step, rank))
        calls = comm.stats.snapshot()
        start = comm.now()
        for g in grads:
            fusion.add(g)
        fusion.flush()
        sync_s += comm.now() - start
        delta = comm.stats.since(calls)
        collectives += sum(delta.calls[op] for op in delta.collectives_used())
        model.apply_update(spec, params, grads, p)
    if rank != 0:
        return None
    after = model.heldout(spec, params)
    n = max(int(steps), 1)
    total = sum(nbytes for _, nbytes in model.step_shapes(spec))
    return (f"{steps} steps on {p} ranks: held-out loss {before[0]:.3f} -> {after[0]:.3f}, "
            f"AUC {before[1]:.3f} -> {after[1]:.3f}; {len(names)} tensors ({total / 1024:.1f} KiB) "
            f"in {collectives / n:.1f} collectives per step; sync {sync_s / n * 1e3:.3f} ms per "
            f"step (virtual)")
