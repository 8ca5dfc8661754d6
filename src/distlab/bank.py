"""The problem bank: the course index, the cards, and where a problem's files are.

A problem lives in ``problems/NN-slug/`` with ``card.toml``, ``starter.py``, ``reference.py``,
``check.py`` and ``programs.py`` (a package: docs/problem-format.md). The course order of all 25
problems lives in ``problems/index.toml``; a problem listed there without a folder yet shows as
"coming". Validation names the file, the key and the bad value.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import CardError, UsageError

FORMAT_VERSION = 1
TIERS = ("basic", "advanced", "expert")
BACKENDS = ("mpi", "gloo")
PROBLEM_FILES = ("card.toml", "starter.py", "reference.py", "check.py", "programs.py")


@dataclass(frozen=True)
class Scenario:
    background: str
    constraints: tuple[str, ...]
    faults: tuple[str, ...]
    metrics: tuple[str, ...]


@dataclass(frozen=True)
class Steps:
    define: str
    instrument: str
    simulate: str
    tune: str


@dataclass(frozen=True)
class Card:
    format_version: int
    id: str
    slug: str
    title: str
    tier: str
    tags: tuple[str, ...]
    world_sizes: tuple[int, ...]
    platform: str
    time_limit_s: int
    backends: tuple[str, ...]
    solution_file: str  # name of the learner's file in the workspace
    scenario: Scenario
    steps: Steps
    hints: tuple[str, ...]
    # The rank count of a free run (distlab run, tune, the report's timeline) unless one is given:
    # a scenario's cluster may need all of its ranks to show anything (problem 09: 12 on three-dc).
    free_run_ranks: int = 4


@dataclass(frozen=True)
class Entry:
    """One slot of the course: a problem, written or still coming."""

    number: str
    slug: str
    title: str
    tier: str
    path: Path  # problems/NN-slug (may not exist for a coming problem)

    @property
    def ready(self) -> bool:
        return (self.path / "card.toml").exists()

    def card(self) -> Card:
        return load_card(self.path / "card.toml")


# -- validation ---------------------------------------------------------------------------------


class _Reader:
    """Typed access to a TOML table that names the file and the key in every error."""

    def __init__(self, data: dict[str, Any], where: str, prefix: str = "") -> None:
        self.data = data
        self.where = where
        self.prefix = prefix

    def _fail(self, key: str, msg: str) -> CardError:
        return CardError(f"{self.where}: key '{self.prefix}{key}' {msg}")

    def _get(self, key: str) -> Any:
        if key not in self.data:
            raise self._fail(key, "is missing")
        return self.data[key]

    def string(self, key: str, choices: tuple[str, ...] = ()) -> str:
        value = self._get(key)
        if not isinstance(value, str) or not value.strip():
            raise self._fail(key, f"must be a non-empty string; got {value!r}")
        if choices and value not in choices:
            raise self._fail(key, f"must be one of {', '.join(choices)}; got {value!r}")
        return value

    def integer(self, key: str, minimum: int = 0) -> int:
        value = self._get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self._fail(key, f"must be an integer >= {minimum}; got {value!r}")
        return value

    def strings(self, key: str, choices: tuple[str, ...] = (), min_items: int = 1) -> tuple[str, ...]:
        value = self._get(key)
        if not isinstance(value, list) or len(value) < min_items:
            raise self._fail(key, f"must be a list of at least {min_items} string(s); got {value!r}")
        for item in value:
            if not isinstance(item, str) or not item.strip():
                raise self._fail(key, f"must hold non-empty strings; got {item!r}")
            if choices and item not in choices:
                raise self._fail(key, f"entries must be among {', '.join(choices)}; got {item!r}")
        return tuple(value)

    def integers(self, key: str, minimum: int = 1) -> tuple[int, ...]:
        value = self._get(key)
        if not isinstance(value, list) or not value:
            raise self._fail(key, f"must be a non-empty list of integers; got {value!r}")
        for item in value:
            if not isinstance(item, int) or isinstance(item, bool) or item < minimum:
                raise self._fail(key, f"entries must be integers >= {minimum}; got {item!r}")
        return tuple(value)

    def table(self, key: str) -> "_Reader":
        value = self._get(key)
        if not isinstance(value, dict):
            raise self._fail(key, f"must be a table; got {type(value).__name__}")
        return _Reader(value, self.where, f"{self.prefix}{key}.")

    def unknown_keys(self, allowed: set[str]) -> None:
        extra = sorted(set(self.data) - allowed)
        if extra:
            raise self._fail(extra[0], f"is not a known key (known: {', '.join(sorted(allowed))})")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise CardError(f"{path}: file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise CardError(f"{path}: not valid TOML: {exc}") from None


CARD_KEYS = {
    "format_version", "id", "slug", "title", "tier", "tags", "world_sizes", "platform",
    "time_limit_s", "backends", "solution_file", "scenario", "steps", "hints", "free_run_ranks",
}


def load_card(path: Path) -> Card:
    data = _read_toml(path)
    r = _Reader(data, str(path))
    version = r.integer("format_version", minimum=1)
    if version != FORMAT_VERSION:
        raise CardError(
            f"{path}: key 'format_version' is {version}; this distlab reads version {FORMAT_VERSION}"
        )
    r.unknown_keys(CARD_KEYS)
    card_id = r.string("id")
    if not (len(card_id) == 2 and card_id.isdigit()):
        raise CardError(f"{path}: key 'id' must be two digits like \"03\"; got {card_id!r}")
    scenario = r.table("scenario")
    scenario.unknown_keys({"background", "constraints", "faults", "metrics"})
    steps = r.table("steps")
    steps.unknown_keys({"define", "instrument", "simulate", "tune"})
    return Card(
        format_version=version,
        id=card_id,
        slug=r.string("slug"),
        title=r.string("title"),
        tier=r.string("tier", TIERS),
        tags=r.strings("tags"),
        world_sizes=r.integers("world_sizes"),
        platform=r.string("platform"),
        time_limit_s=r.integer("time_limit_s", minimum=1),
        backends=r.strings("backends", BACKENDS),
        solution_file=_workspace_file(path, r.string("solution_file")),
        scenario=Scenario(
            background=scenario.string("background"),
            constraints=scenario.strings("constraints"),
            faults=scenario.strings("faults"),
            metrics=scenario.strings("metrics"),
        ),
        steps=Steps(
            define=steps.string("define"),
            instrument=steps.string("instrument"),
            simulate=steps.string("simulate"),
            tune=steps.string("tune"),
        ),
        hints=r.strings("hints", min_items=1),
        free_run_ranks=r.integer("free_run_ranks", minimum=1) if "free_run_ranks" in data else 4,
    )


def _workspace_file(path: Path, name: str) -> str:
    """The learner's file is written (and checked) in the workspace: a card may name a file there,
    or in a folder of it, but never one outside (absolute, or climbing out with ..)."""
    parts = PurePosixPath(name).parts
    if PurePosixPath(name).is_absolute() or ".." in parts or "\\" in name or not parts:
        raise CardError(
            f"{path}: key 'solution_file' must be a file name inside the workspace; got {name!r}"
        )
    return name


# -- the index ----------------------------------------------------------------------------------


def default_problems_dir() -> Path:
    env = os.environ.get("DISTLAB_PROBLEMS")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "problems" / "index.toml"
        if candidate.exists():
            return candidate.parent
    raise UsageError("cannot find the problem bank (problems/index.toml); set DISTLAB_PROBLEMS")


class Bank:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.entries = _load_index(root)

    @classmethod
    def default(cls) -> "Bank":
        return cls(default_problems_dir())

    def problem(self, ref: str) -> Entry:
        """Finds a problem by number ('3', '03') or slug."""
        key = ref.strip().lower()
        for entry in self.entries:
            if key.isdigit() and int(key) == int(entry.number):
                return entry
            if key in (entry.slug, f"{entry.number}-{entry.slug}"):
                return entry
        raise UsageError(f"no problem {ref!r}: `distlab list` shows the 25 problems")

    def ready_problem(self, ref: str) -> Entry:
        entry = self.problem(ref)
        if not entry.ready:
            raise UsageError(f"problem {entry.number} ({entry.title}) is coming but not written yet")
        return entry


def _load_index(root: Path) -> list[Entry]:
    path = root / "index.toml"
    data = _read_toml(path)
    r = _Reader(data, str(path))
    if r.integer("format_version", minimum=1) != FORMAT_VERSION:
        raise CardError(f"{path}: unsupported format_version")
    problems = data.get("problem")
    if not isinstance(problems, list) or not problems:
        raise CardError(f"{path}: needs [[problem]] entries")
    entries = []
    seen: set[str] = set()
    for i, raw in enumerate(problems):
        item = _Reader(raw, str(path), f"problem[{i}].")
        number = item.string("number")
        if number in seen:
            raise CardError(f"{path}: problem number {number} appears twice")
        seen.add(number)
        slug = item.string("slug")
        entries.append(
            Entry(number, slug, item.string("title"), item.string("tier", TIERS), root / f"{number}-{slug}")
        )
    return entries


def resolve_solution(entry: Entry, arg: str) -> Path:
    """'reference' or 'starter' name the problem's own files; anything else is a path."""
    from .options import solution_file

    if arg in ("reference", "starter"):
        return entry.path / f"{arg}.py"
    return solution_file(arg)
