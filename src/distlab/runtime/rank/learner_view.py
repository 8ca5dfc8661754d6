"""What a sealed learner process may read: the paths the sandbox hides from it, and the ones it
binds back where it empties a folder (runtime/seal/sandbox.py, which applies them)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from ...errors import UsageError
from ..jobspec import Job


def kept_paths(job: Job) -> list[str]:
    """What the learner process needs to read where the sandbox covers it (an empty tmpfs over
    every folder at the top of the filesystem but the system's, its fresh /tmp over a checkout
    there): its solution, the problem's folder, the interpreter's prefix and every folder on the
    import path (the learner process starts with this process's), the folders of the libraries
    loaded here, and the interpreter itself, which a learner's subprocess (a data loader's
    workers) starts again."""
    wanted = [job.solution_file, str(Path(job.program_file).parent), sys.prefix, *sys.path,
              os.path.dirname(os.path.realpath(sys.executable)), *_library_folders()]
    return [p for p in dict.fromkeys(wanted) if p and os.path.exists(p)]


def _library_folders() -> list[str]:
    """The folders of the shared libraries this process has loaded (the learner loads the same:
    the interpreter's, MPI's, NumPy's), wherever they lie: the sandbox empties every folder at
    the top of the filesystem but the system's, and binds these back."""
    folders: dict[str, None] = {}
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            path = fields[5].strip() if len(fields) == 6 else ""
            if ".so" in path and path.startswith("/") and not path.startswith(("/dev/", "/proc/")):
                folders[os.path.dirname(path)] = None
    return list(folders)


def hidden_paths(job: Job, job_dir: Path) -> list[str]:
    """What the learner process must not read: the job folder (the tasks' hidden cases, the fault
    plan, every rank's files), and the checks, judges and reference solutions of the shipped bank
    and of the program's own (a problem's programs.py and cases.py stay: its rank programs run
    there), with every problem's bytecode cache (a .pyc of check.py is check.py). The solution
    being checked stays readable, even when it is a reference."""
    from ...bank import (
        default_problems_dir,  # the bank module is the CLI's; imported when needed
    )

    banks = {Path(job.program_file).resolve().parent.parent}
    try:
        banks.add(default_problems_dir().resolve())
    except UsageError:
        pass  # no shipped bank (an installed distlab run from elsewhere): the program's only
    solution = Path(job.solution_file).resolve() if job.solution_file else None
    hidden = [str(job_dir), *job.private]
    kept = kept_paths(job)  # once: each bank's checkout keeps the same paths readable
    for bank in sorted(banks):
        for name in ("check.py", "judging.py", "reference.py"):
            hidden += [str(p) for p in sorted(bank.glob(f"*/{name}")) if p.resolve() != solution]
        for package in sorted({p.parent for p in bank.glob("*/check.py")}):
            cache = package / "__pycache__"
            # Made if missing, so that it is covered: a cache written after the sandbox was set up
            # would be readable (a mount covers a folder, not files yet to come).
            with contextlib.suppress(OSError):
                cache.mkdir(exist_ok=True)
            if cache.is_dir():
                hidden.append(str(cache))
        hidden += checkout_paths(bank, kept)
    return hidden


def checkout_paths(bank: Path, kept: list[str]) -> list[str]:
    """What a checkout around a bank holds that would give a solution away: its git history
    (every reference and check, as objects: an outside tester read them back with zlib) and its
    tests (their fixtures hold correct alternatives). The tests are hidden around what must stay
    readable in them (a fixture being checked, a bank kept there): everything beside the path
    down to it."""
    root = next((folder for folder in (bank, *bank.parents) if (folder / ".git").exists()), None)
    if root is None:
        return []
    kept_real = [Path(os.path.realpath(p)) for p in kept]
    hidden = [str(root / ".git")]
    tests = root / "tests"
    if tests.is_dir():
        hidden += _around(tests.resolve(), kept_real)
    return hidden


def _around(folder: Path, kept: list[Path]) -> list[str]:
    """``folder`` itself when nothing kept lies inside it, else each of its entries that holds
    nothing kept, and the same inside those that do."""
    if folder in kept or not any(folder in p.parents for p in kept):
        return [] if folder in kept else [str(folder)]
    out: list[str] = []
    for entry in sorted(folder.iterdir()):
        if not entry.is_symlink():  # a mount over a link would land on its target
            out += _around(entry, kept)
    return out
