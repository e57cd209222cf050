"""Evaluation metrics that fraud teams use: pure functions over scores, labels, cards and days.

Threshold-free metrics (ROC AUC, average precision) are pooled over the whole test period. Card precision
at k is the handbook's (Le Borgne et al., section 4.2): an investigator checks k cards a day, so each
test day the cards are ranked by their highest transaction score of the day, and cards already caught
(a fraud found in the top k) on an earlier test day are not checked again. Alert metrics measure the
model's threshold, chosen on the training period to meet an alert budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

#: Cards an investigator checks per day in ``card_precision_at_k``.
DEFAULT_TOP_K = 100
#: Alerts per day the threshold is chosen to raise on the training period.
DEFAULT_ALERTS_PER_DAY = 100

#: Metric names (besides ``card_precision_key(top_k)``), as training and the A/B comparison report them.
ROC_AUC = "roc_auc"
AVERAGE_PRECISION = "average_precision"
ALERT_PRECISION = "alert_precision"
ALERT_RECALL = "alert_recall"
ALERTS_PER_DAY = "alerts_per_day"
BUDGET_ALERT_PRECISION = "budget_alert_precision"
BUDGET_ALERT_RECALL = "budget_alert_recall"


def roc_auc(y_true: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """Area under the ROC curve; NaN when only one class is present (it is undefined)."""
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y_true, dtype=np.int64)
    if len(np.unique(y)) < 2:
        return math.nan
    return float(roc_auc_score(y, np.asarray(scores, dtype=np.float64)))


def average_precision(y_true: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """Average precision (area under the precision-recall curve, step-wise); NaN without any fraud."""
    from sklearn.metrics import average_precision_score

    y = np.asarray(y_true, dtype=np.int64)
    if not y.any():
        return math.nan
    return float(average_precision_score(y, np.asarray(scores, dtype=np.float64)))


def card_precision_key(k: int) -> str:
    """Metric name of card precision at ``k`` (``card_precision_at_100``)."""
    return f"card_precision_at_{k}"


@dataclass(frozen=True)
class CardPrecision:
    """Card precision at k: the mean over test days, and each day's value with its number of cards."""

    k: int
    mean: float
    days: tuple[int, ...]
    per_day: tuple[float, ...]
    cards_per_day: tuple[int, ...]


def card_precision_at_k(
    cards: Sequence[object] | pd.Series | npt.ArrayLike,
    days: npt.ArrayLike,
    y_true: npt.ArrayLike,
    scores: npt.ArrayLike,
    k: int = DEFAULT_TOP_K,
) -> CardPrecision:
    """The handbook's daily card precision at ``k``, averaged over days.

    For each day in increasing order: drop the cards caught on an earlier day; score each remaining
    card by its highest transaction score that day (its fraud flag: any fraud that day); take the
    ``k`` best cards; the day's precision is the number of them with a fraud divided by ``k`` (also
    when fewer than ``k`` cards transacted); those cards count as caught from then on.

    Ties are broken by card identifier (ascending), so the result is deterministic.

    Args:
        cards: card of each transaction.
        days: day (any integer, e.g. days since an epoch) of each transaction.
        y_true: 1 for a fraudulent transaction, else 0.
        scores: fraud score of each transaction.
        k: cards checked per day.
    """
    if k < 1:
        raise ValueError("k must be at least 1")
    frame = pd.DataFrame(
        {
            "card": np.asarray(cards),
            "day": np.asarray(days, dtype=np.int64),
            "fraud": np.asarray(y_true, dtype=np.int64),
            "score": np.asarray(scores, dtype=np.float64),
        }
    )
    caught: set[object] = set()
    day_list: list[int] = []
    per_day: list[float] = []
    n_cards: list[int] = []
    for day, of_day in frame.groupby("day", sort=True):
        remaining = of_day[~of_day["card"].isin(caught)]
        by_card = remaining.groupby("card", sort=True).agg(score=("score", "max"), fraud=("fraud", "max"))
        top = by_card.sort_values("score", ascending=False, kind="stable").head(k)
        found = top.index[top["fraud"] > 0]
        caught.update(found)
        day_list.append(int(day))
        per_day.append(len(found) / k)
        n_cards.append(len(by_card))
    mean = float(np.mean(per_day)) if per_day else math.nan
    return CardPrecision(k, mean, tuple(day_list), tuple(per_day), tuple(n_cards))


def threshold_for_budget(scores: npt.ArrayLike, n_days: float, alerts_per_day: float) -> float:
    """The lowest threshold that raises at most ``alerts_per_day`` alerts a day on ``scores``.

    An alert is a score >= threshold. Ties are never split: when the scores tied at the budget's edge would
    overshoot it, the threshold moves up to the next higher score (coarse models, such as a shallow tree,
    then alert less than the budget). If even the highest score is shared by more rows than the budget,
    it is the threshold, and the budget is exceeded.
    """
    values = np.asarray(scores, dtype=np.float64)
    if len(values) == 0:
        raise ValueError("no scores to choose a threshold from")
    budget = max(1, round(alerts_per_day * n_days))
    distinct, counts = np.unique(values, return_counts=True)  # ascending
    alerts_at_or_above = np.cumsum(counts[::-1])[::-1]  # alerts if the threshold is distinct[i]
    within = np.flatnonzero(alerts_at_or_above <= budget)
    return float(distinct[within[0]] if len(within) else distinct[-1])


@dataclass(frozen=True)
class AlertMetrics:
    """What the alert threshold does on a labelled set."""

    threshold: float
    alerts: int
    alerts_per_day: float
    precision: float
    recall: float


def alert_metrics(
    y_true: npt.ArrayLike, scores: npt.ArrayLike, threshold: float, n_days: float
) -> AlertMetrics:
    """Precision and recall of the alerts ``score >= threshold``; NaN where undefined (no alert, no fraud)."""
    y = np.asarray(y_true, dtype=np.int64) > 0
    alert = np.asarray(scores, dtype=np.float64) >= threshold
    n_alerts = int(alert.sum())
    hits = int((alert & y).sum())
    return AlertMetrics(
        threshold=threshold,
        alerts=n_alerts,
        alerts_per_day=n_alerts / n_days if n_days else math.nan,
        precision=hits / n_alerts if n_alerts else math.nan,
        recall=hits / int(y.sum()) if y.any() else math.nan,
    )
