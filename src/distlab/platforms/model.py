"""What a platform is: device profiles, a graph of named nodes, links, and the rank-to-device map.

The platform file format (TOML, ``format_version = 1``)
=======================================================

A platform file describes the cluster a problem runs on; the virtual clock reads it to time
messages and compute. ``docs/platform-format.md`` has the same description with a full example.

Top-level keys (TOML wants them, and any ``node = [...]``/``link = [...]`` arrays, before the first
``[profile.NAME]`` table)::

    format_version = 1
    name = "rack"                       # how cards and the CLI refer to it
    description = "2 sockets x 2 PCIe switches x 2 GPUs"
    ranks = ["gpu0", "gpu1", "gpu4", ...]   # rank i runs on device ranks[i]

``[profile.NAME]``: one table per kind of device::

    flops = 19.5e12                     # FLOP/s the virtual clock divides declared work by
    memory_gib = 40                     # GiB (2**30 bytes)
    unsupported_ops = ["fft"]           # optional; every other operator is supported
    description = "NVIDIA A100 40GB"    # optional
    [profile.NAME.throughput]           # optional; any name -> a positive rate
    resnet50_img_per_s = 940

``[[node]]``: the named nodes of the network graph, one entry each (or ``node = [{...}, ...]``)::

    name = "gpu0"                       # letters, digits, '_', '.', '-'; unique among nodes
    kind = "device"                     # one of KINDS below
    in = "pcie0"                        # optional: the node this one sits under
    profile = "v100"                    # devices only, and required for them

``in`` builds the containment tree used for groups and for the drawing: a device sits in a PCIe
switch, the switch in a socket, the socket in a host, the host in a data center. It is declared,
not derived from the links, because the links alone do not say which node "owns" which (a switch
joins two hosts but belongs to neither). Every device must have a node of kind ``host`` among its
ancestors: that is the device's host. ``in`` must not form a cycle, and nothing sits in a device.

``[[link]]`` (or ``link = [{...}, ...]``): the cables, each declared once and full duplex; a
one-device platform may have none::

    a = "gpu0"
    b = "pcie0"
    latency_us = 1.0                    # one-way latency in microseconds, >= 0
    bandwidth_gbps = 128                # gigabits per second (1e9 bits/s), > 0, in EACH direction
    price_per_gb = 0.02                 # optional, money per GB (1e9 bytes) crossing it, >= 0
    label = "PCIe 3.0 x16"              # optional, for the drawing

A link becomes two directed links, ``"gpu0>pcie0"`` and ``"pcie0>gpu0"``, each with the full
bandwidth (full duplex) and the same latency and price. Bandwidth is in gigabits per second because
that is how networks are sold and measured; 100 Gb/s is 12.5e9 bytes/s. At most one link joins two
nodes.

Routing and the rules that follow from it
-----------------------------------------

A message from rank i to rank j follows the path of least total latency from device ``ranks[i]``
to device ``ranks[j]``; ties go to the path with fewer hops, then to the path whose node names come
first in order, so routes are deterministic. A route never passes *through* another device (GPUs
do not forward each other's traffic), so every device must reach every other device through
non-device nodes or a direct link: a platform where one cannot is rejected as disconnected.
Nodes with no links at all are allowed: they are pure groups (a data center, a host).

Groups
------

``groups(kind)`` maps every node of that kind to the ranks whose device sits under it in the
containment tree, e.g. ``groups("datacenter") == {"dc0": [0, 1, 2, 3], ...}``. Groups without
ranks are left out.

Ranks
-----

A platform may have more devices than ranks, and a run may use fewer ranks than the platform
lists: rank i uses ``ranks[i]``. A run with more ranks than entries is an error naming both
numbers (``Platform.check_world``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from ..errors import DistlabError
from .routing import Graph, shortest_paths

FORMAT_VERSION = 1

# The kinds of node a file may declare. A closed list so that a typo ("socekt") is caught.
KINDS = (
    "device", "nic", "pcie_switch", "socket", "host", "switch", "router", "rack", "datacenter",
)


class PlatformError(DistlabError):
    """A platform file is malformed or a platform was asked for something it does not have."""


@dataclass(frozen=True)
class Profile:
    """A kind of device: how fast it computes, how much memory it has, what it cannot run."""

    name: str
    flops: float  # FLOP/s
    memory_gib: float
    # hash=False: a mapping is not hashable, and two profiles differ by name and figures anyway
    throughput: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )
    unsupported_ops: frozenset[str] = frozenset()
    description: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    def supports(self, op: str) -> bool:
        return op not in self.unsupported_ops

    def __reduce__(self) -> tuple[Any, ...]:
        # A read-only mapping does not pickle; rebuild it from a plain dict.
        return (_profile, (self.name, self.flops, self.memory_gib, dict(self.throughput),
                           self.unsupported_ops, self.description))


def _profile(name: str, flops: float, memory_gib: float, throughput: dict[str, float],
             unsupported_ops: frozenset[str], description: str) -> Profile:
    return Profile(name, flops, memory_gib, MappingProxyType(throughput), unsupported_ops, description)


@dataclass(frozen=True)
class Node:
    name: str
    kind: str
    parent: str | None = None  # the ``in`` key
    profile: str | None = None  # devices only


@dataclass(frozen=True)
class Link:
    """One direction of a cable. ``id`` is ``"src>dst"``."""

    src: str
    dst: str
    latency_s: float
    bytes_per_s: float  # math.inf for a link that costs no time per byte
    s_per_byte: float  # kept as given (not 1 / bytes_per_s) so uniform() routes are exact
    price_per_byte: float = 0.0
    label: str = ""

    @property
    def id(self) -> str:
        return f"{self.src}>{self.dst}"


@dataclass(frozen=True)
class Device:
    """A device and where it sits; ``ancestors`` runs from its parent up to the root."""

    name: str
    profile: Profile
    host: str
    ancestors: tuple[str, ...]

    @property
    def flops(self) -> float:
        return self.profile.flops

    @property
    def memory_bytes(self) -> int:
        return self.profile.memory_bytes

    def supports(self, op: str) -> bool:
        return self.profile.supports(op)

    def throughput(self, metric: str) -> float:
        try:
            return self.profile.throughput[metric]
        except KeyError:
            known = ", ".join(sorted(self.profile.throughput)) or "none"
            raise PlatformError(
                f"profile '{self.profile.name}' has no throughput '{metric}' (it has: {known})"
            ) from None


@dataclass(frozen=True)
class Route:
    alpha_s: float  # one-way latency: sum of the link latencies on the path
    links: tuple[str, ...]  # directed link ids on the path, e.g. "gpu0>sw0", "sw0>socket0"
    beta_s_per_byte: float  # 1 / (smallest bandwidth on the path, in bytes per second)
    price_per_byte: float  # sum of link prices on the path (0 if none)


ZERO_ROUTE = Route(alpha_s=0.0, links=(), beta_s_per_byte=0.0, price_per_byte=0.0)


class Platform:
    """A validated platform. Build it with ``load_platform``/``resolve``/``uniform``, not by hand:
    the constructor trusts its arguments (the loader has checked them)."""

    def __init__(
        self,
        name: str,
        description: str,
        profiles: Mapping[str, Profile],
        nodes: list[Node],
        links: list[Link],
        ranks: list[str],
        source: str = "",
    ) -> None:
        self.name = name
        self.description = description
        self.source = source  # the file it came from, for messages ("" when built in code)
        self.profiles = MappingProxyType(dict(profiles))
        self.nodes: Mapping[str, Node] = MappingProxyType({n.name: n for n in nodes})
        self.links: Mapping[str, Link] = MappingProxyType({ln.id: ln for ln in links})
        self.ranks: tuple[str, ...] = tuple(ranks)
        self._devices = {
            n.name: _make_device(n, self.nodes, self.profiles) for n in nodes if n.kind == "device"
        }
        self._graph = Graph(
            edges={(ln.src, ln.dst): _latency_ps(ln.latency_s) for ln in links},
            endpoints=frozenset(self._devices),
        )
        self._paths: dict[str, dict[str, tuple[str, ...]]] = {}  # src device -> dst -> nodes
        self._routes: dict[tuple[int, int], Route] = {}

    def __repr__(self) -> str:
        return f"Platform({self.name!r}, ranks={len(self.ranks)}, devices={len(self._devices)})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Jobs carry their platform to the ranks as a pickle; rebuild it from its parts there.
        return (Platform, (self.name, self.description, dict(self.profiles),
                           list(self.nodes.values()), list(self.links.values()), list(self.ranks),
                           self.source))

    # -- ranks and devices -----------------------------------------------------------------------

    def max_ranks(self) -> int:
        return len(self.ranks)

    def check_world(self, world: int) -> None:
        """Raises if a run of ``world`` ranks does not fit on this platform."""
        if world > len(self.ranks):
            raise PlatformError(
                f"platform '{self.name}' maps {len(self.ranks)} ranks; the run asked for {world}"
            )

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < len(self.ranks):
            last = len(self.ranks) - 1
            raise PlatformError(f"rank {rank} is not on platform '{self.name}' (ranks 0..{last})")

    def device_of(self, rank: int) -> Device:
        self._check_rank(rank)
        return self._devices[self.ranks[rank]]

    @property
    def devices(self) -> Mapping[str, Device]:
        return MappingProxyType(self._devices)

    def rank_of(self, device: str) -> int | None:
        """The rank that runs on ``device``, or None if no rank does."""
        return self.ranks.index(device) if device in self.ranks else None

    # -- groups ----------------------------------------------------------------------------------

    def groups(self, kind: str, world: int | None = None) -> dict[str, list[int]]:
        """Nodes of ``kind`` -> the ranks under them (only ranks < world if given), in file order."""
        if kind not in KINDS:
            raise PlatformError(f"no node kind '{kind}': kinds are {', '.join(KINDS)}")
        n = len(self.ranks) if world is None else min(world, len(self.ranks))
        out: dict[str, list[int]] = {}
        for node in self.nodes.values():
            if node.kind != kind:
                continue
            members = [
                r for r in range(n)
                if self.ranks[r] == node.name or node.name in self._devices[self.ranks[r]].ancestors
            ]
            if members:
                out[node.name] = members
        return out

    def group_of(self, rank: int, kind: str) -> str | None:
        """The node of ``kind`` that rank sits under (None if none does)."""
        device = self.device_of(rank)
        if kind == "device":
            return device.name
        return next((a for a in device.ancestors if self.nodes[a].kind == kind), None)

    # -- the network -----------------------------------------------------------------------------

    def capacity(self, link: str) -> float:
        """Bytes per second of a directed link such as ``"gpu0>pcie0"``."""
        return self.link(link).bytes_per_s

    def link_price(self, link: str) -> float:
        """Money per byte crossing this directed link alone (the flow simulator charges per link)."""
        return self.link(link).price_per_byte

    def link(self, link: str) -> Link:
        try:
            return self.links[link]
        except KeyError:
            raise PlatformError(f"platform '{self.name}' has no link '{link}'") from None

    def path(self, src_rank: int, dst_rank: int) -> tuple[str, ...]:
        """Node names on the route, both devices included."""
        self._check_rank(src_rank)
        self._check_rank(dst_rank)
        src, dst = self.ranks[src_rank], self.ranks[dst_rank]
        if src == dst:
            return (src,)
        if src not in self._paths:
            self._paths[src] = shortest_paths(self._graph, src)
        # The loader rejects platforms where a device cannot reach another, so this is present.
        return self._paths[src][dst]

    def unreachable_pair(self) -> tuple[str, str] | None:
        """Two devices with no route between them (None when every device reaches every other)."""
        names = list(self._devices)
        for src in names:
            if src not in self._paths:
                self._paths[src] = shortest_paths(self._graph, src)
            missing = next((d for d in names if d not in self._paths[src]), None)
            if missing is not None:
                return src, missing
        return None

    def route(self, src_rank: int, dst_rank: int) -> Route:
        key = (src_rank, dst_rank)
        cached = self._routes.get(key)
        if cached is not None:
            return cached
        nodes = self.path(src_rank, dst_rank)
        if len(nodes) == 1:
            route = ZERO_ROUTE
        else:
            hops = [self.links[f"{a}>{b}"] for a, b in zip(nodes, nodes[1:])]
            route = Route(
                alpha_s=sum(h.latency_s for h in hops),  # summed in path order: deterministic
                links=tuple(h.id for h in hops),
                beta_s_per_byte=max(h.s_per_byte for h in hops),
                price_per_byte=sum(h.price_per_byte for h in hops),
            )
        self._routes[key] = route
        return route


def _latency_ps(latency_s: float) -> int:
    # Paths are compared on integer picoseconds so that equal sums compare equal whatever the
    # order of float additions; the Route itself still reports the float sum of the link latencies.
    return round(latency_s * 1e12)


def _make_device(node: Node, nodes: Mapping[str, Node], profiles: Mapping[str, Profile]) -> Device:
    ancestors: list[str] = []
    parent = node.parent
    while parent is not None:
        ancestors.append(parent)
        parent = nodes[parent].parent
    host = next((a for a in ancestors if nodes[a].kind == "host"), None)
    assert host is not None and node.profile is not None, "checked by the loader"
    return Device(node.name, profiles[node.profile], host, tuple(ancestors))


def bytes_per_s_from_gbps(gbps: float) -> float:
    return gbps * 1e9 / 8


def s_per_byte(bytes_per_s: float) -> float:
    return 0.0 if math.isinf(bytes_per_s) else 1.0 / bytes_per_s
