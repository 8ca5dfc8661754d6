"""Checks for problem 05. The plan on a table of cases (eight named ones, then hidden ones) against
the checker's own rule, a wrong layout's memory worked out to say why; then the tensor-parallel MLP
on p = 2, 3 and 4 ranks (none receiving more than its TP allreduces bring, which could carry the others'
weights): values against one device, each rank's share of the weights (1/p), one
allreduce of tokens x hidden each way per block carrying the rank's partial sum (forward) or its part of
dL/dx (backward), as its agent recorded what it sent, and their time on the virtual clock."""

from collections import Counter

from distlab.grading import (
    COLLECTIVES,
    POINT_TO_POINT,
    CaseRun,
    CheckContext,
    Checklist,
    Counts,
    Run,
    RunFailed,
    Task,
)

from . import cases, judging, programs
from .cases import MlpCase, PlanCase

MEMORY_TOLERANCE = 0.01  # per-rank parameter elements within 1% of whole / p
TIME_TOLERANCE = 0.05

CHECKS = Checklist()


def plan_task(seed: int) -> Task:
    return Task(ranks=1, cases=judging.plan_cases(seed), label="the plan cases")


@CHECKS.run
def one_launch(t: CheckContext) -> Run:
    """The plan cases on rank 0, then the MLP on 2, 3 and 4 ranks, one launch for every check (ranks
    import torch, which costs more than the rest); a failure comes back as a run without tasks."""
    plan, named = plan_task(t.seed), len(cases.NAMED_CASES)
    t.say(f"{named} named cases and {len(plan.cases) - named} hidden ones; 16 bytes "
          "per parameter plus activations, least model parallelism first, TP before PP")
    # The MLP tasks keep a copy of what each rank sends: the allreduces must carry the partial sums.
    mlp = [Task(ranks=batch[0].p, cases=batch, label=f"the MLP cases with p = {batch[0].p}", record_sent=True)
           for batch in cases.mlp_cases(t.seed)]
    try:
        return t.launch(programs.run_cases, [plan, *mlp])
    except RunFailed as exc:
        return Run(exc.result)


def failed_in_mlp(run: Run) -> bool:
    return (run.result.failing_task or 0) >= 1  # task 0 is the plan cases


def mlp_run(one_launch: Run, first: bool = False) -> Run:
    """The shared launch; an MLP failure is told by the first MLP check, the others are not graded."""
    if not one_launch.ok:
        raise RunFailed(one_launch.result, first_report=first and failed_in_mlp(one_launch))
    return one_launch


def shaped(t: CheckContext, run: Run) -> Run:
    """The run (one that finished: ``run.ok``), once every rank of every task returned one value per case,
    as the harness's run_cases does (the learner's process returns them: a patched program must fail, not
    crash the check)."""
    for task_run in run.tasks:
        for rank, value in enumerate(task_run.values):
            if type(value) is not list or len(value) != len(task_run.spec.cases or ()):
                t.fail(f"{task_run.spec.label}: rank {rank} returned a {type(value).__name__}, not one value "
                       "per case as the harness's run_cases does")
    return run


def plan_answers(t: CheckContext, run: Run) -> tuple[list[PlanCase], list[programs.PlanAnswer]]:
    results = shaped(t, run).cases(PlanCase)
    for result in results:
        if why := judging.malformed_plan(result.values[0]):
            t.fail(f"{result.case.label}: rank 0 returned {why}")
    return [result.case for result in results], [result.values[0] for result in results]


def mlp_results(t: CheckContext, run: Run) -> list[CaseRun[MlpCase]]:
    results = shaped(t, run).cases(MlpCase)
    for result in results:
        for rank, value in enumerate(result.values):
            if why := judging.malformed_mlp(result.case, value):
                t.fail(f"{result.case.label()}: rank {rank} returned {why}")
    return results


def phases(t: CheckContext, result: CaseRun[MlpCase]) -> list[dict[str, Counts]]:
    """programs.phase_counts, or a failed check where a rank did not mark its phases as the harness does."""
    try:
        return programs.phase_counts(result)
    except KeyError as exc:
        t.fail(f"{result.case.label()}: {exc.args[0] if exc.args else exc}: the harness marks forward and "
               "backward once per case")


def outside_phases(t: CheckContext, run: Run) -> None:
    """Fails where a rank communicated outside its cases' forward and backward (set-up, read back): what
    the phases do not show could carry another rank's weights."""
    for task_run in run.tasks[1:]:
        results = [result for result in run.cases(MlpCase) if result.task is task_run]
        for rank in range(task_run.spec.ranks):
            inside: Counter[str] = Counter()
            for result in results:
                for counts in phases(t, result)[rank].values():
                    inside.update(counts.calls)
            total = task_run.counts(rank).calls
            extra = {op: n - inside[op] for op, n in total.items()
                     if n > inside[op] and (op in POINT_TO_POINT or op in COLLECTIVES)}
            if extra:
                said = ", ".join(f"{op} x{n}" for op, n in sorted(extra.items()))
                t.fail(f"{task_run.spec.label}: rank {rank} called {said} outside forward and backward (in "
                       "ParallelMLP's set-up or after backward): a TP block needs one Allreduce each way and "
                       "nothing else")


def received_too_much(t: CheckContext, run: Run, what: str) -> None:
    """Fails where a rank received more than its TP allreduces bring: the other ranks' weights fit in it."""
    for task_run in run.tasks[1:]:
        if message := judging.received_too_much(task_run):
            t.fail(f"{message}; {what} not graded")


@CHECKS.check("plan picks the rule's layout on a table of cases", points=4)
def plan_table(t: CheckContext, one_launch: Run) -> None:
    run = one_launch
    if not run.ok and not failed_in_mlp(run):  # plan's own task failed: the whole story here
        raise RunFailed(run.result, first_report=True)
    if not run.ok:
        # The MLP part failed (its checks say how); ask plan on its own, so this check still grades.
        t.say("the MLP run failed (see the checks below): asking plan on its own")
        run = t.launch(programs.run_cases, [plan_task(t.seed)])
    table, answers = plan_answers(t, run)
    if message := judging.diagnose_all_dp(table, answers):
        t.fail(message)
    wrong = judging.wrong_plans(table, answers)
    t.metric("cases", len(table))
    t.metric("wrong", len(wrong))
    if wrong:
        more = f" (and {len(wrong) - 1} more wrong case(s))" if len(wrong) > 1 else ""
        t.fail(wrong[0] + more)
    kinds = Counter(judging.layout_kind(judging.best_plan(c.model, c.devices, c.batch)) for c in table)
    t.say(f"all {len(table)} agree ({kinds['DP']} pure DP, {kinds['TP']} with TP, {kinds['PP']} with PP, "
          f"{kinds['none']} with nothing that fits)")


@CHECKS.check("TP MLP: output and every gradient equal the single-device module", points=4)
def mlp_matches(t: CheckContext, one_launch: Run) -> None:
    t.say("p = 2, 3, 4; one block, then a stack of 2-3; float64; output, dL/dx and the "
          "gradient shards of W1, b1, W2, b2 against torch on one device")
    run = mlp_run(one_launch, first=True)
    results = mlp_results(t, run)
    received_too_much(t, run, "its values are")
    t.say("no rank received more than its TP allreduces bring, so none could hold the others' weights")
    for result in results:
        want = judging.single_device(result.case)
        for diagnose in (judging.diagnose_grad_shapes, judging.diagnose_output, judging.diagnose_input_grad,
                         judging.diagnose_weight_grads):
            if message := diagnose(result.case, result.values, want):
                t.fail(message)
    t.metric("cases", len(results))
    t.say(f"{len(results)} cases agree on every rank")


@CHECKS.check("each rank keeps 1/p of the weights (within 1%)", points=2)
def weights_split(t: CheckContext, one_launch: Run) -> None:
    """The evidence: no rank received more than its TP allreduces bring (so none holds another's shard), and
    each hands back gradients of its shard's shapes, the checker's values where they depend on nothing else.
    The learner's word: the parameter elements it counts, and so a copy of its own shard kept besides them
    (zero-padded to the whole shape or not; too small for the memory probe to see)."""
    run = mlp_run(one_launch)
    results = mlp_results(t, run)
    received_too_much(t, run, "its share is")
    worst_ratio = 0.0
    for result in results:
        case = result.case
        share = case.whole_params / case.p
        for rank, value in enumerate(result.values):
            for block, count in enumerate(value.param_counts):
                ratio = count / share
                worst_ratio = max(worst_ratio, abs(ratio - 1))
                t.expect(abs(ratio - 1) <= MEMORY_TOLERANCE,
                         f"about {share:.0f} parameter elements per rank per block (1/p of "
                         f"{case.whole_params}, within 1%)",
                         f"{case.label()}: block {block} on rank {rank} keeps {count} ({ratio:.2f}x the "
                         f"share){': the whole block, unsplit' if count == case.whole_params else ''}")
    for result in results:
        if message := judging.unproven_share(result.case, result.values, judging.single_device(result.case)):
            t.fail(f"{message}: the share is read from the gradient shards ParallelMLP hands back")
    t.metric("worst_deviation", round(worst_ratio, 5))
    t.say(f"every rank counts its share, at most {worst_ratio:.2%} over (the replicated bias b2), and hands "
          "back its shard's gradients")


@CHECKS.check("one allreduce of tokens x hidden values in forward, one in backward, per block", points=2)
def one_allreduce_each_way(t: CheckContext, one_launch: Run) -> None:
    run = mlp_run(one_launch)
    results = mlp_results(t, run)
    for result in results:
        case = result.case
        for rank, by_phase in enumerate(phases(t, result)):
            for phase, counts in by_phase.items():
                head = f"{case.label()}: rank {rank}, {phase}"
                if wrong := judging.wrong_calls(head, phase, counts, case.blocks):
                    t.fail(wrong)
                moved = counts.op_bytes.get("Allreduce", 0)
                t.expect(moved == case.blocks * case.activation_bytes,
                         f"{case.blocks} x {case.activation_bytes} bytes (tokens x hidden float64 per block)",
                         f"{head} allreduced {moved} bytes: the allreduce carries the "
                         "activations (or their gradient), not the weights")
    outside_phases(t, run)
    t.say("one forward and one backward allreduce of tokens x hidden per block, on every rank")
    for result in results:  # and what they carried, as each rank's agent copied it
        if message := judging.wrong_carried(result):
            t.fail(message)
    t.say("each carries the rank's partial sum (forward) or its part of dL/dx (backward)")


@CHECKS.check("TP communication time within 5% of two ring allreduces per block", points=2)
def tp_time(t: CheckContext, one_launch: Run) -> None:
    worst_ratio, run = 0.0, mlp_run(one_launch)
    every = mlp_results(t, run)
    for task_run in run.tasks[1:]:  # one per rank count
        results = [result for result in every if result.task is task_run]
        p = results[0].case.p
        for result in results:
            case = result.case
            for rank, by_phase in enumerate(phases(t, result)):
                t.expect(not any(judging.wrong_calls("", *phase, case.blocks) for phase in by_phase.items()),
                         "one allreduce each way per block before the time is graded",
                         f"{case.label()}: rank {rank} made {judging.allreduce_calls(by_phase['forward'])} in "
                         f"forward and {judging.allreduce_calls(by_phase['backward'])} in backward (see the check above)")
            carried = judging.wrong_carried(result)
            t.expect(carried is None, "allreduces that carry the partial sums before the time is graded",
                     f"{case.label()}: {judging.carried_in_short(carried or '')} (see the check above)")
        bound = sum(2 * r.case.blocks * judging.ring_time(t, p, r.case.activation_bytes) for r in results)
        measured = t.measured_time(task_run)
        t.say(f"p = {p}: {measured * 1e6:.1f} us {t.clock} for {sum(2 * r.case.blocks for r in results)} "
              f"allreduces, bound {bound * 1e6:.1f} us ({measured / bound:.3f}x)")
        if measured / bound >= worst_ratio:
            worst_ratio = measured / bound
            t.performance(measured, bound, task_run)
        if t.learner_faults:  # delays and caps the bound knows nothing of: a figure, not a grade
            t.say("a fault plan of yours is in force (the bound knows none of its delays, caps or slow ranks): "
                  "reported, not graded")
            continue
        t.expect(measured <= (1 + TIME_TOLERANCE) * bound,
                 f"at most {(1 + TIME_TOLERANCE) * bound * 1e6:.1f} us (5% over the bound)",
                 f"{measured * 1e6:.1f} us for p = {p}, {measured / bound:.2f}x: more communication "
                 "than one allreduce of the activations each way per block")
    t.metric("worst_time_over_bound", round(worst_ratio, 4))
