"""The network as the replay sees it (routes and link capacities, which the platforms package
provides), and what a replay returns: per-rank times, bytes per pair and link, and every flow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from distlab.errors import DistlabError


@dataclass(frozen=True)
class Route:
    alpha_s: float  # one-way latency of the path
    links: tuple[str, ...]  # directed link ids on the path
    beta_s_per_byte: float  # 1 / smallest bandwidth on the path (bytes/s); 0 for no limit
    price_per_byte: float


class RouteLike(Protocol):
    @property
    def alpha_s(self) -> float: ...
    @property
    def links(self) -> tuple[str, ...]: ...
    @property
    def beta_s_per_byte(self) -> float: ...
    @property
    def price_per_byte(self) -> float: ...


class Network(Protocol):
    """What the replay needs from a platform. A network may also offer
    ``link_price(link) -> float`` (money per byte on that link alone); ``Replay.link_money`` then
    charges each link its own price instead of the whole route's."""

    def route(self, src_rank: int, dst_rank: int) -> RouteLike: ...
    def capacity(self, link: str) -> float: ...  # bytes per second of a directed link; may be inf


class ReplayError(DistlabError):
    """The traces cannot be replayed: a message never sent, a deadlock, a malformed event."""

    def __init__(self, message: str, rank: int | None = None, event: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.event = event


# -- the result ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlowRecord:
    """One message on the wire: posted by the sender, moving bytes from start to end."""

    src: int
    dst: int
    nbytes: int
    posted: float
    start: float  # posted + alpha: the first byte leaves
    end: float  # the last byte has arrived
    op: str  # "send" for point-to-point, else the collective ("Allreduce", ...)
    event: int  # index of the sender's event that created it ("send" or "coll")


@dataclass(frozen=True)
class Replay:
    spans: dict[int, tuple[tuple[float, float], ...]]  # rank -> (begin, end) of each event
    finish: dict[int, float]  # rank -> virtual time after its last event
    makespan: float
    compute_s: dict[int, float]
    comm_s: dict[int, float]  # blocked in waits and collectives
    sync_wait_s: dict[int, float]  # part of comm_s: in blocking collectives, before the last peer came
    idle_s: dict[int, float]  # makespan - finish == makespan - (compute_s + comm_s)
    marks: dict[int, tuple[tuple[str, float], ...]]  # rank -> (name, time) of each "mark"
    pair_bytes: dict[tuple[int, int], int]  # (src, dst) -> bytes, collectives included
    link_bytes: dict[str, int]
    link_money: dict[str, float]  # money of the bytes that crossed each link (see Network)
    money: float  # sum over flows of nbytes * route.price_per_byte
    flows: tuple[FlowRecord, ...]

    @property
    def messages(self) -> int:
        return len(self.flows)
