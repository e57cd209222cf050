"""Champion (A) against challenger (B) on the same transactions: paired metrics, bootstrap intervals of
the differences, McNemar's test and the overlap of the alerts, and a promotion gate.

Pure functions over one frame with a row per transaction and both models' scores (``COLUMNS``), so the
A/B replay command, its HTML report and the tests share one computation. The frame follows the test
protocol of ``models.splits``: per day, cards with a fraud known before that day are already removed, and
labels are every fraud known by the end of the range plus the label delay.

Both models are measured as ``models.training`` measures one (ROC AUC, average precision, card precision
at k, alerts at the model's own threshold) and, so that precision is compared at equal cost, at an equal
alert budget: each model's threshold is chosen on this frame to raise the same alerts per day.

The uncertainty of each difference B - A comes from a paired percentile bootstrap, twice: resampling
whole days (day-to-day variation: fraud waves, weekdays) and resampling whole cards (transactions of a
card are not independent). Every statistic is recomputed on each resample, the equal-budget thresholds
included, except card precision under day resampling, where the per-day values are resampled (a day's
value depends on the cards caught on earlier days); ``models.bootstrap`` computes the resamples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from contracts.arrays import FloatArray
from contracts.errors import FraudError
from contracts.events import TxColumns
from models.bootstrap import Bootstrap, PairedRows, counts
from models.metrics import (
    ALERT_PRECISION,
    ALERT_RECALL,
    ALERTS_PER_DAY,
    AVERAGE_PRECISION,
    BUDGET_ALERT_PRECISION,
    BUDGET_ALERT_RECALL,
    DEFAULT_TOP_K,
    ROC_AUC,
    AlertMetrics,
    CardPrecision,
    alert_metrics,
    average_precision,
    card_precision_at_k,
    card_precision_key,
    roc_auc,
    threshold_for_budget,
)

#: Input columns: one row per transaction.
TX_ID = TxColumns.TX_ID
CARD_ID = TxColumns.CARD_ID
#: Day index within the compared range (any integers; days are ordered by it).
DAY = "day"
#: 1 for a fraud known by the end of the range plus the label delay, else 0.
LABEL = "label"
SCORE_A = "score_a"
SCORE_B = "score_b"
COLUMNS = (TX_ID, CARD_ID, DAY, LABEL, SCORE_A, SCORE_B)

DEFAULT_N_BOOT = 200
#: Coverage of the percentile intervals.
CONFIDENCE = 0.95
#: McNemar's p-value is the exact binomial one below this many discordant transactions, else chi-squared.
MCNEMAR_EXACT_BELOW = 25


class ComparisonError(FraudError, ValueError):
    """The frame or the arguments cannot give a comparison (missing columns, labels not 0/1, ...)."""


def metric_names(top_k: int = DEFAULT_TOP_K) -> tuple[str, ...]:
    """Names of the compared metrics, in the order reports show them."""
    return (
        ROC_AUC,
        AVERAGE_PRECISION,
        card_precision_key(top_k),
        ALERT_PRECISION,
        ALERT_RECALL,
        ALERTS_PER_DAY,
        BUDGET_ALERT_PRECISION,
        BUDGET_ALERT_RECALL,
    )


def gate_metric_names(top_k: int = DEFAULT_TOP_K) -> tuple[str, ...]:
    """The metrics the promotion gate can judge on: the quality ones, where higher is better (alerts per day
    is a volume)."""
    return tuple(name for name in metric_names(top_k) if name != ALERTS_PER_DAY)


@dataclass(frozen=True)
class ModelMetrics:
    """One model's metrics on the compared frame.

    Attributes:
        roc_auc: pooled over the frame; NaN without both classes.
        average_precision: pooled over the frame; NaN without fraud.
        card_precision: card precision at k, per day and its mean.
        alerts: alerts at the model's own threshold.
        budget_alerts: alerts at the threshold chosen on this frame for the shared alert budget.
    """

    roc_auc: float
    average_precision: float
    card_precision: CardPrecision
    alerts: AlertMetrics
    budget_alerts: AlertMetrics

    def values(self) -> dict[str, float]:
        """Each compared metric by name (``metric_names``)."""
        return {
            ROC_AUC: self.roc_auc,
            AVERAGE_PRECISION: self.average_precision,
            card_precision_key(self.card_precision.k): self.card_precision.mean,
            ALERT_PRECISION: self.alerts.precision,
            ALERT_RECALL: self.alerts.recall,
            ALERTS_PER_DAY: self.alerts.alerts_per_day,
            BUDGET_ALERT_PRECISION: self.budget_alerts.precision,
            BUDGET_ALERT_RECALL: self.budget_alerts.recall,
        }

    def to_dict(self) -> dict[str, Any]:
        """The metrics, thresholds and alert counts as plain JSON values."""
        return {
            **{name: _json(value) for name, value in self.values().items()},
            "threshold": _json(self.alerts.threshold),
            "alerts": self.alerts.alerts,
            "budget_threshold": _json(self.budget_alerts.threshold),
            "budget_alerts": self.budget_alerts.alerts,
            "budget_alerts_per_day": _json(self.budget_alerts.alerts_per_day),
        }


@dataclass(frozen=True)
class Interval:
    """A percentile bootstrap interval, and how many replicates (those where the metric is defined for
    both models) it rests on; NaN bounds when none is."""

    low: float
    high: float
    replicates: int

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


@dataclass(frozen=True)
class Difference:
    """B - A of one metric, with its intervals from resampling days and from resampling cards."""

    metric: str
    a: float
    b: float
    diff: float
    days: Interval
    cards: Interval

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": _json(self.a),
            "b": _json(self.b),
            "diff": _json(self.diff),
            "ci_days": self.days.to_dict(),
            "ci_cards": self.cards.to_dict(),
        }


@dataclass(frozen=True)
class McNemar:
    """McNemar's test of the alert decisions at each model's own threshold (correct: alert == label).

    Attributes:
        a_only_correct: transactions A decides right and B wrong.
        b_only_correct: transactions B decides right and A wrong.
        statistic: ``(|a_only - b_only| - 1)^2 / (a_only + b_only)``, the continuity-corrected chi-squared
            statistic (the bracket floored at 0; 0 without discordant transactions).
        p_value: two-sided; exact binomial below ``MCNEMAR_EXACT_BELOW`` discordant transactions, else
            the chi-squared (1 degree of freedom) tail of ``statistic``.
        exact: whether ``p_value`` is the exact binomial one.
    """

    a_only_correct: int
    b_only_correct: int
    statistic: float
    p_value: float
    exact: bool

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


@dataclass(frozen=True)
class Agreement:
    """Transactions alerted (each at its model's own threshold) by both, by A only, by B only, by neither,
    and the frauds among each."""

    both: int
    a_only: int
    b_only: int
    neither: int
    frauds_both: int
    frauds_a_only: int
    frauds_b_only: int
    frauds_neither: int

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


@dataclass(frozen=True)
class Comparison:
    """Everything ``compare`` measures; ``to_dict`` for JSON output, ``flat_metrics`` for MLflow.

    Attributes:
        a: the champion's metrics (card precision per day in ``a.card_precision.per_day``).
        b: the challenger's metrics.
        differences: B - A of each metric, in ``metric_names(top_k)`` order.
        mcnemar: McNemar's test of the alert decisions at the models' own thresholds.
        agreement: overlap of the alerts at the models' own thresholds.
        alerts_per_day_budget: the shared alert budget of the ``budget_*`` metrics.
        days: the days of the frame, ascending.
        n_rows: transactions compared.
        n_frauds: frauds among them.
        top_k: cards checked per day in card precision.
        n_boot: bootstrap replicates per resampling scheme.
        seed: seed of the bootstrap draws.
    """

    a: ModelMetrics
    b: ModelMetrics
    differences: tuple[Difference, ...]
    mcnemar: McNemar
    agreement: Agreement
    alerts_per_day_budget: float
    days: tuple[int, ...]
    n_rows: int
    n_frauds: int
    top_k: int
    n_boot: int
    seed: int

    @property
    def metric_names(self) -> tuple[str, ...]:
        return tuple(d.metric for d in self.differences)

    def difference(self, metric: str) -> Difference:
        """B - A of ``metric``; a ``ComparisonError`` names the known metrics if it is not one."""
        for found in self.differences:
            if found.metric == metric:
                return found
        raise ComparisonError(f"unknown metric {metric!r}; one of {', '.join(self.metric_names)}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values: floats rounded to 6 digits, NaN as None."""
        return {
            "rows": self.n_rows,
            "frauds": self.n_frauds,
            "days": list(self.days),
            "top_k": self.top_k,
            "alerts_per_day_budget": _json(self.alerts_per_day_budget),
            "n_boot": self.n_boot,
            "seed": self.seed,
            "confidence": CONFIDENCE,
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "differences": {d.metric: d.to_dict() for d in self.differences},
            "mcnemar": self.mcnemar.to_dict(),
            "agreement": self.agreement.to_dict(),
            "card_precision_per_day": {
                "days": list(self.a.card_precision.days),
                "a": [_json(v) for v in self.a.card_precision.per_day],
                "b": [_json(v) for v in self.b.card_precision.per_day],
            },
        }

    def flat_metrics(self) -> dict[str, float]:
        """Numbers for MLflow metrics (``a_roc_auc``, ``diff_roc_auc``, ``diff_roc_auc_days_low``, ...),
        rounded to 6 digits; undefined (NaN) values are left out."""
        values: dict[str, float] = {
            "rows": self.n_rows,
            "frauds": self.n_frauds,
            "alerts_per_day_budget": self.alerts_per_day_budget,
            "a_threshold": self.a.alerts.threshold,
            "b_threshold": self.b.alerts.threshold,
            "a_budget_threshold": self.a.budget_alerts.threshold,
            "b_budget_threshold": self.b.budget_alerts.threshold,
            "mcnemar_statistic": self.mcnemar.statistic,
            "mcnemar_p_value": self.mcnemar.p_value,
            **{f"agreement_{k}": v for k, v in self.agreement.to_dict().items()},
        }
        for d in self.differences:
            values |= {
                f"a_{d.metric}": d.a,
                f"b_{d.metric}": d.b,
                f"diff_{d.metric}": d.diff,
                f"diff_{d.metric}_days_low": d.days.low,
                f"diff_{d.metric}_days_high": d.days.high,
                f"diff_{d.metric}_cards_low": d.cards.low,
                f"diff_{d.metric}_cards_high": d.cards.high,
            }
        return {k: round(float(v), 6) for k, v in values.items() if math.isfinite(v)}


@dataclass(frozen=True)
class Decision:
    """Outcome of the promotion gate, with the one-line reason shown to people and logged."""

    promote: bool
    reason: str


def compare(
    frame: pd.DataFrame,
    threshold_a: float,
    threshold_b: float,
    *,
    top_k: int = DEFAULT_TOP_K,
    alerts_per_day: float | None = None,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
) -> Comparison:
    """Compare challenger B with champion A on the same transactions.

    Args:
        frame: ``COLUMNS``, one row per transaction (see the module docstring for the protocol).
        threshold_a: A's own alert threshold (an alert is ``score >= threshold``).
        threshold_b: B's own alert threshold.
        top_k: cards an investigator checks per day, for card precision.
        alerts_per_day: the shared alert budget; by default A's alerts per day at its own threshold on
            this frame (what the team handles today).
        n_boot: bootstrap replicates per resampling scheme.
        seed: seed of ``numpy.random.default_rng``; the same input and seed give identical numbers.

    Raises:
        ComparisonError: the frame or an argument cannot be used.
    """
    data = _paired_rows(frame)
    if top_k < 1 or n_boot < 1:
        raise ComparisonError("top_k and n_boot must be at least 1")
    if math.isnan(threshold_a) or math.isnan(threshold_b):
        raise ComparisonError("the alert thresholds must be numbers")
    n_days = len(data.days)
    if alerts_per_day is None:
        alerts_per_day = alert_metrics(data.label, data.score_a, threshold_a, n_days).alerts_per_day
    if not (math.isfinite(alerts_per_day) and alerts_per_day >= 0):
        raise ComparisonError(f"the alert budget must be a number of alerts per day, not {alerts_per_day}")

    a = _model_metrics(data, data.score_a, threshold_a, top_k, alerts_per_day)
    b = _model_metrics(data, data.score_b, threshold_b, top_k, alerts_per_day)
    names = metric_names(top_k)
    rng = np.random.default_rng(seed)
    bootstrap = Bootstrap(
        data,
        (a.alerts.threshold, b.alerts.threshold),
        (a.card_precision.per_day, b.card_precision.per_day),
        top_k,
        max(1, round(alerts_per_day * n_days)),
    )
    day_draws = counts(rng.integers(0, n_days, size=(n_boot, n_days)), n_days)
    card_draws = counts(rng.integers(0, data.n_cards, size=(n_boot, data.n_cards)), data.n_cards)
    by_days = bootstrap.days(day_draws) if n_days > 1 else None
    by_cards = bootstrap.cards(card_draws) if data.n_cards > 1 else None
    a_values, b_values = a.values(), b.values()
    differences = tuple(
        Difference(
            name,
            a_values[name],
            b_values[name],
            b_values[name] - a_values[name],
            _interval(None if by_days is None else by_days[name]),
            _interval(None if by_cards is None else by_cards[name]),
        )
        for name in names
    )
    alerts_a, alerts_b = data.score_a >= threshold_a, data.score_b >= threshold_b
    return Comparison(
        a=a,
        b=b,
        differences=differences,
        mcnemar=mcnemar(data.label, alerts_a, alerts_b),
        agreement=agreement(data.label, alerts_a, alerts_b),
        alerts_per_day_budget=float(alerts_per_day),
        days=tuple(int(d) for d in data.days),
        n_rows=len(data.label),
        n_frauds=int(data.label.sum()),
        top_k=top_k,
        n_boot=n_boot,
        seed=seed,
    )


def mcnemar(y_true: npt.ArrayLike, alerts_a: npt.ArrayLike, alerts_b: npt.ArrayLike) -> McNemar:
    """McNemar's test: do A and B make wrong alert decisions equally often on the same transactions?"""
    from scipy import stats  # a third of a second to import: not at every `fraud` command's start

    y = np.asarray(y_true, dtype=np.int64) > 0
    right_a = np.asarray(alerts_a, dtype=bool) == y
    right_b = np.asarray(alerts_b, dtype=bool) == y
    only_a, only_b = int((right_a & ~right_b).sum()), int((~right_a & right_b).sum())
    discordant = only_a + only_b
    if discordant == 0:
        return McNemar(only_a, only_b, 0.0, 1.0, exact=True)
    statistic = max(abs(only_a - only_b) - 1, 0) ** 2 / discordant
    exact = discordant < MCNEMAR_EXACT_BELOW
    if exact:
        p_value = min(1.0, 2.0 * float(stats.binom.cdf(min(only_a, only_b), discordant, 0.5)))
    else:
        p_value = float(stats.chi2.sf(statistic, df=1))
    return McNemar(only_a, only_b, float(statistic), p_value, exact)


def agreement(y_true: npt.ArrayLike, alerts_a: npt.ArrayLike, alerts_b: npt.ArrayLike) -> Agreement:
    """How the two models' alerts overlap, and where the frauds are."""
    y = np.asarray(y_true, dtype=np.int64) > 0
    in_a, in_b = np.asarray(alerts_a, dtype=bool), np.asarray(alerts_b, dtype=bool)
    cells = (in_a & in_b, in_a & ~in_b, ~in_a & in_b, ~in_a & ~in_b)
    counts = [int(cell.sum()) for cell in cells]
    frauds = [int((cell & y).sum()) for cell in cells]
    return Agreement(*counts, *frauds)


def decide(comparison: Comparison, metric: str, max_precision_drop: float) -> Decision:
    """The promotion gate: promote B only if it is better on ``metric`` under both resampling schemes and
    does not cost precision at equal alert volume.

    B is promoted when the lower bounds of both intervals (days and cards) of B - A in ``metric`` are
    above zero, and B's alert precision at the equal budget is at most ``max_precision_drop`` (absolute)
    below A's. An undefined value (NaN) refuses.

    Args:
        comparison: the result of ``compare``.
        metric: one of ``comparison.metric_names`` where higher is better (not ``alerts_per_day``).
        max_precision_drop: allowed fall of the equal-budget alert precision, e.g. 0.02.

    Raises:
        ComparisonError: ``metric`` is not a compared quality metric, or the allowed drop is negative.
    """
    if metric == ALERTS_PER_DAY:
        raise ComparisonError(
            f"{ALERTS_PER_DAY} is a volume, not a quality metric to gate on: one of {', '.join(gate_metric_names())}"
        )
    if not max_precision_drop >= 0:
        raise ComparisonError("max_precision_drop must be zero or positive")
    gate = comparison.difference(metric)
    precision = comparison.difference(BUDGET_ALERT_PRECISION)
    failures = [
        f"{metric} B - A 95% CI {scheme} lower bound {_signed(interval.low)} is not above 0"
        for scheme, interval in (("days", gate.days), ("cards", gate.cards))
        if not interval.low > 0
    ]
    if not precision.diff >= -max_precision_drop:
        failures.append(
            f"{BUDGET_ALERT_PRECISION} B - A {_signed(precision.diff)} falls more than {max_precision_drop:g}"
        )
    if failures:
        return Decision(False, "keep A: " + "; ".join(failures))
    return Decision(
        True,
        f"promote B: {metric} B - A {_signed(gate.diff)} (95% CI days [{_signed(gate.days.low)}, "
        f"{_signed(gate.days.high)}], cards [{_signed(gate.cards.low)}, {_signed(gate.cards.high)}]); "
        f"{BUDGET_ALERT_PRECISION} B - A {_signed(precision.diff)} within -{max_precision_drop:g}",
    )


# --- inputs and point estimates ----------------------------------------------------------------------


def _paired_rows(frame: pd.DataFrame) -> PairedRows:
    """The frame as arrays, checked (``COLUMNS``, a row per tx id, labels 0 or 1, finite scores)."""
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ComparisonError(f"the frame lacks the columns {', '.join(missing)}")
    if frame.empty:
        raise ComparisonError("no transactions to compare")
    if frame[TX_ID].duplicated().any():
        raise ComparisonError("the frame has several rows for one tx id")
    label = frame[LABEL].to_numpy()
    if not np.isin(label, (0, 1)).all():
        raise ComparisonError("labels must be 0 or 1")
    scores = frame[[SCORE_A, SCORE_B]].to_numpy(dtype=np.float64)
    if not np.isfinite(scores).all():
        raise ComparisonError("scores must be finite numbers")
    day = frame[DAY].to_numpy(dtype=np.int64)
    days = np.unique(day)
    card_code, cards = pd.factorize(frame[CARD_ID], sort=True)
    return PairedRows(
        label=label.astype(np.int64),
        score_a=scores[:, 0].copy(),
        score_b=scores[:, 1].copy(),
        day=day,
        card=frame[CARD_ID].to_numpy(),
        days=days,
        day_code=np.searchsorted(days, day).astype(np.int64),
        card_code=card_code.astype(np.int64),
        n_cards=len(cards),
    )


def _model_metrics(
    data: PairedRows, scores: FloatArray, threshold: float, top_k: int, alerts_per_day: float
) -> ModelMetrics:
    n_days = len(data.days)
    budget_threshold = threshold_for_budget(scores, n_days, alerts_per_day)
    return ModelMetrics(
        roc_auc=roc_auc(data.label, scores),
        average_precision=average_precision(data.label, scores),
        card_precision=card_precision_at_k(data.card, data.day, data.label, scores, top_k),
        alerts=alert_metrics(data.label, scores, threshold, n_days),
        budget_alerts=alert_metrics(data.label, scores, budget_threshold, n_days),
    )


def _interval(replicates: FloatArray | None) -> Interval:
    """The percentile interval of the defined replicates (NaN when there are none, or no resampling:
    a single day or card cannot be resampled)."""
    if replicates is None:
        return Interval(math.nan, math.nan, 0)
    finite = replicates[np.isfinite(replicates)]
    if not len(finite):
        return Interval(math.nan, math.nan, 0)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(finite, [tail, 100 - tail])
    return Interval(float(low), float(high), len(finite))


def _json(value: float) -> float | None:
    return round(float(value), 6) if math.isfinite(value) else None


def _plain(record: Any) -> dict[str, Any]:
    """A flat dataclass's fields as plain JSON values (floats through ``_json``)."""
    return {
        f.name: _json(v) if isinstance(v := getattr(record, f.name), float) else v for f in fields(record)
    }


def _signed(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.4f}"
