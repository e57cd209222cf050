"""The HTML report of an A/B comparison: self-contained, every section, the table's numbers, valid plots."""

from __future__ import annotations

import base64
import re

import numpy as np
import pandas as pd
import pytest

from models.ab_report import METRICS_TABLE_HEADER, SECTIONS, metrics_table_rows, render_html
from models.comparison import CARD_ID, DAY, LABEL, SCORE_A, SCORE_B, TX_ID, Comparison, compare

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NAMES = ("fraud-detector@champion", "fraud-detector v7 <candidate>")


def _frame(rows: int = 2000, days: int = 5, cards: int = 300) -> pd.DataFrame:
    rng = np.random.default_rng(42)
    card = rng.integers(0, cards, rows)
    label = ((rng.random(cards) < 0.05)[card] & (rng.random(rows) < 0.5)).astype(np.int64)
    return pd.DataFrame(
        {
            TX_ID: np.arange(rows),
            CARD_ID: [f"card{c:04d}" for c in card],
            DAY: rng.integers(0, days, rows),
            LABEL: label,
            SCORE_A: 1 / (1 + np.exp(-(2 * label + rng.normal(0, 1, rows) - 3))),
            SCORE_B: 1 / (1 + np.exp(-(3 * label + rng.normal(0, 1, rows) - 3))),
        }
    )


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return _frame()


@pytest.fixture(scope="module")
def comparison(frame: pd.DataFrame) -> Comparison:
    return compare(frame, 0.4, 0.4, top_k=10, n_boot=50, seed=0)


@pytest.fixture(scope="module")
def page(comparison: Comparison, frame: pd.DataFrame) -> str:
    return render_html(comparison, frame, NAMES, "A/B replay 2018-05-01..05")


def test_the_page_is_self_contained_with_every_section(page: str, comparison: Comparison) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert "<title>A/B replay 2018-05-01..05</title>" in page
    assert not re.search(r"(src|href)=\"(?!data:)", page), "no external resources"
    assert "http" not in page
    headings = re.findall(r"<h2>(.*?)</h2>", page)
    assert headings == [s.replace("'", "&#x27;") for s in SECTIONS]
    # The header: both names (escaped), the range of days, rows and frauds.
    assert "fraud-detector@champion" in page
    assert "fraud-detector v7 &lt;candidate&gt;" in page
    assert "<candidate>" not in page
    assert "0..4 (5 days)" in page
    assert f"{comparison.n_rows:,}" in page and f"{comparison.n_frauds:,}" in page
    mcnemar = comparison.mcnemar
    assert f"<td>{mcnemar.a_only_correct:,}</td>" in page
    assert f"{mcnemar.p_value:.4g}" in page


def test_exactly_four_valid_png_plots(page: str) -> None:
    images = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]*)">', page)
    assert len(images) == page.count("<img") == 4
    for encoded in images:
        data = base64.b64decode(encoded, validate=True)
        assert len(data) > 1000
        assert data.startswith(PNG_SIGNATURE)


def test_the_page_shows_the_terminal_table(page: str, comparison: Comparison) -> None:
    rows = metrics_table_rows(comparison)
    assert [row[0] for row in rows] == list(comparison.metric_names)
    assert all(len(row) == len(METRICS_TABLE_HEADER) for row in rows)
    for cell in METRICS_TABLE_HEADER:
        assert f"<th>{cell}</th>" in page
    for row in rows:
        assert "<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" in page


def test_table_cells_are_the_comparison_numbers(comparison: Comparison) -> None:
    auc = comparison.difference("roc_auc")
    row = next(r for r in metrics_table_rows(comparison) if r[0] == "roc_auc")
    assert row == (
        "roc_auc",
        f"{auc.a:.4f}",
        f"{auc.b:.4f}",
        f"{auc.diff:+.4f}",
        f"[{auc.days.low:+.4f}, {auc.days.high:+.4f}]",
        f"[{auc.cards.low:+.4f}, {auc.cards.high:+.4f}]",
    )


def test_undefined_values_show_as_n_a_and_plots_still_render(frame: pd.DataFrame) -> None:
    genuine = frame.assign(**{LABEL: 0})
    result = compare(genuine, 0.4, 0.4, top_k=10, n_boot=10)
    row = next(r for r in metrics_table_rows(result) if r[0] == "roc_auc")
    assert row[1:] == ("n/a",) * 5
    page = render_html(result, genuine, NAMES, "no fraud")
    assert page.count("data:image/png;base64,") == 4
