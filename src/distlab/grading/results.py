"""The results file: a stable, versioned JSON record of one checking session.

Schema ``distlab.results/1`` is documented in docs/results-schema.md. Fields are only ever added
within a major version; a consumer should ignore fields it does not know.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..workspace import write_atomically

SCHEMA = "distlab.results/1"
STATUSES = ("passed", "failed", "error")


@dataclass
class CheckResult:
    name: str
    status: str  # passed | failed | error
    score: int
    max_score: int
    message: str
    seed: int
    wall_s: float
    metrics: dict[str, Any] = field(default_factory=dict)
    details: str = ""


@dataclass
class Results:
    problem: str
    title: str
    solution: str
    backend: str
    seed: int
    started_at: str
    wall_s: float
    checks: list[CheckResult]
    footer: str = ""
    launches: int = 0
    messages: int = 0
    bytes: int = 0
    ranks: list[int] = field(default_factory=list)
    virtual_s: float | None = None  # the headline time a check reported, and its bound
    bound_s: float | None = None
    clock: str = "virtual"  # which clock virtual_s is on: "virtual" or "wall"
    summary: dict[str, Any] | None = None  # metrics of the run behind the headline figure
    # Exam grading only: traffic Open MPI counted that the proxy did not (mpi_monitoring.py).
    below_proxy: dict[str, Any] | None = None
    # The learner's code ran sealed (runtime/seal/): unsealed, it shared its process with the
    # counters the grade reads, which then only advise.
    sealed: bool = False

    @property
    def score(self) -> int:
        return sum(c.score for c in self.checks)

    @property
    def max_score(self) -> int:
        return sum(c.max_score for c in self.checks)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.status == "passed" for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        document = {
            "schema": SCHEMA,
            "problem": self.problem,
            "title": self.title,
            "passed": self.passed,
            "score": self.score,
            "max_score": self.max_score,
            "solution": self.solution,
            "backend": self.backend,
            "seed": self.seed,
            "started_at": self.started_at,
            "wall_s": round(self.wall_s, 3),
            "totals": {
                "launches": self.launches,
                "messages": self.messages,
                "bytes": self.bytes,
                "ranks": self.ranks,
                "virtual_s": self.virtual_s,
                "bound_s": self.bound_s,
                "clock": self.clock,
            },
            "summary": self.summary,
            "footer": self.footer,
            "seal": "on" if self.sealed else "off",
            "checks": [asdict(c) for c in self.checks],
        }
        if self.below_proxy is not None:
            document["below_proxy"] = self.below_proxy
        return document


def write(results: Results | list[Results], path: Path) -> None:
    """Writes atomically: a reader never sees half a file, and a failed write leaves no temp file.
    Several solutions' results (one `distlab check` of several) are written as a list, in order."""
    document = results.to_json() if isinstance(results, Results) else [r.to_json() for r in results]
    write_atomically(path, json.dumps(document, indent=2, default=_plain) + "\n")


def _plain(value: Any) -> Any:
    # NumPy scalars and arrays in metrics become plain JSON values.
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
