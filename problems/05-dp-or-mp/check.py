"""Checks for problem 05, data parallel or model parallel?

The story, in two parts. First the plan: the learner's plan(model, devices, batch) answers a
table of cases (eight named ones that each teach one thing, then hidden random ones), and each
answer is compared with the checker's own rule (best_plan), with the memory of the learner's
layout worked out to say why it is wrong. Then the tensor-parallel MLP: blocks of the learner's
ParallelMLP run on p = 2, 3 and 4 real ranks, forward and backward; the output, the input gradient
and every weight-gradient shard are compared with the single-device torch module computed in the
supervisor, with the same weights. The same run shows how many parameters each rank keeps (1/p of
the whole), how many allreduces went out around forward and around backward (one each per block,
of tokens x hidden values), and what that communication costs on the virtual clock.

Hidden variants: the random plan cases; the MLP sizes, batch shapes, block counts and values.
"""

from __future__ import annotations

import numpy as np
import torch

from distlab.grading import COLLECTIVES, POINT_TO_POINT, CheckContext, Checklist, CommStats
from distlab.grading import RunFailed, Task, TaskRun, check_part

# The parts, beside this file: the memory model and the rule, the cases (named and hidden), the
# programs that run on the ranks, and the expected values with the messages that name a symptom.
rule = check_part(__file__, "rule")
scenario = check_part(__file__, "scenario")
programs = check_part(__file__, "programs")
diagnoses = check_part(__file__, "diagnoses")

MEMORY_TOLERANCE = 0.01  # per-rank parameter elements within 1% of whole / p
TIME_TOLERANCE = 0.05


# == one launch for every check ===================================================================


def all_tasks(t: CheckContext) -> list[Task]:
    """One launch for every check: the plan cases on rank 0, then the MLP on 2, 3 and 4 ranks.
    (Each rank imports torch, which costs more than everything the checks then run.)"""
    tasks = [Task(ranks=1, args=("plan", scenario.plan_cases(t.seed)), label="the plan cases")]
    for cases in scenario.mlp_cases(t.seed):
        tasks.append(Task(ranks=cases[0].p, args=("mlp", cases), label=f"the MLP cases with p = {cases[0].p}"))
    return tasks


def failed_in_mlp(exc: RunFailed) -> bool:
    """The shared launch failed in an MLP task (task 0 is the plan cases)."""
    return exc.result.failing_task is not None and exc.result.failing_task >= 1


def mlp_runs(t: CheckContext, first: bool = False) -> list[TaskRun]:
    """The MLP tasks of the shared launch. The plan check, which runs first, catches a failed
    launch to grade plan on its own; the first MLP check then reports the failure in full."""
    try:
        return t.launch(programs.run_cases, all_tasks(t)).tasks[1:]
    except RunFailed as exc:
        if first and not exc.first_report and failed_in_mlp(exc):
            raise RunFailed(exc.result, first_report=True) from None
        raise


CHECKS = Checklist()


@CHECKS.check("plan picks the rule's layout on a table of cases", points=4)
def plan_table(t: CheckContext) -> None:
    tasks = all_tasks(t)
    cases = tasks[0].args[1]
    named = len(scenario.NAMED_CASES)
    t.say(f"{named} named cases and {len(cases) - named} hidden ones; 16 bytes "
          "per parameter plus activations, least model parallelism first, TP before PP")
    try:
        run = t.launch(programs.run_cases, tasks)
    except RunFailed as exc:
        if not failed_in_mlp(exc):
            raise
        # The MLP part failed (its checks say how); ask plan on its own, so this check still grades.
        t.say("the MLP run failed (see the checks below): asking plan on its own")
        run = t.launch(programs.run_cases, tasks[:1])
    answers = run.tasks[0].values[0]
    if message := diagnoses.diagnose_all_dp(cases, answers):
        t.fail(message)
    misreading = diagnoses.misreading_of(cases, answers)
    wrong = [msg for case, answer in zip(cases, answers)
             if (msg := diagnoses.diagnose_plan(case, answer, misreading))]
    t.metric("cases", len(cases))
    t.metric("wrong", len(wrong))
    if wrong:
        more = f" (and {len(wrong) - 1} more wrong case(s))" if len(wrong) > 1 else ""
        t.fail(wrong[0] + more)
    kinds = {"DP": 0, "TP": 0, "PP": 0, "none": 0}
    for case in cases:
        layout = rule.best_plan(case.model, case.devices, case.batch)
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
            want = diagnoses.single_device(case)
            results = [rank_results[i] for rank_results in task_run.values]
            for diagnose in (diagnoses.diagnose_output, diagnoses.diagnose_input_grad,
                             diagnoses.diagnose_weight_grads):
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
                r: programs.MlpResult = rank_results[i]
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
                r: programs.MlpResult = rank_results[i]
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
    programs.one_thread()
    p, rank = comm.Get_size(), comm.Get_rank()
    h, n, k = int(hidden), int(tokens), int(blocks)
    ffn = 4 * h
    if ffn % p:
        return f"ffn = 4 * hidden = {ffn} must be a multiple of the {p} ranks" if rank == 0 else None
    case = scenario.MlpCase(p, 1, n, h, ffn, k, 12345)
    x0, gout, weights = scenario.mlp_inputs(case)
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
    want = diagnoses.single_device(case)
    err = float(np.max(np.abs(out.detach().numpy() - want.out)))
    verdict = "matches" if err < 1e-3 * max(1.0, float(np.max(np.abs(want.out)))) else "DIFFERS FROM"
    tp_bytes = 2 * n * h * 4
    dp_bytes = case.whole_params * 4
    seven_b = scenario.NAMED_CASES[2]
    layout = solution.plan(dict(seven_b.model), dict(seven_b.devices), seven_b.batch)
    return (f"p={p}, {k} block(s), hidden {h}, {n} tokens: output {verdict} one device (max err {err:.1e}); "
            f"TP moves {tp_bytes / 2**20:.2f} MiB per block per step (DP would move {dp_bytes / 2**20:.2f} MiB "
            f"of gradients); plan(7B, 8 x 80 GiB, batch 8) = {layout}")
