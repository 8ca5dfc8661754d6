"""The author's kit: `distlab dev lint` and `distlab dev new`.

Lint proves the bank is sound, the way rustlings' `dev check` does: every card validates and
agrees with the index, every problem has its files and at least three hints and nothing stray,
every check.py declares its checks, every starter *fails* its checks and every reference *passes*
them. The checks run as real `distlab check` processes, two problems at a time.
"""

from __future__ import annotations

import json
import os
import string
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .bank import PROBLEM_FILES, Bank, Entry
from .errors import CardError, DistlabError, UsageError
from .grading.imports import ALLOWED as ALLOWED_IMPORTS
from .grading.imports import problem_import_findings

# Files a problem folder may hold besides its five: the optional roles of a problem package
# (docs/problem-format.md), notes for authors, data it ships.
ALLOWED_EXTRAS = {"cases.py", "judging.py", "README.md", "data", "__pycache__"}
MIN_HINTS = 3


@dataclass(frozen=True)
class Finding:
    problem: str
    ok: bool
    what: str  # "card", "files", "hints", "platform", "checks", "starter fails", "reference passes"
    message: str


def static_findings(entry: Entry) -> list[Finding]:
    """Everything lint can tell without running a rank."""
    out: list[Finding] = []
    n = entry.number

    def add(ok: bool, what: str, message: str) -> None:
        out.append(Finding(n, ok, what, message))

    missing = [f for f in PROBLEM_FILES if not (entry.path / f).is_file()]
    add(not missing, "files", f"missing {', '.join(missing)}" if missing else "all five present")
    stray = sorted(p.name for p in entry.path.iterdir() if p.name not in PROBLEM_FILES
                   and p.name not in ALLOWED_EXTRAS)
    add(not stray, "stray files", f"unexpected: {', '.join(stray)}" if stray else "none")
    try:
        card = entry.card()
    except CardError as exc:
        add(False, "card", str(exc))
        return out
    mismatch = [
        f"{key} is {got!r} in the card but {want!r} in the index"
        for key, got, want in (("id", card.id, entry.number), ("slug", card.slug, entry.slug),
                               ("title", card.title, entry.title), ("tier", card.tier, entry.tier))
        if got != want
    ]
    add(not mismatch, "card", "; ".join(mismatch) or "valid, agrees with the index")
    add(len(card.hints) >= MIN_HINTS, "hints",
        f"{len(card.hints)} hint(s); at least {MIN_HINTS} expected")
    try:
        from .platforms import resolve

        # The card's platform must exist now, not when the first check of a learner looks it up.
        platform = resolve(card.platform)
        add(True, "platform", f"{card.platform}: {platform.max_ranks()} ranks")
    except DistlabError as exc:
        add(False, "platform", str(exc))
    try:
        from .grading.runner import load_checklist

        count = len(load_checklist(entry).checks)
        add(True, "checks", f"{count} checks declared")
    except Exception as exc:  # noqa: BLE001 - any import error of check.py is a finding
        add(False, "checks", f"check.py does not load: {type(exc).__name__}: {exc}")
    leaks = problem_import_findings(entry.path)
    add(not leaks, "imports", "; ".join(leaks) + f" (only {' and '.join(ALLOWED_IMPORTS)})"
        if leaks else "only " + " and ".join(ALLOWED_IMPORTS))
    return out


def run_check(entry: Entry, solution: str, timeout_s: float) -> tuple[int, dict[str, object] | None, str]:
    """Runs `distlab check` as a learner would; returns (exit code, results JSON, output tail)."""
    with tempfile.TemporaryDirectory(prefix="distlab-lint-") as tmp:
        out_json = Path(tmp) / "r.json"
        env = dict(os.environ, DISTLAB_WORKSPACE=str(Path(tmp) / "ws"), DISTLAB_PROBLEMS=str(entry.path.parent))
        command = [sys.executable, "-P", "-m", "distlab.cli", "check", entry.number,
                   "--solution", solution, "--json", str(out_json)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            return 124, None, f"took longer than {timeout_s:.0f} s"
        results = json.loads(out_json.read_text()) if out_json.exists() else None
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-3:])
        return done.returncode, results, tail


def dynamic_findings(entry: Entry, timeout_s: float) -> list[Finding]:
    n = entry.number
    out = []
    code, results, tail = run_check(entry, "starter", timeout_s)
    starter_ok = code == 1 and results is not None and not results.get("passed")
    out.append(Finding(n, starter_ok, "starter fails",
                       f"exit {code}: {tail.splitlines()[-1] if tail else ''}" if not starter_ok
                       else f"fails as it should (score {results['score']}/{results['max_score']})"))  # type: ignore[index]
    code, results, tail = run_check(entry, "reference", timeout_s)
    ref_ok = code == 0 and results is not None and bool(results.get("passed"))
    out.append(Finding(n, ref_ok, "reference passes",
                       f"exit {code}: {tail}" if not ref_ok else f"passes in {results['wall_s']:.1f} s"))  # type: ignore[index]
    return out


def lint(bank: Bank, only: list[str] | None = None, run: bool = True, jobs: int = 2,
         timeout_s: float = 300.0) -> list[Finding]:
    entries = [e for e in bank.entries if e.ready and (not only or e.number in only)]
    if only:
        unknown = sorted(set(only) - {e.number for e in entries})
        if unknown:
            raise UsageError(f"no written problem {', '.join(unknown)} to lint")
    findings = [f for e in entries for f in static_findings(e)]
    if run:
        sound = [e for e in entries if all(f.ok for f in findings if f.problem == e.number
                                           and f.what in ("files", "card", "checks"))]
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for batch in pool.map(lambda e: dynamic_findings(e, timeout_s), sound):
                findings += batch
    return sorted(findings, key=lambda f: f.problem)


# -- dev new ------------------------------------------------------------------------------------

# The files of a new problem: the small complete example of docs/writing-a-problem.md, with
# ${number}, ${slug}, ${title} and ${tier} filled in.
SCAFFOLD = Path(__file__).parent / "scaffold"
SCAFFOLD_FILES = ("card.toml", "starter.py", "reference.py", "check.py", "programs.py", "cases.py")


def new_problem(bank: Bank, slug: str, title: str | None, tier: str) -> Path:
    """Scaffolds problems/NN-slug with a valid card, a failing starter and a passing reference,
    and adds it to the end of the course index. Returns the new folder."""
    if not slug.replace("-", "").isalnum() or slug != slug.lower():
        raise UsageError(f"slug {slug!r} must be lower-case letters, digits and dashes")
    if any(e.slug == slug for e in bank.entries):
        raise UsageError(f"a problem with slug {slug!r} exists already")
    number = f"{max(int(e.number) for e in bank.entries) + 1:02d}"
    title = title or slug.replace("-", " ").capitalize()
    folder = bank.root / f"{number}-{slug}"
    folder.mkdir()
    fields = {"number": number, "slug": slug, "title": title, "tier": tier}
    for name in SCAFFOLD_FILES:
        template = string.Template((SCAFFOLD / f"{name}.tmpl").read_text())
        (folder / name).write_text(template.substitute(fields))
    with open(bank.root / "index.toml", "a") as index:
        index.write(f'\n[[problem]]\nnumber = "{number}"\nslug = "{slug}"\n'
                    f'title = "{title}"\ntier = "{tier}"\n')
    return folder
