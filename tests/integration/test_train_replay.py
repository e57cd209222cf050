"""Training sets replayed from the real broker equal the batch path over the same file (Kappa parity).

Ingests a small simulation into fresh topics (one part of it twice, as an at-least-once re-run would),
replays the transactions and labels topics into a dataset, and expects the same rows, features and labels
as the file path; then `fraud train` without --input trains and registers from the topics.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from contracts.events import TxColumns
from contracts.settings import Settings
from features.definitions import DAY_MS, DEFAULT_PARAMS, EVENT_TIME_MS
from fraud.cli import app
from infra.clients import Clients
from ingest.files import clean_table
from ingest.produce import events_from_table, produce_events
from ingest.simulator import simulate
from models.dataset import file_dataset
from models.metrics import card_precision_key
from models.registry import load_model
from models.replay import replay_dataset, replay_topics
from tests.support.samples import SMALL

C = TxColumns


@pytest.fixture
def small_ingested(settings: Settings, clients: Clients) -> pd.DataFrame:
    frame = simulate(SMALL)
    key = settings.token_key.get_secret_value().encode()
    batch = events_from_table(clean_table(frame, "sim"), "sim", key, 7 * DAY_MS, settings.max_event_bytes)
    assert produce_events(clients.producer(), settings.topics, batch).delivery_errors == []
    again = frame.iloc[:500]  # a re-run of the start of the import: duplicates in the topics
    batch = events_from_table(clean_table(again, "sim"), "sim", key, 7 * DAY_MS, settings.max_event_bytes)
    assert produce_events(clients.producer(), settings.topics, batch).delivery_errors == []
    return frame


def test_replayed_dataset_equals_the_file_path(
    settings: Settings, clients: Clients, small_ingested: pd.DataFrame
) -> None:
    events = replay_topics(clients, settings.topics, settings.max_event_bytes)
    replayed = replay_dataset(events, DEFAULT_PARAMS)
    from_file = file_dataset(small_ingested, "sim", DEFAULT_PARAMS, settings.max_event_bytes)
    compared = [C.TX_ID, EVENT_TIME_MS, C.AMOUNT, *DEFAULT_PARAMS.feature_columns]
    pd.testing.assert_frame_equal(replayed.rows[compared], from_file.rows[compared], check_dtype=False)
    assert replayed.labels[C.TX_ID].sort_values().tolist() == from_file.labels[C.TX_ID].sort_values().tolist()
    assert replayed.rejected == 0


def _on_the_topics(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point the CLI at the test's topics and a fresh MLflow store; returns the store's URI."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {
        "FRAUD_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "FRAUD_REDIS_URL": settings.redis_url,
        "FRAUD_MLFLOW_TRACKING_URI": uri,
        "FRAUD_TOPICS__TRANSACTIONS": settings.topics.transactions,
        "FRAUD_TOPICS__LABELS": settings.topics.labels,
        "FRAUD_TOPICS__FEATURES": f"{settings.topics.transactions}-features",
        "FRAUD_HOME": str(tmp_path / "home"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    return uri


def test_train_from_the_topics(
    settings: Settings, small_ingested: pd.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = _on_the_topics(settings, tmp_path, monkeypatch)
    out = tmp_path / "metrics.json"
    result = CliRunner().invoke(
        app, ["train", "--model", "logistic_regression", "--metrics-out", str(out)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads(out.read_text())
    assert metrics["folds"][0]["test"] == "2018-05-09"  # the latest week the data allows
    assert metrics["version"] == 1
    assert metrics["aliases"] == ["champion"]
    assert load_model(uri).version == 1


def test_the_ab_figures_of_a_model_on_its_test_week_are_its_training_figures(
    settings: Settings, small_ingested: pd.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fraud train --test-start` over the topics registers a model with its test week's metrics; `fraud ab
    run` over that week, the model as champion, judges the same transactions and frauds and gives the same
    AUC, AP and card precision: one protocol, under the default known-frauds rule and under `all`. (The
    features are recomputed from the topics; that the features topic gives the same figures is
    test_ab.py's.)"""
    _on_the_topics(settings, tmp_path, monkeypatch)
    week = ("2018-05-04", "2018-05-11")
    rows = {}
    for rule in ("recent", "all"):
        out = tmp_path / f"{rule}.json"
        result = CliRunner().invoke(
            app,
            ["train", "--model", "logistic_regression", "--test-start", week[0], "--train-days", "7", "--known-frauds", rule,
             "--metrics-out", str(out)],
            catch_exceptions=False,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        trained = json.loads(out.read_text())
        fold = trained["folds"][0]
        assert (fold["test"], fold["train"]) == (week[0], "2018-04-20")
        result = CliRunner().invoke(
            app,
            ["ab", "run", "--from", week[0], "--to", week[1], "--champion", str(trained["version"]),
             "--challenger", "1", "--features", "recompute", "--known-frauds", rule, "--n-boot", "10",
             "--report", str(tmp_path / "ab.html"), "--json"],
            catch_exceptions=False,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        replayed = json.loads(result.stdout[result.stdout.index("{") :])
        assert (replayed["rows"], replayed["frauds"]) == (fold["test_rows"], fold["test_frauds"]), rule
        for metric in ("roc_auc", "average_precision", card_precision_key(100)):  # the A/B's JSON: 6 digits
            assert replayed["differences"][metric]["a"] == pytest.approx(fold[metric], abs=1e-6), (
                rule,
                metric,
            )
        rows[rule] = replayed["rows"]
    assert rows["all"] < rows["recent"], "the two rules give different frames here"
