"""`distlab tune N --param NAME=V1,V2,...`: the Tune step, a sweep of one parameter.

Each value is one free run of the problem's ``main`` program (runtime as in ``distlab run``); the
figure kept is a metric of the run (the virtual time by default, or any field of the run's metrics
summary), or a number that ``main`` returns in a dict. The sweep is written as CSV and drawn as a
PNG, so the learner sees the curve (step time against fusion threshold, AUC against compression).
"""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from .bank import Entry
from .errors import UsageError
from .freerun import RunOptions, RunOutcome, execute
from .runtime.clock.metrics import RunMetrics

METRICS = tuple(f for f in RunMetrics.__dataclass_fields__ if f not in ("bytes_by_pair", "step_times_s"))


def parse_param(text: str) -> tuple[str, list[str]]:
    """'threshold=1024,4096' -> ('threshold', ['1024', '4096'])."""
    if "=" not in text:
        raise UsageError(f"--param takes NAME=V1,V2,...; got {text!r}")
    name, raw = text.split("=", 1)
    values = [v.strip() for v in raw.split(",") if v.strip()]
    if not name.strip() or not values:
        raise UsageError(f"--param takes NAME=V1,V2,...; got {text!r}")
    return name.strip(), values


def metric_value(outcome: RunOutcome, metric: str) -> float | None:
    """The metric of one run: a field of its metrics, or a number main() returned in a dict."""
    if isinstance(outcome.summary, dict) and metric in outcome.summary:
        value = outcome.summary[metric]
        return float(value) if isinstance(value, (int, float)) else None
    if outcome.metrics is not None and metric in METRICS:
        value = getattr(outcome.metrics, metric)
        return float(value) if value is not None else None
    return None


def sweep(
    entry: Entry, solution: Path, base: RunOptions, param: str, values: list[str], metric: str,
    out_prefix: Path, console: Console,
) -> tuple[Path, Path | None]:
    rows: list[tuple[str, float | None, str]] = []
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task(f"{param} sweep", total=len(values))
        for value in values:
            outcome = execute(entry, solution, replace(base, params={**base.params, param: value}))
            if outcome.result.ok:
                got = metric_value(outcome, metric)
                note = "" if got is not None else f"no metric {metric!r} in this run"
            else:
                got, note = None, outcome.result.message
            rows.append((value, got, note))
            progress.advance(bar)
    csv_path = out_prefix.with_suffix(".csv")
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([param, metric, "note"])
        for value, got, note in rows:
            writer.writerow([value, "" if got is None else repr(got), note])
    for value, got, note in rows:
        shown = "-" if got is None else f"{got:.6g}"
        console.print(f"  {param} = {escape(value)}: {metric} = {shown}" + (f"  ({escape(note)})" if note else ""))
    png = plot(rows, param, metric, out_prefix.with_suffix(".png"), f"{entry.number} · {entry.title}")
    return csv_path, png


def plot(rows: list[tuple[str, float | None, str]], param: str, metric: str, path: Path,
         title: str) -> Path | None:
    points = [(v, y) for v, y, _ in rows if y is not None]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display here, nor on CI
    import matplotlib.pyplot as plt

    numeric = all(_is_number(v) for v, _ in points)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    if numeric:
        xs = [float(v) for v, _ in points]
        ax.plot(xs, [y for _, y in points], marker="o")
        positive = [x for x in xs if x > 0]
        if len(positive) == len(xs) and max(xs) / min(xs) >= 100:
            ax.set_xscale("log")
    else:
        ax.bar([v for v, _ in points], [y for _, y in points])
    ax.set_xlabel(param)
    ax.set_ylabel(metric)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _is_number(text: Any) -> bool:
    try:
        return math.isfinite(float(text))
    except (TypeError, ValueError):
        return False
