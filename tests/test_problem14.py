"""Problem 14, large sparse features: the checks' pure helpers, then `distlab check 14` end to end.

The first half starts no process: the card's cost formulas against the reference's, the factorization
machine's gradient, the harness's shard and batch, the single-process simulation, the diagnoses,
and the margins: over many hidden variants, each tolerance keeps the right answer within half of
it and the common wrong answers at least twice it away (the grid's measured times stood in for by
the card's formula at the busiest server's real load, which the replay followed within 1.1x).

The second half runs the real CLI once per solution (the reference sealed, as a learner runs it;
the starter; every fixture in tests/fixtures/14/ unsealed; the alternative on gloo) with one fixed
seed, so a failure replays with `distlab check 14 --seed 1414 --solution ...`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from conftest import PROBLEMS, run_cli
from e2e import (
    Checked,
    CheckRuns,
    assert_clean,
    assert_passes,
    assert_starter_fails,
    fixture_names,
    fixture_runs,
    fixture_solution,
    leftovers,
    load_file,
    problem_modules,
)

from distlab.grading import first_mismatch

SEED = 1414
FOLDER = PROBLEMS / "14-sparse-features"
cases, programs, judging, check = problem_modules(FOLDER, "cases", "programs", "judging", "check")
MARGIN_SEEDS = range(40)  # 300 held when written (tests/test_problem14.py's margin functions); 40 in the suite


reference = load_file(FOLDER / "reference.py", "problem14_reference")


class FakeComm:
    """What a Shard or a Batch asks of its comm: the declared work, noted."""

    def __init__(self) -> None:
        self.work: list[tuple[str, float]] = []

    def compute(self, seconds: float = 0.0, flops: float = 0.0, label: str = "") -> None:
        self.work.append((label, seconds or flops))


# -- the pieces --------------------------------------------------------------------------------------


def test_the_cards_formulas_are_the_references_cost_model() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        args = (int(rng.integers(256, 10**6)), int(rng.integers(1, 4096)), float(rng.uniform(1, 5000)),
                int(rng.integers(1, 9)), int(rng.integers(1, 9)), float(rng.uniform(1e-6, 1e-4)),
                float(rng.uniform(1e-11, 1e-8)), float(rng.uniform(0, 2e-6)))
        assert judging.step_costs(*args) == pytest.approx(reference.step_times(*args))
        assert reference.choose(*args) == ("parameter server" if reference.step_times(*args)[0] <
                                           reference.step_times(*args)[1] else "allreduce")
    # A million rows on the card's cluster: past 1024 the parameter server wins at 10% touched, not at 50%.
    alpha, beta = 50e-6, 1e-10
    for density, wins in ((0.1, True), (0.5, False)):
        sparse, dense = judging.step_costs(10**6, 1024, density * 10**6, 8, 8, alpha, beta, cases.ROW_COST_S)
        assert (sparse < dense) == wins


def test_the_gradient_of_every_occurrence_is_the_log_loss_gradient() -> None:
    rng = np.random.default_rng(1)
    emb, labels = rng.normal(0, 0.3, (5, cases.FIELDS, 3)), (rng.random(5) < 0.4).astype(float)
    grads, loss = cases.fm_gradients(emb, labels, 1.0 / 5)

    def mean_loss(e: np.ndarray) -> float:
        logits = cases.fm_logits(e)[0]
        return float(np.mean(np.logaddexp(0.0, logits) - labels * logits))

    assert loss == pytest.approx(mean_loss(emb))
    for index in [(0, 0, 0), (3, 2, 1), (4, 5, 2)]:
        bumped = emb.copy()
        bumped[index] += 1e-6
        assert grads[index] == pytest.approx((mean_loss(bumped) - mean_loss(emb)) / 1e-6, rel=1e-3, abs=1e-8)


def test_the_shard_holds_its_rows_sums_repeats_charges_each_row_and_refuses_strangers() -> None:
    data, comm = cases.Data(20, 3, 4, 1, 1.0, 1.1, 7), FakeComm()
    shard = programs.Shard(comm, data, 1, 3, 0.5e-6)
    table = cases.initial_table(data)
    assert np.array_equal(shard.lookup(np.array([1, 7, 19])), table[[1, 7, 19]])
    shard.add(np.array([4, 4, 10]), np.ones((3, 3)))
    assert np.allclose(shard.lookup(np.array([4, 10])), table[[4, 10]] + np.array([[2.0], [1.0]]))
    assert comm.work == [("lookup", 1.5e-6), ("add", 1.5e-6), ("lookup", 1e-6)]
    with pytest.raises(ValueError, match="row 2 lives on server 2 .*route each id to server id % S"):
        shard.lookup(np.array([1, 2]))
    batch = programs.Batch(data, 0, 0, 2, comm, declare=False)
    with pytest.raises(ValueError, match="one row per id occurrence"):
        batch.gradients(np.zeros((4, 3)))


def test_batches_touch_about_the_density_they_were_sized_for() -> None:
    for rows, zipf, density in ((8192, 1.0, 0.03), (1024, 1.2, 0.3), (600, 0.95, 0.5)):
        data = cases.Data(rows, 4, cases.batch_for(rows, zipf, density), 1, 0.5, zipf, 3)
        assert cases.touched(data, 4) / rows == pytest.approx(density, rel=0.12)


def test_sessions_replay_per_seed_and_vary_the_hidden_variants() -> None:
    assert cases.session(5) == cases.session(5)
    drawn = [cases.session(seed) for seed in range(12)]
    assert len({s.sparse[0].data.zipf for s in drawn}) == 12
    assert {s.sparse[0].servers for s in drawn} == {1, 2, 3} and {s.grid.servers for s in drawn} == {2, 3}
    for s in drawn:
        main, bigger = s.sparse[0], s.sparse[2]
        assert np.array_equal(cases.batch_ids(main.data, 1, 1), cases.batch_ids(bigger.data, 1, 1))
        assert bigger.data.rows == cases.TABLE_ROWS and main.late in range(main.servers, main.servers + main.workers)
        assert len(s.grid.points) == 16 and all(d.rows * d.dim <= cases.GRID_CELLS for d, _ in s.grid.points)


def test_a_server_builds_its_shard_of_the_table_block_by_block() -> None:
    data = replace(cases.session(3).sparse[0].data, rows=2 * cases.BLOCK_ROWS + 5, dim=2)
    whole = cases.initial_table(data)
    assert whole.shape == (data.rows, 2) and 0.09 < float(np.std(whole)) < 0.11
    for server in range(3):  # row r lives on server r % 3, at r // 3, across the blocks' seams
        assert np.array_equal(cases.initial_table(data, server, 3), whole[server::3])


def test_point_times_read_the_marks_of_every_rank() -> None:
    class Timeline:
        ranks = [0, 1]

        def marks(self, rank: int) -> list[tuple[str, float]]:
            return [("between", 0.0), ("point 0", 1.0 + rank), ("done", 4.0 + rank), ("between", 5.0),
                    ("point 1", 6.0), ("done", 6.5 + rank)]

    class Task:
        def timeline(self) -> Timeline:
            return Timeline()

    assert judging.point_times(Task(), 2) == [4.0, 1.5]  # first rank's start to last rank's end


def test_point_times_pass_over_the_learners_own_marks_and_the_program_s_are_counted() -> None:
    from types import SimpleNamespace

    class Timeline:
        ranks = [0, 1]

        def marks(self, rank: int) -> list[tuple[str, float]]:  # "mine": the learner's, mid-point
            return [("between", 0.0), ("point 0", 1.0 + rank), ("mine", 1.5), ("done", 4.0 + rank), ("between", 5.0),
                    ("point 1", 6.0), ("mine", 6.1), ("done", 6.5 + rank)]

    g = replace(cases.session(3).grid, points=cases.session(3).grid.points[:2])
    task = SimpleNamespace(timeline=Timeline, spec=SimpleNamespace(marks=judging.task_marks(g)))
    assert judging.point_times(task, 2) == [4.0, 1.5]
    assert judging.program_marks(g) == ["between", "point 0", "done", "between", "point 1", "done", "between"]
    assert judging.task_marks(g) == ("between", "done", "point 0", "point 1")
    run = cases.session(3).sparse[0]
    assert judging.program_marks([run]) == ["between"] + [run.what] * run.data.steps + ["done"]


def test_a_rank_is_handed_only_its_own_part_of_a_case() -> None:
    """A server gets its shard's initial rows, a worker its own batches (and the table's key on the
    allreduce path); no rank can rebuild another worker's batches, and cases.py trains nothing."""
    from distlab.runtime.rank.views import for_rank

    s = cases.session(4)
    for run in (*s.sparse, *s.dense):
        for rank in range(run.servers + run.workers):
            view, own = for_rank([run], rank)[0].data, rank - run.servers
            assert view.seed == -1 and view.rows == run.data.rows
            for w in range(run.workers):
                if w == own:
                    ids = cases.batch_ids(view, w, 0)
                    assert np.array_equal(ids, cases.batch_ids(run.data, w, 0))
                    assert np.array_equal(cases.clicks(view, ids, w, 0), cases.clicks(run.data, ids, w, 0))
                else:
                    with pytest.raises(ValueError, match="holds no data of worker"):
                        cases.batch_ids(view, w, 0)
            if rank < run.servers or not run.servers:
                server, servers = (rank, run.servers) if run.servers else (0, 1)
                assert np.array_equal(cases.initial_table(view, server, servers),
                                      cases.initial_table(run.data, server, servers))
            else:
                with pytest.raises(ValueError, match="no key of the initial table"):
                    cases.initial_table(view)
    for mode, servers in (("sparse", s.grid.servers), ("dense", 0), ("model", 0)):
        grid = replace(s.grid, mode=mode)
        for rank in range(servers + grid.workers if mode != "model" else 1):
            for (view, _), (data, _) in zip(grid.for_rank(rank).points, grid.points):
                assert view.seed == -1 and (view.rows, view.dim, view.batch) == (data.rows, data.dim, data.batch)
                with pytest.raises(ValueError, match="holds no data of worker"):
                    cases.batch_ids(view, grid.workers if mode == "model" else (rank - servers + 1) % grid.workers, 0)
    assert not hasattr(cases, "train") and not hasattr(cases, "held_out_loss")


def test_a_rank_view_holds_its_own_data_and_no_key_of_it() -> None:
    """No int in a rank's view is a key of the case's data (the seed, the teacher's, a worker's, the
    table's where a rank holds a shard only; the allreduce path shares the table's), so nothing in
    it is shorter than the data it stands for; its arrays are the whole case's, every step's."""
    from dataclasses import fields, is_dataclass

    from distlab.runtime.rank.views import for_rank

    def ints(value: Any) -> list[int]:  # every int among a view's fields, walked down to the arrays
        if is_dataclass(value):
            return [i for f in fields(value) for i in ints(getattr(value, f.name))]
        if isinstance(value, (tuple, list)):
            return [i for item in value for i in ints(item)]
        return [int(value)] if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else []

    def check(data: Any, view: Any, servers: int, workers: int, rank: int | None, held: Any = None) -> None:
        # rank None: the cost model's view, which holds no data at all; held: what is walked (the view)
        keys = {data.seed, cases.data_key(data.seed, cases.TEACHER)} | {
            cases.data_key(data.seed, cases.WORKER, w) for w in range(workers)}
        shared = cases.data_key(data.seed, cases.TABLE)
        if servers or rank is None:
            keys.add(shared)
        found = ints(view if held is None else held)
        assert not keys & set(found), (data, rank)
        assert all(0 <= i < 2**31 or i in (-1, shared) for i in found), (data, rank, found)
        if rank is None:
            assert view.part.batches == () and view.part.rows is None
        elif rank < servers:
            assert np.array_equal(cases.initial_table(view, rank, servers), cases.initial_table(data, rank, servers))
        else:
            for step in range(data.steps):
                ids = cases.batch_ids(data, rank - servers, step)
                assert np.array_equal(cases.batch_ids(view, rank - servers, step), ids)
                assert np.array_equal(cases.clicks(view, ids, rank - servers, step),
                                      cases.clicks(data, ids, rank - servers, step))

    s = cases.session(5)
    for run in (*s.sparse, *s.dense):
        for rank in range(run.servers + run.workers):
            view = for_rank([run], rank)[0]
            assert ints(view)[:2] == [run.servers, run.workers]  # the walk starts at the Run's own fields
            check(run.data, view.data, run.servers, run.workers, rank, held=view)
    for mode, servers in (("sparse", s.grid.servers), ("dense", 0), ("model", 0)):
        grid = replace(s.grid, mode=mode)
        for rank in range(servers + grid.workers if mode != "model" else 1):
            for (seen, _), (data, _) in zip(grid.for_rank(rank).points, grid.points):
                check(data, seen, servers, grid.workers, rank if mode != "model" else None)


def test_what_a_rank_returns_is_checked_for_its_shape_before_it_is_read() -> None:
    assert judging.as_table(np.zeros((3, 3)), (4, 2), "server 0's rows")[1] == (
        "server 0's rows has shape (3, 3), expected (4, 2) (rows x dim)")
    assert "is not an array of numbers" in judging.as_table([[1.0], [1.0, 2.0]], (2, 2), "t")[1]
    assert judging.as_table([[1, 2]], (1, 2), "t")[1] is None
    assert judging.broken_answer([(1.0, 2.0, "allreduce")], 2) is not None
    assert "step_times returned (1.0, 2.0, 3.0)" in judging.broken_answer([(1.0, 2.0, 3.0, "allreduce")], 1)
    assert "choose returned array" in judging.broken_answer([(1.0, 2.0, np.zeros(2))], 1)
    assert judging.broken_answer([(1.0, 2.0, "allreduce")], 1) is None
    assert [judging.point_index(m, 3) for m in ("point 2", "point 3", "point x", "pointy 1", "done")] == [2] + [None] * 4


# -- the diagnoses --------------------------------------------------------------------------------


def test_a_table_that_kept_one_occurrence_is_named_and_another_mistake_is_not() -> None:
    s = cases.session(3)
    data, workers = s.sparse[1].data, s.sparse[1].workers
    last = judging.train(data, workers, keep_last=True).astype(np.float32)
    message = judging.duplicates_problem(data, workers, last, "the table")
    assert message is not None and "keeping only the last occurrence" in message and "np.add.at" in message
    assert "were overwritten, not summed" in judging.table_problem(data, workers, last, "the table")
    counts = [np.bincount(cases.batch_ids(data, w, 0).ravel(), minlength=data.rows) for w in range(workers)]
    total, most = np.sum(counts, axis=0), np.max(counts, axis=0)  # in the step; in one batch
    untouched, once, repeated = (int(np.flatnonzero(test)[0]) for test in (total == 0, total == 1, most > 2))
    for row, said in ((untouched, "differs from single-process SGD"), (once, "differs from single-process SGD"),
                      (repeated, "are wrong; row")):
        other = judging.train(data, workers).astype(np.float32)
        other[row] += 0.5  # one wrong row: no cause can be named
        problem = judging.duplicates_problem(data, workers, other, "t")
        assert problem is not None and said in problem and "overwritten" not in problem and "np.add.at" not in problem
    assert judging.duplicates_problem(data, workers, judging.train(data, workers).astype(np.float32), "t") is None


def _busiest(g: Any, data: Any) -> float:
    """The card's formula at the busiest server's real load: what the replay measured, within 1.1x."""
    distinct = [np.unique(cases.batch_ids(data, w, 0)) for w in range(g.workers)]
    served = max(sum(int(np.sum(x % g.servers == s)) for x in distinct) for s in range(g.servers))
    touched = max(x.size for x in distinct)
    return 3 * g.alpha + 2 * g.row_cost * served + (8 * served + 8 * data.dim * max(served, touched)) * g.beta


def _models(g: Any) -> dict[str, Callable[[Any, float], tuple[float, float]]]:
    def card(d: Any, u: float, row_cost: float = g.row_cost) -> tuple[float, float]:
        return judging.step_costs(d.rows, d.dim, u, g.workers, g.servers, g.alpha, g.beta, row_cost)

    return {"right": card,
            "dimension alone (1% touched)": lambda d, u: card(d, 0.01 * d.rows),
            "no row cost": lambda d, u: card(d, u, 0.0),
            "ring without (W-1)/W": lambda d, u: (card(d, u)[0], 2 * (g.workers - 1) * g.alpha
                                                   + 2 * d.rows * 4 * d.dim * g.beta)}


def _answers(g: Any, model: Callable[[Any, float], tuple[float, float]]) -> list[tuple[float, float, str]]:
    times = [model(d, u) for d, u in g.points]
    return [(a, b, "parameter server" if a < b else "allreduce") for a, b in times]


def test_the_cost_model_margins_and_diagnosis_over_hidden_grids() -> None:
    """Right: within half the tolerance of the stand-in at every point, choose never wrong. Each
    common wrong model agrees at fewer points than the check needs even at twice the tolerance; only
    the model that ignores the touched rows is told so."""
    tolerance, needed = check.MODEL_TOLERANCE, check.MODEL_SHARE * 16
    for seed in MARGIN_SEEDS:
        g = cases.session(seed).grid
        measured = [[_busiest(g, d) for d, _ in g.points], [c[1] for c in judging.grid_costs(g)]]
        for name, model in _models(g).items():
            answers = _answers(g, model)
            message = judging.model_problem(g, answers, measured, "head")
            assert ("does not follow the rows a batch touches" in message) == name.startswith("dimension alone"), (seed, name)
            if name == "right":
                assert judging.model_lines(g, answers, measured, tolerance / 2)[0] == 16, seed
                assert not judging.wrong_choices(g, answers, measured, tolerance), seed
            else:
                assert judging.model_lines(g, answers, measured, 2 * tolerance)[0] < needed, (seed, name)


def test_the_step_cost_margins_over_hidden_grids() -> None:
    """A right step within half the slack of the card's cost; a float64 allreduce, and a parameter
    server that pulls one row per id occurrence, more than twice the slack over it somewhere."""
    for seed in MARGIN_SEEDS:
        g = cases.session(seed).grid
        costs = judging.grid_costs(g)
        assert max(_busiest(g, d) / c[0] for (d, _), c in zip(g.points, costs)) <= 1 + (check.SPARSE_SLACK - 1) / 2
        float64 = [judging.step_costs(d.rows, 2 * d.dim, u, g.workers, g.servers, g.alpha, g.beta, g.row_cost)[1]
                   for d, u in g.points]
        assert max(f / c[1] for f, c in zip(float64, costs)) >= 1 + 2 * (check.DENSE_SLACK - 1), seed
        per_occurrence = [judging.step_costs(d.rows, d.dim, d.batch * cases.FIELDS, g.workers, g.servers, g.alpha,
                                             g.beta, g.row_cost)[0] for d, _ in g.points]
        assert max(p / c[0] for p, c in zip(per_occurrence, costs)) >= 1 + 2 * (check.SPARSE_SLACK - 1), seed


def test_the_byte_limit_margins_over_hidden_variants() -> None:
    """The reference's bytes (8 per distinct id, 4 dim per row each way, 8 per count) sit below the
    limit, and a worker that pulls one row per occurrence, or moves float64 rows, stands more than
    twice the limit's slack above the right bytes."""
    for seed in MARGIN_SEEDS:
        for case in cases.session(seed).sparse:
            d = case.data.dim
            for w in range(case.workers):
                for step in range(case.data.steps):
                    touched, ids = judging.distinct(case.data, w, step), case.data.batch * cases.FIELDS
                    right = touched * (8 + 8 * d) + 8 * case.servers
                    slack = judging.bytes_limit(case, touched) / right - 1
                    assert 0 < slack
                    for wrong in (ids * (8 + 8 * d), touched * (8 + 16 * d)):
                        assert wrong >= right * (1 + 2 * slack), (seed, case.what, wrong / right, slack)


def _float32_training(data: Any, workers: int) -> np.ndarray:
    """The ranks' arithmetic: float32 rows and gradients, summed by id, one update a step."""
    table, scale = cases.initial_table(data), 1.0 / (workers * data.batch)
    for step in range(data.steps):
        total = np.zeros_like(table)
        for w in range(workers):
            ids = cases.batch_ids(data, w, step)
            grads = cases.fm_gradients(table[ids], cases.clicks(data, ids, w, step), scale)[0].astype(np.float32)
            np.add.at(total, ids.ravel(), grads.reshape(-1, data.dim))
        table -= np.float32(data.lr) * total
    return table


def test_the_training_margins_over_hidden_variants() -> None:
    """float32 training within half the tolerance of the float64 simulation; the table untouched, or
    the last occurrence kept per repeated id, more than twice the tolerance away."""
    for seed in MARGIN_SEEDS[:20]:
        s = cases.session(seed)
        for case in (s.sparse[0], s.sparse[1], replace(s.sparse[0], workers=1)):
            right = judging.train(case.data, case.workers)
            assert first_mismatch(_float32_training(case.data, case.workers), right,
                                  rtol=cases.RTOL / 2, atol=cases.ATOL / 2) is None, seed
            for wrong in (cases.initial_table(case.data), judging.train(case.data, case.workers, keep_last=True)):
                assert first_mismatch(wrong, right, rtol=2 * cases.RTOL, atol=2 * cases.ATOL) is not None, seed


def test_the_card_tells_where_the_rule_of_thumb_holds() -> None:
    from distlab.platforms import resolve

    said = judging.card_crossovers(resolve("ethernet-50us"))
    assert "from d = 1024 at 30.0%" in said and "holds while batches touch less than 39.4%" in said


# -- end to end -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checked() -> CheckRuns:
    return CheckRuns("14", seed=SEED, timeout=180,
                     together=fixture_runs("14", sorted(BUGGY)))


TRAIN, DUPS, BYTES, COST, MODEL = ("both paths train", "duplicate ids", "a worker's bytes", "each step within",
                                   "the cost model agrees")

# fixture -> (checks that must fail, substrings their messages hold, checks that must pass)
BUGGY: dict[str, tuple[list[str], list[str], list[str]]] = {
    "overwrite_duplicates.py": ([TRAIN, DUPS], ["were overwritten, not summed", "keeping only the last occurrence",
                                                "np.add.at(summed, where, grads)"], [BYTES, COST, MODEL]),
    "whole_shard_pull.py": ([BYTES, COST, MODEL], ["whole shards: send only the rows asked for",
                                                   "(see the byte check)", "the steps themselves cost more"], [TRAIN, DUPS]),
    "dense_push.py": ([BYTES, COST, MODEL], ["a gradient for every row of a shard"], [TRAIN, DUPS]),
    "wrong_shard.py": ([TRAIN, DUPS, BYTES, COST, MODEL], ["lives on server", "route each id to server id % S"], []),
    "no_dedup.py": ([BYTES, COST, MODEL], ["one row per id occurrence", "de-duplicate the ids (np.unique)"],
                    [TRAIN, DUPS]),
    "dimension_only_model.py": ([MODEL], ["does not follow the rows a batch touches"], [TRAIN, DUPS, BYTES, COST]),
    "float64_dense.py": ([COST, MODEL], ["the gradient is float64"], [TRAIN, DUPS, BYTES]),
    # The attacks: a rank's view holds no other worker's data and cases.py no single-process SGD (in
    # judging.py now); a server's rows of the wrong shape are named, not a crash of the checker.
    "forged_tables.py": ([TRAIN, DUPS, BYTES, COST, MODEL], ["has no attribute 'train'"], []),
    # Marks of its own: a name the program never sets cuts nothing; one it sets ("done"), set again, is named.
    "forged_own_mark.py": ([TRAIN, DUPS, BYTES, COST, MODEL],
                           ["rank 3 set 9 marks 'done' where the program sets 3", "your own marks may have other names"],
                           []),
    "forged_row_shape.py": ([TRAIN, DUPS, BYTES, COST, MODEL],
                            ["server 0's rows after training has shape (3, 3), expected", "it neither pulled nor pushed"],
                            []),
    # A token per step to server 0 stayed under the byte limit; each worker must move its rows both ways.
    "forged_token_bytes.py": ([TRAIN, DUPS, BYTES, COST, MODEL],
                              ["too few bytes to have carried its rows and their gradients", "it sent server 0 8 bytes"],
                              []),
    # An outside tester's: run_case swapped to hand back no value for a batch of cases; every check crashed.
    "forged_short_batch.py": ([TRAIN, DUPS, BYTES, COST, MODEL],
                              ["rank 0's program handed back 0 values for 3 cases, one value per case expected"], []),
}

# Each diagnosis that names a cause, and the fixture whose bug it is: silent on every other one.
NAMES_ITS_BUG = {
    "were overwritten, not summed": "overwrite_duplicates.py",
    "whole shards: send only the rows asked for": "whole_shard_pull.py",
    "a gradient for every row of a shard": "dense_push.py",
    "route each id to server id % S": "wrong_shard.py",
    "one row per id occurrence": "no_dedup.py",
    "does not follow the rows a batch touches": "dimension_only_model.py",
    "the gradient is float64": "float64_dense.py",
    "has no attribute 'train'": "forged_tables.py",
    "rows after training has shape": "forged_row_shape.py",
    "your own marks may have other names": "forged_own_mark.py",
    "too few bytes to have carried its rows": "forged_token_bytes.py",
    "one value per case expected": "forged_short_batch.py",
}


def test_every_buggy_fixture_has_a_row_and_a_diagnosis() -> None:
    assert fixture_names("14") - {"alt_sorted_pushes.py"} == set(BUGGY) == set(NAMES_ITS_BUG.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUGGY))
def test_buggy_solution_fails_with_its_symptom(name: str, checked: Callable[..., Checked]) -> None:
    failing, needles, passing = BUGGY[name]
    run = checked("--solution", str(fixture_solution("14", name)))
    assert_clean(run)
    assert run.rc == 1, run.out
    assert sorted(run.failed()) == sorted(run.check(n)["name"] for n in failing), run.out
    messages = " ".join(" ".join(run.check(n)["message"].split()) for n in failing)
    for needle in needles:
        assert needle in messages and needle in run.flat, (needle, run.out)
    for phrase, owner in NAMES_ITS_BUG.items():
        assert (phrase in run.messages()) == (owner == name), (phrase, run.out)
    assert all(run.status(n) == "passed" for n in passing)
    assert f"distlab check 14 --seed {SEED}" in run.flat  # the replay hint


@pytest.mark.slow
def test_reference_passes_sealed(checked: Callable[..., Checked]) -> None:
    run = checked("--solution", "reference")
    assert_clean(run)
    assert run.rc == 0, run.out
    r = run.results
    assert r is not None and r["passed"] and r["score"] == r["max_score"] == 16 and r["seal"] == "on"
    assert r["totals"]["launches"] == 1 and r["totals"]["bound_s"] > 0
    metrics = {k: v for c in r["checks"] for k, v in c["metrics"].items()}
    assert metrics["held_out_loss"][1] < metrics["held_out_loss"][0]  # real training: the loss fell
    assert max(metrics["sparse_over_cost"]) <= 1.1 and metrics["agreeing_points"] == 16
    assert set(metrics["bytes_per_touched_row"]) == {"the main case", "the same batches, a million rows"}
    assert "holds while batches touch less than 39.4%" in run.flat


@pytest.mark.slow
def test_alternative_passes_on_gloo(checked: Callable[..., Checked]) -> None:
    assert_passes(checked("--solution", str(fixture_solution("14", "alt_sorted_pushes.py")), "--backend", "gloo"), "gloo")


@pytest.mark.slow
def test_starter_fails_with_helpful_messages(checked: Callable[..., Checked]) -> None:
    run = checked()  # no workspace file: the starter is checked
    assert_starter_fails(run, ["is still the initial table: no update was applied", "it neither pulled nor pushed",
                               "did not move each worker's distinct rows both ways", "step_times returned (0.0, 0.0)"])
    assert run.results is not None and run.results["score"] == 0


@pytest.mark.slow
def test_free_run_times_both_paths() -> None:
    proc = run_cli("run", "14", "--solution", "reference", "--param", "steps=1", "--param", "rows=4096", timeout=120)
    flat = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0, flat
    assert "'ps_over_allreduce':" in flat and "'touched_fraction':" in flat and "'faster':" in flat
    assert not leftovers()
