"""The imports a problem's files may make of distlab: ``distlab`` itself (the ops, ``IN_PLACE``,
the wildcards, as learner code uses them) and ``distlab.grading``, the one door of check code.

Everything else of distlab (the runtime, the platforms, the bank, the CLI) is the harness's
inside: a problem that reaches into it breaks when the inside moves, and learner code that does
could read what the grader keeps to itself. ``distlab dev lint`` runs this on every file.
"""

from __future__ import annotations

import ast
from pathlib import Path

ALLOWED = ("distlab", "distlab.grading")


def forbidden_imports(path: Path) -> list[str]:
    """``file:line: imports distlab.X`` for each import of distlab outside ``ALLOWED``, including
    imports inside functions; a file that does not parse is left to the checks that load it."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "distlab" and name not in ALLOWED:
                found.append(f"{path.name}:{node.lineno}: imports {name}")
    return found


def problem_import_findings(folder: Path) -> list[str]:
    """The forbidden imports of every Python file of a problem's folder."""
    return [line for path in sorted(folder.glob("*.py")) for line in forbidden_imports(path)]
