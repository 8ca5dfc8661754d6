"""Platforms: the clusters the virtual clock models, as data (design decision 4).

    from distlab.platforms import resolve
    rack = resolve("rack")                 # a shipped platform, or resolve("path/to/mine.toml")
    rack.route(0, 5).alpha_s               # one-way latency of rank 0 -> rank 5
    rack.groups("socket")                  # {"socket0": [0, 1, 4, 5], "socket1": [2, 3, 6, 7]}

The file format is documented in ``model.py`` and ``docs/platform-format.md``.
"""

from __future__ import annotations

from .loader import load_platform, load_shipped, parse_platform, resolve, shipped_names
from .model import (
    FORMAT_VERSION, KINDS, Device, Link, Node, Platform, PlatformError, Profile, Route,
)
from .render import list_platforms, render, show_platform, summary_table
from .uniform import uniform

__all__ = [
    "FORMAT_VERSION", "KINDS", "Device", "Link", "Node", "Platform", "PlatformError", "Profile",
    "Route", "list_platforms", "load_platform", "load_shipped", "parse_platform", "render",
    "resolve", "shipped_names", "show_platform", "summary_table", "uniform",
]
