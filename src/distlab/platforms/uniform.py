"""p devices on one switch, built in code: every route has exactly the given alpha and beta.

This is the cluster of the textbook cost formulas (a ring allreduce costs 2(p-1)alpha +
2(p-1)/p n beta), so tests of the virtual clock can compare against them with no slack:
- each device has its own cable to the switch, so the flows of a ring (i -> i+1) never share a
  directed link (flow i uses dev_i>switch and switch>dev_{i+1}, each used by no other flow);
- each cable has latency alpha/2 (halving a float is exact, so the two halves add back to alpha)
  and keeps beta as given (not 1/(1/beta), which may differ in the last bit).
"""

from __future__ import annotations

import math

from .model import Link, Node, Platform, PlatformError, Profile


def uniform(
    p: int,
    alpha_s: float,
    beta_s_per_byte: float,
    *,
    flops: float = 1e12,
    memory_gib: float = 16.0,
) -> Platform:
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise PlatformError(f"uniform platform: p must be an integer >= 1; got {p!r}")
    for label, value in (("alpha_s", alpha_s), ("beta_s_per_byte", beta_s_per_byte)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise PlatformError(f"uniform platform: {label} must be a number >= 0; got {value!r}")
    profile = Profile("generic", flops=flops, memory_gib=memory_gib, description="uniform device")
    half = alpha_s / 2
    capacity = math.inf if beta_s_per_byte == 0 else 1.0 / beta_s_per_byte
    nodes = [Node("switch", "switch")]
    links: list[Link] = []
    for i in range(p):
        host, dev = f"host{i}", f"dev{i}"
        nodes += [Node(host, "host", "switch"), Node(dev, "device", host, "generic")]
        for src, dst in ((dev, "switch"), ("switch", dev)):
            links.append(Link(src, dst, half, capacity, float(beta_s_per_byte)))
    return Platform(
        name=f"uniform-{p}",
        description=(
            f"{p} devices on one switch; every route alpha={alpha_s:g} s, "
            f"beta={beta_s_per_byte:g} s/B"
        ),
        profiles={"generic": profile},
        nodes=nodes,
        links=links,
        ranks=[f"dev{i}" for i in range(p)],
    )
