"""The paired bootstrap of ``models.comparison``: every metric of both models recomputed on many resamples
of whole days or whole cards at a time.

A resample is a vector of multiplicities (how often each day or card was drawn), so the metrics are
computed as weighted sums over rankings sorted once, for many resamples at a time; each gives the same
numbers as the metric functions of ``models.metrics`` on the resampled rows. Card precision under day
resampling is the mean of the drawn days' values (a day's value depends on the cards caught on earlier
days); under card resampling it is recomputed with the drawn copies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from contracts.arrays import FloatArray, IntArray
from models.metrics import (
    ALERT_PRECISION,
    ALERT_RECALL,
    ALERTS_PER_DAY,
    AVERAGE_PRECISION,
    BUDGET_ALERT_PRECISION,
    BUDGET_ALERT_RECALL,
    ROC_AUC,
    card_precision_key,
)

#: Resample weights held in memory at once (replicates x rows), about 16 MB of float64.
_CHUNK_CELLS = 2_000_000


@dataclass(frozen=True)
class PairedRows:
    """The compared transactions as arrays: each row's label, both models' scores, its day and card, and
    the days and cards coded 0.. in ascending order of day and card id."""

    label: IntArray
    score_a: FloatArray
    score_b: FloatArray
    day: IntArray
    card: npt.NDArray[Any]
    days: IntArray
    day_code: IntArray
    card_code: IntArray
    n_cards: int


def counts(draws: IntArray, n_units: int) -> IntArray:
    """Multiplicity of each unit (day or card) in each replicate's draws: (replicates, units)."""
    replicates = draws.shape[0]
    offsets = (np.arange(replicates, dtype=np.int64) * n_units)[:, None]
    flat = np.bincount((draws + offsets).ravel(), minlength=replicates * n_units)
    return flat.reshape(replicates, n_units).astype(np.int64)


@dataclass(frozen=True)
class Ranking:
    """One model's rows sorted by ascending score, cut into groups of tied scores."""

    order: IntArray
    starts: IntArray
    fraud: FloatArray
    #: Tie groups at or above the model's own threshold (counted from the highest score).
    alerted_groups: int

    @classmethod
    def of(cls, scores: FloatArray, label: IntArray, threshold: float) -> Ranking:
        order = np.argsort(scores, kind="stable").astype(np.int64)
        ranked = scores[order]
        starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]]).astype(np.int64)
        distinct = ranked[starts]
        alerted = len(distinct) - int(np.searchsorted(distinct, threshold, side="left"))
        return cls(order, starts, label[order].astype(np.float64), alerted)


@dataclass(frozen=True)
class CardDays:
    """Per day (ascending), the cards that transacted by descending highest score of the day (ties by
    card id, as ``card_precision_at_k`` orders them) and whether the card had a fraud that day."""

    cards: tuple[IntArray, ...]
    fraud: tuple[IntArray, ...]

    @classmethod
    def of(cls, data: PairedRows, scores: FloatArray) -> CardDays:
        grouped = (
            pd.DataFrame({"day": data.day_code, "card": data.card_code, "score": scores, "fraud": data.label})
            .groupby(["day", "card"], sort=True)
            .agg(score=("score", "max"), fraud=("fraud", "max"))
            .reset_index()
        )
        day, card = grouped["day"].to_numpy(), grouped["card"].to_numpy(dtype=np.int64)
        order = np.lexsort((card, -grouped["score"].to_numpy(), day))
        day, card, fraud = day[order], card[order], grouped["fraud"].to_numpy(dtype=np.int64)[order]
        bounds = np.flatnonzero(np.diff(day)) + 1
        return cls(tuple(np.split(card, bounds)), tuple(np.split(fraud, bounds)))


def weighted_row_metrics(
    ranking: Ranking, weights: FloatArray, n_days: int, budget: int
) -> dict[str, FloatArray]:
    """The row metrics of each replicate, rows weighted by their multiplicity ((replicates, rows), in the
    ranking's order); the same numbers as the metric functions on the resampled rows."""
    pos = weights * ranking.fraud
    frauds = np.add.reduceat(pos, ranking.starts, axis=1)  # per tie group, ascending scores
    genuine = np.add.reduceat(weights - pos, ranking.starts, axis=1)
    total_frauds, total_genuine = frauds.sum(axis=1), genuine.sum(axis=1)
    below = np.cumsum(genuine, axis=1) - genuine
    hits = np.cumsum(frauds[:, ::-1], axis=1)  # frauds alerted with each group as the threshold
    alerts = hits + np.cumsum(genuine[:, ::-1], axis=1)
    rows = np.arange(weights.shape[0])
    # Threshold for the budget: the lowest score with at most ``budget`` alerts (the highest score if
    # even it has more), as ``threshold_for_budget``; ``alerts`` grows along each row.
    at_budget = np.maximum((alerts <= budget).sum(axis=1) - 1, 0)
    budget_hits, budget_alerts = hits[rows, at_budget], alerts[rows, at_budget]
    if ranking.alerted_groups:
        own_hits, own_alerts = hits[:, ranking.alerted_groups - 1], alerts[:, ranking.alerted_groups - 1]
    else:
        own_hits = own_alerts = np.zeros(len(rows))
    with np.errstate(divide="ignore", invalid="ignore"):
        precision_curve = np.where(alerts > 0, hits / alerts, 0.0)
        return {
            ROC_AUC: (frauds * (below + 0.5 * genuine)).sum(axis=1) / (total_frauds * total_genuine),
            AVERAGE_PRECISION: (frauds[:, ::-1] * precision_curve).sum(axis=1) / total_frauds,
            ALERT_PRECISION: own_hits / own_alerts,
            ALERT_RECALL: own_hits / total_frauds,
            ALERTS_PER_DAY: own_alerts / n_days,
            BUDGET_ALERT_PRECISION: budget_hits / budget_alerts,
            BUDGET_ALERT_RECALL: budget_hits / total_frauds,
        }


def weighted_card_precision(card_days: CardDays, card_counts: IntArray, k: int) -> FloatArray:
    """Card precision at ``k`` of each replicate, each card present as often as it was drawn: the copies
    of a card are distinct cards that tie, and a copy caught on a day is not checked again."""
    remaining = card_counts.copy()
    found_total = np.zeros(card_counts.shape[0])
    for cards, fraud in zip(card_days.cards, card_days.fraud, strict=True):
        copies = remaining[:, cards]
        before = np.cumsum(copies, axis=1) - copies
        checked = np.clip(k - before, 0, copies)
        caught = checked * fraud
        found_total += caught.sum(axis=1) / k
        remaining[:, cards] -= caught
    return found_total / len(card_days.cards)


class Bootstrap:
    """Differences B - A of every metric on resamples of days or cards, many replicates at a time."""

    def __init__(
        self,
        data: PairedRows,
        thresholds: tuple[float, float],
        card_precision_per_day: tuple[Sequence[float], Sequence[float]],
        top_k: int,
        budget: int,
    ):
        """``thresholds``: each model's own alert threshold; ``card_precision_per_day``: each model's card
        precision at ``top_k`` of each day on the whole frame; ``budget``: the alerts of the equal budget."""
        self._data = data
        self._top_k = top_k
        self._budget = budget
        self._card_key = card_precision_key(top_k)
        scores = (data.score_a, data.score_b)
        self._rankings = tuple(
            Ranking.of(s, data.label, threshold) for s, threshold in zip(scores, thresholds, strict=True)
        )
        self._per_day = tuple(np.asarray(values, dtype=np.float64) for values in card_precision_per_day)
        self._card_days = tuple(CardDays.of(data, s) for s in scores)

    def days(self, day_counts: IntArray) -> dict[str, FloatArray]:
        """Replicates drawing whole days; card precision as the mean of the drawn days' values."""
        n_days = day_counts.shape[1]
        return self._run(
            day_counts,
            self._data.day_code,
            lambda chunk, model: (chunk @ self._per_day[model]) / n_days,
        )

    def cards(self, card_counts: IntArray) -> dict[str, FloatArray]:
        """Replicates drawing whole cards; card precision recomputed with the drawn copies."""
        return self._run(
            card_counts,
            self._data.card_code,
            lambda chunk, model: weighted_card_precision(self._card_days[model], chunk, self._top_k),
        )

    def _run(
        self,
        unit_counts: IntArray,
        unit_of_row: IntArray,
        card_precision: Callable[[IntArray, int], FloatArray],
    ) -> dict[str, FloatArray]:
        n_days = len(self._data.days)
        parts: list[dict[str, FloatArray]] = []
        for chunk in _chunks(unit_counts, max(len(unit_of_row), unit_counts.shape[1])):
            values = []
            for model, ranking in enumerate(self._rankings):
                weights = chunk[:, unit_of_row[ranking.order]].astype(np.float64)
                metrics = weighted_row_metrics(ranking, weights, n_days, self._budget)
                metrics[self._card_key] = card_precision(chunk, model)
                values.append(metrics)
            parts.append({name: values[1][name] - values[0][name] for name in values[0]})
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _chunks(counts: IntArray, width: int) -> Iterator[IntArray]:
    size = max(1, _CHUNK_CELLS // max(width, 1))
    for start in range(0, counts.shape[0], size):
        yield counts[start : start + size]
