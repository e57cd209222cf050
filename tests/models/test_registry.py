"""Registry round trip against a real MLflow store (a SQLite file): register, alias, load, promote."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pytest

from features.definitions import DEFAULT_PARAMS
from models.contributions import contributions
from models.dataset import Dataset
from models.estimators import ModelSpec, feature_set
from models.registry import (
    CHALLENGER,
    CHAMPION,
    MODEL_NAME,
    MissingFeaturesError,
    ModelNotFoundError,
    list_versions,
    load_model,
    promote,
    resolve_version,
)
from models.splits import SplitPlan
from models.tracking import default_artifact_location, log_training
from models.training import TrainingResult, train_and_evaluate

PLAN = SplitPlan(dt.date(2018, 4, 20))


@pytest.fixture(scope="module")
def trained(small_dataset: Dataset) -> TrainingResult:
    spec = ModelSpec("decision_tree", max_depth=3)
    return train_and_evaluate(small_dataset, [PLAN], spec, feature_set("all", DEFAULT_PARAMS))


def _log(uri: str, result: TrainingResult, register: bool = True) -> tuple[str, int | None, tuple[str, ...]]:
    logged = log_training(
        uri, result, {"features": "all"}, {"data_rows": 1.0}, register, default_artifact_location(uri)
    )
    return logged.run_id, logged.version, logged.aliases


def test_register_alias_load_promote_resolve(store_uri: str, trained: TrainingResult) -> None:
    uri = store_uri
    with pytest.raises(ModelNotFoundError, match="fraud train"):
        load_model(uri)  # empty registry

    _, first, aliases = _log(uri, trained)
    assert (first, aliases) == (1, (CHAMPION,))  # the first model becomes the champion
    _, second, aliases = _log(uri, trained)
    assert (second, aliases) == (2, ())  # later ones wait for a promotion
    assert resolve_version(uri) == 1

    loaded = load_model(uri)  # by alias, champion by default
    assert (loaded.name, loaded.version) == (MODEL_NAME, 1)
    assert loaded.threshold == trained.threshold
    assert loaded.feature_columns == trained.feature_columns
    rows = trained.latest.example
    scores = loaded.score(rows)
    assert scores.dtype == np.float64
    np.testing.assert_array_equal(scores, trained.pipeline.predict_proba(rows)[:, 1])
    # Extra columns and any column order are fine: the model picks its own.
    np.testing.assert_array_equal(loaded.score(rows[list(reversed(rows.columns))].assign(extra=1.0)), scores)

    assert promote(uri, 2, CHAMPION) == 1
    assert promote(uri, 1, CHALLENGER) is None
    assert resolve_version(uri) == 2
    assert resolve_version(uri, CHALLENGER) == 1
    assert load_model(uri, alias=CHALLENGER).version == 1
    assert load_model(uri, alias=None, version=2).version == 2
    versions = {info.version: info for info in list_versions(uri)}
    assert versions[2].aliases == (CHAMPION,)
    assert versions[1].aliases == (CHALLENGER,)
    assert versions[2].metrics["roc_auc"] == pytest.approx(trained.metrics["roc_auc"])


def test_clear_errors(store_uri: str, trained: TrainingResult) -> None:
    uri = store_uri
    _log(uri, trained)
    with pytest.raises(ModelNotFoundError, match="challenger"):
        load_model(uri, alias=CHALLENGER)
    with pytest.raises(ModelNotFoundError, match="challenger"):
        resolve_version(uri, CHALLENGER)
    with pytest.raises(ModelNotFoundError, match="version 7"):
        load_model(uri, version=7)
    with pytest.raises(ModelNotFoundError):
        promote(uri, 7, CHAMPION)
    loaded = load_model(uri)
    rows = trained.latest.example.drop(columns=["terminal_risk_7d", "amount"])
    with pytest.raises(
        MissingFeaturesError, match=r"terminal_risk_7d, amount|amount, terminal_risk_7d"
    ) as info:
        loaded.score(rows)
    assert sorted(info.value.missing) == ["amount", "terminal_risk_7d"]


def test_no_register_logs_the_run_only(store_uri: str, tmp_path: Path, trained: TrainingResult) -> None:
    uri = store_uri
    run_id, version, _ = _log(uri, trained, register=False)
    assert version is None
    assert list_versions(uri) == []
    artifacts = tmp_path / "artifacts"
    logged = {
        p.relative_to(artifacts).as_posix().split("/", 2)[-1] for p in artifacts.rglob("*") if p.is_file()
    }
    assert {"plots/roc.png", "plots/precision_recall.png", "plots/card_precision_per_day.png"} <= logged
    assert {"model/MLmodel", "model/model.skops", "model/input_example.json"} <= logged
    assert run_id


@pytest.mark.parametrize("kind", ["lightgbm", "hist_gradient_boosting"])
def test_a_boosted_model_loads_from_the_registry_and_explains_its_scores(
    store_uri: str, small_dataset: Dataset, kind: str
) -> None:
    """LightGBM's classifier and booster are among the trusted types; the loaded model's contributions
    are the trained one's and add up to its scores' log-odds."""
    spec = ModelSpec(kind, n_estimators=20)  # type: ignore[arg-type]
    result = train_and_evaluate(small_dataset, [PLAN], spec, feature_set("all", DEFAULT_PARAMS))
    _, version, _ = _log(store_uri, result)
    loaded = load_model(store_uri, alias=None, version=version)
    rows = result.latest.example
    np.testing.assert_array_equal(loaded.score(rows), result.pipeline.predict_proba(rows)[:, 1])
    found = loaded.contributions(rows)
    assert found.method == "tree_shap"
    np.testing.assert_allclose(found.values, contributions(result.pipeline, rows).values, rtol=0, atol=1e-12)
    np.testing.assert_allclose(1 / (1 + np.exp(-found.margin)), loaded.score(rows), rtol=0, atol=1e-9)
