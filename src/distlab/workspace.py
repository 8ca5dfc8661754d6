"""The learner's workspace: their solution files, their progress, their last results.

Layout (``$DISTLAB_WORKSPACE``, default ``./workspace``)::

    workspace/
      03-ring-allreduce.py      the learner's file, copied from the starter by `distlab start 03`
      progress.json             what passed, hints shown (written atomically)
      results/03.json           the last results of `distlab check 03`

A missing progress file starts empty; a corrupt one is reported, kept aside as
``progress.json.corrupt`` and rebuilt, never a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bank import Entry
from .errors import StateError

STATE_VERSION = 1


def workspace_dir() -> Path:
    return Path(os.environ.get("DISTLAB_WORKSPACE", "workspace")).resolve()


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Temp file in the same folder, fsync, rename: a crash leaves the old file or the new one.
    ``mode`` 0o644 by default: mkstemp's 0600 would hide the learner's own files from their tools."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class ProblemProgress:
    passed: bool = False
    best_score: int = 0
    max_score: int = 0
    hints_shown: int = 0
    attempts: int = 0


@dataclass
class Progress:
    problems: dict[str, ProblemProgress] = field(default_factory=dict)
    warning: str = ""  # set when the file was corrupt and has been rebuilt

    def of(self, number: str) -> ProblemProgress:
        return self.problems.setdefault(number, ProblemProgress())


class Workspace:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or workspace_dir()

    @property
    def progress_file(self) -> Path:
        return self.root / "progress.json"

    def solution_path(self, entry: Entry) -> Path:
        return self.root / entry.card().solution_file

    def results_path(self, entry: Entry) -> Path:
        return self.root / "results" / f"{entry.number}.json"

    def start(self, entry: Entry) -> tuple[Path, bool]:
        """Copies the starter into the workspace; never overwrites. Returns (path, created)."""
        target = self.solution_path(entry)
        if target.exists():
            return target, False
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, (entry.path / "starter.py").read_text())
        return target, True

    def load_progress(self) -> Progress:
        try:
            # Bytes: json.loads decodes them, and a binary file fails there as corrupt (below).
            raw = self.progress_file.read_bytes()
        except FileNotFoundError:
            return Progress()
        except OSError as exc:
            raise StateError(f"cannot read {self.progress_file}: {exc.strerror}") from None
        try:
            data = json.loads(raw)
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"unknown version {data.get('version')!r}")
            problems = {k: ProblemProgress(**v) for k, v in data["problems"].items()}
            return Progress(problems)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = self.progress_file.with_suffix(".json.corrupt")
            shutil.copyfile(self.progress_file, aside)
            progress = Progress(warning=(
                f"{self.progress_file} was unreadable ({exc}); kept it as {aside.name} "
                "and started a fresh one"
            ))
            self.save_progress(progress)
            return progress

    def save_progress(self, progress: Progress) -> None:
        data: dict[str, Any] = {
            "version": STATE_VERSION,
            "problems": {k: vars(v) for k, v in sorted(progress.problems.items())},
        }
        try:
            write_atomically(self.progress_file, json.dumps(data, indent=2) + "\n")
        except OSError as exc:
            raise StateError(f"cannot write {self.progress_file}: {exc.strerror}") from None
