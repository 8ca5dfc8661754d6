"""`distlab tune N --param NAME=V1,V2,...`: the Tune step, a sweep of one parameter.

Each value is one free run of the problem's ``main`` program (runtime as in ``distlab run``); the
figure kept is a metric of the run (the virtual time by default, or any field of the run's metrics
summary), or a number that ``main`` returns in a dict. Where the problem's programs.py gives a
bound for the metric (``bounds(platform, ranks, **params)``, computed in the supervisor), it is kept
beside each figure and drawn beside the curve. A second metric (``beside``) is drawn on a right-hand
axis of the same plot, for a trade-off one curve cannot show (10: throughput against staleness,
and the loss it costs at equal samples). The sweep is written as CSV and drawn as a PNG, in readable units and
on log axes where the values span decades, so the learner sees the curve (step time against fusion
threshold, AUC against compression) against what the model allows.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
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


def bound_value(outcome: RunOutcome, metric: str) -> float | None:
    """The analytic bound of the metric for this run: what the problem's ``bounds`` computed for it
    in the supervisor (freerun.py), or a ``<metric>_bound`` number main() returned in its dict."""
    value = outcome.bounds.get(metric)
    if value is None and isinstance(outcome.summary, dict):
        value = outcome.summary.get(f"{metric}_bound")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


@dataclass(frozen=True)
class Point:
    value: str  # the parameter's value, as given
    got: float | None  # the metric; None when the run failed or had no such metric
    bound: float | None  # the analytic bound main() reported for it, if any
    note: str
    other: float | None = None  # the second metric (``beside``), if one was asked for


def sweep(
    entry: Entry, solution: Path, base: RunOptions, param: str, values: list[str], metric: str,
    out_prefix: Path, console: Console, beside: str | None = None,
) -> tuple[Path, Path | None]:
    points: list[Point] = []
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task(f"{param} sweep", total=len(values))
        for value in values:
            outcome = execute(entry, solution, replace(base, params={**base.params, param: value}))
            if outcome.result.ok:
                got = metric_value(outcome, metric)
                note = "" if got is not None else f"no metric {metric!r} in this run"
                other = metric_value(outcome, beside) if beside else None
                if beside and other is None:
                    note = "; ".join(filter(None, [note, f"no metric {beside!r} in this run"]))
                points.append(Point(value, got, bound_value(outcome, metric), note, other))
            else:
                points.append(Point(value, None, None, outcome.result.message))
            progress.advance(bar)
    csv_path = out_prefix.with_suffix(".csv")
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([param, metric, "note", "bound", *([beside] if beside else [])])
        for pt in points:
            writer.writerow([pt.value, _cell(pt.got), pt.note, _cell(pt.bound), *([_cell(pt.other)] if beside else [])])
    for pt in points:
        shown = "-" if pt.got is None else f"{pt.got:.6g}"
        bound = "" if pt.bound is None else f" (bound {pt.bound:.6g})"
        second = "" if not beside else f", {beside} = " + ("-" if pt.other is None else f"{pt.other:.6g}")
        console.print(f"  {param} = {escape(pt.value)}: {metric} = {shown}{bound}{escape(second)}"
                      + (f"  ({escape(pt.note)})" if pt.note else ""))
    png = plot(points, param, metric, out_prefix.with_suffix(".png"), f"{entry.number} · {entry.title}", beside)
    return csv_path, png


def _cell(value: float | None) -> str:
    return "" if value is None else repr(value)


def time_unit(metric: str, values: list[float]) -> tuple[float, str]:
    """(scale, unit) for a metric in seconds, as a person would read it; (1, "") otherwise."""
    if not (metric.endswith("_s") or metric == "seconds") or metric.endswith("_per_s") or not values:
        return 1.0, ""
    largest = max(abs(v) for v in values)
    if largest >= 1:
        return 1.0, "s"
    return (1e3, "ms") if largest >= 1e-3 else (1e6, "us")


def spans_decades(values: list[float]) -> bool:
    return all(v > 0 for v in values) and max(values) / min(values) >= 100


def plot(points: list[Point], param: str, metric: str, path: Path, title: str,
         beside: str | None = None) -> Path | None:
    """The measured curve, the analytic bound beside it where main() gave one, in readable units,
    on log axes where the values span decades; the ``beside`` metric on a right-hand axis."""
    measured = [pt for pt in points if pt.got is not None]
    if not measured:
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display here, nor on CI
    import matplotlib.pyplot as plt

    ys = [pt.got for pt in measured if pt.got is not None]
    bounds = [pt for pt in measured if pt.bound is not None]
    scale, unit = time_unit(metric, ys + [pt.bound for pt in bounds if pt.bound is not None])
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    if all(_is_number(pt.value) for pt in measured):
        xs = [float(pt.value) for pt in measured]
        ax.plot(xs, [y * scale for y in ys], marker="o", label=beside and metric or "measured")
        if bounds:
            ax.plot([float(pt.value) for pt in bounds], [(pt.bound or 0.0) * scale for pt in bounds],
                    linestyle="--", color="gray", label="analytic bound")
        if spans_decades(xs):
            ax.set_xscale("log")
        if spans_decades(ys):
            ax.set_yscale("log")
    else:
        ax.bar([pt.value for pt in measured], [y * scale for y in ys], label=beside and metric or "measured")
        if bounds:
            ax.scatter([pt.value for pt in bounds], [(pt.bound or 0.0) * scale for pt in bounds],
                       marker="_", s=400, color="gray", label="analytic bound", zorder=3)
    ax.set_xlabel(param)
    ax.set_ylabel(f"{metric} ({unit})" if unit else metric)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    others = [(pt.value, pt.other) for pt in measured if pt.other is not None]
    if beside and others:
        right = ax.twinx()
        where = [float(value) if _is_number(value) else value for value, _ in others]
        right.plot(where, [other for _, other in others], marker="s", color="tab:red", label=beside)
        right.set_ylabel(beside, color="tab:red")
        if all(other >= 0 for _, other in others):  # from zero: a 0.3% wobble must not look like a trend
            right.set_ylim(0, 1.15 * max(other for _, other in others) or 1.0)
        lines, labels = ax.get_legend_handles_labels()
        more, more_labels = right.get_legend_handles_labels()
        ax.legend(lines + more, labels + more_labels)
    elif bounds:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _is_number(text: Any) -> bool:
    try:
        return math.isfinite(float(text))
    except (TypeError, ValueError):
        return False
