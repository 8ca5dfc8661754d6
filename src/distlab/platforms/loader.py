"""Reading and validating platform files; finding the shipped ones and the learner's own.

A name is looked up among the shipped platforms first, then in the workspace's ``platforms/``
folder, where `distlab calibrate` writes ``calibrated-mpi.toml`` (so ``--platform calibrated-mpi``
finds it); anything else is a path.

Every error names the file, the field (``link[3].bandwidth_gbps``) and the bad value, in one
sentence, as ``PlatformError`` (a ``DistlabError``, so the CLI prints it without a traceback).
The format itself is described in ``model.py`` and ``docs/platform-format.md``.
"""

from __future__ import annotations

import functools
import math
import re
import tomllib
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .model import (
    FORMAT_VERSION, KINDS, Link, Node, Platform, PlatformError, Profile, bytes_per_s_from_gbps,
    s_per_byte,
)

# Names may not hold '>' (link ids are "a>b") nor spaces or markup brackets (they are drawn with rich).
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
TOP_KEYS = {"format_version", "name", "description", "ranks", "profile", "node", "link"}
PROFILE_KEYS = {"flops", "memory_gib", "throughput", "unsupported_ops", "description"}
NODE_KEYS = {"name", "kind", "in", "profile"}
LINK_KEYS = {"a", "b", "latency_us", "bandwidth_gbps", "price_per_gb", "label"}


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


class _Fields:
    """Typed access to one TOML table; every error names the file and the full field path."""

    def __init__(self, data: dict[str, Any], where: str, prefix: str = "") -> None:
        self.data = data
        self.where = where
        self.prefix = prefix

    def fail(self, key: str, msg: str) -> PlatformError:
        return PlatformError(f"{self.where}: {self.prefix}{key} {msg}")

    def has(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str) -> Any:
        if key not in self.data:
            raise self.fail(key, "is missing")
        return self.data[key]

    def text(
        self, key: str, default: str | None = None, pattern: re.Pattern[str] | None = None
    ) -> str:
        if default is not None and key not in self.data:
            return default
        value = self.get(key)
        if not isinstance(value, str) or (default is None and not value.strip()):
            raise self.fail(key, f"must be a non-empty string; got {_show(value)}")
        if pattern is not None and not pattern.match(value):
            rule = "must use only letters, digits, '_', '.' and '-' (no spaces or '>')"
            raise self.fail(key, f"{rule}; got {value!r}")
        return value

    def number(
        self, key: str, minimum: float = 0.0, strict: bool = False, default: float | None = None
    ) -> float:
        """A finite int or float >= minimum (> minimum when strict)."""
        if default is not None and key not in self.data:
            return default
        value = self.get(key)
        ok = (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (value > minimum if strict else value >= minimum)
        )
        if not ok:
            what = "a positive number" if strict and minimum == 0 else f"a number >= {minimum:g}"
            raise self.fail(key, f"must be {what}; got {_show(value)}")
        return float(value)

    def texts(self, key: str) -> list[str]:
        value = self.data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise self.fail(key, f"must be a list of non-empty strings; got {_show(value)}")
        return value

    def tables(self, key: str) -> list["_Fields"]:
        value = self.get(key)
        if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
            raise self.fail(
                key, f"must be a non-empty array of tables ([[{key}]]); got {_show(value)}"
            )
        return [_Fields(v, self.where, f"{self.prefix}{key}[{i}].") for i, v in enumerate(value)]

    def table(self, key: str) -> "_Fields":
        value = self.get(key)
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table; got {_show(value)}")
        return _Fields(value, self.where, f"{self.prefix}{key}.")

    def only(self, allowed: set[str]) -> None:
        extra = sorted(set(self.data) - allowed)
        if extra:
            raise self.fail(extra[0], f"is not a known key (known: {', '.join(sorted(allowed))})")


# -- parsing ------------------------------------------------------------------------------------


def parse_platform(text: str, where: str) -> Platform:
    """A platform from TOML text; ``where`` (usually the file name) starts every error message."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlatformError(f"{where}: not valid TOML: {exc}") from None
    top = _Fields(data, where)
    version = top.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise top.fail("format_version", f"must be {FORMAT_VERSION} (this distlab reads version "
                                         f"{FORMAT_VERSION}); got {_show(version)}")
    top.only(TOP_KEYS)
    name = top.text("name", pattern=NAME_RE)
    description = top.text("description")
    profiles = _profiles(top)
    nodes = _nodes(top, profiles)
    links = _links(top, nodes)
    ranks = _ranks(top, nodes)
    platform = Platform(name, description, profiles, list(nodes.values()), links, ranks, source=where)
    _check_connected(platform, where, links)
    return platform


def _profiles(top: _Fields) -> dict[str, Profile]:
    table = top.table("profile")
    if not table.data:
        raise top.fail("profile", "must declare at least one device profile ([profile.NAME])")
    out: dict[str, Profile] = {}
    for pname in table.data:
        if not NAME_RE.match(pname):
            raise table.fail(pname, "is not a valid profile name (letters, digits, '_', '.', '-')")
        p = table.table(pname)
        p.only(PROFILE_KEYS)
        throughput: dict[str, float] = {}
        if p.has("throughput"):
            t = p.table("throughput")
            for metric in t.data:
                throughput[metric] = t.number(metric, strict=True)
        out[pname] = Profile(
            name=pname,
            flops=p.number("flops", strict=True),
            memory_gib=p.number("memory_gib", strict=True),
            throughput=MappingProxyType(throughput),
            unsupported_ops=frozenset(p.texts("unsupported_ops")),
            description=p.text("description", default=""),
        )
    return out


def _nodes(top: _Fields, profiles: dict[str, Profile]) -> dict[str, Node]:
    entries = top.tables("node")
    nodes: dict[str, Node] = {}
    index: dict[str, int] = {}
    for i, f in enumerate(entries):
        f.only(NODE_KEYS)
        name = f.text("name", pattern=NAME_RE)
        if name in nodes:
            raise f.fail("name", f"{name!r} is already the name of node[{index[name]}]")
        kind = f.text("kind")
        if kind not in KINDS:
            raise f.fail("kind", f"must be one of {', '.join(KINDS)}; got {kind!r}")
        profile: str | None = None
        if kind == "device":
            profile = f.text("profile")
            if profile not in profiles:
                known = ", ".join(profiles)
                raise f.fail("profile", f"{profile!r} is not a declared profile (declared: {known})")
        elif f.has("profile"):
            raise f.fail("profile", f"is only for devices; node {name!r} is a {kind}")
        parent = f.text("in") if f.has("in") else None
        nodes[name] = Node(name, kind, parent, profile)
        index[name] = i
    # Containment is checked once every name is known, so `in` may point forward in the file;
    # parents first, so that walking up the chains below meets only known nodes.
    for name, node in nodes.items():
        if node.parent is None:
            continue
        field = f"node[{index[name]}].in"
        if node.parent not in nodes:
            raise PlatformError(f"{top.where}: unknown node {node.parent!r} in {field}")
        if nodes[node.parent].kind == "device":
            raise PlatformError(
                f"{top.where}: {field} is {node.parent!r}, a device; nothing can sit in a device"
            )
    for name, node in nodes.items():
        field = f"{top.where}: node[{index[name]}].in"
        chain, cur = [name], node.parent
        while cur is not None:
            if cur in chain:
                raise PlatformError(f"{field} makes a containment cycle: {' -> '.join(chain + [cur])}")
            chain.append(cur)
            cur = nodes[cur].parent
        if node.kind == "device" and not any(nodes[a].kind == "host" for a in chain[1:]):
            raise PlatformError(
                f"{top.where}: node[{index[name]}] {name!r} is a device but no node of kind 'host' "
                f"contains it; set `in` so that its chain of parents reaches a host"
            )
    if not any(n.kind == "device" for n in nodes.values()):
        raise top.fail("node", "must declare at least one node of kind 'device'")
    return nodes


def _links(top: _Fields, nodes: dict[str, Node]) -> list[Link]:
    links: list[Link] = []
    seen: dict[frozenset[str], int] = {}
    # No [[link]] at all is fine for a one-device platform; with more, the connectivity check
    # below names the device that has none.
    entries = top.tables("link") if top.has("link") else []
    for i, f in enumerate(entries):
        f.only(LINK_KEYS)
        ends = []
        for side in ("a", "b"):
            end = f.text(side)
            if end not in nodes:
                raise PlatformError(f"{top.where}: unknown node {end!r} in link[{i}].{side}")
            ends.append(end)
        a, b = ends
        if a == b:
            raise PlatformError(f"{top.where}: link[{i}] joins {a!r} to itself")
        pair = frozenset(ends)
        if pair in seen:
            raise PlatformError(
                f"{top.where}: link[{i}] joins {a!r} and {b!r} again (link[{seen[pair]}] already does)"
            )
        seen[pair] = i
        latency_s = f.number("latency_us") * 1e-6
        bytes_per_s = bytes_per_s_from_gbps(f.number("bandwidth_gbps", strict=True))
        price_per_byte = f.number("price_per_gb", default=0.0) / 1e9
        label = f.text("label", default="")
        for src, dst in ((a, b), (b, a)):  # full duplex: each direction has the full bandwidth
            links.append(Link(src, dst, latency_s, bytes_per_s, s_per_byte(bytes_per_s),
                              price_per_byte, label))
    return links


def _ranks(top: _Fields, nodes: dict[str, Node]) -> list[str]:
    value = top.get("ranks")
    if not isinstance(value, list) or not value:
        raise top.fail("ranks", f"must be a non-empty list of device names; got {_show(value)}")
    first: dict[str, int] = {}
    for i, dev in enumerate(value):
        field = f"{top.where}: ranks[{i}]"
        if not isinstance(dev, str):
            raise PlatformError(f"{field} must be a device name; got {_show(dev)}")
        if dev not in nodes:
            raise PlatformError(f"{field} {dev!r} is not a device (no node has that name)")
        if nodes[dev].kind != "device":
            raise PlatformError(f"{field} {dev!r} is not a device (it is a {nodes[dev].kind})")
        if dev in first:
            raise PlatformError(f"{field} {dev!r} repeats ranks[{first[dev]}]; one rank per device")
        first[dev] = i
    return value


def _check_connected(platform: Platform, where: str, links: list[Link]) -> None:
    linked = {ln.src for ln in links}
    for dev in platform.devices:
        if dev not in linked and len(platform.devices) > 1:
            raise PlatformError(f"{where}: device {dev!r} has no link, so no rank can reach it")
    pair = platform.unreachable_pair()
    if pair is not None:
        raise PlatformError(
            f"{where}: the network is disconnected: no route from device {pair[0]!r} to {pair[1]!r} "
            f"(routes may not pass through another device)"
        )


# -- files --------------------------------------------------------------------------------------


def load_platform(path: str | Path) -> Platform:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlatformError(f"{path}: platform file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlatformError(f"{path}: cannot read the platform file ({exc})") from None
    return parse_platform(text, str(path))


def _shipped_dir() -> Traversable:
    return resources.files(__package__) / "shipped"


def shipped_names() -> list[str]:
    files = _shipped_dir().iterdir()
    return sorted(f.name[: -len(".toml")] for f in files if f.name.endswith(".toml"))


@functools.lru_cache(maxsize=None)
def load_shipped(name: str) -> Platform:
    """A platform that ships with distlab; cached (platforms are read-only once built)."""
    if name not in shipped_names():
        raise PlatformError(f"no shipped platform {name!r}; shipped: {', '.join(shipped_names())}")
    file = _shipped_dir() / f"{name}.toml"
    return parse_platform(file.read_text(encoding="utf-8"), f"{name}.toml (shipped)")


def workspace_platforms_dir() -> Path:
    """The learner's own platforms (what `distlab calibrate` writes): workspace/platforms/."""
    from ..workspace import workspace_dir  # the workspace's place is the workspace module's to say

    return workspace_dir() / "platforms"


def workspace_names() -> list[str]:
    """Names of the platform files in the workspace, less those a shipped name hides."""
    folder = workspace_platforms_dir()
    if not folder.is_dir():
        return []
    shipped = set(shipped_names())
    return sorted(p.stem for p in folder.glob("*.toml") if p.is_file() and p.stem not in shipped)


def resolve(name_or_path: str | Path) -> Platform:
    """A shipped platform by name ("rack"), else one of the workspace's by name
    ("calibrated-mpi"), else a platform file by path ("my/cluster.toml")."""
    ref = str(name_or_path)
    if isinstance(name_or_path, str) and ref in shipped_names():
        return load_shipped(ref)
    if isinstance(name_or_path, str) and ref in workspace_names():
        return load_platform(workspace_platforms_dir() / f"{ref}.toml")
    path = Path(ref).expanduser()
    if path.is_file() or ref.endswith(".toml") or "/" in ref or isinstance(name_or_path, Path):
        return load_platform(path)
    mine = workspace_names()
    raise PlatformError(
        f"no platform {ref!r}: shipped platforms are {', '.join(shipped_names())}"
        + (f"; yours (in {workspace_platforms_dir()}) are {', '.join(mine)}" if mine else "")
        + "; or give the path of a .toml platform file"
    )
