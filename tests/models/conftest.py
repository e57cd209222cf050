"""A small simulated world shared by the model tests: enough days for one handbook split and history."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pandas as pd
import pytest

from features.definitions import DAY_MS, DEFAULT_PARAMS
from ingest.simulator import SimulatorConfig, simulate, write_parquet
from models.dataset import Dataset, file_dataset

#: 45 days from 2018-04-01: 30 days of feature history, then train 7 / delay 7 / test 7 would not fit,
#: so the tests' default split starts after 24 days (short history is fine for tests).
SMALL = SimulatorConfig(customers=300, terminals=600, days=45, start=dt.date(2018, 4, 1), seed=3)
LABEL_DELAY_MS = 7 * DAY_MS


@pytest.fixture(scope="session")
def small_frame() -> pd.DataFrame:
    return simulate(SMALL)


@pytest.fixture(scope="session")
def small_file(small_frame: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "small.parquet"
    write_parquet(small_frame, path)
    return path


@pytest.fixture(scope="session")
def small_dataset(small_frame: pd.DataFrame) -> Dataset:
    return file_dataset(small_frame, "simulator", DEFAULT_PARAMS, LABEL_DELAY_MS, 16_384)


@pytest.fixture(scope="session")
def blank_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store, created (schema migrations and all) once per session."""
    from models.registry import registry_client

    path = tmp_path_factory.mktemp("mlflow") / "blank.db"
    registry_client(f"sqlite:///{path}").search_experiments(max_results=1)
    return path


@pytest.fixture
def store_uri(blank_store: Path, tmp_path: Path) -> str:
    """A fresh, empty MLflow store of this test: a copy of the blank one (artifacts next to it)."""
    path = tmp_path / "mlflow.db"
    shutil.copyfile(blank_store, path)
    return f"sqlite:///{path}"
