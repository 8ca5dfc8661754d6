"""Loading a learner's solution file as a module, with errors that point at the learner's line."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from types import CodeType, ModuleType, TracebackType

from ...errors import UsageError


class SolutionLoadError(Exception):
    def __init__(self, summary: str, where: str, detail: str) -> None:
        super().__init__(summary)
        self.summary = summary
        self.where = where
        self.detail = detail


def read_source(path: Path) -> bytes:
    """The file's bytes, as Python's import reads them; UsageError if it cannot be Python at all."""
    try:
        source = path.read_bytes()
    except IsADirectoryError:
        raise UsageError(f"the solution file {path} is a folder, not a .py file") from None
    except OSError as exc:
        raise UsageError(f"cannot read the solution file {path}: {exc.strerror}") from None
    if b"\0" in source:  # no text file holds a NUL byte, and compile() refuses one
        raise UsageError(f"the solution file {path} is binary, not Python source text")
    return source


def compile_check(path: Path) -> CodeType:
    """The file's code, compiled; SolutionLoadError for a syntax error, without running anything.

    It compiles the bytes, not a decoded str, so that a UTF-8 BOM or a ``# -*- coding: ... -*-``
    line means what it means to Python's import."""
    source = read_source(path)
    try:
        return compile(source, str(path), "exec")
    except SyntaxError as exc:
        where = f"{path.name}, line {exc.lineno}"
        summary = f"SyntaxError in {where}: {exc.msg}"
        line = (exc.text or "").rstrip("\n")
        detail = f"{line}\n{' ' * max((exc.offset or 1) - 1, 0)}^" if line else ""
        raise SolutionLoadError(summary, where, detail) from None


def load_module(path: Path, name: str) -> ModuleType:
    """Imports the file as a fresh module; errors raised by its top level become SolutionLoadError.

    It runs the code compiled from the file's bytes as they are now, never a cached .pyc: Python
    trusts a cache whose source has the same size and modification second, which a learner who
    fixes one character and checks again within the second would otherwise be graded on."""
    code = compile_check(path)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)  # noqa: S102 - the learner's own file, in its rank
    except Exception as exc:
        where = innermost_frame_in(exc.__traceback__, path)
        summary = f"importing {path.name} failed: {type(exc).__name__}: {exc}"
        raise SolutionLoadError(summary, where, format_for(exc, path)) from None
    return module


def innermost_frame_in(tb: TracebackType | None, path: Path) -> str:
    """'file.py, line 12, in allreduce' for the deepest frame in ``path``, else ''."""
    found = ""
    for frame in traceback.extract_tb(tb):
        if Path(frame.filename).resolve() == path.resolve():
            found = f"{path.name}, line {frame.lineno}, in {frame.name}"
    return found


def format_for(exc: BaseException, path: Path) -> str:
    """The traceback trimmed to start at the first frame of the learner's file."""
    frames = traceback.extract_tb(exc.__traceback__)
    start = next(
        (i for i, f in enumerate(frames) if Path(f.filename).resolve() == path.resolve()), 0
    )
    lines = traceback.format_list(frames[start:])
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines).rstrip()
