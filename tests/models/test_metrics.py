"""Metric functions against cases computed by hand."""

from __future__ import annotations

import math

import pytest

from models.metrics import (
    alert_metrics,
    average_precision,
    card_precision_at_k,
    roc_auc,
    threshold_for_budget,
)


def test_roc_auc_and_average_precision_by_hand() -> None:
    y, scores = [0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]
    # 3 of the 4 (fraud, genuine) pairs are ordered right.
    assert roc_auc(y, scores) == pytest.approx(0.75)
    # Ranked: .8 fraud (P=1, R=.5), .4 genuine, .35 fraud (P=2/3, R=1): AP = .5 * 1 + .5 * 2/3.
    assert average_precision(y, scores) == pytest.approx(0.5 + 1 / 3)


def test_roc_auc_counts_a_tie_as_half() -> None:
    assert roc_auc([0, 1], [0.5, 0.5]) == pytest.approx(0.5)


def test_undefined_metrics_are_nan() -> None:
    assert math.isnan(roc_auc([0, 0], [0.1, 0.2]))
    assert math.isnan(average_precision([0, 0], [0.1, 0.2]))


def test_card_precision_drops_cards_caught_on_earlier_days_and_breaks_ties_by_card() -> None:
    rows = [
        # day 0: card scores A .9 (fraud), B .8, C .7 (fraud); top 2 = A, B -> 1/2; A is caught.
        ("A", 0, 1, 0.9),
        ("A", 0, 0, 0.1),
        ("B", 0, 0, 0.8),
        ("C", 0, 1, 0.7),
        # day 1: A is gone despite .95; B .6 (fraud) and D .6 tie, card order puts B first; C .5.
        # top 2 = B, D -> 1/2; B is caught.
        ("A", 1, 1, 0.95),
        ("B", 1, 1, 0.6),
        ("D", 1, 0, 0.6),
        ("C", 1, 0, 0.5),
        # day 2: B is gone; only C is left (no fraud): 0 of k = 2.
        ("B", 2, 1, 0.9),
        ("C", 2, 0, 0.2),
    ]
    cards, days, y, scores = zip(*rows, strict=True)
    result = card_precision_at_k(cards, days, y, scores, k=2)
    assert result.per_day == (0.5, 0.5, 0.0)
    assert result.mean == pytest.approx(1 / 3)
    assert result.days == (0, 1, 2)
    assert result.cards_per_day == (3, 3, 1)


def test_card_precision_tie_at_the_cut_goes_to_the_lower_card_id() -> None:
    # k = 1, "B" (genuine) and "D" (fraud) tie: B is checked, the day scores 0.
    result = card_precision_at_k(["D", "B"], [0, 0], [1, 0], [0.6, 0.6], k=1)
    assert result.per_day == (0.0,)
    # The card's score is its highest of the day, its fraud flag any fraud that day.
    result = card_precision_at_k(["D", "D", "B"], [0, 0, 0], [1, 0, 0], [0.1, 0.7, 0.6], k=1)
    assert result.per_day == (1.0,)


def test_a_card_checked_without_fraud_is_not_caught() -> None:
    # Day 0: A is in the top 1 but genuine, so it is checked again on day 1, where it is a fraud.
    result = card_precision_at_k(["A", "A"], [0, 1], [0, 1], [0.9, 0.9], k=1)
    assert result.per_day == (0.0, 1.0)


def test_threshold_meets_the_alert_budget_without_splitting_ties() -> None:
    scores = [0.9, 0.8, 0.8, 0.7, 0.1]
    # 2 alerts allowed: .8 would raise 3, so the threshold stays at .9 (1 alert).
    assert threshold_for_budget(scores, n_days=1, alerts_per_day=2) == 0.9
    assert threshold_for_budget(scores, n_days=1, alerts_per_day=3) == 0.8
    assert threshold_for_budget(scores, n_days=2, alerts_per_day=2) == 0.7
    assert threshold_for_budget(scores, n_days=1, alerts_per_day=100) == 0.1
    # The top score alone exceeds the budget: it is the threshold anyway.
    assert threshold_for_budget([0.5, 0.5, 0.5], n_days=1, alerts_per_day=1) == 0.5


def test_alert_precision_and_recall_by_hand() -> None:
    alerts = alert_metrics([1, 0, 1, 0, 0], [0.9, 0.8, 0.8, 0.7, 0.1], threshold=0.8, n_days=2)
    assert (alerts.alerts, alerts.alerts_per_day) == (3, 1.5)
    assert alerts.precision == pytest.approx(2 / 3)
    assert alerts.recall == 1.0
    none = alert_metrics([0, 1], [0.1, 0.2], threshold=0.5, n_days=1)
    assert none.alerts == 0
    assert math.isnan(none.precision)
    assert none.recall == 0.0
