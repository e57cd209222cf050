"""Training and evaluation over one or several folds of the honest split.

For each fold: fit the pipeline on the training period, choose the alert threshold on the training
period's scores (an alert budget per day), score the test days and compute the metrics. Several folds
give the mean and standard deviation of each metric; the model kept (and registered) is the one of the
latest fold, with that fold's threshold.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sklearn.pipeline import Pipeline

from models.dataset import Dataset
from models.estimators import ModelSpec, build_pipeline
from models.metrics import (
    ALERT_PRECISION,
    ALERT_RECALL,
    ALERTS_PER_DAY,
    AVERAGE_PRECISION,
    DEFAULT_ALERTS_PER_DAY,
    DEFAULT_TOP_K,
    ROC_AUC,
    CardPrecision,
    alert_metrics,
    average_precision,
    card_precision_at_k,
    card_precision_key,
    roc_auc,
    threshold_for_budget,
)
from models.splits import TARGET, TEST_DAY, EvalProtocol, Split, SplitPlan, split, split_counts


@dataclass
class FoldResult:
    """One fold: its plan, counts, metrics, the test scores (for plots) and a few input rows (example)."""

    plan: SplitPlan
    counts: dict[str, int]
    metrics: dict[str, float]
    card_precision: CardPrecision
    y_test: np.ndarray
    test_scores: np.ndarray
    pipeline: Pipeline
    threshold: float
    example: pd.DataFrame


@dataclass
class TrainingResult:
    """Every fold, the summary metrics (means, and ``*_std`` with several folds) and the kept model."""

    spec: ModelSpec
    feature_columns: tuple[str, ...]
    folds: list[FoldResult]
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def latest(self) -> FoldResult:
        return self.folds[-1]

    @property
    def pipeline(self) -> Pipeline:
        return self.latest.pipeline

    @property
    def threshold(self) -> float:
        return self.latest.threshold


def scores_of(pipeline: Pipeline, frame: pd.DataFrame, feature_columns: tuple[str, ...]) -> np.ndarray:
    """Fraud probability of each row, float64."""
    probabilities = pipeline.predict_proba(frame[list(feature_columns)])
    return np.asarray(probabilities[:, 1], dtype=np.float64)


def evaluate_fold(
    data: Split,
    spec: ModelSpec,
    feature_columns: tuple[str, ...],
    alerts_per_day: float = DEFAULT_ALERTS_PER_DAY,
    top_k: int = DEFAULT_TOP_K,
) -> FoldResult:
    """Fit on the split's training rows, pick the threshold there, and measure on its test rows."""
    plan = data.plan
    pipeline = build_pipeline(spec)
    started = time.monotonic()
    pipeline.fit(data.train[list(feature_columns)], data.train[TARGET].to_numpy())
    fit_seconds = time.monotonic() - started
    threshold = threshold_for_budget(
        scores_of(pipeline, data.train, feature_columns), plan.train_days, alerts_per_day
    )
    y_test = data.test[TARGET].to_numpy()
    scores = scores_of(pipeline, data.test, feature_columns)
    cards = card_precision_at_k(data.test["card_id"], data.test[TEST_DAY], y_test, scores, top_k)
    alerts = alert_metrics(y_test, scores, threshold, plan.test_days)
    metrics = {
        ROC_AUC: roc_auc(y_test, scores),
        AVERAGE_PRECISION: average_precision(y_test, scores),
        card_precision_key(top_k): cards.mean,
        "threshold": threshold,
        ALERT_PRECISION: alerts.precision,
        ALERT_RECALL: alerts.recall,
        ALERTS_PER_DAY: alerts.alerts_per_day,
        "fit_seconds": fit_seconds,
    }
    example = data.test[list(feature_columns)].head(5).astype(np.float64).reset_index(drop=True)
    return FoldResult(plan, split_counts(data), metrics, cards, y_test, scores, pipeline, threshold, example)


def train_and_evaluate(
    dataset: Dataset,
    plans: list[SplitPlan],
    spec: ModelSpec,
    feature_columns: tuple[str, ...],
    alerts_per_day: float = DEFAULT_ALERTS_PER_DAY,
    top_k: int = DEFAULT_TOP_K,
    protocol: EvalProtocol | None = None,
) -> TrainingResult:
    """Evaluate ``spec`` on every plan (oldest first), the test days under ``protocol`` (default: the
    default ``EvalProtocol``); summary metrics are means over the folds."""
    folds = [
        evaluate_fold(split(dataset, plan, protocol), spec, feature_columns, alerts_per_day, top_k)
        for plan in plans
    ]
    result = TrainingResult(spec, feature_columns, folds)
    result.metrics = summarise(folds)
    return result


def summarise(folds: list[FoldResult]) -> dict[str, float]:
    """Mean of each metric over the folds, plus ``<metric>_std`` when there are several; the latest
    fold's threshold (the one stored with the model)."""
    summary: dict[str, float] = {}
    for name in folds[0].metrics:
        values = np.array([fold.metrics[name] for fold in folds], dtype=np.float64)
        summary[name] = float(np.nanmean(values)) if not np.isnan(values).all() else math.nan
        if len(folds) > 1:
            summary[f"{name}_std"] = float(np.nanstd(values)) if not np.isnan(values).all() else math.nan
    summary["threshold"] = folds[-1].threshold
    return summary
