"""Drawing platforms in the terminal: the containment tree with links, and summary tables.

The tree follows the ``in`` keys (data center > switch > host > socket > PCIe switch > device).
A link between a node and one of its ancestors is written on the node's own line ("up 128 Gb/s");
any other link (a socket-to-socket UPI link, a WAN link between data centers) is listed under
"other links" at the end, so every cable appears exactly once.
"""

from __future__ import annotations

import math
from typing import Iterable

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from ..terminal import folding

from .loader import load_platform, load_shipped, resolve, shipped_names, workspace_names, \
    workspace_platforms_dir
from .model import Link, Platform


def fmt_bandwidth(link: Link) -> str:
    if math.isinf(link.bytes_per_s):
        return "unlimited"
    return f"{link.bytes_per_s * 8 / 1e9:g} Gb/s"


def fmt_latency(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:g} ms"
    return f"{seconds * 1e6:g} µs"


def fmt_link(link: Link) -> str:
    parts = [fmt_bandwidth(link), fmt_latency(link.latency_s)]
    if link.price_per_byte:
        parts.append(f"{link.price_per_byte * 1e9:g}/GB")
    text = " · ".join(parts)
    return f"{text} ({escape(link.label)})" if link.label else text


def fmt_ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    runs: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        runs.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(runs)


def _ancestors(platform: Platform, name: str) -> list[str]:
    out, cur = [], platform.nodes[name].parent
    while cur is not None:
        out.append(cur)
        cur = platform.nodes[cur].parent
    return out


def _cables(platform: Platform) -> list[Link]:
    """One direction of each cable (the one declared first), in file order."""
    seen: set[frozenset[str]] = set()
    out = []
    for link in platform.links.values():
        pair = frozenset((link.src, link.dst))
        if pair not in seen:
            seen.add(pair)
            out.append(link)
    return out


def render(platform: Platform) -> Tree:
    up: dict[str, list[tuple[str, Link]]] = {}  # node -> cables to its ancestors
    other: list[Link] = []
    for link in _cables(platform):
        if link.dst in _ancestors(platform, link.src):
            up.setdefault(link.src, []).append((link.dst, link))
        elif link.src in _ancestors(platform, link.dst):
            up.setdefault(link.dst, []).append((link.src, link))
        else:
            other.append(link)

    members: dict[str, list[int]] = {}  # node -> ranks under it
    for rank, dev in enumerate(platform.ranks):
        for name in [dev, *_ancestors(platform, dev)]:
            members.setdefault(name, []).append(rank)

    def label(name: str) -> str:
        node = platform.nodes[name]
        if node.kind == "device":
            ranks = members.get(name)
            who = f"[bold cyan]rank {ranks[0]}[/]" if ranks else "[dim]no rank[/]"
            text = f"{who} {name} [dim]{node.profile}[/]"
        else:
            text = f"[bold]{name}[/] [dim]{node.kind}[/]"
            if name in members:
                text += f" [dim]ranks {fmt_ranks(members[name])}[/]"
        for other_end, link in up.get(name, []):
            text += f"  [green]↑ {other_end} {fmt_link(link)}[/]"
        return text

    children: dict[str | None, list[str]] = {}
    for node in platform.nodes.values():
        children.setdefault(node.parent, []).append(node.name)

    n_dev = len(platform.devices)
    root = Tree(
        f"[bold]{escape(platform.name)}[/]: {escape(platform.description)} "
        f"[dim]({platform.max_ranks()} ranks, {n_dev} devices)[/]"
    )

    def grow(branch: Tree, name: str) -> None:
        sub = branch.add(label(name))
        for child in children.get(name, []):
            grow(sub, child)

    for top in children.get(None, []):
        grow(root, top)
    if other:
        links = root.add("[bold]other links[/]")
        for link in other:
            links.add(f"{link.src} ↔ {link.dst}  [green]{fmt_link(link)}[/]")
    return root


def profiles_table(platform: Platform) -> Table:
    table = Table(title=f"device profiles of {platform.name}", title_justify="left")
    for col in ("profile", "devices", "TFLOP/s", "memory", "throughput", "unsupported ops"):
        table.add_column(col)
    for prof in platform.profiles.values():
        count = sum(1 for d in platform.devices.values() if d.profile.name == prof.name)
        rates = ", ".join(f"{k} = {v:g}" for k, v in prof.throughput.items()) or "-"
        ops = ", ".join(sorted(prof.unsupported_ops)) or "-"
        name = prof.name + (f" [dim]({escape(prof.description)})[/]" if prof.description else "")
        tflops, memory = f"{prof.flops / 1e12:g}", f"{prof.memory_gib:g} GiB"
        table.add_row(name, str(count), tflops, memory, rates, ops)
    return folding(table)


def summary_table(platforms: Iterable[Platform]) -> Table:
    table = Table(title="platforms", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("ranks", justify="right")
    table.add_column("devices", justify="right")
    table.add_column("description")
    for p in platforms:
        table.add_row(p.name, str(p.max_ranks()), str(len(p.devices)), escape(p.description))
    return folding(table)


def list_platforms(console: Console) -> None:
    """`distlab platforms`: the shipped platforms in one table, then the workspace's own."""
    console.print(summary_table(load_shipped(name) for name in shipped_names()))
    mine = workspace_names()
    if mine:
        folder = workspace_platforms_dir()
        table = summary_table(load_platform(folder / f"{name}.toml") for name in mine)
        table.title = f"yours, in {escape(str(folder))}"
        console.print(table)
    console.print("[dim]`distlab platform show NAME` draws one; a card may also name a .toml file.[/]")


def show_platform(name_or_path: str, console: Console) -> None:
    """`distlab platform show NAME`: the topology tree and the device profiles."""
    platform = resolve(name_or_path)
    console.print(render(platform))
    console.print(profiles_table(platform))
