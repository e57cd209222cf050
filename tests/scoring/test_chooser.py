"""Which model scores each micro-batch, against a real MLflow store: hot swaps, load failures, re-runs."""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

import scoring.model_cache
from contracts.errors import ServiceUnavailableError
from features.definitions import DEFAULT_PARAMS
from models.dataset import Dataset
from models.estimators import ModelSpec, feature_set
from models.registry import CHAMPION, MODEL_NAME, ModelNotFoundError, load_model, promote, registry_client
from models.splits import SplitPlan
from models.tracking import default_artifact_location, log_training
from models.training import TrainingResult, train_and_evaluate
from scoring.chooser import ModelChooser
from scoring.model_cache import worker_model


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
        ModelChooser(store_uri, CHAMPION, interval_s=0.0, path=tmp_path / "versions.json").refresh()


def test_alias_moves_switch_versions_failures_keep_serving_and_reruns_keep_their_version(
    store_uri: str, trained: TrainingResult, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "versions.json"
    first, broken, third = (register(store_uri, trained) for _ in range(3))
    chooser = ModelChooser(store_uri, CHAMPION, interval_s=0.0, path=path)
    assert [chooser.version_for(batch) for batch in (0, 1)] == [first, first]

    # A version whose artifacts are gone cannot load: the old one keeps serving, the error is logged.
    uri = registry_client(store_uri).get_model_version_download_uri(MODEL_NAME, str(broken))
    shutil.rmtree(urlparse(uri).path)
    promote(store_uri, broken, CHAMPION)
    with caplog.at_level(logging.ERROR, logger="scoring.chooser"):
        assert chooser.version_for(2) == first
    assert f"version {first} keeps serving" in caplog.text

    promote(store_uri, third, CHAMPION)
    assert chooser.version_for(3) == third

    # A restarted job re-running batches uses what was recorded for them, not where the alias is now.
    promote(store_uri, first, CHAMPION)
    again = ModelChooser(store_uri, CHAMPION, interval_s=3600.0, path=path)
    assert [again.version_for(batch) for batch in (1, 2, 3)] == [first, first, third]
    assert again.version_for(4) == first  # a new batch: the alias as it is now


def test_a_registry_outage_never_stalls_a_micro_batch_and_is_logged_once(
    store_uri: str, trained: TrainingResult, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    version = register(store_uri, trained)
    chooser = ModelChooser(
        store_uri, CHAMPION, interval_s=0.0, path=tmp_path / "versions.json", check_timeout_s=60
    )
    assert chooser.version_for(0) == version

    # A registry that answers, without the model: every check fails, the version serving goes on; one line.
    chooser.tracking_uri = f"sqlite:///{tmp_path / 'other-mlflow.db'}"
    with caplog.at_level(logging.WARNING, logger="scoring.chooser"):
        assert [chooser.version_for(batch) for batch in range(1, 4)] == [version] * 3
        chooser.tracking_uri = store_uri
        assert chooser.version_for(4) == version
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert f"version {version} keeps serving" in lines[0] and "checks work again" in lines[1]

    # A registry that does not answer at all (MLflow retries for minutes): batches wait at most once.
    chooser.check_timeout_s = 0.5
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        chooser.tracking_uri = f"http://127.0.0.1:{unused.getsockname()[1]}"
    started = time.monotonic()
    assert [chooser.version_for(batch) for batch in range(5, 15)] == [version] * 10
    assert time.monotonic() - started < 2.0, "micro-batches waited for an unreachable registry"


def test_a_worker_that_needs_the_model_while_mlflow_is_away_waits_for_it(
    store_uri: str,
    trained: TrainingResult,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Python worker loads its model at its first task; MLflow away then (the registry's client says
    so) makes it wait and retry, one line when the outage starts and one when it ends, not fail the task."""
    version = register(store_uri, trained)
    refusals = [ServiceUnavailableError("MLflow at http://mlflow:5000 did not answer")] * 2

    def load_after_an_outage(tracking_uri: str, alias: str | None = None, version: int | None = None) -> Any:
        if refusals:
            raise refusals.pop()
        return load_model(tracking_uri, version=version)

    monkeypatch.setattr(scoring.model_cache, "load_model", load_after_an_outage)
    monkeypatch.setattr(scoring.model_cache, "_MODELS", {})
    with caplog.at_level(logging.WARNING, logger="infra.retry"):
        model = worker_model(store_uri, version)
    assert model.version == version and not refusals
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2 and "unreachable" in lines[0] and "answers again" in lines[1], lines
