"""Fixtures shared by the test tiers.

Integration tests run against ONE embedded stack per test session (a real Apache Kafka broker, a real
Valkey server and a SQLite MLflow store), started by the same code as `fraud up`; each test gets its own
freshly created topics, so tests never see each other's records.

The model, scoring and command tests share a small simulated world (``tests.support.samples.SMALL``:
enough days for one handbook split and history) and empty MLflow stores.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import settings as hypothesis_settings

from contracts.settings import Settings, Topics
from features.definitions import DEFAULT_PARAMS
from infra.clients import Clients, Endpoints
from infra.embedded.stack import StackInfo, temporary_stack
from infra.kafka.admin import ensure_topics
from ingest.simulator import simulate, write_parquet
from models.dataset import Dataset, file_dataset
from tests.support.samples import SMALL

#: Property-based tests: a fixed budget of examples, the same examples on every run (no flaky CI), no
#: example database written into the tree. ``HYPOTHESIS_PROFILE=explore`` searches anew, with more.
hypothesis_settings.register_profile("ci", max_examples=1_000, derandomize=True, database=None, deadline=None)
hypothesis_settings.register_profile("explore", max_examples=20_000, deadline=None)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests under tests/integration are the integration tier. The longest files (their ``minutes`` mark,
    measured by ``make test``'s durations) run first: the tier's two workers take whole files in this order
    (``--dist loadfile --no-loadscope-reorder``), so a long file never starts last while the other worker
    idles."""
    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: -minutes(item))


def minutes(item: pytest.Item) -> float:
    """A test's ``minutes`` mark: about how long its file runs on 2 busy cores (0 when unmarked)."""
    mark = item.get_closest_marker("minutes")
    return float(mark.args[0]) if mark is not None else 0.0


@pytest.fixture(scope="session")
def stack_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fraud-home")


@pytest.fixture(scope="session")
def stack(stack_home: Path) -> Iterator[StackInfo]:
    """The embedded stack, started once per session; fails loudly if it cannot start."""
    with temporary_stack(stack_home) as info:
        yield info


@pytest.fixture
def settings(stack: StackInfo, stack_home: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings pointing at the session stack, with topics of this test only (already created)."""
    for name in [n for n in os.environ if n.upper().startswith("FRAUD_")]:
        monkeypatch.delenv(name)
    topics = Topics().with_prefix(f"test-{uuid.uuid4().hex[:10]}-")
    result = Settings(
        home=stack_home,
        bootstrap_servers=stack.bootstrap_servers,
        redis_url=stack.redis_url,
        mlflow_tracking_uri=stack.mlflow_tracking_uri,
        topics=topics,
        partitions=3,
    )
    clients = Clients(result, Endpoints(stack.bootstrap_servers, stack.redis_url, stack.mlflow_tracking_uri))
    ensure_topics(clients.admin(), topics.all(), result.partitions, result.replication_factor)
    return result


@pytest.fixture
def clients(settings: Settings) -> Clients:
    return Clients.from_settings(settings)


# --- the small simulated world and MLflow stores ---------------------------------------------------------


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
    return file_dataset(small_frame, "simulator", DEFAULT_PARAMS, 16_384)


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
