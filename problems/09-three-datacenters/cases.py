"""Problem 09, the cases, computed here in the checker: the clusters (the card's three data centers
of four, and a hidden one: 2 or 4 data centers of 3 or 4 ranks, ranks numbered round-robin across
them, another WAN price), the buffers each rank starts with, the data-parallel training task, and
the bills of the cost questions. What they must give (the sums, the trained weights, the bills'
closed forms) is judging.py's, out of the ranks' reach.

A rank is handed its own view of a buffer or of the training (``for_rank``): its own data itself,
made by its agent, and nothing it was made from. With the seed, every rank's data would follow,
and with it the sum, with no allreduce at all; with the short key of its own data, a rank could
smuggle it to the others inside a few bytes of a message, and each could rebuild every rank's data."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from distlab import grading

WAN_GBPS, WAN_LATENCY_US = 10, 2000  # between data centers, as on the card's platform three-dc
LAN_GBPS, LAN_LATENCY_US = 100, 2.5  # each rank's port on its data center's switch


@dataclass(frozen=True)
class Cluster:
    dcs: int
    per_dc: int
    wan_price_per_gb: float
    round_robin: bool = False  # rank r sits in data center r % dcs, not r // per_dc

    @property
    def p(self) -> int:
        return self.dcs * self.per_dc

    def label(self) -> str:
        numbering = ", ranks numbered round-robin across them" if self.round_robin else ""
        return f"{self.dcs} data centers x {self.per_dc} ranks{numbering}"

    def datacenter_of(self) -> list[int]:
        """The data center of each rank: what the learner's allreduce is handed."""
        return [r % self.dcs if self.round_robin else r // self.per_dc for r in range(self.p)]

    def platform(self) -> grading.Platform:
        """The cluster as a platform: one switch per data center, a full mesh of priced WAN links."""
        dc_of = self.datacenter_of()
        devices = [f"dc{dc_of[r]}-gpu{r}" for r in range(self.p)]
        lines = ["format_version = 1", f'name = "dc{self.dcs}x{self.per_dc}"',
                 f'description = "{self.label()}"', f"ranks = {devices!r}".replace("'", '"'),
                 "[profile.a100]", "flops = 19.5e12", "memory_gib = 40"]
        for dc in range(self.dcs):
            lines += ["[[node]]", f'name = "dc{dc}"', 'kind = "datacenter"',
                      "[[node]]", f'name = "dc{dc}-sw"', 'kind = "switch"', f'in = "dc{dc}"']
        for device in devices:  # one host with one GPU per rank, its port on the switch
            switch = device.split("-")[0] + "-sw"
            lines += ["[[node]]", f'name = "{device}-host"', 'kind = "host"', f'in = "{switch}"',
                      "[[node]]", f'name = "{device}"', 'kind = "device"', 'profile = "a100"',
                      f'in = "{device}-host"', "[[link]]", f'a = "{device}"', f'b = "{switch}"',
                      f"latency_us = {LAN_LATENCY_US}", f"bandwidth_gbps = {LAN_GBPS}"]
        for a in range(self.dcs):
            for b in range(a + 1, self.dcs):
                lines += ["[[link]]", f'a = "dc{a}-sw"', f'b = "dc{b}-sw"',
                          f"latency_us = {WAN_LATENCY_US}", f"bandwidth_gbps = {WAN_GBPS}",
                          f"price_per_gb = {self.wan_price_per_gb}", 'label = "WAN"']
        return grading.parse_platform("\n".join(lines), f"problem 09's cluster {self.label()}")

    def optimal_wan_bytes(self, nbytes: int) -> float:
        """Bytes crossing data centers in the best allreduce: each data center's data leaves it
        and comes back once over (D-1)/D of it, in both phases: 2 (D-1) n over the whole job."""
        return 2 * (self.dcs - 1) * nbytes

    def hierarchical_time(self, nbytes: int) -> float:
        """The reference's allreduce in closed form: reduce-scatter and allgather inside (rings of
        L on the fabric), a ring allreduce across of n/L per rank whose L flows share each WAN
        link, so each of its 2 (D-1) steps moves n/D over it after the WAN's latency."""
        lan_alpha, lan_beta = 2 * LAN_LATENCY_US * 1e-6, 8 / (LAN_GBPS * 1e9)
        wan_alpha, wan_beta = (WAN_LATENCY_US + 2 * LAN_LATENCY_US) * 1e-6, 8 / (WAN_GBPS * 1e9)
        inside = 2 * (self.per_dc - 1) * (lan_alpha + nbytes / self.per_dc * lan_beta)
        return inside + 2 * (self.dcs - 1) * (wan_alpha + nbytes / self.dcs * wan_beta)

    def flat_ring_wan_bytes(self, nbytes: int) -> float:
        """Bytes crossing data centers in one ring over all p ranks in rank order: each of the
        ring's hops that leaves a data center carries 2 (p-1) chunks of n/p."""
        dc_of = self.datacenter_of()
        hops = sum(dc_of[r] != dc_of[(r + 1) % self.p] for r in range(self.p))
        return hops * 2 * (self.p - 1) / self.p * nbytes


CARD = Cluster(3, 4, 0.02)  # the card's platform three-dc, rank for rank


def hidden_cluster(rng: np.random.Generator) -> Cluster:
    return Cluster(int(rng.choice([2, 4])), int(rng.choice([3, 4])),
                   round(float(rng.uniform(0.01, 0.09)), 3), round_robin=True)


@dataclass(frozen=True)
class Buffer:
    """One allreduce: every rank's ``n`` values of ``dtype``, summed in place."""

    cluster: Cluster
    n: int
    dtype: str
    seed: int  # the checker's; -1 in a rank's view, which holds its own input instead
    timed: bool = False  # its virtual time and WAN bytes are graded (the only call of its task)
    # A rank's view: (its rank, (its input,)), the array itself, made by its agent.
    own: tuple[int, tuple[np.ndarray]] | None = field(default=None, compare=False)

    def label(self) -> str:
        return f"{self.cluster.label()}: n = {self.n} {self.dtype}"

    def input(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s input: drawn from the seed here, a copy of the rank's own in its view."""
        if self.own is not None:
            (values,) = _own_data(self.own, rank, "buffer")
            return values.copy()
        rng = np.random.default_rng(data_key(self.seed, rank))
        if self.dtype == "int64":
            return rng.integers(-1000, 1000, size=self.n)
        return rng.standard_normal(self.n).astype(self.dtype)

    def for_rank(self, rank: int) -> Buffer:
        """What rank ``rank``'s process is handed: its own input, no key and no other rank's."""
        return replace(self, seed=-1, own=(rank, (self.input(rank),)))


def data_key(seed: int, rank: int, kind: int = 0) -> int:
    """The key of one rank's data (kind 0: a buffer, 1: a training shard, 2: the training's truth,
    the same for every rank), drawn from the case's seed. No seed and no key reaches a rank: its
    view holds its data itself (``for_rank``)."""
    return int(np.random.default_rng([seed, 9, kind, rank]).integers(2**62))


def _own_data(own: tuple[int, tuple[np.ndarray, ...]], rank: int, what: str) -> tuple[np.ndarray, ...]:
    if rank != own[0]:
        raise ValueError(f"rank {own[0]}'s view of the {what} holds no data of rank {rank}: "
                         "the other ranks' data reaches it through the allreduce only")
    return own[1]


def buffers(cluster: Cluster, rng: np.random.Generator, widen: grading.Widener) -> list[Buffer]:
    """The lengths that trip a hierarchical allreduce up: shorter than a data center, not a
    multiple of its ranks or of all ranks; each in three types."""
    L, p = cluster.per_dc, cluster.p
    lengths = [1, L - 1, L * int(rng.integers(2, 9)) + int(rng.integers(1, L)),
               p * int(rng.integers(10, 40)) + int(rng.integers(1, p)), (1 << 15) + int(rng.integers(1, 99))]
    return [Buffer(cluster, n, dtype, widen(int(rng.integers(1 << 31))))
            for n in lengths for dtype in ("float32", "float64", "int64")]


def timed_buffer(cluster: Cluster, rng: np.random.Generator, widen: grading.Widener) -> Buffer:
    """About 1 MiB of float32 per rank: large enough to be a gradient, small enough that the WAN's
    2 ms dominates (past a few MiB its bandwidth does, and every allreduce gets as slow)."""
    return Buffer(cluster, (1 << 18) + int(rng.integers(1, 4096)), "float32",
                  widen(int(rng.integers(1 << 31))), timed=True)


@dataclass(frozen=True)
class Training:
    """Least squares trained by full-batch gradient descent, each rank holding a shard of the
    rows; the gradient summed with the learner's allreduce. The answer (judging.trained): the same
    run on one process, in the checker."""

    cluster: Cluster
    features: int
    rows_per_rank: int
    steps: int
    lr: float
    seed: int  # the checker's; -1 in a rank's view, which holds its own rows instead
    # A rank's view: (its rank, (its rows x, their targets y)), the arrays themselves.
    own: tuple[int, tuple[np.ndarray, np.ndarray]] | None = field(default=None, compare=False)

    def label(self) -> str:
        return f"training on {self.cluster.label()}: {self.steps} steps"

    def shard(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """``rank``'s rows and their targets (from a truth every rank's targets share): drawn from
        the seed here, a copy of the rank's own in its view."""
        if self.own is not None:
            x, y = _own_data(self.own, rank, "training")
            return x.copy(), y.copy()
        rng = np.random.default_rng(data_key(self.seed, rank, kind=1))
        truth = np.random.default_rng(data_key(self.seed, 0, kind=2)).standard_normal(self.features)
        x = rng.standard_normal((self.rows_per_rank, self.features))
        return x, x @ truth + 0.1 * rng.standard_normal(self.rows_per_rank)

    def gradient(self, w: np.ndarray, rank: int) -> np.ndarray:
        """This rank's part of the gradient of the mean squared error over every row."""
        x, y = self.shard(rank)
        return 2.0 * x.T @ (x @ w - y) / (self.rows_per_rank * self.cluster.p)

    def for_rank(self, rank: int) -> Training:
        """What rank ``rank``'s process is handed: its own rows and targets, no key and no other
        rank's rows (with them, one process could train alone and skip the allreduce)."""
        return replace(self, seed=-1, own=(rank, self.shard(rank)))


@dataclass(frozen=True)
class Bill:
    """A data-parallel job across data centers, priced: the learner's cost functions get one, data
    only (its closed forms, the answers, are judging.py's)."""

    dcs: int
    per_dc: int
    wan_price_per_gb: float  # dollars per 1e9 bytes crossing between data centers
    gpu_price_per_hour: float  # dollars per GPU-hour
    compute_s_per_step: float  # seconds every GPU computes per optimizer step
    steps_per_epoch: int
    bytes_per_param: int  # of a gradient on the wire: 2 for fp16, 4 for fp32

    def label(self) -> str:
        return (f"{self.dcs} x {self.per_dc} GPUs, WAN ${self.wan_price_per_gb}/GB, "
                f"${self.gpu_price_per_hour}/GPU-h, {self.compute_s_per_step} s/step, "
                f"{self.steps_per_epoch} steps/epoch, {self.bytes_per_param} B/param")


CARD_BILL = Bill(3, 4, 0.02, 2.40, 48.0, 1000, 2)  # the card's numbers: about a billion at 40%
MODEL_SIZES = (125e6, 1.3e9, 13e9)  # the cost questions ask about these models


def hidden_bills(rng: np.random.Generator) -> list[Bill]:
    return [Bill(int(rng.integers(2, 5)), int(rng.integers(2, 9)), round(float(rng.uniform(0.01, 0.09)), 3),
                 round(float(rng.uniform(1.5, 4.0)), 2), round(float(rng.uniform(20, 120)), 1),
                 int(rng.integers(200, 5000)), int(rng.choice([2, 4]))) for _ in range(3)]
