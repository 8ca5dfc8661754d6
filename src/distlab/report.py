"""`distlab report N`: one self-contained HTML page about a problem and the learner's work on it.

Sections: the last check results with each performance figure beside its bound and each check's
figures; the problem's own picture, where its programs.py draws one from the free run (problem
11: the server's tree with the learner's ring on it); a per-rank timeline of a free run on the
virtual clock (drawn as inline SVG); the metrics of that run; the sweep curves the learner made
with `distlab tune`; the scenario card. Everything is inline (CSS, SVG,
PNG as data URIs), so the file can be mailed or attached to an assessment.
"""

from __future__ import annotations

import base64
import datetime
import html
import json
from pathlib import Path
from typing import Any

from .bank import Entry
from .freerun import RunOptions, RunOutcome, execute
from .runtime.clock.metrics import format_seconds
from .runtime.trace.chrome import virtual_spans
from .workspace import Workspace

# What a rank's time went to, as the metrics count it (compute + communication + idle = the run's
# virtual time, on every rank), and how the timeline draws each part.
PARTS = {
    "compute": ("#4c78a8", "compute: declared work"),
    "communication": ("#f58518", "communication: blocked in a call (a Wait, a collective, a blocking "
                                 "send or receive)"),
    "idle": ("#d0d0d0", "idle: finished, waiting for the slowest rank"),
}
DRAWN_AS = {"compute": "compute", "comm": "communication", "wait": "communication"}

STYLE = """
body { font: 15px/1.5 system-ui, sans-serif; max-width: 1000px; margin: 2em auto; color: #222; }
h1 { font-size: 1.6em; margin-bottom: 0; } h2 { border-bottom: 1px solid #ddd; margin-top: 2em; }
.meta { color: #666; } table { border-collapse: collapse; width: 100%; }
td, th { border-bottom: 1px solid #eee; padding: 4px 8px; text-align: left; vertical-align: top; }
.passed { color: #1a7f37; font-weight: 600; } .failed, .error { color: #cf222e; font-weight: 600; }
pre { background: #f6f8fa; padding: 8px; white-space: pre-wrap; font-size: 13px; }
.figures td { border: none; padding: 0 8px 0 0; font-size: 13px; color: #444; }
.legend span { display: inline-block; margin-right: 1em; } .swatch { width: 12px; height: 12px;
display: inline-block; margin-right: 4px; vertical-align: middle; }
"""


def _e(text: Any) -> str:
    return html.escape(str(text))


def card_section(entry: Entry) -> str:
    card = entry.card()
    s = card.scenario
    items = lambda xs: "<ul>" + "".join(f"<li>{_e(x)}</li>" for x in xs) + "</ul>"  # noqa: E731
    steps = "".join(
        f"<li><b>{name}</b>: {_e(text)}</li>"
        for name, text in (("Define", card.steps.define), ("Instrument", card.steps.instrument),
                           ("Simulate", card.steps.simulate), ("Tune", card.steps.tune))
    )
    return (
        f'<section id="card"><h2>Scenario</h2><p>{_e(s.background.strip())}</p>'
        f"<h3>Constraints</h3>{items(s.constraints)}<h3>Fault injection</h3>{items(s.faults)}"
        f"<h3>Monitoring metrics</h3>{items(s.metrics)}<h3>The DIST path</h3><ul>{steps}</ul></section>"
    )


def results_section(results: dict[str, Any] | None, number: str) -> str:
    if results is None:
        return (f'<section id="results"><h2>Check results</h2><p>No results yet: run '
                f"<code>distlab check {number}</code>.</p></section>")
    rows = "".join(
        f'<tr><td class="{_e(c["status"])}">{_e(c["status"])}</td><td>{_e(c["name"])}</td>'
        f'<td>{c["score"]}/{c["max_score"]}</td><td>'
        + (f'<pre>{_e(c["message"])}</pre>' if c["message"] else "")
        + _figures(c.get("metrics") or {}) + "</td></tr>"
        for c in results["checks"]
    )
    totals = results.get("totals", {})
    perf = ""
    if totals.get("virtual_s") is not None and totals.get("bound_s"):
        measured, bound = totals["virtual_s"], totals["bound_s"]
        perf = (f'<p id="performance"><b>Performance</b> ({_e(totals.get("clock", "virtual"))} clock): '
                f"{format_seconds(measured)} against the bound {format_seconds(bound)} "
                f"({measured / bound:.3f}x)</p>")
    return (
        f'<section id="results"><h2>Check results</h2><p class="meta">{_e(results["footer"])}<br>'
        f'solution {_e(results["solution"])} · {_e(results["started_at"])}</p>{perf}'
        f"<table><tr><th>status</th><th>check</th><th>score</th><th>message</th></tr>{rows}</table>"
        "</section>"
    )


def _figures(metrics: dict[str, Any]) -> str:
    """A check's recorded figures (t.metric), as the side-by-side numbers a problem reports: its
    measured times, bounds, bytes and costs."""
    if not metrics:
        return ""
    cells = "".join(f"<tr><td>{_e(name)}</td><td>{_e(value)}</td></tr>" for name, value in metrics.items())
    return f'<table class="figures">{cells}</table>'


def timeline_svg(outcome: RunOutcome, width: int = 940) -> str:
    """Each rank a row on the virtual clock: its compute, its time blocked in communication, and
    its idle time after its last call, in the colours of the legend."""
    assert outcome.played is not None
    played = outcome.played
    spans = virtual_spans(outcome.traces, played)
    ranks = sorted(outcome.traces)
    end = played.makespan or 1e-9
    row, left = 22, 70
    height = row * len(ranks) + 30
    scale = (width - left - 10) / end

    def bar(rank: int, start: float, seconds: float, part: str, title: str) -> str:
        y = ranks.index(rank) * row + 4
        x, w = left + start * scale, max(seconds * scale, 0.5)
        return (f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row - 6}" fill="{PARTS[part][0]}" '
                f'data-part="{part}"><title>{_e(title)} {format_seconds(start)} + '
                f"{format_seconds(seconds)}</title></rect>")

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="per-rank timeline">']
    for i, rank in enumerate(ranks):
        y = i * row + 4
        parts.append(f'<text x="4" y="{y + 14}" font-size="12">rank {rank}</text>')
        parts.append(f'<rect x="{left}" y="{y}" width="{width - left - 10}" height="{row - 6}" fill="#f7f7f7"/>')
    for span in spans:
        if span.duration_s > 0 and span.category in DRAWN_AS:
            parts.append(bar(span.rank, span.start_s, span.duration_s, DRAWN_AS[span.category], span.name))
    for rank in ranks:
        idle = played.idle_s.get(rank, 0.0)
        if idle > 0:
            parts.append(bar(rank, played.finish[rank], idle, "idle", "idle"))
    axis_y = row * len(ranks) + 20
    parts.append(f'<text x="{left}" y="{axis_y}" font-size="11">0</text>')
    parts.append(f'<text x="{width - 10}" y="{axis_y}" font-size="11" text-anchor="end">'
                 f"{format_seconds(end)}</text></svg>")
    return "".join(parts)


def shares(outcome: RunOutcome) -> dict[str, float]:
    """What share of the ranks' time each part took (they add up to 1), from the same replay the
    timeline draws and the metrics count."""
    assert outcome.played is not None
    played, ranks = outcome.played, len(outcome.traces)
    total = played.makespan * ranks
    if total <= 0:
        return dict.fromkeys(PARTS, 0.0)
    return {"compute": sum(played.compute_s.values()) / total,
            "communication": sum(played.comm_s.values()) / total,
            "idle": sum(played.idle_s.values()) / total}


def timeline_section(outcome: RunOutcome | None, note: str) -> str:
    if outcome is None or outcome.played is None:
        return f'<section id="timeline"><h2>Timeline</h2><p>{_e(note)}</p></section>'
    share = shares(outcome)
    legend = "".join(f'<span data-part="{part}"><i class="swatch" style="background:{colour}"></i>'
                     f"{_e(meaning)} ({share[part]:.1%})</span>"
                     for part, (colour, meaning) in PARTS.items())
    metrics = outcome.metrics
    assert metrics is not None
    lines = "".join(f"<li>{_e(line)}</li>" for line in metrics.lines())
    return (f'<section id="timeline"><h2>Timeline of a free run (virtual clock)</h2>'
            f'<p class="meta">{_e(note)}</p><div class="legend">{legend}</div>{timeline_svg(outcome)}'
            f'<h3>Metrics</h3><ul id="metrics">{lines}</ul></section>')


def sweeps_section(ws: Workspace, number: str) -> str:
    images = sorted((ws.root / "tune").glob(f"{number}-*.png")) if (ws.root / "tune").exists() else []
    if not images:
        return (f'<section id="sweeps"><h2>Sweeps</h2><p>No sweep yet: try '
                f"<code>distlab tune {number} --param NAME=V1,V2,...</code>.</p></section>")
    figures = "".join(
        f'<figure><img alt="{_e(p.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{_e(p.stem)}</figcaption></figure>'
        for p in images
    )
    return f'<section id="sweeps"><h2>Sweeps</h2>{figures}</section>'


def figure_section(entry: Entry, outcome: RunOutcome | None) -> str:
    """The picture that explains the problem, when its programs.py draws one: ``figure(summary)``
    runs here, in the checker's process, on the data the free run's rank 0 returned (never markup
    from a rank: the learner's code runs there), and returns SVG."""
    if outcome is None or not isinstance(outcome.summary, dict):
        return ""
    from .runtime.jobspec import import_program_module, problem_programs

    draw = getattr(import_program_module(*problem_programs(entry.path)), "figure", None)
    svg = draw(outcome.summary) if callable(draw) else ""
    if not svg:
        return ""
    return f'<section id="figure"><h2>The picture</h2>{svg}</section>'


def build(entry: Entry, solution: Path, ws: Workspace, ranks: int | None = None) -> str:
    results_file = ws.results_path(entry)
    results = json.loads(results_file.read_text()) if results_file.exists() else None
    outcome, note = None, ""
    ranks = ranks or entry.card().free_run_ranks
    try:
        outcome = execute(entry, solution, RunOptions(ranks=ranks))
        note = f"{ranks} ranks, {solution.name}, platform {outcome.platform.name}"
        if not outcome.result.ok:
            note = f"the free run ended badly: {outcome.result.message}"
    except Exception as exc:  # noqa: BLE001 - the page is still worth having without a timeline
        note = f"no timeline: {exc}"
    card = entry.card()
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>distlab report {entry.number}</title><style>{STYLE}</style></head><body>"
        f"<h1>{entry.number} · {_e(entry.title)}</h1>"
        f'<p class="meta">{_e(card.tier)} tier · platform {_e(card.platform)} · made {stamp}</p>'
        f"{results_section(results, entry.number)}{figure_section(entry, outcome)}"
        f"{timeline_section(outcome, note)}"
        f"{sweeps_section(ws, entry.number)}{card_section(entry)}</body></html>"
    )
