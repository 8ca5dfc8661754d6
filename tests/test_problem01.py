"""Problem 01, the synchronous parameter server: its checks, end to end and piece by piece.

End to end: `distlab check 01` runs once per solution (the reference, the starter, every fixture in
tests/fixtures/01/) in a child process, on real MPI ranks, with one fixed seed, so a failure here
replays with `distlab check 01 --seed 4242 --solution ...`. Each test reads what a learner reads
(the console) and what a tool reads (--json), and makes sure no rank outlived the command.

Piece by piece: the pure helpers of the problem's package (cases.py, programs.py, judging.py: the
tiling of the key ranges, the balance, the out-of-step detector, the bound, the averaging mistakes,
the byte verdict, the AUC) are called directly, with no process started.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FIXTURES, PROBLEMS, run_cli
from e2e import (
    Checked,
    CheckRuns,
    assert_clean,
    fixture_runs,
    fixture_solution,
    leftovers,
)

from distlab.runtime.jobspec import problem_package

SEED = 4242
FOLDER = PROBLEMS / "01-sync-parameter-server"
PACKAGE = problem_package(FOLDER)
# the pure helpers are called where they live
cases, programs, judging = (importlib.import_module(f"{PACKAGE}.{m}") for m in ("cases", "programs", "judging"))


# -- end to end ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checked() -> CheckRuns:
    return CheckRuns("01", seed=SEED, timeout=240,
                     together=fixture_runs("01", [*sorted(BUGGY), "alt_pull_requests.py"]))


def fixture(name: str) -> tuple[str, ...]:
    return ("--solution", str(fixture_solution("01", name)))


MODEL = "the model after K steps"
PAIRS = "works for every (S, W)"
BYTES = "bytes per worker per step"
BALANCE = "shards balanced"
LATE = "a late worker"
TIME = "virtual time per step"

# fixture -> (the check that must fail, substrings of its message, checks that must pass)
BUGGY: dict[str, tuple[str, list[str], list[str]]] = {
    "mixes_steps.py": (LATE, ["with worker rank", "late", "it mixed two steps",
                              "answer the pull of step k only after applying step k - 1"],
                       [BYTES, BALANCE]),
    "whole_gradient.py": (BYTES, ["pushes the whole gradient to every server",
                                  "x one pull + one push of the model"],
                          [MODEL, PAIRS, BALANCE, LATE, TIME]),
    "mean_of_means.py": (MODEL, ["MEAN gradient was averaged over the W",
                                 "divide by the total number of examples"],
                         [BYTES, BALANCE]),
    "all_on_server0.py": (BALANCE, ["server 1: 0", "split the key range into S nearly equal parts"],
                          [MODEL, PAIRS, BYTES, LATE, TIME]),
    "serial_server.py": (TIME, ["waited for each other's compute",
                                "wait for that worker's push before it serves the next"],
                         [MODEL, PAIRS, BYTES, BALANCE, LATE]),
    "stale_pull.py": (MODEL, ["began its gradient of step 0 with", "not yet waited", "(a stale read)",
                              "Wait for every pull before batch.gradient reads w"], [BYTES, BALANCE]),
    "sum_never_reset.py": (MODEL, ["sums of the pushes and counts were never reset between steps",
                                   "set them to zero at the start of every step"], [BYTES, BALANCE]),
    # sealed or not, a server's view holds no worker's examples: cases.sgd raises in the server
    "forged_frames.py": (MODEL, ["'s view of the case holds no examples of rank"], []),
    # a right model, its pushes zeros of the right size: what they carried is checked, not their bytes
    "forged_central.py": (MODEL, ["sent server 0 no message carrying the gradient of its batch at the model of step 0",
                                  "cannot have come from the workers' gradients"], [BALANCE]),
    # a serial server whose workers compute undeclared and declare batch.gradient while idle
    "forged_hidden_compute.py": (MODEL, ["declared its gradient of step 0 before the pull of step 0",
                                         "call batch.gradient(w) on the model you pulled"],
                                 [BYTES, BALANCE]),
}

# Each diagnosis that names a cause, and the fixture whose bug it is: silent on every other one.
NAMES_ITS_BUG = {
    "it mixed two steps": "mixes_steps.py",
    "pushes the whole gradient to every server": "whole_gradient.py",
    "MEAN gradient was averaged over the W": "mean_of_means.py",
    "split the key range into S nearly equal parts": "all_on_server0.py",
    "waited for each other's compute": "serial_server.py",
    "(a stale read)": "stale_pull.py",
    "were never reset between steps": "sum_never_reset.py",
    "view of the case holds no examples": "forged_frames.py",
    "no message carrying the gradient of its batch": "forged_central.py",
    "before the pull of step": "forged_hidden_compute.py",
}
# And the fixtures a phrase may also name, where it is their bug too: a stale pull computes before
# its pulls have arrived; where MPI wrote them in time its model is right and its trace says so.
MAY_ALSO = {"before the pull of step": {"stale_pull.py"}}


def test_the_table_has_a_diagnosis_for_every_buggy_fixture() -> None:
    fixtures = {path.with_suffix(".py").name for path in (FIXTURES / "01").iterdir()
                if path.suffix in (".py", ".diff")}
    assert set(BUGGY) == fixtures - {"alt_pull_requests.py"} == set(NAMES_ITS_BUG.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUGGY))
def test_buggy_solution_fails_with_its_symptom(name: str, checked: Callable[..., Checked]) -> None:
    failing, needles, passing = BUGGY[name]
    run = checked(*fixture(name))
    assert_clean(run)
    assert run.rc == 1, run.out
    result = run.check(failing)
    assert result["status"] == "failed", run.out
    for needle in needles:
        assert needle in result["message"], f"{needle!r} missing from {result['message']!r}"
        assert needle in run.flat  # and the learner sees it on the console
    for name_start in passing:
        assert run.check(name_start)["status"] == "passed", run.check(name_start)["message"]
    assert f"distlab check 01 --seed {SEED}" in run.flat  # the replay hint
    for phrase, owner in NAMES_ITS_BUG.items():
        if name not in MAY_ALSO.get(phrase, ()):
            assert (phrase in run.messages()) == (owner == name), (phrase, run.messages())
    if name == "mean_of_means.py":
        # The same mistake under the late worker is named as itself, not as mixed steps.
        assert "mixed" not in run.check(LATE)["message"]


@pytest.mark.slow
def test_alternative_with_pull_requests_passes(checked: Callable[..., Checked]) -> None:
    run = checked(*fixture("alt_pull_requests.py"))
    assert_clean(run)
    assert run.rc == 0, run.out
    assert run.results is not None and run.results["score"] == run.results["max_score"]


@pytest.mark.slow
def test_reference_passes_with_metrics(checked: Callable[..., Checked]) -> None:
    run = checked("--solution", "reference")
    assert_clean(run)
    assert run.rc == 0, run.out
    r = run.results
    assert r is not None and r["passed"] and r["score"] == r["max_score"] == 14
    assert r["footer"].startswith("passed 01") and f"seed {SEED}" in r["footer"]
    assert r["seal"] == "on" and "unsealed" not in r["footer"]  # check grades sealed unless told
    assert r["totals"]["launches"] == 1  # every case, the late worker's too, in one launch
    metrics = run.check(MODEL)["metrics"]
    assert metrics["pull_p50_s"] > 0 and metrics["push_p50_s"] > 0
    assert 0 < metrics["sync_compute_ratio"] < 100
    assert len(run.check(BYTES)["metrics"]["bytes_per_server"]) >= 2
    assert abs(run.check(BYTES)["metrics"]["worst_bytes_over_model"] - 1) < 0.05
    timed = run.check(TIME)["metrics"]
    assert timed["bound_s"] <= timed["measured_s"] <= 1.02 * timed["bound_s"]
    assert "pull P50" in run.flat and "sync/compute" in run.flat


@pytest.mark.slow
@pytest.mark.parametrize("where", [("--platform", "three-dc"), ("--faults", "delay")])
def test_reference_passes_on_another_platform_and_under_a_delay_plan(where: tuple[str, str], tmp_path: Path) -> None:
    """Issue 11, item 4: off the card's platform the time bound is that of the slowest server-worker
    route (three data centres: 4 ms a step, 250x the laptop's bound); under the learner's own fault
    plan the time is reported, not graded. Neither is a serial server."""
    option, value = where
    if value == "delay":
        value = str(tmp_path / "delay.toml")
        Path(value).write_text('format_version = 1\nseed = 3\n\n[[fault]]\nkind = "delay"\nsrc = 1\n'
                               'latency_s = 0.001\n')
    run = run_cli("check", "01", "--solution", "reference", option, value, "--seed", "7", timeout=240)
    flat = " ".join(run.stdout.split())
    assert run.returncode == 0, run.stdout + run.stderr
    assert "waited for each other's compute" not in flat
    assert ("reported, not graded" in flat) == (option == "--faults")


@pytest.mark.slow
def test_starter_fails_with_a_helpful_message(checked: Callable[..., Checked]) -> None:
    run = checked()  # no workspace file: the starter is checked
    assert_clean(run)
    assert run.rc == 1, run.out
    assert "checking the starter" in run.flat and "distlab start 01" in run.flat
    assert "still the initial weights on every key: no update was applied" in run.flat
    assert "it neither pulled nor pushed" in run.flat
    assert run.results is not None and run.results["score"] == 0


@pytest.mark.slow
def test_free_run_trains_and_reports() -> None:
    proc = run_cli("run", "01", "--solution", "reference", "--ranks", "3",
                   "--param", "steps=8", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    flat = " ".join(proc.stdout.split())
    assert "S=1 W=2" in flat and "held-out AUC" in flat
    assert "equals single-process gradient descent" in flat
    assert not leftovers()


# -- the pure helpers ----------------------------------------------------------------------------


def small_case(**changes: Any) -> Any:
    base: dict[str, Any] = {"servers": 2, "workers": 3, "keys": 301, "batches": (20, 35, 9),
                            "steps": 4, "lr": 0.8, "seed": 11, "what": "a unit test"}
    base.update(changes)
    return cases.Case(**base)


def test_tiling_names_gaps_overlaps_and_strays() -> None:
    assert judging.tiling_problem(10, [(0, 4), (4, 10)]) is None
    assert judging.tiling_problem(10, [(4, 10), (0, 4)]) is None  # any order of servers
    assert judging.tiling_problem(10, [(0, 10), (10, 10)]) is None  # empty shards tile too
    assert "keys 4..5 are held by no server" in judging.tiling_problem(10, [(0, 4), (6, 10)])
    assert "keys 8..9 are held by no server" in judging.tiling_problem(10, [(0, 4), (4, 8)])
    assert "another server holds too" in judging.tiling_problem(10, [(0, 6), (4, 10)])
    assert "outside the model's 0..9" in judging.tiling_problem(10, [(0, 5), (5, 12)])


def test_balance_ratio() -> None:
    assert judging.balance([5, 5, 5]) == 1.0
    assert judging.balance([4, 5]) == 1.25
    assert judging.balance([10, 0]) == float("inf")


def test_out_of_step_detector() -> None:
    workers = [2, 3]
    in_step = [("pull", 2), ("pull", 3), ("push", 3), ("push", 2),
               ("pull", 2), ("pull", 3), ("push", 2), ("push", 3)]
    assert judging.first_out_of_step(in_step, workers) is None
    stale = [("pull", 2), ("pull", 3), ("push", 2), ("pull", 2)]
    message = judging.first_out_of_step(stale, workers)
    assert message is not None and "shard for step 1" in message and "worker rank 3" in message
    assert "stale pull" in message
    mixed = [("push", 2), ("push", 2)]
    message = judging.first_out_of_step(mixed, workers)
    assert message is not None and "push of step 1 from worker rank 2" in message


def test_step_bound_on_a_uniform_platform() -> None:
    from distlab.platforms import uniform

    case = small_case(servers=2, workers=3, keys=1001, batches=(50, 80, 20))
    platform = uniform(5, 1e-6, 1e-9, flops=1e10)
    b = judging.step_bound(case, platform)
    shard = 501 * 8  # ceil(1001 / 2) keys of 8 bytes
    wire = 1e-6 + max(3 * shard, 1001 * 8) * 1e-9
    assert b.wire == pytest.approx(wire)
    assert b.compute == pytest.approx(4 * 80 * 1001 / 1e10)
    assert b.compute_sum == pytest.approx(4 * 150 * 1001 / 1e10)
    assert b.bound == pytest.approx(2 * wire + b.compute)
    assert b.limit == pytest.approx(1.1 * b.bound + 5 * 1e-6)
    assert b.serial == pytest.approx(sum(2 * (1e-6 + shard * 1e-9) + 4 * n * 1001 / 1e10 for n in (50, 80, 20)))


def test_averaging_mistakes_are_recognised() -> None:
    case = small_case()
    layout = [(0, 151), (151, 301)]
    right = cases.sgd(case)
    assert judging.close(right, cases.trajectory(case, case.steps)[-1])
    for what, weights in judging.averaging_mistakes(case):
        wrong = cases.sgd(case, weights)
        assert not judging.close(wrong, right), what
        message, named = judging.diagnose_model(case, wrong, layout)
        assert named and "is wrong" in message
    message, named = judging.diagnose_model(case, cases.initial_weights(case), layout)
    assert named and "still the initial weights" in message
    message, named = judging.diagnose_model(case, cases.trajectory(case, 3)[-1], layout)
    assert named and "after 3 steps, not 4" in message
    broken = right.copy()
    broken[200] += 1.0
    message, named = judging.diagnose_model(case, broken, layout)
    assert not named and "key 200" in message and "only server(s) 1" in message


def test_sums_never_reset_are_named_and_only_they() -> None:
    case = small_case()
    layout = [(0, 151), (151, 301)]
    for carried, phrase in (("counts too", "sums of the pushes and counts were never reset"),
                            ("sums", "sums of the pushes were never reset")):
        message, named = judging.diagnose_model(case, cases.sgd(case, carried=carried), layout)
        assert named and phrase in message, message
    # step 0 is the same either way; after it the running sums differ from the step's gradient
    assert judging.close(cases.trajectory(case, 1, carried="sums")[-1], cases.trajectory(case, 1)[-1])
    for what, weights in judging.averaging_mistakes(case):  # no look-alike among the averaging mistakes
        assert "never reset" not in judging.diagnose_model(case, cases.sgd(case, weights), layout)[0], what


class _Timeline:
    """A worker's calls in program order, as grading's Timeline gives them."""

    def __init__(self, spans: list[Any]) -> None:
        self.spans = spans

    def events(self, rank: int) -> list[Any]:
        return self.spans


def test_stale_read_fires_only_on_a_gradient_before_its_pulls_completed() -> None:
    from distlab.grading.views import Span

    def recv(server: int) -> Span:
        return Span("recv", 0.0, 0.0, peer=server)

    def wait(*servers: int) -> Span:
        return Span("wait", 0.0, 0.0, received=tuple((0, s, 5, 0, 0) for s in servers))

    compute, send = Span("compute", 0.0, 1.0, name="gradient"), Span("send", 0.0, 0.0, peer=0)
    right = [recv(0), recv(1), wait(0, 1), compute, send, send, wait(), recv(0), recv(1), wait(0, 1), compute]
    assert judging.stale_read(_Timeline(right), 5, servers=2) is None
    blocking = [recv(0), wait(0), recv(1), wait(1), compute]  # Recv: a receive and its wait at once
    assert judging.stale_read(_Timeline(blocking), 5, servers=2) is None
    early = [recv(0), recv(1), wait(0, 1), compute, send, recv(0), recv(1), compute, wait(0, 1)]
    message = judging.stale_read(_Timeline(early), 5, servers=2)
    assert message is not None and "worker rank 5 began its gradient of step 1 with 2 receive(s)" in message
    assert "(a stale read)" in message


def test_the_data_is_the_same_in_every_process() -> None:
    case = small_case()
    X1, y1 = cases.worker_data(case, 1)
    X2, y2 = cases.worker_data(case, 1)
    assert np.array_equal(X1, X2) and np.array_equal(y1, y2)
    assert X1.shape == (35, 301) and set(np.unique(y1)) <= {0.0, 1.0}
    assert np.all(np.abs(X1).sum(axis=1) >= 1)  # every row has the bias and hashed fields
    batch = programs.Batch(X1, y1)
    w = cases.initial_weights(case)
    assert batch.size == 35
    assert np.allclose(batch.gradient(w), X1.T @ (1 / (1 + np.exp(-(X1 @ w))) - y1))
    with pytest.raises(ValueError, match="the whole model"):
        batch.gradient(w[:10])


def test_a_rank_is_handed_its_own_part_of_the_case_only() -> None:
    """A server's view holds the initial weights, a worker's its own examples (the same arrays the
    checker makes), neither the seed: no rank can compute the model without the others' messages."""
    from distlab.runtime.rank.views import for_rank

    case = small_case()
    server, worker = for_rank(case, 1), for_rank([case], 3)[0]
    assert server.seed == worker.seed == -1 and server == view_of(case) and "own" not in repr(server)
    assert np.array_equal(cases.initial_weights(server), cases.initial_weights(case))
    for got, want in zip(cases.worker_data(worker, 1), cases.worker_data(case, 1)):
        assert np.array_equal(got, want)
    for view, call in ((server, lambda v: cases.worker_data(v, 0)), (server, cases.sgd),
                       (worker, lambda v: cases.worker_data(v, 0)), (worker, cases.initial_weights)):
        with pytest.raises(ValueError, match="view of the case holds no"):
            call(view)
    # nor what marks a case for the checks: which worker is late, the timed case's class and equal batches
    for marked in (cases.Timed(**vars_of(case)), replace(case, late=3)):
        assert all(type(v) is cases.Case and v == view_of(case) for v in (for_rank(marked, 0), for_rank(marked, 4)))


def view_of(case: Any) -> Any:
    return replace(case, seed=-1, late=None, batches=(), what="a rank's view")


def vars_of(case: Any) -> dict[str, Any]:
    from dataclasses import fields

    return {f.name: getattr(case, f.name) for f in fields(case)}


def test_a_right_model_needs_the_workers_pushes_and_the_harness_compute() -> None:
    """The shards are the learner's word: a right model passes only with every server having received
    K slices of its keys from every worker, and each worker having declared K gradients of 4 n D flops."""
    from types import SimpleNamespace

    from distlab.grading import Counts
    from distlab.grading.views import Span
    from distlab.platforms import uniform

    case = small_case()  # S = 2 (keys 0..150, 151..300), workers 2, 3, 4 with 20, 35, 9 examples, K = 4
    layout, platform = [(0, 151), (151, 301)], uniform(5, 1e-6, 1e-9, flops=1e10)

    def run(pushed: int, spans: dict[int, list[Any]]) -> Any:
        counts = {s: Counts(recv_bytes=dict.fromkeys(case.worker_ranks, pushed * (hi - lo) * 8))
                  for s, (lo, hi) in enumerate(layout)}
        timeline = SimpleNamespace(events=lambda rank, kind=None: spans.get(rank, []))
        return SimpleNamespace(case=case, values=[], task=SimpleNamespace(counts=counts.__getitem__,
                                                                          timeline=lambda: timeline))

    def gradient(n: int, name: str = "gradient", scale: float = 1.0) -> list[Any]:
        return [Span("compute", k, k + scale * 4 * n * 301 / 1e10, name=name) for k in range(case.steps)]

    honest = {w: gradient(n) for w, n in zip(case.worker_ranks, case.batches)}
    assert judging.gradients_problem(run(case.steps, honest), layout) is None
    assert judging.compute_problem(run(case.steps, honest), platform) is None
    message = judging.gradients_problem(run(case.steps - 1, honest), layout)
    assert message is not None and "server 0 received" in message and "cannot have come from" in message
    for forged in ({**honest, 3: []}, {**honest, 3: gradient(35, "loss")}, {**honest, 3: gradient(35, scale=0.5)},
                   {**honest, 3: gradient(35) + gradient(35)}):
        message = judging.compute_problem(run(case.steps, forged), platform)
        assert message is not None and "the declared compute differs from the harness's: worker rank 3" in message
    # a learner's fault plan may slow a rank: then the spans' number and labels only
    assert judging.compute_problem(run(case.steps, {**honest, 3: gradient(35, scale=2.0)}), platform, True) is None


def test_a_message_holds_a_slice_exactly_or_times_one_factor() -> None:
    want = np.array([0.5, -2.0, 0.0, 3.0])
    assert judging.holds(np.array([9.0, 0.5, -2.0, 0.0, 3.0, 7.0]), want, scaled=False)
    assert judging.holds(np.array([0.5, -2.0, 0.0, 3.0]).view(np.uint8), want, scaled=False)  # sent as bytes
    assert judging.holds(np.array([-0.25, 1.0, 0.0, -1.5, 20.0]), want, scaled=True)  # a mean, a negated one
    assert not judging.holds(np.array([-0.25, 1.0, 0.0, -1.5, 20.0]), want, scaled=False)
    for wrong in (np.zeros(5), [0.5, -2.0, 0.0, 3.001], [0.5, -2.0, 0.0], [1.0, -2.0, 0.0, 3.0], [0.5, 2.0, 0.0, 3.0]):
        assert not judging.holds(np.array(wrong), want, scaled=True), wrong
    assert judging.holds(np.array([1.0, 0.0, 0.0, 0.0, 0.0]), np.zeros(4), scaled=True)  # a slice no example touches


def test_a_right_model_is_held_to_what_its_messages_carried() -> None:
    """Pulls must carry synchronous SGD's shards, pushes the gradient of the worker's batch at them (times
    one factor), and each worker's k-th declared gradient must sit between its pull and its push."""
    from types import SimpleNamespace

    from distlab.grading import SentLog
    from distlab.grading.views import Span

    case = small_case()  # S = 2, workers 2, 3, 4, K = 4
    layout, models = [(0, 151), (151, 301)], cases.trajectory(case, case.steps)
    compute = Span("compute", 0.0, 1.0, name="gradient")

    def run(push: Any = np.append, pull: Any = lambda m: m, at: int = 1) -> Any:
        """``at``: the worker's compute among its calls of a step (0 before the pull's wait, 2 after its pushes)."""
        events: dict[int, list[Any]] = {r: [] for r in range(5)}
        logs = {r: SentLog() for r in range(5)}

        def send(src: int, dst: int, data: np.ndarray) -> Any:
            logs[src].add("Send", dst, data, 0)
            return Span("send", 0.0, 0.0, peer=dst, nbytes=data.nbytes, message=(0, src, dst, 0, len(logs[src].items)))

        for model in models[:-1]:
            for i, w in enumerate(case.worker_ranks):
                X, y = cases.worker_data(case, i)
                gradient = X.T @ (cases.sigmoid(X @ model) - y)
                for s, (lo, hi) in enumerate(layout):
                    events[s].append(send(s, w, pull(model[lo:hi])))
                calls = [Span("wait", 0.0, 0.0, received=tuple(events[s][-1].message for s in range(2))),
                         *[send(w, s, push(gradient[lo:hi], len(y))) for s, (lo, hi) in enumerate(layout)]]
                events[w] += calls[:at] + [compute] + calls[at:]
        timeline = SimpleNamespace(events=lambda rank, kind=None: [e for e in events[rank] if kind in (None, e.kind)])
        return SimpleNamespace(case=case, task=SimpleNamespace(timeline=lambda: timeline, sent=logs.__getitem__))

    def problem(**how: Any) -> str:
        return judging.carried_problem(run(**how), layout) or ""

    assert problem() == "" and problem(push=lambda g, n: np.append(g / n, n)) == ""  # a mean and its count
    zeros = problem(push=lambda g, n: np.zeros(len(g) + 1))
    assert "worker rank 2 sent server 0 no message carrying the gradient of its batch at the model of step 0" in zeros
    assert "server 0 sent worker rank 2 no message carrying its shard (keys 0..150)" in problem(pull=np.zeros_like)
    assert "worker rank 2 declared its gradient of step 0 before the pull of step 0 from server 0" in problem(at=0)
    assert "worker rank 2 declared its gradient of step 0 after its push of step 0 to server 0" in problem(at=3)
    broken = run()
    broken.task.sent(3).items.pop()
    message = judging.carried_problem(broken, layout)
    assert message is not None and "rank 3's copy of what it sent does not match its trace" in message


def test_a_forged_server_return_fails_without_crashing_the_check() -> None:
    case = small_case()
    good = (0, np.zeros(151))
    for bad in ((0, np.zeros((151, 1))), (0, [0.0] * 151), ("0", np.zeros(151)), (True, np.zeros(151)),
                {"lo": 0}, None, (0, np.zeros(151, dtype=object))):
        layout, problem = judging.shard_layout(case, [good, bad])
        assert layout == [] and problem is not None and "server 1 returned" in problem, bad
    assert judging.shard_layout(case, [good])[1] is not None  # a server's value missing altogether


def test_bytes_verdict_names_the_whole_gradient_push() -> None:
    from distlab.grading import Counts

    def counts(pushed: int, pulled: int) -> Counts:  # one message of each size to and from servers 0 and 1
        return Counts(sent_msgs={0: 1, 1: 1}, sent_bytes={0: pushed, 1: pushed},
                      recv_msgs={0: 1, 1: 1}, recv_bytes={0: pulled, 1: pulled})

    case = small_case(servers=2, keys=1000, steps=2)
    ratio, problem = judging.worker_bytes_problem(case, 0, counts(2 * (500 * 8 + 8), 2 * 500 * 8))
    assert problem is None and ratio == pytest.approx(1.001)  # the counts: 8 bytes per slice
    ratio, problem = judging.worker_bytes_problem(case, 0, counts(2 * (1000 * 8 + 8), 2 * 500 * 8))
    assert problem is not None and "pushes the whole gradient to every server" in problem
    ratio, problem = judging.worker_bytes_problem(case, 1, Counts())
    assert problem is not None and "worker rank 3" in problem and "neither pulled nor pushed" in problem


def test_auc() -> None:
    y = np.array([0, 0, 1, 1.0])
    assert programs.auc(y, np.array([0.1, 0.2, 0.3, 0.4])) == 1.0
    assert programs.auc(y, np.array([0.4, 0.3, 0.2, 0.1])) == 0.0
    assert programs.auc(y, np.zeros(4)) == 0.5


# -- margins: the common wrong answers stand at least twice each tolerance away -------------------

MARGIN_SEEDS = range(500)  # 2000 held when written; 500 in the suite


def test_bytes_margin_an_extra_pull_stands_twice_the_tolerance_away() -> None:
    """Per worker and step, the reference moves 1 + S / 2D models (one count per slice), a worker
    with pull requests 1 + S / D; one pull more after the last step makes 1 + 1 / 2K, a second pull
    per step 1.5: the first two well inside the tolerance, the others at least twice it away."""
    tolerance = judging.BYTES_TOLERANCE
    for seed in MARGIN_SEEDS:
        for case in cases.sweep(seed):
            assert case.servers / case.keys <= tolerance / 2
            assert 1 / (2 * case.steps) >= 2 * tolerance, case  # K <= 12
            if case.servers > 1:  # the whole gradient to every server: (S + 1) / 2 models
                assert (case.servers + 1) / 2 - 1 >= 2 * tolerance


def test_time_margin_a_serial_server_stands_twice_the_tolerance_away() -> None:
    """Serving one worker at a time (serial_server), each worker's pull, compute and push come one
    after another: at least W x (2 shard messages + compute) per step, on the card's platform more
    than twice the check's allowance (10% + one latency per rank) over the bound."""
    from distlab.platforms import resolve

    laptop = resolve("laptop")
    for seed in MARGIN_SEEDS:
        (case,) = [c for c in cases.sweep(seed) if isinstance(c, cases.Timed)]
        b, route = judging.step_bound(case, laptop), laptop.route(0, case.servers)
        shard = route.alpha_s + -(-case.keys // case.servers) * judging.ITEMSIZE * route.beta_s_per_byte
        serial = case.workers * (2 * shard + b.compute)
        assert serial >= b.bound + 2 * (b.limit - b.bound), (seed, serial, b)


def test_model_margin_every_named_mistake_stands_twice_the_tolerance_away() -> None:
    """Every model diagnose_model names differs from the right one by more than 2x (rtol, atol)."""
    from distlab.grading import first_mismatch

    for seed in range(0, 2000, 40):  # each case trains several models: a sample of the seeds
        case = cases.sweep(seed)[0]
        right, models = cases.sgd(case), cases.trajectory(case, case.steps + 2)
        wrong = [m for k, m in enumerate(models) if k != case.steps]
        wrong += [cases.sgd(case, weights) for _, weights in judging.averaging_mistakes(case)]
        wrong += [cases.sgd(case, carried=carried) for carried in ("sums", "counts too")]
        for model in wrong:
            assert first_mismatch(model, right, rtol=2 * cases.RTOL, atol=2 * cases.ATOL) is not None, seed
