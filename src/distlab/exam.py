"""`distlab exam`: a timed assessment on hidden variants, for team leads and interviewers.

Call order: `distlab exam --problems 03,07 --time 90m --out DIR` opens the exam: DIR/exam.json
records the problems, fresh secret seeds and the deadline, and DIR/work/ gets the starters for the
candidate to edit. `distlab exam --out DIR --submit` grades: every problem is checked on its
secret seed (expected values are computed in the checker, outside the candidate's processes), the
files are kept with their SHA-256 in DIR/submitted/, and the assessor gets DIR/results.json (one
document, every problem, signed with the key that signs exam.json) and DIR/report.html;
`distlab exam --out DIR --verify` says whether the results and the kept files are as graded.
A file changed after the deadline is graded as it was not: it scores zero, and the report says so. When it changed is the later of its mtime and its
ctime: ``touch`` can set the first back, not the second (so grade the folder the candidate worked
in: a copy of it, even ``cp -a``, reads every file as changed when it was copied). A file that is a link, not a regular file,
missing or over 4 MiB is refused (scored 0, nothing run): the grader runs as the assessor, and
would otherwise copy whatever a link points at (the signing key) into DIR/submitted/.

Integrity: a file that goes around the communicator is flagged and scores zero, caught two ways.
The import scan flags a file that imports an engine directly (mpi4py, torch.distributed). Below
the proxy, every MPI launch is graded with Open MPI's own monitoring on (runtime/supervisor/mpi_monitoring.py):
a problem is flagged when MPI carried point-to-point messages the harness never handed it, ran
collective operations on MPI_COMM_WORLD beyond the harness's own duplication of it, or carried
one-sided traffic; this catches a disguised import too (``importlib.import_module("mpi" +
"4py")``). The counters exist on the MPI backend only, which the exam uses; gloo runs get the
import scan alone. The seeds live in DIR/exam.json: give the candidate DIR/work/ only, and keep
DIR yourself.
"""

from __future__ import annotations

import ast
import datetime
import errno
import hashlib
import html
import json
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from . import examkey
from .bank import Bank
from .errors import StateError, UsageError
from .grading.console import ConsoleReporter
from .grading.runner import Options, check_problem, draw_seed, not_run
from .workspace import write_atomically

EXAM_FILE = "exam.json"
BYPASS_MODULES = ("mpi4py", "torch.distributed")
MAX_SUBMISSION_BYTES = 4 << 20  # a solution file of more is not a solution


def parse_duration(text: str) -> float:
    """'90m', '1h30m', '45s', '2h' -> seconds."""
    parts = re.fullmatch(r"\s*(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+)s)?\s*", text)
    if not parts or not any(parts.groups()):
        raise UsageError(f"--time takes a duration like 90m, 1h30m or 45s; got {text!r}")
    h, m, s = (int(g) if g else 0 for g in parts.groups())
    return float(h * 3600 + m * 60 + s)


@dataclass(frozen=True)
class Exam:
    problems: list[str]
    seeds: dict[str, int]
    started_at: float
    deadline: float
    folder: Path
    tampered: str = ""  # why exam.json cannot be trusted (its signature does not hold), or ""

    def to_json(self) -> dict[str, Any]:
        # The folder is signed too: another exam's exam.json (a later deadline), copied in whole,
        # carries a good signature of its own folder.
        fields: dict[str, Any] = {"format_version": 2, "problems": self.problems, "seeds": self.seeds,
                                  "started_at": self.started_at, "deadline": self.deadline,
                                  "folder": str(self.folder)}
        return {**fields, "signature": examkey.sign(fields)}

    @classmethod
    def load(cls, folder: Path) -> "Exam":
        try:
            data = json.loads((folder / EXAM_FILE).read_text())
            tampered = "" if examkey.verify(data) else (
                f"{folder / EXAM_FILE} does not carry this installation's signature: it was edited "
                "after the exam opened (or opened elsewhere)")
            if not tampered and data.get("folder", str(folder)) != str(folder):  # format 1: none
                tampered = (f"{folder / EXAM_FILE} is the exam opened in {data['folder']}: an exam "
                            "file copied in from another exam")
            return cls(list(data["problems"]), {k: int(v) for k, v in data["seeds"].items()},
                       float(data["started_at"]), float(data["deadline"]), folder, tampered)
        except FileNotFoundError:
            raise UsageError(f"{folder} holds no exam: open one with --problems and --time") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise StateError(f"{folder / EXAM_FILE} is damaged ({exc}); open a new exam") from None


def open_exam(bank: Bank, problems: list[str], seconds: float, folder: Path) -> Exam:
    if (folder / EXAM_FILE).exists():
        raise UsageError(f"{folder} already holds an exam: grade it with --submit, or use another --out")
    entries = [bank.ready_problem(p) for p in problems]
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time()
    exam = Exam([e.number for e in entries], {e.number: draw_seed() for e in entries},
                now, now + seconds, folder)
    examkey.remember_exam(folder)  # hidden from every later exam's graded code (submit)
    # The assessor's alone: the seeds give away every hidden variant (cases.py is readable).
    write_atomically(folder / EXAM_FILE, json.dumps(exam.to_json(), indent=2) + "\n", mode=0o600)
    for entry in entries:
        target = folder / "work" / entry.card().solution_file
        write_atomically(target, (entry.path / "starter.py").read_text())
    return exam


@dataclass(frozen=True)
class Submission:
    """A candidate's file as the grader took it (read once: what is graded is what is kept)."""

    data: bytes
    changed_at: float  # the later of its mtime and ctime (0 when there is no file)
    refused: str = ""  # why it is not graded, or ""


def take_submission(work: Path) -> Submission:
    """Reads ``work`` without following a link, and only if it is a regular file of at most
    MAX_SUBMISSION_BYTES: a FIFO would hang the grader, a device or a huge file fill it."""
    try:
        fd = os.open(work, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return Submission(b"", 0.0, f"{work.name} is missing from {work.parent}")
    except OSError as exc:
        why = "is a symbolic link: submit the file itself" if exc.errno == errno.ELOOP else \
            f"cannot be read ({exc.strerror})"
        return Submission(b"", 0.0, f"{work.name} {why}")
    try:
        info = os.fstat(fd)
        changed_at = max(info.st_mtime, info.st_ctime)
        if not stat.S_ISREG(info.st_mode):
            return Submission(b"", changed_at, f"{work.name} is not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_SUBMISSION_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SUBMISSION_BYTES:
        return Submission(b"", changed_at, f"{work.name} is larger than {MAX_SUBMISSION_BYTES >> 20} MiB")
    return Submission(data, changed_at)


def bypasses(path: Path) -> list[str]:
    """Engine modules the file imports directly (going around the communicator)."""
    try:
        # Bytes, so that a BOM or a coding line reads as Python reads it.
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):  # not Python: grading says so; nothing is imported
        return []
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            for banned in BYPASS_MODULES:
                if name == banned or name.startswith(banned + "."):
                    found.append(banned)
    return sorted(set(found))


def traffic_flag(below_proxy: dict[str, Any] | None) -> str:
    """The report's sentence when MPI's own counters saw traffic the proxy did not; "" if none
    (or nothing was measured: a problem without MPI launches)."""
    if not below_proxy or not below_proxy.get("flagged"):
        return ""
    return f"bypassed the communicator: {below_proxy['sentence']}"


def _isolation() -> str:
    """What the seal held on this machine (it depends on root, the kernel and the cgroups), for the
    assessor: an exam taken where the learner stays uid 0, or shares the filesystem, reads so."""
    from .runtime.seal import memgroup
    from .runtime.seal.sandbox import expected

    return f"{expected()}; {memgroup.available()}"


def submit(bank: Bank, folder: Path, console: Console, seal: bool = True) -> dict[str, Any]:
    """Grades the exam in ``folder``; ``seal`` False (the CLI's ``--seal off --allow-unsealed``)
    runs the candidate's code in the ranks themselves, where it could reach what grades it."""
    exam = Exam.load(folder)
    if exam.tampered:
        console.print(f"tampered: {exam.tampered}; every problem scores 0", markup=False, highlight=False)
    # Out of the candidate's sealed code's sight: the exam's state, its results, the signing key,
    # and the work folder, where a file written after the deadline (read by a solution that was
    # not) would be graded unflagged: the solution is graded from its copy in submitted/.
    # And every other exam this installation opened, whole: a candidate's file once exec'd another
    # candidate's graded copy from an exam folder beside its own (/srv/exams/*/submitted/).
    private = (str(folder / EXAM_FILE), str(folder / "results.json"), str(folder / "report.html"),
               str(examkey.key_path()), str(folder / "work"),
               *(str(other) for other in examkey.exams_opened() if other != folder))
    submitted_at = time.time()
    documents = []
    for number in exam.problems:
        entry = bank.ready_problem(number)
        work = folder / "work" / entry.card().solution_file
        kept = folder / "submitted" / work.name
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.parent.chmod(0o700)  # the assessor's: no other account reads a graded file
        taken = take_submission(work)
        kept.write_bytes(taken.data)
        late = taken.changed_at > exam.deadline
        if late:  # said first, so the score printed below is not taken for the grade
            console.print(f"{number}: {work.name} was changed after the deadline "
                          f"({_iso(taken.changed_at)}, deadline {_iso(exam.deadline)}): "
                          "it is checked, and scored 0", markup=False, highlight=False)
        options = Options(seed=exam.seeds[number], mpi_monitoring=True, seal=seal, private=private)
        reporter = ConsoleReporter(console)
        if taken.refused:
            results = not_run(entry, kept, options, reporter, f"refused: {taken.refused}")
        else:
            results = check_problem(entry, kept, options, reporter)
        doc = results.to_json()
        doc["file_sha256"] = hashlib.sha256(taken.data).hexdigest()
        doc["refused"] = taken.refused
        doc["late"] = late
        doc["bypass"] = bypasses(kept)
        doc["bypass_traffic"] = traffic_flag(doc.get("below_proxy"))
        doc["tampered"] = exam.tampered
        if late or taken.refused or doc["bypass"] or doc["bypass_traffic"] or exam.tampered:
            doc["score"] = 0
            doc["passed"] = False
        documents.append(doc)
    summary = {
        "schema": "distlab.exam/1",
        "folder": str(folder),  # signed: another exam's results, copied in, name their own
        "started_at": _iso(exam.started_at),
        "deadline": _iso(exam.deadline),
        "submitted_at": _iso(submitted_at),
        "seal": "on" if seal else "off (the candidate's code shared its process with the counters)",
        "isolation": _isolation() if seal else "",
        "tampered": exam.tampered,
        "score": sum(d["score"] for d in documents),
        "max_score": sum(d["max_score"] for d in documents),
        "problems": documents,
    }
    # Signed as it reads back (JSON's own types), so that `--verify` can tell an edited score.
    signed: dict[str, Any] = json.loads(json.dumps(summary, default=str))
    signed["signature"] = examkey.sign(signed)
    write_atomically(folder / "results.json", json.dumps(signed, indent=2) + "\n", mode=0o600)
    write_atomically(folder / "report.html", assessor_page(signed), mode=0o600)
    return signed


def verify_results(folder: Path) -> list[str]:
    """What does not hold in a graded exam's results: their signature (this installation's key,
    as exam.json's), and each submitted file against the SHA-256 it was graded with. Empty when
    all holds: the assessor reads results.json as the grader wrote it."""
    path = folder / "results.json"
    try:
        results = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{folder} holds no graded exam: grade it first with --submit") from None
    except (ValueError, UnicodeDecodeError) as exc:
        return [f"{path} is not the JSON the grader wrote ({exc})"]
    if not isinstance(results, dict):
        return [f"{path} is not the document the grader wrote"]
    found = []
    if not examkey.verify(results):
        found.append(f"{path} does not carry this installation's signature: it was edited after "
                     "grading (or graded elsewhere)")
    elif results.get("folder") != str(folder):
        found.append(f"{path} holds the results of the exam in {results.get('folder')}: copied in "
                     "from another exam")
    problems = results.get("problems")
    for doc in problems if isinstance(problems, list) else []:
        if not isinstance(doc, dict) or not isinstance(doc.get("solution"), str):
            continue  # an unsigned document's shape is already reported above
        kept = folder / "submitted" / Path(doc["solution"]).name
        try:
            digest = hashlib.sha256(kept.read_bytes()).hexdigest()
        except OSError as exc:
            found.append(f"{kept} cannot be read ({exc.strerror}): the graded file is gone")
            continue
        if digest != doc.get("file_sha256"):
            found.append(f"{kept} is not the file graded for problem {doc.get('problem')} "
                         f"(its SHA-256 is {digest[:16]}…, the results say "
                         f"{str(doc.get('file_sha256'))[:16]}…)")
    return found


def assessor_page(summary: dict[str, Any]) -> str:
    e = html.escape
    rows = []
    for doc in summary["problems"]:
        flags = []
        if doc.get("refused"):
            flags.append("refused: " + doc["refused"])
        if doc["late"]:
            flags.append("changed after the deadline")
        if doc["bypass"]:
            flags.append("imports " + ", ".join(doc["bypass"]) + " directly")
        if doc.get("bypass_traffic"):
            flags.append(doc["bypass_traffic"])
        checks = "".join(
            f"<li>{e(c['status'])}: {e(c['name'])} ({c['score']}/{c['max_score']})"
            + (f"<br><small>{e(c['message'])}</small>" if c["message"] else "") + "</li>"
            for c in doc["checks"]
        )
        rows.append(
            f"<section><h2>{e(doc['problem'])} · {e(doc['title'])}: {doc['score']}/{doc['max_score']}</h2>"
            f"<p>{e('; '.join(flags)) or 'no integrity flag'} · {e(_counted(doc))} · seed {doc['seed']} · "
            f"sha256 {e(doc['file_sha256'][:16])}…</p><ul>{checks}</ul></section>"
        )
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>distlab exam</title>"
        "<style>body{font:15px/1.5 system-ui,sans-serif;max-width:900px;margin:2em auto}</style>"
        f"</head><body><h1>Exam: {summary['score']}/{summary['max_score']}</h1>"
        f"<p>started {e(summary['started_at'])} · deadline {e(summary['deadline'])} · submitted "
        f"{e(summary['submitted_at'])}</p><p><small>seal {e(summary['seal'])}"
        + (f": {e(summary['isolation'])}" if summary.get("isolation") else "")
        + f"</small></p>{''.join(rows)}</body></html>"
    )


def _counted(doc: dict[str, Any]) -> str:
    below = doc.get("below_proxy")
    if below is None:
        return "MPI's own counters not used (MPI backend only)"
    return f"MPI's own counters on {below['launches_measured']} launch(es)"


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")
