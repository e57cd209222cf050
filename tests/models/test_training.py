"""Training data checks, every model family, and a directional check (after Made With ML)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pytest

from contracts.events import TxColumns
from features.definitions import CARD_AMOUNT_RATIO_30D, DEFAULT_PARAMS, HANDBOOK_FEATURES
from models.dataset import Dataset
from models.estimators import (
    DEFAULT_SPEC,
    DEFAULT_TRAIN_DAYS,
    MODEL_KINDS,
    ModelSpec,
    build_pipeline,
    depth_for,
    feature_set,
)
from models.splits import TARGET, SplitPlan, split
from models.training import train_and_evaluate

C = TxColumns
PLAN = SplitPlan(dt.date(2018, 4, 20))


def test_training_data_checks(small_dataset: Dataset) -> None:
    data = split(small_dataset, PLAN)
    for frame in (data.train, data.test):
        assert frame[C.TX_ID].is_unique
        assert set(frame[TARGET].unique()) <= {0, 1}
        assert not frame[list(feature_set("all", DEFAULT_PARAMS))].isna().any().any()
    for name in ("handbook", "all"):
        columns = feature_set(name, DEFAULT_PARAMS)  # type: ignore[arg-type]
        assert C.CARD_ID not in columns and C.TX_ID not in columns and C.TERMINAL_ID not in columns
    assert feature_set("handbook", DEFAULT_PARAMS) == HANDBOOK_FEATURES
    assert len(HANDBOOK_FEATURES) == 15
    assert CARD_AMOUNT_RATIO_30D in feature_set("all", DEFAULT_PARAMS)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_every_model_family_trains_and_ranks_frauds_first(small_dataset: Dataset, kind: str) -> None:
    spec = ModelSpec(kind, max_depth=4, n_estimators=20)  # type: ignore[arg-type]
    result = train_and_evaluate(small_dataset, [PLAN], spec, HANDBOOK_FEATURES, alerts_per_day=20)
    assert result.metrics["roc_auc"] > 0.6
    assert 0 <= result.threshold <= 1
    assert result.latest.pipeline.named_steps["scale"].n_features_in_ == 15
    again = train_and_evaluate(small_dataset, [PLAN], spec, HANDBOOK_FEATURES, alerts_per_day=20)
    # Fixed seeds: the same model (a parallel forest sums its trees in any order: last-bit differences).
    np.testing.assert_allclose(again.latest.test_scores, result.latest.test_scores, rtol=1e-12)


def test_class_weights_are_the_classifiers_own() -> None:
    balanced = build_pipeline(ModelSpec("random_forest")).named_steps["classify"]
    raw = build_pipeline(ModelSpec("random_forest", class_weight="none")).named_steps["classify"]
    assert (balanced.class_weight, raw.class_weight) == ("balanced", None)


def test_a_much_larger_amount_raises_the_score(small_dataset: Dataset) -> None:
    """Directional: the same transactions with ten times the amount score higher, on average."""
    result = train_and_evaluate(small_dataset, [PLAN], ModelSpec("logistic_regression"), HANDBOOK_FEATURES)
    rows = split(small_dataset, PLAN).test
    rows = rows[rows[TARGET] == 0].head(500)
    columns = list(HANDBOOK_FEATURES)
    base = result.pipeline.predict_proba(rows[columns])[:, 1]
    inflated = result.pipeline.predict_proba(rows[columns].assign(**{C.AMOUNT: rows[C.AMOUNT] * 10}))[:, 1]
    assert (inflated >= base).mean() > 0.95


def test_the_default_model_is_the_one_the_model_report_chose_on_validation() -> None:
    """docs/models.md (written by `make eval`) names the candidate validation chose; `fraud train`'s
    default is that one."""
    report = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    chosen = [line for line in report.splitlines() if line.startswith("Chosen on validation: ")]
    assert len(chosen) == 1, "run `make eval`: docs/models.md names no chosen model"
    assert chosen[0].startswith(f"Chosen on validation: {DEFAULT_SPEC.describe(DEFAULT_TRAIN_DAYS)}.")


def test_a_depth_not_given_is_the_defaults_for_its_kind_and_unlimited_for_others() -> None:
    assert depth_for(DEFAULT_SPEC.kind, None) == DEFAULT_SPEC.max_depth
    assert depth_for("random_forest", None) is None
    assert depth_for(DEFAULT_SPEC.kind, 0) is None
    assert depth_for("random_forest", 7) == 7
