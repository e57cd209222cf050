"""An embedded stack of a test's own for the `fraud` command run as a user runs it: the environment that
points the command at it, clients with the same settings, and a registered champion model."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from contracts.settings import Settings
from features.definitions import FeatureParams
from fraud.training import Periods, TrainOptions, run_training
from infra.clients import Clients
from infra.embedded.stack import HOST, StackInfo, temporary_stack
from models.dataset import Dataset, file_dataset
from models.estimators import ModelSpec
from models.metrics import DEFAULT_ALERTS_PER_DAY
from models.registry import CHAMPION, promote
from models.tracking import default_artifact_location
from tests.support.feature_jobs import MAX_EVENT_BYTES


@contextlib.contextmanager
def cli_stack(tmp_path: Path, **settings: str) -> Iterator[tuple[StackInfo, Clients, dict[str, str]]]:
    """A stack under ``tmp_path``; the `fraud` command's environment for it (plus ``settings``, as
    ``FRAUD_*`` values), and clients of the same settings."""
    with temporary_stack(tmp_path / "stack") as stack:
        values = {
            "FRAUD_HOME": str(tmp_path / "home"),
            "FRAUD_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
            "FRAUD_REDIS_URL": stack.redis_url,
            "FRAUD_MLFLOW_TRACKING_URI": stack.mlflow_tracking_uri,
            "FRAUD_TOKEN_KEY": "test-token-key",
            "FRAUD_PARTITIONS": "3",
            **settings,
        }
        base = {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}
        env = {**base, **values, "SPARK_LOCAL_IP": HOST, "COLUMNS": "160"}
        with pytest.MonkeyPatch.context() as patch:
            for name, value in values.items():
                patch.setenv(name, value)
            clients = Clients.from_settings(Settings())
        yield stack, clients, env


def register_champion(clients: Clients, frame: pd.DataFrame, params: FeatureParams, artifacts: Path) -> None:
    """Train a small model on a simulated table and make it version 1, the champion."""
    dataset = file_dataset(frame, "sim", params, MAX_EVENT_BYTES)
    tracking_uri = clients.endpoints.mlflow_tracking_uri
    train_champion(dataset, params, tracking_uri, artifacts)
    promote(tracking_uri, 1, CHAMPION)


def train_champion(dataset: Dataset, params: FeatureParams, tracking_uri: str, artifacts: Path) -> None:
    """Train a small decision tree on ``dataset`` and register it (the first version becomes champion)."""
    options = TrainOptions(
        ModelSpec("decision_tree", max_depth=4),
        "handbook",
        params,
        Periods(train_days=7).plans(dataset.last_ms),
        DEFAULT_ALERTS_PER_DAY,
    )
    run_training(
        dataset, options, tracking_uri, default_artifact_location(tracking_uri, str(artifacts)), True
    )
