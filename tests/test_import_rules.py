"""The allowed import directions between the rooms of the runtime (docs/architecture.md).

Every import in src/distlab/runtime is read with ``ast`` (relative ones resolved, imports inside
functions included) and each arrow from one room to another is held against ``ALLOWED``. A new
arrow is either a design decision (add it here and to the doc, with its reason) or a mistake.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Room -> the rooms it may import. Rooms are runtime/<folder>/, and runtime/jobspec.py alone.
ALLOWED: dict[str, set[str]] = {
    "trace": set(),  # the event record: read by everyone, reads no one
    "faults": set(),  # plans and pure decisions
    "engines": set(),  # MPI and gloo behind one protocol
    "clock": {"trace", "engines"},  # the replay reads events; the online clock sends stamps
    "comm": {"engines", "faults", "clock", "trace"},  # the proxy and its layers
    "jobspec": {"comm"},  # outcomes carry the proxy's counters
    "rank": {"jobspec", "comm", "engines", "clock", "faults", "trace", "seal"},
    "supervisor": {"jobspec", "faults", "comm", "engines", "zygote"},  # slots; monitoring's names
    "zygote": set(),  # forks ranks of a worker it names, never imports
    # The agent-learner channel, the learner's client comm (mpi4py's API: comm's requests and
    # object calls) and the agent's service of it on the proxy.
    "seal": {"comm", "engines"},
}
# What the runtime may use from the rest of distlab (the bank: a rank under an external launcher
# looks its problem up, runtime/rank/worker.py).
OUTSIDE_ALLOWED = {"ops", "errors", "bank"}


def room_of(module: str) -> str | None:
    """The runtime room of a dotted module name, or None outside the runtime."""
    parts = module.split(".")
    if parts[:2] != ["distlab", "runtime"] or len(parts) < 3:
        return None
    return parts[2]


def module_name(path: Path, root: Path = SRC) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, imported dotted name) of every distlab import in the file, relative ones resolved."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # "from . import stats" names a module; "from .stats import X" names the module.
            names = [f"{target}.{a.name}" for a in node.names] if node.module is None else [target]
            found += [(node.lineno, name) for name in names]
    return [(line, name) for line, name in found if name.split(".")[0] == "distlab"]


def violations(root: Path) -> list[str]:
    bad = []
    for path in sorted((root / "distlab" / "runtime").rglob("*.py")):
        here = room_of(module_name(path, root))
        for line, target in imports_of(path, root):
            there = room_of(target)
            where = f"{path.relative_to(root)}:{line}"
            if there is None:
                top = target.split(".")[1] if "." in target else target
                if top != "runtime" and top not in OUTSIDE_ALLOWED:
                    bad.append(f"{where}: runtime/{here} imports distlab.{top}")
            elif there != here and here is not None and there not in ALLOWED.get(here, set()):
                bad.append(f"{where}: runtime/{here} imports runtime/{there} ({target})")
    return bad


def test_every_runtime_module_sits_in_a_room_with_rules() -> None:
    rooms = {room_of(module_name(p)) for p in (SRC / "distlab" / "runtime").rglob("*.py")}
    rooms.discard(None)
    rooms.discard("__init__")
    assert rooms <= ALLOWED.keys(), f"rooms without rules: {rooms - ALLOWED.keys()}"


def test_runtime_imports_follow_the_allowed_directions() -> None:
    assert violations(SRC) == []


@pytest.mark.parametrize("room, forbidden", [
    ("trace", "from ..comm.stats import CommStats"),
    ("supervisor", "from ..rank import worker"),
    ("clock", "from distlab.runtime.comm.proxy import Comm"),
    ("faults", "from ...grading import Checklist"),
])
def test_a_forbidden_import_is_caught(tmp_path: Path, room: str, forbidden: str) -> None:
    """The rule itself can fail: a copy of the runtime with one forbidden arrow added."""
    import shutil

    copy = tmp_path / "src"
    shutil.copytree(SRC / "distlab" / "runtime", copy / "distlab" / "runtime")
    (copy / "distlab" / "__init__.py").write_text("")
    target = next(p for p in sorted((copy / "distlab" / "runtime" / room).glob("*.py"))
                  if p.name != "__init__.py")
    target.write_text(target.read_text() + f"\n\ndef _late() -> None:\n    {forbidden}\n")
    found = [v for v in violations(copy) if target.name in v]
    assert found, f"{forbidden!r} in runtime/{room} was not caught"
