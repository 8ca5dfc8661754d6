"""The calibrated platform as a file: ``ranks`` devices on one switch, every route exactly the
fitted alpha and beta, written atomically and loaded back to prove it valid.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import HarnessError, UsageError
from ..platforms import Platform, load_platform
from ..platforms.loader import workspace_platforms_dir
from ..workspace import write_atomically
from .fit import ROUTE_TOLERANCE

# -- the platform file ------------------------------------------------------------------------


@dataclass(frozen=True)
class MachineModel:
    """What the platform file says about this machine."""

    name: str
    description: str
    ranks: int
    alpha_s: float
    beta_s_per_byte: float
    flops: float
    memory_gib: float
    notes: tuple[str, ...] = ()  # comment lines at the top of the file


def _toml_float(value: float) -> str:
    # repr is the shortest text that reads back as the same float, and is valid TOML for any
    # finite value: the file keeps every bit of the fit.
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    return repr(float(value))


def platform_toml(model: MachineModel) -> str:
    """The platform file (format_version 1): a star of ``ranks`` devices around one switch.

    As in ``platforms.uniform``, each device has its own cable to the switch, so the flows of a
    ring never share a directed link, and each cable carries half the latency: a route (two
    cables) has exactly alpha. Both cables have the full bandwidth 1/beta, so a route's
    bottleneck gives exactly beta."""
    latency_us = model.alpha_s / 2 * 1e6
    bandwidth_gbps = 8 / model.beta_s_per_byte / 1e9  # bytes/s -> Gb/s, as the format wants
    devices = [f"cpu{i}" for i in range(model.ranks)]
    lines = [f"# {note}" for note in model.notes]
    lines += [
        "format_version = 1",
        f"name = {json.dumps(model.name)}",
        f"description = {json.dumps(model.description)}",
        f"ranks = [{', '.join(json.dumps(d) for d in devices)}]",
        "",
        "node = [",
        '  { name = "machine", kind = "host" },',
        '  { name = "switch", kind = "switch", in = "machine" },',
        *(
            f'  {{ name = "{d}", kind = "device", in = "switch", profile = "cpu" }},'
            for d in devices
        ),
        "]",
        "",
        "link = [",
        *(
            f'  {{ a = "{d}", b = "switch", latency_us = {_toml_float(latency_us)}, '
            f'bandwidth_gbps = {_toml_float(bandwidth_gbps)}, label = "measured" }},'
            for d in devices
        ),
        "]",
        "",
        "[profile.cpu]",
        'description = "one rank of this machine (flops: a numpy matmul, all cores)"',
        f"flops = {_toml_float(model.flops)}",
        f"memory_gib = {_toml_float(model.memory_gib)}",
    ]
    return "\n".join(lines) + "\n"


def write_platform(path: Path, model: MachineModel) -> Platform:
    """Writes the file atomically and loads it back: what is returned is what a run would read."""
    try:
        write_atomically(path, platform_toml(model))
    except OSError as exc:
        raise UsageError(f"cannot write the platform file {path}: {exc.strerror or exc}") from None
    platform = load_platform(path)
    route = platform.route(0, 1)
    alpha, beta = model.alpha_s, model.beta_s_per_byte
    if not (_close(route.alpha_s, alpha) and _close(route.beta_s_per_byte, beta)):
        raise HarnessError(
            f"{path}: route 0 -> 1 reads back as alpha={route.alpha_s!r}, "
            f"beta={route.beta_s_per_byte!r}, not the fitted {alpha!r}, {beta!r}"
        )
    return platform


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= ROUTE_TOLERANCE * abs(b)


def default_output(backend: str) -> Path:
    """In the workspace's platforms/, where ``--platform calibrated-BACKEND`` finds it by name."""
    return workspace_platforms_dir() / f"calibrated-{backend}.toml"


def platform_option(path: Path) -> str:
    """What to give --platform for the file at ``path``: its name if lookup finds it, else the path."""
    from ..platforms.loader import workspace_names

    if path.parent == workspace_platforms_dir() and path.suffix == ".toml" and path.stem in workspace_names():
        return path.stem
    return str(path)


def check_writable(path: Path) -> None:
    """Fails now, in one sentence, if ``path`` cannot be written: not after the measurements."""
    if path.is_dir():
        raise UsageError(f"cannot write the platform file {path}: it is a folder")
    blocker = next((p for p in path.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise UsageError(f"cannot write the platform file {path}: {blocker} is a file, not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A real trial file, because os.access says yes to root whatever the permissions are.
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}."):
            pass
    except OSError as exc:
        raise UsageError(f"cannot write the platform file {path}: {exc.strerror or exc}") from None
