"""Platforms: the shipped files load, routes are right and deterministic, bad files are named.

The story of each test, in order: every shipped platform validates; on each one a route says what
the cluster's diagram says (three-dc pays the WAN, rack keeps a PCIe pair off the socket link,
laptop is flat); routing is a pure function of the graph, not of the file's order; uniform() gives
the textbook alpha and beta exactly; on rack the best ring beats the naive one about 2x; and every
kind of malformed file is refused with its file, field and value named.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from distlab.errors import DistlabError
from distlab.platforms import (
    Platform, PlatformError, list_platforms, load_platform, load_shipped, parse_platform, render,
    resolve, shipped_names, show_platform, uniform,
)

GBPS = 1e9 / 8  # bytes per second in one gigabit per second
SHIPPED = ["cluster-100", "ethernet-50us", "laptop", "rack", "seed-lab", "three-dc"]


def fresh(name: str) -> Platform:
    """A platform parsed anew (load_shipped caches; tests that time or reorder want their own)."""
    from distlab.platforms import loader

    return parse_platform((loader._shipped_dir() / f"{name}.toml").read_text(), f"{name}.toml")


def ring_bottleneck(p: Platform, order: tuple[int, ...]) -> float:
    """Bytes/s of the most loaded directed link when each rank sends to the next in ``order``."""
    load = Counter(
        link for a, b in zip(order, order[1:] + order[:1]) for link in p.route(a, b).links
    )
    return min(p.capacity(link) / count for link, count in load.items())


# -- the shipped platforms ----------------------------------------------------------------------


def test_the_bank_ships_the_catalog_platforms() -> None:
    assert shipped_names() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_platform_loads_and_is_consistent(name: str) -> None:
    p = load_shipped(name)
    assert p.name == name  # cards refer to platforms by file name
    assert p.max_ranks() == len(p.ranks) > 0
    for rank in range(p.max_ranks()):
        dev = p.device_of(rank)
        assert dev.flops > 0 and dev.memory_bytes > 0
        assert p.nodes[dev.host].kind == "host"
    for link in p.links.values():  # full duplex: every link has its twin with the same capacity
        twin = p.link(f"{link.dst}>{link.src}")
        assert twin.bytes_per_s == link.bytes_per_s and twin.latency_s == link.latency_s


def test_three_dc_routes_pay_the_wan() -> None:
    p = load_shipped("three-dc")
    assert p.max_ranks() == 12
    assert p.groups("datacenter") == {
        "dc0": [0, 1, 2, 3], "dc1": [4, 5, 6, 7], "dc2": [8, 9, 10, 11]
    }
    inside, across = p.route(0, 1), p.route(1, 6)
    assert inside.alpha_s == pytest.approx(5e-6)
    assert inside.beta_s_per_byte == pytest.approx(1 / (100 * GBPS))
    assert inside.price_per_byte == 0
    assert across.alpha_s == pytest.approx(2e-3 + 5e-6)  # the WAN hop plus both ends' fabric
    assert across.beta_s_per_byte == pytest.approx(1 / (10 * GBPS))
    assert across.price_per_byte == pytest.approx(0.02 / 1e9) and across.price_per_byte > 0
    assert across.links == ("dc0-gpu1>dc0-sw", "dc0-sw>dc1-sw", "dc1-sw>dc1-gpu2")
    assert sum(p.link_price(link) for link in across.links) == across.price_per_byte
    assert p.group_of(6, "datacenter") == "dc1"


def test_rack_keeps_a_pcie_pair_off_the_socket_link() -> None:
    p = load_shipped("rack")
    assert p.groups("socket") == {"socket0": [0, 1, 4, 5], "socket1": [2, 3, 6, 7]}
    for group in p.groups("pcie_switch").values():
        a, b = group
        route = p.route(a, b)
        assert not any("socket" in link for link in route.links)
        assert len(route.links) == 2
    crossing = p.route(0, 2)
    assert "socket0>socket1" in crossing.links
    assert p.capacity("socket0>socket1") < p.capacity("pcie0>socket0")  # the slow link


def test_laptop_is_flat() -> None:
    p = load_shipped("laptop")
    assert p.max_ranks() == 32
    first = p.route(0, 1)
    assert first.alpha_s == pytest.approx(1e-6)
    assert first.beta_s_per_byte == pytest.approx(1 / 10e9)
    for a, b in itertools.permutations(range(32), 2):
        r = p.route(a, b)
        assert (r.alpha_s, r.beta_s_per_byte, r.price_per_byte) == (
            first.alpha_s, first.beta_s_per_byte, 0.0
        )
    assert len(p.groups("host")) == 1


def test_seed_lab_profiles_and_routes() -> None:
    p = load_shipped("seed-lab")
    assert p.max_ranks() == 16
    kinds = Counter(p.device_of(r).profile.name for r in range(16))
    assert kinds == {"a100": 8, "v100": 4, "ascend910": 4}
    a100, v100, npu = p.device_of(0), p.device_of(8), p.device_of(12)
    assert a100.throughput("resnet50_img_per_s") == 940
    assert v100.throughput("resnet50_img_per_s") == 370
    assert v100.throughput("resnet50_img_per_s") < npu.throughput("resnet50_img_per_s") < 940
    assert a100.supports("fft") and not npu.supports("fft")
    assert npu.profile.unsupported_ops  # the accelerator that lacks some operators
    with pytest.raises(PlatformError, match="no throughput 'bert'"):
        a100.throughput("bert")
    between = p.route(0, 12)  # A100 node to Ascend node through the switch
    assert between.alpha_s == pytest.approx(5e-6)
    assert between.beta_s_per_byte == pytest.approx(1 / (100 * GBPS))
    assert p.route(0, 1).beta_s_per_byte < p.route(8, 9).beta_s_per_byte  # NVLink beats PCIe
    assert len(p.groups("host")) == 4 and p.groups("switch") == {"tor": list(range(16))}


def test_cluster_100_is_modelled_at_full_size() -> None:
    p = load_shipped("cluster-100")
    assert p.max_ranks() == 100
    assert [len(g) for g in p.groups("rack").values()] == [20] * 5
    assert [len(g) for g in p.groups("host").values()] == [4] * 25
    assert "rack0>spine" in p.route(0, 99).links
    assert p.groups("rack", world=24) == {"rack0": list(range(20)), "rack1": [20, 21, 22, 23]}


# -- ranks, errors of use -----------------------------------------------------------------------


def test_more_ranks_than_the_platform_maps_is_an_error_naming_both() -> None:
    p = load_shipped("rack")
    p.check_world(8)
    p.check_world(3)  # fewer ranks than entries is fine: rank i uses ranks[i]
    with pytest.raises(PlatformError, match=r"maps 8 ranks; the run asked for 12"):
        p.check_world(12)
    with pytest.raises(PlatformError, match="rank 8 is not on platform 'rack'"):
        p.route(0, 8)
    with pytest.raises(PlatformError, match="no node kind 'soket'"):
        p.groups("soket")
    with pytest.raises(PlatformError, match="no link 'gpu0>gpu1'"):
        p.capacity("gpu0>gpu1")


def test_route_to_self_is_zero() -> None:
    r = load_shipped("three-dc").route(3, 3)
    assert (r.alpha_s, r.links, r.beta_s_per_byte, r.price_per_byte) == (0.0, (), 0.0, 0.0)


def test_resolve_names_and_paths(tmp_path: Path) -> None:
    assert resolve("rack") is load_shipped("rack")
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    assert resolve(str(path)).name == "tiny"
    assert resolve(path).max_ranks() == 2
    with pytest.raises(PlatformError, match="no platform 'nope'.*laptop"):
        resolve("nope")
    with pytest.raises(PlatformError, match="not found"):
        load_platform(tmp_path / "missing.toml")
    assert issubclass(PlatformError, DistlabError)  # so the CLI prints it as one sentence


# -- routing rules and determinism --------------------------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_routes_do_not_depend_on_file_order(name: str) -> None:
    a, c = fresh(name), fresh(name)
    b = Platform(a.name, a.description, a.profiles, list(reversed(a.nodes.values())),
                 list(reversed(a.links.values())), list(a.ranks))
    n = min(a.max_ranks(), 12)
    for i, j in itertools.product(range(n), repeat=2):
        assert a.route(i, j) == b.route(i, j) == c.route(i, j)


def test_ties_go_to_fewer_hops_then_names(tmp_path: Path) -> None:
    # gpu0 -> gpu1 three ways, all 4 us: direct (1 hop), via swB or via swA (2 hops each).
    text = TINY_HEAD + """
[[node]]
name = "swA"
kind = "switch"
in = "host0"

[[node]]
name = "swB"
kind = "switch"
in = "host0"

[[link]]
a = "gpu0"
b = "swB"
latency_us = 2
bandwidth_gbps = 100

[[link]]
a = "swB"
b = "gpu1"
latency_us = 2
bandwidth_gbps = 100

[[link]]
a = "gpu0"
b = "swA"
latency_us = 2
bandwidth_gbps = 100

[[link]]
a = "swA"
b = "gpu1"
latency_us = 2
bandwidth_gbps = 100
"""
    two_hop = parse_platform(text, "tie.toml")
    assert two_hop.route(0, 1).links == ("gpu0>swA", "swA>gpu1")
    assert two_hop.route(1, 0).links == ("gpu1>swA", "swA>gpu0")
    direct = text + '\n[[link]]\na = "gpu0"\nb = "gpu1"\nlatency_us = 4\nbandwidth_gbps = 1\n'
    assert parse_platform(direct, "tie.toml").route(0, 1).links == ("gpu0>gpu1",)


# -- uniform ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "p, alpha, beta", [(1, 1e-5, 1e-9), (2, 3.7e-6, 1 / 3e9), (5, 0.1, 0.7e-10), (16, 2e-6, 0.0)]
)
def test_uniform_gives_exactly_alpha_and_beta(p: int, alpha: float, beta: float) -> None:
    u = uniform(p, alpha, beta)
    assert u.max_ranks() == p
    for i, j in itertools.permutations(range(p), 2):
        r = u.route(i, j)
        assert r.alpha_s == alpha and r.beta_s_per_byte == beta and r.price_per_byte == 0
    ring = Counter(link for i in range(p) for link in u.route(i, (i + 1) % p).links)
    assert all(count == 1 for count in ring.values())  # no two ring flows share a directed link
    if beta:
        assert all(u.capacity(link) == pytest.approx(1 / beta) for link in ring)


def test_uniform_rejects_nonsense() -> None:
    with pytest.raises(PlatformError, match="p must be an integer >= 1; got 0"):
        uniform(0, 1e-6, 1e-9)
    with pytest.raises(PlatformError, match="alpha_s must be a number >= 0; got -1"):
        uniform(4, -1, 1e-9)


# -- rack: the topology-aware ring --------------------------------------------------------------


def test_best_ring_on_rack_beats_the_naive_one_about_2x() -> None:
    p = load_shipped("rack")
    naive = ring_bottleneck(p, tuple(range(8)))
    best = max(
        ring_bottleneck(p, (0, *rest)) for rest in itertools.permutations(range(1, 8))
    )
    assert best / naive >= 1.9
    assert best == pytest.approx(64 * GBPS)  # each way across the socket link once
    assert naive == pytest.approx(32 * GBPS)  # twice each way: half the bandwidth


# -- drawing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_render_shows_every_rank_and_link_figures(name: str) -> None:
    console = Console(record=True, width=200)
    console.print(render(load_shipped(name)))
    text = console.export_text()
    p = load_shipped(name)
    for rank in range(p.max_ranks()):
        assert f"rank {rank} {p.ranks[rank]}" in text
    assert "Gb/s" in text and "µs" in text


def test_platform_commands_print(tmp_path: Path) -> None:
    console = Console(record=True, width=200)
    list_platforms(console)
    listing = console.export_text()
    for name in SHIPPED:
        assert name in listing
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    show_platform(str(path), console)
    shown = console.export_text()
    assert "rank 1 gpu1" in shown and "device profiles of tiny" in shown
    show_platform("three-dc", console)
    text = console.export_text()
    assert "dc0-sw ↔ dc1-sw" in text and "0.02/GB" in text and "2 ms" in text


# -- malformed files ----------------------------------------------------------------------------

TINY_HEAD = """format_version = 1
name = "tiny"
description = "two GPUs on one switch"
ranks = ["gpu0", "gpu1"]

[profile.gpu]
flops = 1e12
memory_gib = 16

[[node]]
name = "host0"
kind = "host"

[[node]]
name = "gpu0"
kind = "device"
in = "host0"
profile = "gpu"

[[node]]
name = "gpu1"
kind = "device"
in = "host0"
profile = "gpu"
"""

TINY = TINY_HEAD + """
[[node]]
name = "sw0"
kind = "switch"
in = "host0"

[[link]]
a = "gpu0"
b = "sw0"
latency_us = 1
bandwidth_gbps = 100

[[link]]
a = "gpu1"
b = "sw0"
latency_us = 2
bandwidth_gbps = 200
"""

EXTRA_GPU = '\n[[node]]\nname = "gpu2"\nkind = "device"\nin = "host0"\nprofile = "gpu"\n'
EXTRA_LINK = '\n[[link]]\na = "{a}"\nb = "{b}"\nlatency_us = 1\nbandwidth_gbps = 100\n'

BAD = [
    # (id, old, new, fragments the message must contain)
    ("negative bandwidth", "bandwidth_gbps = 200", "bandwidth_gbps = -1",
     ["link[1].bandwidth_gbps must be a positive number; got -1"]),
    ("bandwidth as text", "bandwidth_gbps = 200", 'bandwidth_gbps = "fast"',
     ["link[1].bandwidth_gbps must be a positive number; got 'fast'"]),
    ("negative latency", "latency_us = 2", "latency_us = -5",
     ["link[1].latency_us must be a number >= 0; got -5"]),
    ("negative price", "latency_us = 2", "latency_us = 2\nprice_per_gb = -0.5",
     ["link[1].price_per_gb must be a number >= 0; got -0.5"]),
    ("unknown link end", 'a = "gpu1"\nb = "sw0"', 'a = "gpu1"\nb = "sw9"',
     ["unknown node 'sw9' in link[1].b"]),
    ("link to itself", 'a = "gpu1"\nb = "sw0"', 'a = "sw0"\nb = "sw0"',
     ["link[1] joins 'sw0' to itself"]),
    ("duplicate link", 'a = "gpu1"\nb = "sw0"', 'a = "sw0"\nb = "gpu0"',
     ["link[1] joins 'sw0' and 'gpu0' again (link[0] already does)"]),
    ("misspelt key", "bandwidth_gbps = 200", "bandwith_gbps = 200",
     ["link[1].bandwith_gbps is not a known key"]),
    ("missing bandwidth", "bandwidth_gbps = 200", "", ["link[1].bandwidth_gbps is missing"]),
    ("rank not a node", 'ranks = ["gpu0", "gpu1"]', 'ranks = ["gpu0", "gpu1", "gpu9"]',
     ["ranks[2] 'gpu9' is not a device"]),
    ("rank on a switch", 'ranks = ["gpu0", "gpu1"]', 'ranks = ["sw0", "gpu1"]',
     ["ranks[0] 'sw0' is not a device (it is a switch)"]),
    ("rank twice", 'ranks = ["gpu0", "gpu1"]', 'ranks = ["gpu0", "gpu1", "gpu0"]',
     ["ranks[2] 'gpu0' repeats ranks[0]"]),
    ("duplicate node", 'name = "sw0"', 'name = "gpu1"',
     ["node[3].name 'gpu1' is already the name of node[2]"]),
    ("unknown kind", 'kind = "switch"', 'kind = "swtich"',
     ["node[3].kind must be one of", "'swtich'"]),
    ("unknown profile", 'in = "host0"\nprofile = "gpu"\n\n[[node]]\nname = "sw0"',
     'in = "host0"\nprofile = "h100"\n\n[[node]]\nname = "sw0"',
     ["node[2].profile 'h100' is not a declared profile"]),
    ("profile on a switch", 'kind = "switch"', 'kind = "switch"\nprofile = "gpu"',
     ["node[3].profile is only for devices"]),
    ("unknown parent", 'kind = "switch"\nin = "host0"', 'kind = "switch"\nin = "rack9"',
     ["unknown node 'rack9' in node[3].in"]),
    ("containment cycle", 'name = "host0"\nkind = "host"',
     'name = "host0"\nkind = "host"\nin = "sw0"', ["node[0].in makes a containment cycle"]),
    ("inside a device", 'kind = "switch"\nin = "host0"', 'kind = "switch"\nin = "gpu0"',
     ["node[3].in is 'gpu0', a device; nothing can sit in a device"]),
    ("device without host", 'name = "host0"\nkind = "host"', 'name = "host0"\nkind = "rack"',
     ["node[1] 'gpu0' is a device but no node of kind 'host' contains it"]),
    ("bad node name", 'name = "sw0"', 'name = "sw>0"', ["node[3].name must use only letters"]),
    ("missing flops", "flops = 1e12\n", "", ["profile.gpu.flops is missing"]),
    ("zero memory", "memory_gib = 16", "memory_gib = 0",
     ["profile.gpu.memory_gib must be a positive number; got 0"]),
    ("infinite flops", "flops = 1e12", "flops = inf",
     ["profile.gpu.flops must be a positive number; got inf"]),
    ("wrong version", "format_version = 1", "format_version = 2",
     ["format_version must be 1", "got 2"]),
    ("no ranks", 'ranks = ["gpu0", "gpu1"]', "ranks = []", ["ranks must be a non-empty list"]),
    ("not toml", 'name = "tiny"', "name = tiny", ["not valid TOML"]),
]
# Cases that append nodes and links at the end of the file, where TOML allows them.
APPENDED = [
    ("device with no link", EXTRA_GPU, ["device 'gpu2' has no link"]),
    ("disconnected graph", EXTRA_GPU + '\n[[node]]\nname = "sw1"\nkind = "switch"\n'
     + EXTRA_LINK.format(a="gpu2", b="sw1"),
     ["the network is disconnected: no route from device 'gpu0' to 'gpu2'"]),
    ("route through a device", EXTRA_GPU + EXTRA_LINK.format(a="gpu1", b="gpu2"),
     ["no route from device 'gpu0' to 'gpu2'", "may not pass through another device"]),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c[0])
def test_malformed_file_names_file_field_and_value(tmp_path: Path, case: tuple) -> None:
    _, old, new, fragments = case
    assert TINY.count(old) == 1, f"test case must change exactly one place: {old!r}"
    check_bad(tmp_path, TINY.replace(old, new), fragments)


@pytest.mark.parametrize("case", APPENDED, ids=lambda c: c[0])
def test_malformed_graph_is_refused(tmp_path: Path, case: tuple) -> None:
    _, extra, fragments = case
    check_bad(tmp_path, TINY + extra, fragments)


def check_bad(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = tmp_path / "rack.toml"
    path.write_text(text)
    with pytest.raises(PlatformError) as info:
        load_platform(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message.strip() or "not valid TOML" in message
    for fragment in fragments:
        assert fragment in message, message


def test_the_tiny_file_itself_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    p = load_platform(path)
    assert p.route(0, 1).alpha_s == pytest.approx(3e-6)
    assert p.route(0, 1).beta_s_per_byte == pytest.approx(1 / (100 * GBPS))  # the slower hop
    assert math.isclose(p.capacity("sw0>gpu1"), 200 * GBPS)


def test_a_single_device_needs_no_link() -> None:
    text = TINY_HEAD.replace('ranks = ["gpu0", "gpu1"]', 'ranks = ["gpu0"]')
    text = text[: text.index('[[node]]\nname = "gpu1"')]
    p = parse_platform(text, "one.toml")
    assert p.max_ranks() == 1 and p.route(0, 0).links == ()


def test_the_documented_example_is_a_valid_platform() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "platform-format.md").read_text()
    start = doc.index("```toml\n") + len("```toml\n")
    p = parse_platform(doc[start: doc.index("```", start)], "docs/platform-format.md")
    assert p.groups("datacenter") == {"dcA": [0, 1], "dcB": [2, 3]}
    assert p.route(0, 1).alpha_s == pytest.approx(5e-6)
    assert p.route(0, 1).beta_s_per_byte == pytest.approx(1 / 12.5e9)
    wan = p.route(0, 2)
    assert wan.alpha_s == pytest.approx(2.005e-3)
    assert wan.beta_s_per_byte == pytest.approx(1 / 1.25e9)
    assert wan.price_per_byte == pytest.approx(0.02 / 1e9)
