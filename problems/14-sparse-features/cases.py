"""The cases of problem 14, drawn from the seed, and the data drawn from keys.

A case's data follows from keys drawn from its seed: the initial table's, the hidden teacher's
(the factorization machine the clicks come from), and each worker's (its ids, a Zipf law over the
rows, and its clicks). The checker holds the seed; a rank is handed a view of the case
(Run.for_rank, Grid.for_rank) that holds its own part of the data, materialized by its agent from
those keys, and no key of it: a server its shard's initial rows, a worker its own batches (ids and
clicks, every step's), and on the allreduce path, where every rank holds the whole initial table,
that table's key. No rank can rebuild another worker's batches (nor another server's rows), so none
can train the table alone, nor smuggle a short key to the others: single-process SGD, the table
each case must end with, lives in judging.py. Hidden variants: the Zipf exponent, the table, the
dimension, the shard counts (S, W), the late worker, the timing grid."""

from collections import namedtuple
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from distlab.grading import Widener

FIELDS, TEACHER_DIM = 6, 4  # ids per impression (user, ad, site, ...); the hidden model's width
BIAS, INIT_SCALE = -1.0, 0.1  # a fixed base logit (about 27% clicks); the initial rows' spread
ROW_COST_S = 0.5e-6  # the card's server: seconds per row looked up or updated, whatever its width
ID_BYTES, VALUE_BYTES = 8, 4  # int64 ids; float32 rows and gradients
RTOL, ATOL = 1e-4, 1e-6  # float32 ranks against a float64 simulation, over a few steps
LATE_S = 0.005  # the late worker's messages leave 5 ms late, in real time too
GRID_CELLS, GRID_TOUCHED = 2**22, (400, 1600)  # grid tables within 16 MiB; touched rows aimed at
MAX_IDS = 4096  # ids per worker batch in the grid
TABLE_ROWS, BLOCK_ROWS = 1_000_000, 65_536  # the production table; rows drawn at once


@dataclass(frozen=True, eq=False)
class Part:
    """A rank's own data in its view of a case: arrays its agent drew from the keys (exactly the
    checker's), and no key of them, so nothing here rebuilds another rank's data."""

    worker: int = -1  # the worker whose batches these are; -1: none (a server, the cost model)
    batches: tuple[tuple[np.ndarray, np.ndarray], ...] = ()  # every step's (ids B x FIELDS, clicks B)
    shard: tuple[int, int] | None = None  # (server, servers) whose initial rows follow; None: none
    rows: np.ndarray | None = None  # those initial rows (rows r with r % servers == server)
    table_key: int = -1  # the allreduce path's: the key of the initial table every rank holds whole

    def batch(self, worker: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        if worker != self.worker:
            raise ValueError(f"a rank's view of the case holds no data of worker {worker}" +
                             (f" (only worker {self.worker}'s)" if self.worker >= 0 else ""))
        if not 0 <= step < len(self.batches):
            raise ValueError(f"a rank's view of the case holds {len(self.batches)} step(s) of worker "
                             f"{worker}'s batches, not step {step}")
        return self.batches[step]


@dataclass(frozen=True)
class Data:
    rows: int
    dim: int
    batch: int  # impressions per worker per step
    steps: int
    lr: float
    zipf: float
    seed: int  # the checker's; -1 in a rank's view, which holds its own data (part) instead
    support: int = 0  # ids come from rows 0 .. support-1 (0: every row)
    part: Part | None = field(default=None, compare=False)  # a rank's view: its own data, no key of it

    def key(self, what: int, worker: int = -1) -> int:
        """The key of the initial table (TABLE), the teacher (TEACHER) or ``worker``'s batches (WORKER):
        the checker's alone, but for the table's on the allreduce path (every rank holds that table)."""
        if self.part is None:
            return data_key(self.seed, what, worker)
        if what == TABLE and self.part.table_key >= 0:
            return self.part.table_key
        if what == WORKER:
            self.part.batch(worker, 0)  # another worker's: named as such
        shard = self.part.shard
        raise ValueError(f"a rank's view of the case holds no key of the {KEY_NAMES[what]}" +
                         (f" (only server {shard[0]}'s initial rows)" if what == TABLE and shard else
                          " (only its own data)"))

    def view(self, worker: int = -1, shard: tuple[int, int] | None = None, table: bool = False) -> "Data":
        """What a rank is handed, drawn here from the keys: ``worker``'s batches (every step's ids and
        clicks) if one is named, the initial rows of ``shard`` (server, servers) if one is named, and
        the initial table's key if ``table`` (the allreduce path, where every rank holds the table)."""
        batches = tuple((ids := batch_ids(self, worker, step), clicks(self, ids, worker, step))
                        for step in range(self.steps)) if worker >= 0 else ()
        rows = initial_table(self, *shard) if shard is not None else None
        return replace(self, seed=-1, part=Part(worker, batches, shard, rows, self.key(TABLE) if table else -1))

    def label(self) -> str:
        return (f"{self.rows} rows x {self.dim} dims, {self.batch} impressions x {FIELDS} ids per worker, "
                f"{self.steps} step(s), Zipf exponent {self.zipf:.2f}")


@dataclass(frozen=True)
class Run:
    """S servers (ranks 0 .. S-1) and W workers after them; servers = 0: the allreduce baseline."""

    servers: int
    workers: int
    data: Data
    what: str  # the phase every step is marked with
    late: int | None = None  # a worker rank whose messages leave late

    def for_rank(self, rank: int) -> "Run":
        """Rank ``rank``'s view: a server its shard's initial rows, a worker its own batches (and the
        initial table's key on the allreduce path, where every rank holds the whole table); no key of
        a rank's own data, none of another's."""
        if rank < self.servers:
            return replace(self, data=self.data.view(shard=(rank, self.servers)))
        return replace(self, data=self.data.view(worker=rank - self.servers, table=not self.servers))

    def label(self) -> str:
        path = f"S = {self.servers}, W = {self.workers}" if self.servers else f"allreduce, W = {self.workers}"
        late = f", worker rank {self.late} late" if self.late is not None else ""
        return f"{path} ({self.what}{late}): {self.data.label()}"


@dataclass(frozen=True)
class Grid:
    """The cost model's hidden grid: one step of a path per point, on a scaled-down cluster."""

    servers: int
    workers: int
    alpha: float  # seconds per message
    beta: float  # seconds per byte, each rank's port
    row_cost: float  # a server's seconds per row looked up or updated
    points: tuple[tuple[Data, float], ...]  # (the table and batches, distinct rows per worker batch)
    mode: str = "sparse"  # what a task of the grid runs: "sparse", "dense", or "model" (step_times)

    def label(self) -> str:
        return (f"S = {self.servers}, W = {self.workers}; alpha {self.alpha * 1e6:.1f} us, "
                f"{8 / self.beta / 1e9:.2f} Gb/s, row cost {self.row_cost * 1e9:.0f} ns")

    def for_rank(self, rank: int) -> "Grid":
        """Rank ``rank``'s view: each point's data cut as its path's Run cuts it (the cost model's: no data)."""
        if self.mode == "model":
            return replace(self, points=tuple((d.view(), u) for d, u in self.points))
        servers = self.servers if self.mode == "sparse" else 0
        return replace(self, points=tuple((Run(servers, self.workers, d, "").for_rank(rank).data, u)
                                          for d, u in self.points))

    def where(self, i: int) -> str:
        data, touched = self.points[i]
        return f"d = {data.dim}, {touched / data.rows:.1%} of {data.rows} rows touched"


# The parameter server's cases (the main one, one step, the same batches on a million rows), the
# allreduce baseline's (the main one, one step), and the grid.
Session = namedtuple("Session", "sparse dense grid")


# -- the data, drawn from the keys ---------------------------------------------------------------------

TABLE, TEACHER, WORKER = 0, 1, 2  # the keys of a case's data
KEY_NAMES = {TABLE: "initial table", TEACHER: "teacher", WORKER: "worker's batches"}


def data_key(seed: int, what: int, worker: int = -1) -> int:
    """A key of the data, drawn from the case's seed. None reaches a rank (but the initial table's
    on the allreduce path): a rank's view (Run.for_rank) holds its own data, drawn from them."""
    return int(np.random.default_rng([seed, 14, what, worker + 1]).integers(2**62))



@lru_cache(maxsize=32)
def zipf_cdf(rows: int, exponent: float) -> np.ndarray:
    cdf = np.cumsum(np.arange(1, rows + 1, dtype=np.float64) ** -exponent)  # row 0 the most popular
    return cdf / cdf[-1]


def batch_ids(data: Data, worker: int, step: int) -> np.ndarray:
    """``worker``'s ids at ``step`` (B x FIELDS): drawn from its key, or (a rank's view) its own, a copy."""
    if data.part is not None:
        return data.part.batch(worker, step)[0].copy()
    draws = np.random.default_rng([data.key(WORKER, worker), 1, step]).random(data.batch * FIELDS)
    return np.searchsorted(zipf_cdf(data.support or data.rows, data.zipf), draws, "right").reshape(-1, FIELDS)


def clicks(data: Data, ids: np.ndarray, worker: int, step: int) -> np.ndarray:
    """The clicks of ``ids`` (``worker``'s at ``step``): drawn from the keys, or (a rank's view) its own."""
    if data.part is not None:
        own, labels = data.part.batch(worker, step)
        if not np.array_equal(ids, own):
            raise ValueError(f"a rank's view of the case holds the clicks of worker {worker}'s batch at step "
                             f"{step} only, not of other ids")
        return labels.copy()
    teacher = np.random.default_rng([data.key(TEACHER), 2]).normal(0, 0.45, (data.support or data.rows, TEACHER_DIM))
    draws = np.random.default_rng([data.key(WORKER, worker), 3, step]).random(len(ids))
    return (draws < sigmoid(fm_logits(teacher[ids])[0])).astype(np.float64)


def initial_table(data: Data, server: int = 0, servers: int = 1) -> np.ndarray:
    """The initial rows r with r % servers == server (the whole table by default), drawn block by
    block so that a server of a million-row table never holds more than its shard and one block; in
    a rank's view, a copy of its shard's rows (a server), or drawn from the table's key (allreduce)."""
    if data.part is not None and data.part.shard == (server, servers):
        return data.part.rows.copy()
    shard, key = [], data.key(TABLE)
    for start in range(0, data.rows, BLOCK_ROWS):
        rng = np.random.default_rng([key, 4, start])
        block = rng.standard_normal((min(BLOCK_ROWS, data.rows - start), data.dim), dtype=np.float32)
        shard.append(INIT_SCALE * block[(server - start) % servers::servers])
    return np.concatenate(shard)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def fm_logits(emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # A factorization machine: the bias plus the dot products of every pair of an impression's rows.
    # emb (B, F, d) -> logits (B,), and the sum of the rows (B, d).
    total = emb.sum(axis=1)
    return BIAS + 0.5 * ((total * total).sum(-1) - (emb * emb).sum((1, 2))), total


def fm_gradients(emb: np.ndarray, labels: np.ndarray, scale: float) -> tuple[np.ndarray, float]:
    """The log loss's gradient for every id occurrence, times ``scale``, and the mean log loss."""
    logits, total = fm_logits(emb)
    delta = (sigmoid(logits) - labels) * scale
    loss = float(np.mean(np.logaddexp(0.0, logits) - labels * logits))
    return delta[:, None, None] * (total[:, None, :] - emb), loss  # d logit / d row: the others' sum


def touched(data: Data, workers: int) -> float:  # distinct rows of a first batch, mean over workers
    return float(np.mean([np.unique(batch_ids(data, w, 0)).size for w in range(workers)]))


# -- the hidden variants ---------------------------------------------------------------------------


def batch_for(rows: int, zipf: float, density: float, most: int = MAX_IDS) -> int:
    # The smallest batch whose ids touch ``density`` of the rows on average (at most ``most`` ids).
    p = np.diff(zipf_cdf(rows, zipf), prepend=0.0)
    lo, hi = 1, max(1, most // FIELDS)
    while lo < hi:  # E[distinct rows of n ids] = sum over rows of 1 - (1 - p)^n
        mid = (lo + hi) // 2
        reached = np.sum(-np.expm1(mid * FIELDS * np.log1p(-p)))
        lo, hi = (mid + 1, hi) if reached < density * rows else (lo, mid)
    return lo


def timing_grid(rng: np.random.Generator, widen: Widener, zipf: float) -> Grid:
    # 4 dimensions x 4 touched fractions on a 1-4 Gb/s cluster of 5-15 us whose row cost puts the
    # crossover at 20-56 dims; a table touches 400-1600 rows (fewer where MAX_IDS ids cannot reach).
    servers, workers, beta = int(rng.integers(2, 4)), int(rng.integers(2, 4)), 8 / (rng.uniform(1, 4) * 1e9)
    alpha, row_cost = rng.uniform(5e-6, 15e-6), 4 * beta * (rng.uniform(20, 56) - 1)
    points = []
    for dim in (4 * int(rng.integers(lo, hi + 1)) for lo, hi in ((1, 2), (3, 6), (10, 20), (32, 64))):
        for density in (rng.uniform(lo, hi) for lo, hi in ((0.02, 0.04), (0.08, 0.14), (0.22, 0.32), (0.45, 0.6))):
            aim = np.exp(rng.uniform(*np.log(GRID_TOUCHED)))
            rows = int(np.clip(aim / density, 256, min(2**15, GRID_CELLS // dim)))
            while batch_for(rows, zipf, density) >= MAX_IDS // FIELDS:
                rows = int(rows * 0.8)
            data = Data(rows, dim, batch_for(rows, zipf, density), 1, 0.5, zipf, widen(int(rng.integers(1 << 31))))
            points.append((data, touched(data, workers)))
    return Grid(servers, workers, float(alpha), float(beta), float(row_cost), tuple(points))


def session(seed: int) -> Session:
    rng, widen = np.random.default_rng([seed, 14]), Widener(seed, 14)
    zipf = float(rng.uniform(0.95, 1.25))
    main = Data(int(rng.integers(1500, 2600)), int(rng.choice([8, 12, 16])), int(rng.integers(48, 81)), 5,
                round(float(rng.uniform(0.4, 0.8)), 3), zipf, widen(int(rng.integers(1 << 31))))
    S, W = int(rng.integers(1, 4)), int(rng.integers(2, 4))
    one_step = replace(main, steps=1, seed=main.seed + 1)
    sparse = (Run(S, W, main, "the main case", late=S + int(rng.integers(W))), Run(S, W, one_step, "one step"),
              Run(S, W, replace(main, steps=2, rows=TABLE_ROWS, support=main.rows), "the same batches, a million rows"))
    return Session(sparse, (Run(0, W, main, "the main case"), Run(0, W, one_step, "one step")), timing_grid(rng, widen, zipf))
