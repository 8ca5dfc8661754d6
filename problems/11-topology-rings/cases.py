"""Problem 11, the machines and what they must give, computed here in the checker: the card's
8-GPU server (`rack`: 2 sockets x 2 PCIe switches x 2 GPUs) and hidden ones where the ranks sit
on the devices in another order and the devices and switches have shuffled names, so that no
numbering follows the tree; the ring bottleneck of any order (flows that cross one link share
it), the best over every ring of 8, and the CPUs of each socket on this machine."""

from __future__ import annotations

import hashlib
import itertools
import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from distlab import grading

SOCKETS, SWITCHES_PER_SOCKET, GPUS_PER_SWITCH = 2, 2, 2
P = SOCKETS * SWITCHES_PER_SOCKET * GPUS_PER_SWITCH
# The card's server: a rank per GPU in the order of `rack`'s ranks list (slot s is the s-th GPU of
# the tree, left to right: socket s // 4, switch s // 2).
CARD_SLOTS = (0, 1, 4, 5, 2, 3, 6, 7)


@dataclass(frozen=True)
class Machine:
    slots: tuple[int, ...]  # slots[r]: the tree position of rank r's GPU
    gpu_names: tuple[str, ...]  # the name of the GPU in each slot
    switch_names: tuple[str, ...]  # the name of the PCIe switch of each slot pair
    qpi_gbps: float = 64.0  # the inter-socket link, as GPU peer-to-peer traffic sees it
    pcie_gbps: float = 128.0
    name: str = "rack"

    def label(self) -> str:
        return f"the {self.name} server" if self.name == "rack" else f"hidden server {self.name}"

    def socket_of(self, rank: int) -> str:
        return f"socket{self.slots[rank] // (SWITCHES_PER_SOCKET * GPUS_PER_SWITCH)}"

    def topology(self) -> str:
        """The platform file the learner reads: the server's tree, its links and its ranks."""
        gpu = lambda slot: self.gpu_names[slot]  # noqa: E731
        switch = lambda slot: self.switch_names[slot // GPUS_PER_SWITCH]  # noqa: E731
        rows = ["format_version = 1", f'name = "{self.name}"', 'description = "one 8-GPU server"',
                f"ranks = {[gpu(s) for s in self.slots]!r}".replace("'", '"'),
                "[profile.v100]", "flops = 14e12", "memory_gib = 32",
                '[[node]]\nname = "host0"\nkind = "host"']
        for socket in range(SOCKETS):
            rows.append(f'[[node]]\nname = "socket{socket}"\nkind = "socket"\nin = "host0"')
        for slot in range(P):
            if slot % GPUS_PER_SWITCH == 0:
                rows.append(f'[[node]]\nname = "{switch(slot)}"\nkind = "pcie_switch"\n'
                            f'in = "socket{slot // 4}"')
                rows.append(_link(switch(slot), f"socket{slot // 4}", self.pcie_gbps, 1.0))
            rows.append(f'[[node]]\nname = "{gpu(slot)}"\nkind = "device"\nin = "{switch(slot)}"\n'
                        'profile = "v100"')
            rows.append(_link(gpu(slot), switch(slot), self.pcie_gbps, 1.0))
        rows.append(_link("socket0", "socket1", self.qpi_gbps, 2.0))
        return "\n".join(rows) + "\n"

    @cached_property
    def platform(self) -> grading.Platform:
        return grading.parse_platform(self.topology(), f"problem 11's {self.label()}")

    @cached_property
    def best(self) -> float:
        """The highest bottleneck of any ring of the 8 ranks (rank 0 first: a ring has no start)."""
        return max(self.bottleneck((0, *rest)) for rest in itertools.permutations(range(1, P)))

    def bottleneck(self, order: tuple[int, ...]) -> float:
        """Bytes per second of the ring's slowest flow, each rank sending to the next at once:
        every directed link's capacity shared by the flows that cross it."""
        flows: dict[str, int] = {}
        for a, b in zip(order, order[1:] + order[:1]):
            for link in self.platform.route(a, b).links:
                flows[link] = flows.get(link, 0) + 1
        return min(self.platform.capacity(link) / n for link, n in flows.items())


def _link(a: str, b: str, gbps: float, latency_us: float) -> str:
    return f'[[link]]\na = "{a}"\nb = "{b}"\nlatency_us = {latency_us}\nbandwidth_gbps = {gbps}'


CARD = Machine(CARD_SLOTS, tuple(f"gpu{s}" for s in range(P)), tuple(f"pcie{i}" for i in range(4)))
NAIVE = tuple(range(P))


def hidden_machine(rng: np.random.Generator, name: str) -> Machine:
    """Ranks on the GPUs in a random order whose naive ring (0, 1, ..., 7) crosses the sockets at
    least twice each way, GPUs and switches named at random, another inter-socket link."""
    while True:
        machine = Machine(tuple(int(s) for s in rng.permutation(P)),
                          tuple(f"gpu{g}" for g in rng.permutation(P)),
                          tuple(f"pcie{i}" for i in rng.permutation(4)),
                          qpi_gbps=float(rng.choice([48.0, 64.0, 80.0])), name=name)
        if machine.bottleneck(NAIVE) <= machine.best / 2:
            return machine


def numa_cpus(available: frozenset[int] | None = None) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The CPUs of each socket on this machine, as the checks hand them to the learner: the CPUs
    the checker may use, cut in two halves in order (one each when there are only two; both
    sockets share the one CPU of a one-CPU machine)."""
    cpus = tuple(sorted(available if available is not None else os.sched_getaffinity(0)))
    half = max(1, len(cpus) // 2)
    return (("socket0", cpus[:half]), ("socket1", cpus[half:] or cpus[:half]))


@dataclass(frozen=True)
class Case:
    machine: Machine
    numa: tuple[tuple[str, tuple[int, ...]], ...]  # each socket's CPUs on this machine
    nbytes: int  # the allreduce timed along the learner's ring
    seed: int

    def label(self) -> str:
        return self.machine.label()

    def cpus_of(self, rank: int) -> tuple[int, ...]:
        """The CPUs rank ``rank`` should be pinned to: its GPU's socket's."""
        return dict(self.numa)[self.machine.socket_of(rank)]

    def for_rank(self, rank: int) -> RankCase:
        """What a rank is handed: the server's file, never its Machine (whose slots are the
        answer), and its own allreduce input only (the sum needs every rank's)."""
        return RankCase(self.machine.topology(), self.numa, self.nbytes, data_key(self.seed, rank))

    def digest(self) -> str:
        """The digest of the allreduce's sum over the ranks (``digest``), which every rank must
        hand back: the inputs are whole numbers, so any order of adding gives the same bits."""
        return digest(sum(values(self.nbytes, data_key(self.seed, r)) for r in range(P)))  # type: ignore[arg-type]


@dataclass(frozen=True)
class RankCase:
    """A rank's view of a case (Case.for_rank)."""

    topology: str  # the platform file best_ring and pin_to_numa_node read
    numa: tuple[tuple[str, tuple[int, ...]], ...]
    nbytes: int
    key: int  # of this rank's allreduce input


def data_key(seed: int, rank: int) -> int:
    return int(np.random.default_rng([seed, 11, rank]).integers(2**62))


def values(nbytes: int, key: int) -> np.ndarray:
    """A rank's allreduce input, float32 whole numbers: sums of 8 are exact in any order."""
    return np.random.default_rng(key).integers(-1000, 1001, nbytes // 4).astype(np.float32)


def digest(summed: np.ndarray) -> str:
    """What a rank hands back of its sum: every byte of it, in a few (a sample was summed alone)."""
    return hashlib.sha256(np.ascontiguousarray(summed, dtype=np.float32).tobytes()).hexdigest()
