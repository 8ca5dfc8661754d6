"""The virtual clock's replay: traces built by hand, replayed over tiny networks with known answers.

Each scenario writes the events that real ranks would record (trace.py's tuples), replays them,
and compares virtual times with the closed forms: ping-pong, a hand-written ring allreduce, the
built-in collectives, flows that share a link, max-min fairness on two links, idle time from
compute imbalance. Then the properties the graders rely on: the same traces give bit-identical
results in another process with another string-hash seed, a broken trace fails with a sentence
that names the rank and the event, and 10k messages replay in about a second.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from distlab.runtime.clock import collectives_cost as cc
from distlab.runtime.clock.online import EAGER_LIMIT
from distlab.runtime.clock.replay import Replay, ReplayError, Route, max_min_rates, replay
from distlab.runtime.trace.events import Event

REL = 1e-9

# -- tiny networks ------------------------------------------------------------------------------


class UniformNet:
    """Every pair has its own directed link "i>j": alpha, beta, no sharing between pairs."""

    def __init__(self, alpha: float, beta: float, price: float = 0.0) -> None:
        self.alpha, self.beta, self.price = alpha, beta, price

    def route(self, src: int, dst: int) -> Route:
        return Route(self.alpha, (f"{src}>{dst}",), self.beta, self.price)

    def capacity(self, link: str) -> float:
        return 1.0 / self.beta if self.beta else math.inf


class TableNet:
    """Routes given as link lists; beta is 1 / the smallest capacity on the path."""

    def __init__(self, paths: dict[tuple[int, int], tuple[str, ...]], capacities: dict[str, float],
                 alpha: float = 0.0, prices: dict[str, float] | None = None) -> None:
        self.paths, self.capacities, self.alpha, self.prices = paths, capacities, alpha, prices or {}

    def route(self, src: int, dst: int) -> Route:
        links = self.paths[(src, dst)]
        beta = 1.0 / min(self.capacities[name] for name in links)
        price = sum(self.prices.get(name, 0.0) for name in links)
        return Route(self.alpha, links, beta, price)

    def capacity(self, link: str) -> float:
        return self.capacities[link]


class PricedNet(TableNet):
    def link_price(self, link: str) -> float:
        return self.prices.get(link, 0.0)


def cluster(hosts: int, per_host: int, alpha: float = 1e-6, nic: float = 12.5e9,
            uplink: float = 25e9) -> TableNet:
    """Ranks on hosts; each rank has a NIC in and out, each host an uplink in and out of a core
    switch. Flows between hosts share the uplinks: contention, with string link ids."""
    capacities: dict[str, float] = {}
    paths: dict[tuple[int, int], tuple[str, ...]] = {}
    p = hosts * per_host
    for r in range(p):
        capacities[f"r{r}>h{r // per_host}"] = capacities[f"h{r // per_host}>r{r}"] = nic
    for h in range(hosts):
        capacities[f"h{h}>core"] = capacities[f"core>h{h}"] = uplink
    for a in range(p):
        for b in range(p):
            ha, hb = a // per_host, b // per_host
            if ha == hb:
                paths[(a, b)] = (f"r{a}>h{ha}", f"h{hb}>r{b}")
            else:
                paths[(a, b)] = (f"r{a}>h{ha}", f"h{ha}>core", f"core>h{hb}", f"h{hb}>r{b}")
    return TableNet(paths, capacities, alpha)


# -- writing traces as the comm proxy would ------------------------------------------------------


@dataclass
class Tracer:
    """One rank's recorder: the same counting rules as trace.TraceRecorder, plus the matches."""

    rank: int

    def __post_init__(self) -> None:
        self.events: list[Event] = []
        self._req = 0
        self._sends: dict[tuple[int, int, int], int] = {}
        self._recvs: dict[tuple[int, int, int], int] = {}
        self._colls: dict[tuple[int, ...], int] = {}
        self._match: dict[int, tuple[int, int, int, int]] = {}

    def _next(self) -> int:
        self._req += 1
        return self._req

    def compute(self, seconds: float) -> None:
        self.events.append(("compute", seconds, "work", 0.0, 0.0))

    def isend(self, dst: int, nbytes: int, tag: int = 0, ctx: int = 0) -> int:
        req, k = self._next(), self._sends.get((ctx, dst, tag), 0)
        self._sends[(ctx, dst, tag)] = k + 1
        self.events.append(("send", req, ctx, dst, tag, k, nbytes, 0.0, 0.0))
        return req

    def irecv(self, src: int, nbytes: int, tag: int = 0, ctx: int = 0, any_source: bool = False) -> int:
        req, k = self._next(), self._recvs.get((ctx, src, tag), 0)
        self._recvs[(ctx, src, tag)] = k + 1
        self.events.append(("recv", req, ctx, -1 if any_source else src, tag, nbytes, 0.0, 0.0))
        self._match[req] = (ctx, src, tag, k)
        return req

    def wait(self, *reqs: int) -> None:
        matches = {r: self._match[r] for r in reqs if r in self._match}
        self.events.append(("wait", tuple(reqs), matches, 0.0, 0.0))

    def send(self, dst: int, nbytes: int, tag: int = 0) -> None:
        self.wait(self.isend(dst, nbytes, tag))

    def recv(self, src: int, nbytes: int, tag: int = 0) -> None:
        self.wait(self.irecv(src, nbytes, tag))

    def sendrecv(self, dst: int, nbytes: int, src: int, recv_nbytes: int) -> None:
        self.wait(self.isend(dst, nbytes), self.irecv(src, recv_nbytes))

    def coll(self, op: str, group: tuple[int, ...], nbytes: int, root: int = -1) -> None:
        index = self._colls.get(group, 0)
        self._colls[group] = index + 1
        self.events.append(("coll", op, group, index, nbytes, root, 0.0, 0.0))

    def mark(self, name: str) -> None:
        self.events.append(("mark", name, 0.0, 0.0))


def traces_of(tracers: list[Tracer]) -> dict[int, list[Event]]:
    return {t.rank: t.events for t in tracers}


def ring_allreduce(tracers: list[Tracer], n: int) -> None:
    """Problem 03's reference as events: each step one Sendrecv right/left of one chunk."""
    p = len(tracers)
    sizes = cc.chunk_sizes(n, p)
    for t in tracers:
        r = t.rank
        right, left = (r + 1) % p, (r - 1) % p
        for step in range(p - 1):
            t.sendrecv(right, sizes[(r - step) % p], left, sizes[(r - step - 1) % p])
        for step in range(p - 1):
            t.sendrecv(right, sizes[(r + 1 - step) % p], left, sizes[(r - step) % p])


def builtin(op: str, p: int, nbytes: int, root: int = -1) -> dict[int, list[Event]]:
    tracers = [Tracer(r) for r in range(p)]
    for t in tracers:
        t.coll(op, tuple(range(p)), nbytes, root)
    return traces_of(tracers)


def close(a: float, b: float, rel: float = REL) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)


# -- point to point -----------------------------------------------------------------------------


@pytest.mark.parametrize("alpha, beta, n", [(1e-6, 1e-9, 1 << 20), (5e-5, 1 / 12.5e9, 12345), (2e-6, 1e-10, 0)])
def test_ping_pong_takes_two_uncontended_messages(alpha: float, beta: float, n: int) -> None:
    a, b = Tracer(0), Tracer(1)
    a.send(1, n)
    a.recv(1, n)
    b.recv(0, n)
    b.send(0, n)
    result = replay(traces_of([a, b]), UniformNet(alpha, beta))
    assert close(result.makespan, 2 * (alpha + n * beta))
    # Rank 1's Send: past the eager limit (rendezvous) it is done when delivered; below it, as
    # soon as it is posted (an eager send only copies the message out).
    done = result.makespan if n > EAGER_LIMIT else alpha + n * beta
    assert close(result.finish[1], done)
    assert result.pair_bytes == {(0, 1): n, (1, 0): n}


def test_lone_message_takes_exactly_alpha_plus_n_beta() -> None:
    a, b = Tracer(0), Tracer(1)
    a.send(1, 1000)
    b.recv(0, 1000)
    result = replay(traces_of([a, b]), UniformNet(0.25, 0.001))
    assert result.finish[1] == 0.25 + 1000 * 0.001  # bit for bit
    assert result.finish[0] == 0.0  # eager: the sender is free once the message is copied out
    (flow,) = result.flows
    assert (flow.posted, flow.start, flow.end, flow.op) == (0.0, 0.25, 0.25 + 1.0, "send")


def test_a_send_past_the_eager_limit_is_done_for_its_sender_when_its_bytes_are_in() -> None:
    for n, limit, done in ((EAGER_LIMIT + 1, EAGER_LIMIT, 0.25 + (EAGER_LIMIT + 1) * 1e-6),
                           (EAGER_LIMIT, EAGER_LIMIT, 0.0),  # at the limit: still eager
                           (EAGER_LIMIT + 1, 1 << 20, 0.0)):  # the limit is the replay's to choose
        a, b = Tracer(0), Tracer(1)
        a.send(1, n)
        b.compute(5.0)
        b.recv(0, n)  # posted late: the bytes are in long before (a late receive is not modelled)
        result = replay(traces_of([a, b]), UniformNet(0.25, 1e-6), eager_limit=limit)
        assert close(result.finish[0], done) and result.finish[1] == 5.0, (n, limit)


def test_receive_completes_at_max_of_posted_and_delivery_and_wildcards_match() -> None:
    a, b = Tracer(0), Tracer(1)
    a.send(1, 100)
    b.compute(5.0)
    b.wait(b.irecv(0, 100, any_source=True))  # posted long after the message arrived
    result = replay(traces_of([a, b]), UniformNet(1e-3, 1e-6))
    assert result.finish[1] == 5.0
    assert result.comm_s[1] == 0.0
    assert result.finish[0] == 0.0  # eager: done once copied out


@pytest.mark.parametrize("shape", ["mapping", "pairs", "aligned"])
def test_wait_matches_may_come_as_mapping_pairs_or_one_entry_per_request(shape: str) -> None:
    a, b = Tracer(0), Tracer(1)
    a.send(1, 100)
    send, recv = b.isend(0, 100), b.irecv(0, 100)
    a.recv(1, 100)
    match = (0, 0, 0, 0)  # (ctx, src, tag, k): the first message from rank 0 on tag 0
    matches = {"mapping": {recv: match}, "pairs": ((recv, match),), "aligned": (None, match)}[shape]
    b.events.append(("wait", [send, recv], matches, 0.0, 0.0))  # lists, as from a JSON file
    result = replay(traces_of([a, b]), UniformNet(1.0, 0.0))
    assert result.finish == {0: 1.0, 1: 1.0}  # both messages cross at once, 1 s each


def test_route_without_links_or_bandwidth_limit_is_instant() -> None:
    class Loopback(UniformNet):
        def route(self, src: int, dst: int) -> Route:
            return Route(0.0, (), 0.0, 0.0) if src == dst else super().route(src, dst)

    a = Tracer(0)
    req = a.isend(0, 1 << 30)
    a.wait(req, a.irecv(0, 1 << 30))
    result = replay(traces_of([a]), Loopback(1.0, 1.0))
    assert result.makespan == 0.0 and result.pair_bytes == {(0, 0): 1 << 30}


# -- the ring allreduce, by hand and built in ----------------------------------------------------


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 12])
@pytest.mark.parametrize("per_rank", [1, 1000, 1 << 18])
@pytest.mark.parametrize("alpha", [0.0, 3e-6])
def test_hand_written_ring_allreduce_costs_the_ring_formula(p: int, per_rank: int, alpha: float) -> None:
    beta, n = 1 / 12.5e9, per_rank * p
    tracers = [Tracer(r) for r in range(p)]
    ring_allreduce(tracers, n)
    result = replay(traces_of(tracers), UniformNet(alpha, beta))
    assert close(result.makespan, cc.ring_allreduce_time(p, n, alpha, beta))
    assert sum(result.pair_bytes.values()) == 2 * (p - 1) * n  # 2(p-1)/p n from each of p ranks


@pytest.mark.parametrize("p", [2, 3, 4, 7, 8, 16])
@pytest.mark.parametrize("n", [4096, 40000, 1 << 22])
def test_builtin_allreduce_costs_the_ring_formula_and_matches_the_hand_written_ring(p: int, n: int) -> None:
    alpha, beta = 1e-5, 1e-9
    net = UniformNet(alpha, beta)
    built = replay(builtin("Allreduce", p, n), net)
    tracers = [Tracer(r) for r in range(p)]
    ring_allreduce(tracers, n)
    by_hand = replay(traces_of(tracers), net)
    assert close(built.makespan, by_hand.makespan)
    if n % p == 0:
        assert close(built.makespan, cc.ring_allreduce_time(p, n, alpha, beta))
    assert len(built.flows) == 2 * (p - 1) * p
    assert {f.op for f in built.flows} == {"Allreduce"}
    assert all(len(s) == 1 for s in built.spans.values())


def test_builtin_allreduce_on_the_shipped_uniform_platform() -> None:
    """The same formula on distlab.platforms.uniform: routes of two cables through a switch."""
    from distlab.platforms import uniform

    p, n, alpha, beta = 8, 1 << 20, 2e-6, 1 / 25e9
    result = replay(builtin("Allreduce", p, n), uniform(p, alpha, beta))
    assert close(result.makespan, cc.ring_allreduce_time(p, n, alpha, beta))


# -- the other collectives -----------------------------------------------------------------------


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 7, 8, 9, 16])
def test_barrier_and_bcast_cost_log_p_rounds(p: int) -> None:
    alpha, beta, n = 1e-5, 1e-9, 1 << 16
    net = UniformNet(alpha, beta)
    assert close(replay(builtin("Barrier", p, 0), net).makespan, cc.dissemination_barrier_time(p, alpha))
    for root in {0, p // 2, p - 1}:
        bcast = replay(builtin("Bcast", p, n, root), net)
        assert close(bcast.makespan, cc.binomial_bcast_time(p, n, alpha, beta))
        assert sum(bcast.pair_bytes.values()) == (p - 1) * n  # every rank but the root gets it once
        assert all(dst != root for _, dst in bcast.pair_bytes)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 13])
def test_reduce_reduce_scatter_allgather_costs(p: int) -> None:
    alpha, beta, n = 1e-5, 1e-9, 8 * 3 * 5 * 7 * 11 * 13 * 16
    net = UniformNet(alpha, beta)
    reduce = replay(builtin("Reduce", p, n, root=p - 1), net).makespan
    bound = cc.binomial_reduce_time(p, n, alpha, beta)
    assert close(reduce, bound) if p & (p - 1) == 0 else reduce <= bound * (1 + REL)
    assert close(replay(builtin("Reduce_scatter", p, n), net).makespan,
                 cc.ring_reduce_scatter_time(p, n, alpha, beta))
    assert close(replay(builtin("Allgather", p, n // p), net).makespan,
                 cc.ring_allgather_time(p, n // p, alpha, beta))
    for op in ("Barrier", "Bcast", "Reduce", "Allreduce", "Reduce_scatter"):
        assert close(replay(builtin(op, p, n, root=0), net).makespan,
                     cc.collective_time(op, p, n, alpha, beta)) or op == "Reduce"


def test_collective_starts_when_the_last_rank_arrives() -> None:
    p, alpha = 4, 1e-3
    tracers = [Tracer(r) for r in range(p)]
    for t in tracers:
        t.compute(0.5 * t.rank)
        t.coll("Barrier", tuple(range(p)), 0)
    result = replay(traces_of(tracers), UniformNet(alpha, 1e-9))
    assert close(result.makespan, 1.5 + 2 * alpha)
    assert [result.sync_wait_s[r] for r in range(p)] == [1.5, 1.0, 0.5, 0.0]
    assert all(result.spans[r][1] == (0.5 * r, result.makespan) for r in range(p))


def test_collective_flows_share_links_like_any_other() -> None:
    """Allreduce on a bus where every flow crosses one link: p flows at a time share it."""
    p, n, cap = 4, 4000, 1000.0
    paths = {(a, b): ("bus",) for a in range(p) for b in range(p)}
    result = replay(builtin("Allreduce", p, n), TableNet(paths, {"bus": cap}))
    # 2(p-1) steps, each p chunks of n/p bytes sharing cap: p * (n/p) / cap per step.
    assert close(result.makespan, 2 * (p - 1) * n / cap)
    assert result.link_bytes == {"bus": 2 * (p - 1) * n}


# -- sharing: contention and max-min fairness ---------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 1e-4])
def test_flows_sharing_one_link_take_proportionally_longer(alpha: float) -> None:
    """Ranks 0..2 send to 3..5; every path crosses "core", whose capacity equals each edge link's."""
    cap, n = 1e9, 10_000_000
    capacities = {"core": cap} | {f"e{r}": cap for r in range(6)}
    paths = {(a, a + 3): (f"e{a}", "core", f"e{a + 3}") for a in range(3)}
    net = TableNet(paths, capacities, alpha)

    def transfer_time(k: int) -> float:
        tracers = [Tracer(r) for r in range(6)]
        for a in range(k):
            tracers[a].send(a + 3, n)
            tracers[a + 3].recv(a, n)
        result = replay(traces_of(tracers), net)
        assert result.link_bytes["core"] == k * n
        return result.makespan - alpha

    one = transfer_time(1)
    assert close(one, n / cap)
    assert close(transfer_time(2), 2 * one)
    assert close(transfer_time(3), 3 * one)


def test_max_min_rates_on_two_links() -> None:
    """A (1 B/s) carries f1 and f2; B (2 B/s) carries f2 and f3. Fair shares: A splits evenly,
    f2 is held to 0.5 by A, so f3 gets the rest of B: 1.5 (not 1, an even split of B)."""
    caps = {"A": 1.0, "B": 2.0}
    rates = max_min_rates([("A",), ("A", "B"), ("B",)], [1.0, 1.0, 2.0], [1, 1, 1], caps.__getitem__)
    assert rates == [0.5, 0.5, 1.5]
    # weights count identical flows; caps bind before links do
    assert max_min_rates([("B",), ("B",)], [0.25, math.inf], [2, 1], caps.__getitem__) == [0.25, 1.5]


def test_max_min_fairness_over_time_on_two_links() -> None:
    """The same three flows replayed, with sizes that make rates change as flows finish:
    f1 (0.5 MB) ends at 1 s; then f2 and f3 both run at 1 MB/s (A limits f2, B splits evenly);
    f2 (1 MB) ends at 1.5 s; f3 (3 MB) has 1 MB left and ends alone at 2 MB/s, at 2 s."""
    mb = 1e6
    capacities = {"A": 1 * mb, "B": 2 * mb}
    paths = {(0, 3): ("A",), (1, 4): ("A", "B"), (2, 5): ("B",)}
    tracers = [Tracer(r) for r in range(6)]
    for src, size in ((0, 500_000), (1, 1_000_000), (2, 3_000_000)):
        tracers[src].send(src + 3, size)
        tracers[src + 3].recv(src, size)
    result = replay(traces_of(tracers), TableNet(paths, capacities))
    assert [round(result.finish[r], 9) for r in range(3)] == [1.0, 1.5, 2.0]
    assert result.link_bytes == {"A": 1_500_000, "B": 4_000_000}


def reference_flow_ends(starts: list[float], sizes: list[int], routes: list[tuple[str, ...]],
                        capacities: dict[str, float], pairs: list[tuple[int, int]]) -> list[float]:
    """A naive fluid simulation, one flow at a time: at every start or end, recompute the rate of
    every active flow at the head of its pair's channel (first in, first out) by progressive
    filling in rounds, then jump to the next start or end."""
    n = len(starts)
    left = [float(x) for x in sizes]
    ends = [math.nan] * n
    active: list[int] = []
    t, waiting = 0.0, sorted(range(n), key=lambda f: starts[f])
    while waiting or active:
        heads = [f for i, f in enumerate(active) if all(pairs[g] != pairs[f] for g in active[:i])]
        caps = [min(capacities[x] for x in routes[f]) for f in heads]  # 1 / beta of the route
        rates = naive_max_min([routes[f] for f in heads], caps, capacities)
        t_start = starts[waiting[0]] if waiting else math.inf
        finish = [t + left[f] / r for f, r in zip(heads, rates)]
        t_next = min([t_start, *finish])
        for f, r in zip(heads, rates):
            left[f] -= r * (t_next - t)
        t = t_next
        done = [f for f, e in zip(heads, finish) if e <= t * (1 + 1e-12)]
        for f in done:
            ends[f] = t
        active = [f for f in active if f not in done]
        while waiting and starts[waiting[0]] == t:
            active.append(waiting.pop(0))
    return ends


def naive_max_min(routes: list[tuple[str, ...]], caps: list[float], capacities: dict[str, float]) -> list[float]:
    rates = [0.0] * len(routes)
    unfrozen, level = list(range(len(routes))), 0.0
    room = dict(capacities)
    while unfrozen:
        count = {x: sum(1 for f in unfrozen if x in routes[f]) for x in room}
        shares = {x: room[x] / count[x] for x in room if count[x]}
        level = min([*shares.values(), *(caps[f] for f in unfrozen)])
        full = [x for x, v in shares.items() if v <= level]
        now = [f for f in unfrozen if caps[f] <= level or any(x in full for x in routes[f])]
        for f in now:
            rates[f] = level
            for x in routes[f]:
                room[x] -= level
        unfrozen = [f for f in unfrozen if f not in now]
    return rates


@pytest.mark.parametrize("seed", range(12))
def test_replay_agrees_with_a_naive_fluid_simulation(seed: int) -> None:
    """Random flows, some starting together, on a small cluster with uneven capacities: the
    replay's end times (per-pair channels, heap filling, partial recomputation) match a
    flow-by-flow simulation that recomputes everything at every event."""
    rng = random.Random(seed)
    net = cluster(2, 3, alpha=0.0, nic=rng.choice([1e9, 3e9]), uplink=rng.choice([1e9, 2e9, 5e9]))
    tracers = [Tracer(r) for r in range(6)]
    starts: list[float] = []
    sizes: list[int] = []
    pairs: list[tuple[int, int]] = []
    for t in tracers:
        clock, reqs = 0.0, []
        for _ in range(rng.randrange(1, 6)):
            gap = rng.choice([0.0, 0.0, 1e-4, rng.uniform(0, 1e-3)])
            t.compute(gap)
            clock += gap
            dst, size = rng.choice([d for d in range(6) if d != t.rank]), rng.randrange(1, 2_000_000)
            reqs.append(t.isend(dst, size))
            starts.append(clock)
            sizes.append(size)
            pairs.append((t.rank, dst))
        t.wait(*reqs)
    for t in tracers:  # the receives, so that every message is matched
        t.wait(*[t.irecv(src, size) for (src, dst), size in zip(pairs, sizes) if dst == t.rank])
    result = replay(traces_of(tracers), net)
    expected = reference_flow_ends(starts, sizes, [net.paths[pair] for pair in pairs], net.capacities,
                                   pairs)
    got = {(f.src, f.dst, f.posted, f.nbytes): f.end for f in result.flows}
    assert len(got) == len(pairs)
    for pair, start, size, end in zip(pairs, starts, sizes, expected):
        assert close(got[(*pair, start, size)], end, rel=1e-9)


# -- per-rank accounting -------------------------------------------------------------------------


def test_compute_imbalance_shows_as_sync_wait_and_idle_time() -> None:
    alpha = 0.001
    tracers = [Tracer(r) for r in range(3)]
    for t, work in zip(tracers, (1.0, 3.0, 2.0)):
        t.mark("step")
        t.compute(work)
        t.coll("Barrier", (0, 1, 2), 0)
        t.mark("step")
    tracers[0].compute(0.5)  # rank 0 then works alone: the others sit idle meanwhile
    result = replay(traces_of(tracers), UniformNet(alpha, 1e-9))
    end_barrier = 3.0 + cc.dissemination_barrier_time(3, alpha)
    assert close(result.makespan, end_barrier + 0.5)
    assert result.compute_s == {0: 1.5, 1: 3.0, 2: 2.0}
    assert close(result.sync_wait_s[0], 2.0) and close(result.sync_wait_s[2], 1.0)
    assert close(result.comm_s[0], end_barrier - 1.0) and close(result.comm_s[1], end_barrier - 3.0)
    assert result.idle_s[0] == 0.0 and close(result.idle_s[1], 0.5) and close(result.idle_s[2], 0.5)
    for r in range(3):
        assert close(result.compute_s[r] + result.comm_s[r] + result.idle_s[r], result.makespan)
        assert len(result.spans[r]) == len(tracers[r].events)
        assert result.marks[r] == (("step", 0.0), ("step", result.spans[r][2][1]))


def test_bytes_and_money_per_pair_and_link() -> None:
    prices = {"wan": 2e-9}
    capacities = {"a": 1e9, "wan": 1e8, "b": 1e9}
    paths = {(0, 1): ("a", "wan", "b"), (1, 0): ("b", "wan", "a")}
    tracers = [Tracer(0), Tracer(1)]
    tracers[0].send(1, 1000)
    tracers[1].recv(0, 1000)
    result = replay(traces_of(tracers), TableNet(paths, capacities, prices=prices))
    assert result.money == 1000 * 2e-9
    assert result.link_bytes == {"a": 1000, "b": 1000, "wan": 1000}
    cost = 1000 * 2e-9
    assert result.link_money == {"a": cost, "b": cost, "wan": cost}  # the whole route's price
    priced = replay(traces_of(tracers), PricedNet(paths, capacities, prices=prices))
    assert priced.link_money == {"a": 0.0, "b": 0.0, "wan": cost}  # each link's own price


# -- broken traces fail with a sentence ----------------------------------------------------------


def test_unmatched_receive_names_rank_event_and_message() -> None:
    a, b = Tracer(0), Tracer(1)
    a.send(1, 8, tag=8)
    b.compute(1.0)
    b.recv(0, 8, tag=7)
    with pytest.raises(ReplayError) as info:
        replay(traces_of([a, b]), UniformNet(1e-6, 1e-9))
    msg = str(info.value)
    assert (info.value.rank, info.value.event) == (1, 2)
    assert "rank 1, event 2" in msg and "message #0 from rank 0 to rank 1 on tag 7" in msg
    assert "never sends it" in msg


def test_deadlock_reports_every_blocked_rank_and_ends() -> None:
    a, b = Tracer(0), Tracer(1)
    a.recv(1, 8)
    a.send(1, 8)
    b.recv(0, 8)
    b.send(0, 8)
    with pytest.raises(ReplayError, match="deadlock") as info:
        replay(traces_of([a, b]), UniformNet(1e-6, 1e-9))
    msg = str(info.value)
    assert "rank 0, event 1 (wait" in msg and "rank 1, event 1 (wait" in msg
    assert "message #0 from rank 1 to rank 0" in msg


def test_collective_missing_a_member_fails_at_once() -> None:
    tracers = [Tracer(r) for r in range(3)]
    for t in tracers[:2]:
        t.coll("Allreduce", (0, 1, 2), 64)
    with pytest.raises(ReplayError, match=r"rank\(s\) \[2\] never make that call"):
        replay(traces_of(tracers), UniformNet(1e-6, 1e-9))


def test_mismatched_collectives_and_bad_events_are_reported() -> None:
    tracers = [Tracer(r) for r in range(2)]
    tracers[0].coll("Allreduce", (0, 1), 64)
    tracers[1].coll("Bcast", (0, 1), 64, root=0)
    with pytest.raises(ReplayError, match="where the others call Allreduce"):
        replay(traces_of(tracers), UniformNet(1e-6, 1e-9))
    with pytest.raises(ReplayError, match="unknown event kind 'sleep'"):
        replay({0: [("sleep", 1.0, 0.0, 0.0)]}, UniformNet(1e-6, 1e-9))
    with pytest.raises(ReplayError, match="no algorithm for collective 'Scan'"):
        replay(builtin("Scan", 2, 64), UniformNet(1e-6, 1e-9))
    with pytest.raises(ReplayError, match="wait on request 9"):
        replay({0: [("wait", (9,), {}, 0.0, 0.0)]}, UniformNet(1e-6, 1e-9))


# -- determinism and speed -----------------------------------------------------------------------


def mixed_traces(p: int = 16, rounds: int = 3, seed: int = 7) -> dict[int, list[Event]]:
    """Training-like steps on a contended cluster: uneven compute, a ring allreduce by hand, a
    built-in Allreduce, random Isend bursts to peers, and marks."""
    rng = random.Random(seed)
    tracers = [Tracer(r) for r in range(p)]
    for _ in range(rounds):
        for t in tracers:
            t.mark("step")
            t.compute(rng.uniform(1e-3, 2e-3))
        ring_allreduce(tracers, rng.randrange(1 << 16, 1 << 20))
        for t in tracers:
            t.coll("Allreduce", tuple(range(p)), 1 << 18)
        plan = [[(rng.randrange(p), rng.randrange(1, 1 << 16)) for _ in range(8)] for _ in range(p)]
        for t in tracers:
            reqs = [t.isend(dst, size, tag=3) for dst, size in plan[t.rank]]
            incoming = [(src, size) for src in range(p) for dst, size in plan[src] if dst == t.rank]
            reqs += [t.irecv(src, size, tag=3) for src, size in incoming]
            t.wait(*reqs)
    return traces_of(tracers)


def digest(result: Replay) -> str:
    return hashlib.sha256(repr(result).encode()).hexdigest()


def test_same_traces_give_bit_identical_results() -> None:
    traces, net = mixed_traces(), cluster(4, 4)
    first, second = replay(traces, net), replay(traces, net)
    assert first == second and digest(first) == digest(second)
    assert first.makespan > 0 and len(first.link_bytes) > 0


def test_results_do_not_depend_on_string_hashing() -> None:
    here = digest(replay(mixed_traces(), cluster(4, 4)))
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from test_netsim import mixed_traces, cluster, digest;"
        "from distlab.runtime.clock.replay import replay;"
        "print(digest(replay(mixed_traces(), cluster(4, 4))))"
    )
    for seed in ("1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent)],
                             capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == here


def test_ten_thousand_messages_replay_in_about_a_second() -> None:
    """32 ranks on 4 hosts: five hand-written ring allreduces (9,920 messages), uplinks shared."""
    p = 32
    tracers = [Tracer(r) for r in range(p)]
    for _ in range(5):
        for t in tracers:
            t.compute(1e-3)
        ring_allreduce(tracers, 1 << 22)
    traces, net = traces_of(tracers), cluster(4, 8)
    began = time.perf_counter()
    result = replay(traces, net)
    elapsed = time.perf_counter() - began
    print(f"replayed {result.messages} messages over {p} ranks in {elapsed:.3f} s")
    assert result.messages == 5 * 2 * (p - 1) * p
    # About 0.3 s on an idle machine; the bound catches a replay gone quadratic (minutes), not a
    # slow one: this machine is shared, and CI once took 11 s for the burst below under load.
    assert elapsed < 60.0


def test_an_all_to_all_burst_in_one_contended_component_replays_in_seconds() -> None:
    """Every rank Isends 30 messages to random peers, then waits on all: 960 flows at once that
    all share links, so every start or end recomputes the rates of ~300 (src, dst) pairs. This
    is the replay's worst case: the cost grows with flows in flight times pairs sharing links."""
    p, rng = 32, random.Random(3)
    plan = [[(rng.randrange(p), rng.randrange(1, 1 << 20)) for _ in range(30)] for _ in range(p)]
    tracers = [Tracer(r) for r in range(p)]
    for t in tracers:
        reqs = [t.isend(dst, size) for dst, size in plan[t.rank]]
        reqs += [t.irecv(src, size) for src in range(p) for dst, size in plan[src] if dst == t.rank]
        t.wait(*reqs)
    began = time.perf_counter()
    result = replay(traces_of(tracers), cluster(4, 8))
    elapsed = time.perf_counter() - began
    print(f"replayed {result.messages} concurrent messages in {elapsed:.3f} s")
    assert result.messages == 960
    assert elapsed < 60.0  # about 1 s on an idle machine: see the test above
