"""The A/B comparison as one self-contained HTML page, and the rows of its metrics table for terminals.

The page needs nothing but a browser: styles inline, plots as base64 PNG images drawn with matplotlib's
object API (``Figure``, never pyplot: no global state, safe in threads). ``metrics_table_rows`` gives the
cells of the metrics table, so the CLI's table and the page show the same strings. Matplotlib and
scikit-learn are imported when a page is drawn, not with the module: the CLI imports it for its table, and
every ``fraud`` command would otherwise pay a second for them at start.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from models.comparison import (
    ALERTS_PER_DAY,
    CONFIDENCE,
    LABEL,
    SCORE_A,
    SCORE_B,
    Comparison,
    ComparisonError,
    ModelMetrics,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Header of ``metrics_table_rows``.
METRICS_TABLE_HEADER = ("metric", "A", "B", "B - A", "95% CI days", "95% CI cards")
#: Section headings of the page, in order.
SECTIONS = (
    "Metrics",
    "Precision-recall curves",
    "Card precision per day",
    "Score distributions",
    "Alert overlap",
    "McNemar's test",
)
#: Colours of A and B in every plot.
COLOURS = ("tab:blue", "tab:orange")
_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #eee; text-align: right; }
th:first-child, td:first-child { text-align: left; }
img { max-width: 100%; } .note { color: #666; font-size: 0.85em; }
"""


def metrics_table_rows(comparison: Comparison) -> list[tuple[str, ...]]:
    """One row per compared metric: name, A, B, B - A and the two 95% intervals, formatted (``n/a``
    where undefined). The header is ``METRICS_TABLE_HEADER``."""
    rows: list[tuple[str, ...]] = []
    for d in comparison.differences:
        digits = 2 if d.metric == ALERTS_PER_DAY else 4
        rows.append(
            (
                d.metric,
                _number(d.a, digits),
                _number(d.b, digits),
                _number(d.diff, digits, signed=True),
                _interval(d.days.low, d.days.high, digits),
                _interval(d.cards.low, d.cards.high, digits),
            )
        )
    return rows


def render_html(comparison: Comparison, frame: pd.DataFrame, names: tuple[str, str], title: str) -> str:
    """The comparison as one HTML page with no external resources.

    Args:
        comparison: the result of ``models.comparison.compare`` on ``frame``.
        frame: the compared frame (labels and both scores, for the curves and distributions).
        names: how to call A and B (e.g. ``fraud-detector@champion`` and ``fraud-detector v7``).
        title: the page title.

    Raises:
        ComparisonError: ``frame`` is not the compared frame (another number of rows).
    """
    if len(frame) != comparison.n_rows:
        raise ComparisonError(f"the frame has {len(frame)} rows, the comparison {comparison.n_rows}")
    y = frame[LABEL].to_numpy(dtype=np.int64)
    scores = (frame[SCORE_A].to_numpy(dtype=np.float64), frame[SCORE_B].to_numpy(dtype=np.float64))
    models = (comparison.a, comparison.b)
    labels = (f"A: {names[0]}", f"B: {names[1]}")
    sections = (
        _metrics_section(comparison),
        _image(_precision_recall_figure(y, scores, models, labels), "precision-recall curves"),
        _image(_card_precision_figure(comparison, labels), "card precision per day"),
        _image(_score_figure(y, scores, models, labels), "score distributions"),
        _overlap_section(comparison, names),
        _mcnemar_section(comparison),
    )
    body = "\n".join(
        f'<section id="{_slug(heading)}">\n<h2>{html.escape(heading)}</h2>\n{content}\n</section>'
        for heading, content in zip(SECTIONS, sections, strict=True)
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"{_header(comparison, names, title)}\n{body}\n</body>\n</html>\n"
    )


# --- sections ----------------------------------------------------------------------------------------


def _header(comparison: Comparison, names: tuple[str, str], title: str) -> str:
    days = comparison.days
    a, b = comparison.a, comparison.b
    return (
        f"<h1>{html.escape(title)}</h1>\n<table>\n"
        f"<tr><td>A (champion)</td><td>{html.escape(names[0])}</td></tr>\n"
        f"<tr><td>B (challenger)</td><td>{html.escape(names[1])}</td></tr>\n"
        f"<tr><td>days</td><td>{days[0]}..{days[-1]} ({len(days)} days)</td></tr>\n"
        f"<tr><td>transactions</td><td>{comparison.n_rows:,}</td></tr>\n"
        f"<tr><td>frauds</td><td>{comparison.n_frauds:,}</td></tr>\n"
        f"<tr><td>own thresholds</td><td>A {a.alerts.threshold:.4g}, B {b.alerts.threshold:.4g}</td></tr>\n"
        f"<tr><td>equal budget</td><td>{comparison.alerts_per_day_budget:.2f} alerts/day: thresholds "
        f"A {a.budget_alerts.threshold:.4g} ({a.budget_alerts.alerts:,} alerts), "
        f"B {b.budget_alerts.threshold:.4g} ({b.budget_alerts.alerts:,} alerts)</td></tr>\n"
        f"<tr><td>bootstrap</td><td>{comparison.n_boot} replicates a scheme, seed {comparison.seed}"
        "</td></tr>\n</table>"
    )


def _metrics_section(comparison: Comparison) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in METRICS_TABLE_HEADER)
    rows = "\n".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
        for row in metrics_table_rows(comparison)
    )
    least = min((min(d.days.replicates, d.cards.replicates) for d in comparison.differences), default=0)
    return (
        f"<table>\n<tr>{head}</tr>\n{rows}\n</table>\n"
        f'<p class="note">{CONFIDENCE:.0%} percentile bootstrap intervals of B - A, resampling whole days '
        f"and whole cards ({comparison.n_boot} replicates each; replicates where a metric is undefined "
        f"are left out, the fewest used: {least}). Card precision at {comparison.top_k}; "
        "budget_* metrics at thresholds giving both models the same alerts per day.</p>"
    )


def _overlap_section(comparison: Comparison, names: tuple[str, str]) -> str:
    agreement = comparison.agreement
    cells = (
        ("both", agreement.both, agreement.frauds_both),
        (f"A only ({names[0]})", agreement.a_only, agreement.frauds_a_only),
        (f"B only ({names[1]})", agreement.b_only, agreement.frauds_b_only),
        ("neither", agreement.neither, agreement.frauds_neither),
    )
    rows = "\n".join(
        f"<tr><td>{html.escape(name)}</td><td>{count:,}</td><td>{frauds:,}</td></tr>"
        for name, count, frauds in cells
    )
    figure = _overlap_figure(comparison)
    return (
        f"{_image(figure, 'alert overlap')}\n<table>\n<tr><th>alerted by</th><th>transactions</th>"
        f"<th>frauds</th></tr>\n{rows}\n</table>\n"
        '<p class="note">Alerts at each model\'s own threshold.</p>'
    )


def _mcnemar_section(comparison: Comparison) -> str:
    test = comparison.mcnemar
    method = "exact binomial" if test.exact else "chi-squared, 1 degree of freedom"
    return (
        "<table>\n"
        f"<tr><td>A right, B wrong</td><td>{test.a_only_correct:,}</td></tr>\n"
        f"<tr><td>B right, A wrong</td><td>{test.b_only_correct:,}</td></tr>\n"
        f"<tr><td>statistic (continuity-corrected)</td><td>{test.statistic:.4f}</td></tr>\n"
        f"<tr><td>p-value ({method})</td><td>{test.p_value:.4g}</td></tr>\n</table>\n"
        '<p class="note">Alert decisions at each model\'s own threshold; a decision is right when it '
        "matches the label. A small p-value says the two models are wrong on different numbers of "
        "transactions; it says nothing of which errors cost more.</p>"
    )


# --- plots -------------------------------------------------------------------------------------------


def _precision_recall_figure(
    y: np.ndarray, scores: Sequence[np.ndarray], models: Sequence[ModelMetrics], labels: Sequence[str]
) -> Figure:
    from matplotlib.figure import Figure
    from sklearn.metrics import precision_recall_curve

    figure = Figure(figsize=(6, 5))
    axes = figure.subplots()
    if y.any():
        for score, model, label, colour in zip(scores, models, labels, COLOURS, strict=True):
            precision, recall, _ = precision_recall_curve(y, score)
            axes.step(
                recall,
                precision,
                where="post",
                color=colour,
                label=f"{label} (AP {model.average_precision:.3f})",
            )
            for at, marker in ((model.alerts, "o"), (model.budget_alerts, "s")):
                if not (math.isnan(at.recall) or math.isnan(at.precision)):
                    axes.plot(at.recall, at.precision, marker=marker, color=colour, linestyle="none")
        axes.axhline(float(np.mean(y)), linestyle=":", color="grey", label="fraud rate")
        axes.plot([], [], marker="o", color="black", linestyle="none", label="own threshold")
        axes.plot([], [], marker="s", color="black", linestyle="none", label="equal budget")
        axes.legend(loc="upper right", fontsize=8)
    else:
        axes.text(0.5, 0.5, "no fraud: the curve is undefined", ha="center", va="center")
    axes.set(xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02))
    return figure


def _card_precision_figure(comparison: Comparison, labels: Sequence[str]) -> Figure:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4))
    axes = figure.subplots()
    days = np.asarray(comparison.a.card_precision.days)
    positions = np.arange(len(days))
    for shift, model, label, colour in zip(
        (-0.2, 0.2), (comparison.a, comparison.b), labels, COLOURS, strict=True
    ):
        cards = model.card_precision
        axes.bar(positions + shift, cards.per_day, width=0.4, color=colour, label=label)
        axes.axhline(cards.mean, linestyle="--", color=colour, label=f"mean {cards.mean:.3f}")
    axes.set_xticks(positions, [str(d) for d in days])
    axes.set(xlabel="day", ylabel=f"card precision at {comparison.top_k}", ylim=(0, 1))
    axes.legend(loc="upper right", fontsize=8)
    return figure


def _score_figure(
    y: np.ndarray, scores: Sequence[np.ndarray], models: Sequence[ModelMetrics], labels: Sequence[str]
) -> Figure:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4))
    panels = figure.subplots(1, 2, sharey=False)
    low = min(float(s.min()) for s in scores)
    high = max(float(s.max()) for s in scores)
    bins = np.linspace(low, high if high > low else low + 1, 41)
    fraud = y > 0
    for axes, score, model, label in zip(panels, scores, models, labels, strict=True):
        for subset, name, colour in ((~fraud, "genuine", "tab:green"), (fraud, "fraud", "tab:red")):
            if subset.any():
                axes.hist(score[subset], bins=bins, density=True, alpha=0.5, color=colour, label=name)
        axes.axvline(model.alerts.threshold, color="black", label="own threshold")
        axes.axvline(model.budget_alerts.threshold, color="black", linestyle="--", label="equal budget")
        axes.set(title=label, xlabel="score", ylabel="density")
        axes.title.set_fontsize(9)
        axes.legend(loc="upper center", fontsize=8)
    figure.tight_layout()
    return figure


def _overlap_figure(comparison: Comparison) -> Figure:
    from matplotlib.figure import Figure

    agreement = comparison.agreement
    cells = ("both", "A only", "B only")
    frauds = np.array([agreement.frauds_both, agreement.frauds_a_only, agreement.frauds_b_only])
    totals = np.array([agreement.both, agreement.a_only, agreement.b_only])
    figure = Figure(figsize=(6, 3))
    axes = figure.subplots()
    axes.barh(cells, frauds, color="tab:red", label="fraud")
    axes.barh(cells, totals - frauds, left=frauds, color="tab:grey", label="genuine")
    axes.invert_yaxis()
    axes.set(xlabel=f"alerted transactions (neither: {agreement.neither:,})")
    axes.legend(loc="upper right", fontsize=8)
    figure.tight_layout()
    return figure


# --- formatting --------------------------------------------------------------------------------------


def _image(figure: Figure, alt: str) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{encoded}">'


def _number(value: float, digits: int, signed: bool = False) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _interval(low: float, high: float, digits: int) -> str:
    if math.isnan(low) or math.isnan(high):
        return "n/a"
    return f"[{low:+.{digits}f}, {high:+.{digits}f}]"


def _slug(heading: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in heading.lower()).strip("-")
