"""`fraud train --input` on a small simulated file, without and with registration; `fraud models`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contracts.errors import ConfigError
from fraud.cli import app
from models.registry import CHALLENGER, CHAMPION, list_versions, load_model

SPLIT = ["--train-start", "2018-04-20", "--train-days", "7", "--delay-days", "7", "--test-days", "7"]


@pytest.fixture
def tracking_uri(store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    for name in [n for n in os.environ if n.upper().startswith("FRAUD_")]:
        monkeypatch.delenv(name)
    uri = store_uri
    monkeypatch.setenv("FRAUD_MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("FRAUD_HOME", str(tmp_path / "home"))
    return uri


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    return result.output


def test_train_without_registering(small_file: Path, tmp_path: Path, tracking_uri: str) -> None:
    out = tmp_path / "metrics.json"
    output = _invoke(
        "train", "--input", str(small_file), "--model", "logistic_regression", "--features", "handbook",
        *SPLIT, "--no-register", "--metrics-out", str(out),
    )  # fmt: skip
    assert "Not registered" in output
    metrics = json.loads(out.read_text())
    for key in ("roc_auc", "average_precision", "card_precision_at_100", "threshold", "alert_precision"):
        assert isinstance(metrics[key], float), key
    assert 0.5 < metrics["roc_auc"] <= 1.0
    assert len(metrics["feature_columns"]) == 15
    assert metrics["version"] is None
    assert metrics["folds"][0]["test"] == "2018-05-04"
    assert list_versions(tracking_uri) == []


def test_train_registers_the_first_champion_then_promote(
    small_file: Path, tmp_path: Path, tracking_uri: str
) -> None:
    args = ["train", "--input", str(small_file), "--model", "decision_tree", "--max-depth", "3", *SPLIT]
    assert "version 1 with alias champion" in _invoke(*args)
    out = tmp_path / "folds.json"
    # Two rolling folds: a mean and a spread, and the model of the later fold is registered.
    _invoke(
        *args[:-8], "--folds", "2", "--metrics-out", str(out)
    )  # default start: the latest the data allows
    metrics = json.loads(out.read_text())
    assert [fold["test"] for fold in metrics["folds"]] == ["2018-05-02", "2018-05-09"]
    assert "roc_auc_std" in metrics
    assert metrics["version"] == 2
    assert metrics["aliases"] == []

    listing = _invoke("models", "list")
    assert "champion" in listing
    refused = CliRunner().invoke(app, ["models", "promote", "2", "--alias", CHAMPION])
    assert isinstance(refused.exception, ConfigError)
    assert "no A/B evidence that version 2 beats the champion" in str(refused.exception)
    _invoke("models", "promote", "2", "--alias", CHAMPION, "--force")
    _invoke("models", "promote", "1", "--alias", CHALLENGER)
    assert load_model(tracking_uri).version == 2
    assert load_model(tracking_uri, alias=CHALLENGER).version == 1
    assert load_model(tracking_uri).threshold == metrics["threshold"]


def test_unknown_alias_is_a_one_line_error(tracking_uri: str) -> None:
    result = CliRunner().invoke(app, ["models", "promote", "1", "--alias", "king"])
    assert result.exit_code != 0
