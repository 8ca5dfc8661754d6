"""Checks for problem 08, find the bottleneck.

A training loop written here (declared compute, then a direct reduce-scatter and allgather of the
gradient over every cable) runs on 6 to 8 ranks of a hidden mesh whose cables differ by up to 15%,
with ranks whose work differs by up to ~20% (uneven data shards). Into each variant we slip a
straggler (a `slow` fault: one rank computes 1.5-3x longer), a slow link (a `bandwidth` fault: one
cable keeps 15-30% of its bandwidth), both, or nothing; the variants, drawn from the seed
(cases.py), are the tasks of one launch. The truth is the replay of that run, never what the
ranks say: compute from a rank's "step" mark to its "sync" mark, sync from there to its next
"step" (or "trained") mark, exactly the phases the probes wrap.

Against it, in order: the probes' durations (within 2%), the job's sync/compute ratio over every
rank and step (within 3%: the draw keeps its common wrong answers twice that away), the stragglers and the slow links (named exactly), a Chrome trace with
one track per rank, and what the probes cost: the training's makespan with probes over the same
variant's without them (at most 3% more). That twin runs in the learner's process too, where a patched
exchange could make it as slow as the probed run: its agents' record must be the harness's own
training, call for call and byte for byte, or it is no baseline.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np

from distlab.grading import CheckContext, Checklist, Run, Task, validate_chrome_trace

from . import cases, judging, programs
from .judging import HiddenRun

SPAN_TOLERANCE = 0.02  # probes: each duration within 2% (+ 0.1 us) of the replay's
RATIO_TOLERANCE = cases.RATIO_TOLERANCE  # the sync/compute ratio within 3% of the replay's
MAX_OVERHEAD = 0.03  # probes may add at most 3% to the training's virtual time

CHECKS = Checklist()


@CHECKS.run
def every_variant(t: CheckContext) -> Run:
    """The one launch of the session: every hidden variant on the hidden mesh, then the twin."""
    h = cases.hidden(t.seed)
    tasks = [Task(ranks=v.p, case=v, faults=v.fault_plan(t.seed),
                  label=f"the {v.label()}" + ("" if v.probed else " without probes"))
             for v in h.variants + (h.twin,)]
    return t.launch(programs.run_variant, tasks, online_clock=True, platform=cases.mesh(h.mesh_seed))


@CHECKS.run
def hidden_runs(t: CheckContext, every_variant: Run) -> list[HiddenRun]:
    """The probed variants, each with its truth from the replay and rank 0's answer."""
    for result in every_variant.cases():  # the truth is read from the marks, set in the learner's process
        if message := judging.marks_message(result.task, result.case) or judging.result_message(result):
            t.fail(message)
    return [judging.hidden_run(result) for result in every_variant.cases() if result.case.probed]


@CHECKS.check("probes time compute and sync of every step, gathered on rank 0", points=2)
def probes_match_replay(t: CheckContext, hidden_runs: list[HiddenRun]) -> None:
    t.say(f"{len(hidden_runs)} hidden runs of {', '.join(str(c.variant.p) for c in hidden_runs)} "
          "ranks on an 8-accelerator mesh; each duration is compared with the replay's")
    worst = 0.0
    for case in hidden_runs:
        v, truth = case.variant, case.truth
        spans = judging.spans_of(t, case)
        for phase, got, want in (("compute", spans[..., 1] - spans[..., 0], truth.compute),
                                 ("sync", spans[..., 3] - spans[..., 2], truth.sync)):
            error = np.abs(got - want)
            bad = ~(error <= SPAN_TOLERANCE * np.abs(want) + 1e-7)  # NaN is off too
            worst = max(worst, float(np.max(error / np.maximum(np.abs(want), 1e-9))))
            if bad.any():
                rank, step = (int(x) for x in np.argwhere(bad)[0])
                short = bool((got[bad] < want[bad]).all())
                hint = ("read comm.now() right before and after each phase" if not short or
                        phase == "compute" else "the step goes on after your stop(\"sync\"): do "
                        "the probes send or wait during training?")
                t.fail(f"{v.label()}: rank {rank}, step {step}: expected {phase} "
                       f"{want[rank, step] * 1e3:.4f} ms (the replay, within 2%); the probes say "
                       f"{got[rank, step] * 1e3:.4f} ms ({int(bad.sum())} of {bad.size} {phase} "
                       f"durations off): {hint}")
    t.metric("worst_relative_error", round(worst, 6))
    t.say(f"every rank's per-step compute and sync agree with the replay (worst {worst:.2%})")


@CHECKS.check(f"sync/compute ratio within {RATIO_TOLERANCE:.0%} of the replay's, over all ranks and steps", points=2)
def ratio_matches_replay(t: CheckContext, hidden_runs: list[HiddenRun]) -> None:
    worst = 0.0
    for case in hidden_runs:
        v, want = case.variant, case.truth.ratio
        got = judging.answer(t, case, "sync_compute_ratio")
        if not isinstance(got, (int, float)) or isinstance(got, bool) or judging.finite(got) is None:
            t.fail(f"{v.label()}: 'sync_compute_ratio' must be a number; saw {judging.shown(got)}")
        got = judging.finite(got)
        off = abs(got - want) / want
        worst = max(worst, off)
        if off > RATIO_TOLERANCE:
            hint = ": nothing measured" if got == 0 else ""
            if (named := case.truth.look_alike(got)) is not None:
                hint = (f": that is {named[0]} ({named[1]:.3f}); the job's ratio sums sync and compute "
                        "over every rank and step, then divides the one by the other")
            t.fail(f"{v.label()}: expected sync/compute {want:.3f} (sum of sync over sum of compute, "
                   f"every rank and step, from the replay) within {RATIO_TOLERANCE:.0%}; saw {got:.3f}{hint}")
        t.say(f"{v.name}: {got:.3f} (replay {want:.3f})")
    t.metric("worst_ratio_error", round(worst, 4))


@CHECKS.check("diagnose() names exactly the stragglers in every hidden run", points=3)
def stragglers_exact(t: CheckContext, hidden_runs: list[HiddenRun]) -> None:
    for case in hidden_runs:
        v = case.variant
        got = judging.listed(t, case, "stragglers", "ranks", lambda value: sorted({int(r) for r in value}))
        want = [v.straggler] if v.straggler is not None else []
        ratio = case.truth.compute_over_median()
        missed = [r for r in want if r not in got]
        extra = [r for r in got if r not in want]
        seen = f"{v.label()}: expected stragglers {want}; saw {got}: "
        if missed:
            t.fail(f"{seen}rank {missed[0]} computes {ratio[missed[0]]:.2f}x the median rank and "
                   "was not named")
        if extra:
            outside = [r for r in extra if not 0 <= r < v.p]
            if outside:
                t.fail(f"{seen}rank {outside[0]} is not in this run of {v.p} ranks")
            ends = set(v.slow_link or ())
            if ends and set(extra) <= ends:
                t.fail(f"{seen}{' and '.join(f'rank {r}' for r in extra)} "
                       f"{'are the ends' if len(extra) > 1 else 'is an end'} of the slow link "
                       f"{v.slow_link}, computing only "
                       f"{', '.join(f'{ratio[r]:.2f}x' for r in extra)} the median: a slow link makes "
                       "ranks wait, it does not make them compute slower")
            t.fail(f"{seen}a false positive: rank {extra[0]} computes {ratio[extra[0]]:.2f}x the "
                   "median rank, natural imbalance (uneven shards, up to ~1.2x), not a straggler "
                   "(1.5-3x)")
        t.say(f"{v.name}: stragglers {got}")


@CHECKS.check("diagnose() names exactly the slow links in every hidden run", points=3)
def slow_links_exact(t: CheckContext, hidden_runs: list[HiddenRun]) -> None:
    for case in hidden_runs:
        v = case.variant
        got = judging.listed(t, case, "slow_links", "pairs (i, j)", lambda value: sorted(
            {(min(int(a), int(b)), max(int(a), int(b))) for a, b in value}))
        want = [v.slow_link] if v.slow_link is not None else []
        rtt = judging.pings_of(case.rank0.report)  # only for the hint: what cannot be read is no matrix
        missed = [pair for pair in want if pair not in got]
        extra = [pair for pair in got if pair not in want]
        seen = f"{v.label()}: expected slow links {want}; saw {got}: "
        if missed:
            i, j = missed[0]
            pinged = ""
            if rtt.shape == (v.p, v.p) and v.p > 2:
                others = [rtt[a, b] for a in range(v.p) for b in range(a + 1, v.p) if (a, b) != (i, j)]
                typical = float(np.median(others))
                if not rtt.any():
                    pinged = "; your pings are all zero"
                elif typical > 0:
                    pinged = (f"; your pings show {i}-{j} at {rtt[i, j] / typical:.2f}x the median pair: "
                              "a bandwidth fault leaves latency alone, so only pings of many bytes see it")
            t.fail(f"{seen}link {i}-{j} keeps {v.link_factor:.2f}x of its bandwidth and was not "
                   f"named{pinged}")
        if extra:
            i, j = extra[0]
            if not (0 <= i < j < v.p):
                t.fail(f"{seen}({i}, {j}) is not a pair of distinct ranks of this run of {v.p}")
            t.fail(f"{seen}a false positive: cable {i}-{j} is healthy (cables differ by up to 15%); "
                   "were both ends of each ping ready when it was timed?")
        t.say(f"{v.name}: slow links {got}")


@CHECKS.check("the Chrome trace loads and has one track per rank", points=2)
def trace_has_a_track_per_rank(t: CheckContext, hidden_runs: list[HiddenRun]) -> None:
    for case in hidden_runs:
        v = case.variant
        judging.report_of(t, case)
        if case.rank0.trace_json is None and not case.rank0.trace_error:
            t.fail(f"{v.label()}: diagnose() returned no 'trace' (a dict with a traceEvents list)")
        if case.rank0.trace_error:
            t.fail(f"{v.label()}: the trace is not JSON, so no viewer can load it: "
                   f"{case.rank0.trace_error} (use plain floats and ints)")
        try:
            trace = json.loads(case.rank0.trace_json or "null")
        except (ValueError, RecursionError) as exc:  # run_variant wrote it, in the solution's process
            why = exc if isinstance(exc, ValueError) else "nested deeper than a parser goes"
            t.fail(f"{v.label()}: the trace that came back is not JSON a viewer loads: {why}")
        problems = validate_chrome_trace(trace)
        if problems:
            t.fail(f"{v.label()}: expected a trace in the Chrome trace event format; "
                   f"{len(problems)} problem(s), the first: {problems[0]}")
        tracks = judging.trace_tracks(trace["traceEvents"])
        if len(tracks) != v.p:
            seen = f"{len(tracks)} track(s) holding complete ('X') events"
            if len(tracks) == 1 and v.p > 1:
                seen = (f"all {len(next(iter(tracks.values())))} spans on one track, where the ranks' "
                        "spans overlap: give each rank its own pid (or tid)")
            t.fail(f"{v.label()}: expected one track (pid, tid) per rank, {v.p} in all; saw {seen}")
        for key, spans in sorted(tracks.items(), key=lambda kv: str(kv[0])):
            names = [e.get("name") for e in spans]
            for phase in ("compute", "sync"):
                if names.count(phase) != v.steps:
                    t.fail(f"{v.label()}: expected {v.steps} '{phase}' spans on each rank's track; "
                           f"track pid={key[0]}, tid={key[1]} has {names.count(phase)}")
        want_totals = sorted(case.truth.compute.sum(axis=1) * 1e6)
        got_totals = sorted(sum(float(e.get("dur", 0)) for e in spans if e.get("name") == "compute")
                            for spans in tracks.values())
        for got, want in zip(got_totals, want_totals):
            if not abs(got - want) <= SPAN_TOLERANCE * want + 0.1:  # NaN is off too
                t.fail(f"{v.label()}: expected each track's 'compute' spans to add up to its rank's "
                       f"compute ({', '.join(f'{w / 1e3:.3f}' for w in want_totals)} ms); saw "
                       f"{', '.join(f'{g / 1e3:.3f}' for g in got_totals)} ms: ts and dur are in "
                       "microseconds")
    t.say(f"{len(hidden_runs)} traces, each with one track per rank and a compute and sync span per step")


@CHECKS.check("probes add at most 3% to the training's virtual time", points=2)
def probes_are_cheap(t: CheckContext, hidden_runs: list[HiddenRun], every_variant: Run) -> None:
    twin = every_variant.cases()[-1]  # the healthy job on every rank again, without probes
    probed = next(run for run in hidden_runs if run.variant == replace(twin.case, probed=True))
    judging.spans_of(t, probed)  # a probe that measures nothing costs nothing, and is of no use
    for task_run, v in ((probed.task_run, probed.variant), (twin.task, twin.case)):
        if message := judging.harness_message(task_run, v):  # the learner's process runs the harness
            t.fail(message)
    if message := judging.twin_message(twin.task, twin.case):  # a twin slowed by patched harness code hides any cost
        t.fail(message)
    bare = judging.truth_of(twin.task, twin.case)
    overhead = probed.truth.trained_s / bare.trained_s - 1
    extra_calls = judging.training_calls(probed.task_run) - judging.training_calls(twin.task)
    t.say(f"{probed.variant.label()}: training took {probed.truth.trained_s * 1e3:.3f} ms with "
          f"probes, {bare.trained_s * 1e3:.3f} ms without ({overhead:+.2%}); "
          f"{extra_calls} extra communication calls during training")
    t.metric("overhead", round(overhead, 5))
    t.metric("extra_calls", extra_calls)
    t.performance(probed.truth.trained_s, bare.trained_s, probed.task_run)
    t.expect(overhead <= MAX_OVERHEAD,
             f"at most {bare.trained_s * (1 + MAX_OVERHEAD) * 1e3:.3f} ms of training (3% over the "
             f"{bare.trained_s * 1e3:.3f} ms without probes)",
             f"{probed.truth.trained_s * 1e3:.3f} ms ({overhead:+.1%}) in the {probed.variant.label()}, "
             f"with {extra_calls} extra communication calls during training: keep the numbers on the rank "
             "and send them once, after the last step")
