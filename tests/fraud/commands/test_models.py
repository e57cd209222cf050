"""`fraud train --input` on a small simulated file, without and with registration; `fraud models`."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from contracts.errors import ConfigError
from fraud.cli import app
from fraud.training import Periods
from models.estimators import DEFAULT_TRAIN_DAYS
from models.registry import CHALLENGER, CHAMPION, list_versions, load_model
from models.splits import day_ms
from tests.support.scripts import fraud_in, stderr_lines

SPLIT = ["--train-start", "2018-04-20", "--train-days", "7", "--gap-days", "7", "--test-days", "7"]


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
    """The installed command, as a user runs it: one line on stderr, the usage exit code (2), no traceback."""
    result = fraud_in(os.environ, "models", "promote", "1", "--alias", "king")
    lines = stderr_lines(result)
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "--alias must be one of champion, challenger" in lines[0]
    assert "Traceback" not in result.stdout + result.stderr


def test_a_training_period_without_a_known_fraud_is_a_one_line_error(
    small_file: Path, tracking_uri: str
) -> None:
    """A day of training whose frauds are confirmed after its test days begin: no model is trained."""
    split = ["--train-start", "2018-04-20", "--train-days", "1", "--gap-days", "1", "--test-days", "7"]
    result = fraud_in(os.environ, "train", "--input", str(small_file), *split, "--no-register")
    lines = stderr_lines(result)
    assert result.returncode != 0, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "holds no fraud known before its test days" in lines[0]
    assert "Traceback" not in result.stdout + result.stderr


def test_periods_anchored_at_the_test_week_count_folds_forward() -> None:
    """--test-start fixes the first fold's test week whatever the training length; --folds go forward."""
    last_ms = 0  # unused when a start is given
    for train_days in (7, 28):
        plans = Periods(train_days=train_days, folds=3, test_start="2018-08-08").plans(last_ms)
        assert [p.test_start for p in plans] == [
            dt.date(2018, 8, 8),
            dt.date(2018, 8, 15),
            dt.date(2018, 8, 22),
        ]
        assert all(p.train_days == train_days for p in plans)
        assert plans[0].train_start + dt.timedelta(days=train_days + 7) == dt.date(2018, 8, 8)
    assert Periods(train_start="2018-07-25", train_days=7).plans(last_ms)[0].test_start == dt.date(2018, 8, 8)
    # The default's training length, cut to the data: 61 days hold 47 training days before delay and test.
    first_ms, last_ms = day_ms(dt.date(2018, 4, 1)), day_ms(dt.date(2018, 5, 31)) + 1
    [plan] = Periods().plans(last_ms, first_ms)
    assert (plan.train_start, plan.train_days) == (
        dt.date(2018, 4, 1),
        61 - 14,
    ) and DEFAULT_TRAIN_DAYS > 61 - 14
    assert Periods(folds=2).plans(last_ms, first_ms)[0].train_start == dt.date(2018, 4, 1)
    [anchored] = Periods(test_start="2018-05-04").plans(last_ms, first_ms)
    assert (anchored.train_start, anchored.train_days, anchored.test_start) == (
        dt.date(2018, 4, 1),
        33 - 7,
        dt.date(2018, 5, 4),
    )
    assert Periods(train_days=DEFAULT_TRAIN_DAYS).plans(last_ms, first_ms)[0].train_days == DEFAULT_TRAIN_DAYS
    with pytest.raises(typer.BadParameter, match="not both"):
        Periods(train_start="2018-07-25", test_start="2018-08-08").plans(last_ms)
    with pytest.raises(typer.BadParameter, match="--test-start"):
        Periods(test_start="2018-02-30").plans(last_ms)


def test_train_at_a_test_week_with_either_known_frauds_rule(
    small_file: Path, tmp_path: Path, tracking_uri: str
) -> None:
    """The same test week under the two rules: `all` leaves out more rows, and says so in the metrics."""
    counts = {}
    for rule in ("recent", "all"):
        out = tmp_path / f"{rule}.json"
        _invoke(
            "train", "--input", str(small_file), "--model", "decision_tree", "--max-depth", "3",
            "--test-start", "2018-05-04", "--train-days", "7", "--known-frauds", rule, "--no-register",
            "--metrics-out", str(out),
        )  # fmt: skip
        fold = json.loads(out.read_text())["folds"][0]
        assert fold["test"] == "2018-05-04" and fold["train"] == "2018-04-20"
        counts[rule] = fold["test_rows"], fold["test_rows_removed"]
    assert counts["all"][0] < counts["recent"][0] and counts["all"][1] > counts["recent"][1]
    refused = CliRunner().invoke(app, ["train", "--input", str(small_file), "--known-frauds", "some"])
    assert refused.exit_code == 2 and "one of recent, all" in refused.output
