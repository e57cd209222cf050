"""Which model scores each micro-batch, against a real MLflow store: hot swaps, load failures, re-runs."""

from __future__ import annotations

import datetime as dt
import logging
import shutil
from pathlib import Path
from urllib.parse import urlparse

import pytest

from features.definitions import DEFAULT_PARAMS
from models.dataset import Dataset
from models.estimators import ModelSpec, feature_set
from models.registry import CHAMPION, MODEL_NAME, ModelNotFoundError, promote, registry_client
from models.splits import SplitPlan
from models.tracking import default_artifact_location, log_training
from models.training import TrainingResult, train_and_evaluate
from scoring.job import ModelChooser


@pytest.fixture(scope="module")
def trained(small_dataset: Dataset) -> TrainingResult:
    spec = ModelSpec("decision_tree", max_depth=2)
    return train_and_evaluate(
        small_dataset, [SplitPlan(dt.date(2018, 4, 20))], spec, feature_set("all", DEFAULT_PARAMS)
    )


def register(uri: str, result: TrainingResult) -> int:
    logged = log_training(uri, result, {}, {}, True, default_artifact_location(uri))
    assert logged.version is not None
    return logged.version


def test_without_a_model_the_job_does_not_start(store_uri: str, tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError):
        ModelChooser(store_uri, CHAMPION, 0.0, tmp_path / "versions.json").refresh()


def test_alias_moves_switch_versions_failures_keep_serving_and_reruns_keep_their_version(
    store_uri: str, trained: TrainingResult, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "versions.json"
    first, broken, third = (register(store_uri, trained) for _ in range(3))
    chooser = ModelChooser(store_uri, CHAMPION, 0.0, path)
    assert [chooser.version_for(batch) for batch in (0, 1)] == [first, first]

    # A version whose artifacts are gone cannot load: the old one keeps serving, the error is logged.
    uri = registry_client(store_uri).get_model_version_download_uri(MODEL_NAME, str(broken))
    shutil.rmtree(urlparse(uri).path)
    promote(store_uri, broken, CHAMPION)
    with caplog.at_level(logging.ERROR, logger="scoring.job"):
        assert chooser.version_for(2) == first
    assert f"version {first} keeps serving" in caplog.text

    promote(store_uri, third, CHAMPION)
    assert chooser.version_for(3) == third

    # A restarted job re-running batches uses what was recorded for them, not where the alias is now.
    promote(store_uri, first, CHAMPION)
    again = ModelChooser(store_uri, CHAMPION, 3600.0, path)
    assert [again.version_for(batch) for batch in (1, 2, 3)] == [first, first, third]
    assert again.version_for(4) == first  # a new batch: the alias as it is now
