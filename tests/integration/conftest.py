"""Fixtures of the integration tier: one real Spark session (local mode) for the whole test session.

Starting Spark's JVM costs seconds, so every integration test shares this session; tests isolate
themselves with their own topics (``settings``), checkpoints and query names.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from contracts.settings import Settings
from fraud.jobs import SPARK_PRELOAD
from infra.spark import spark_session


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """Spark in local[2] mode: 2 shuffle partitions, Python workers on this interpreter, no UI, RocksDB state."""
    settings = Settings(spark_master="local[2]", home=tmp_path_factory.mktemp("spark-home"))
    session = spark_session(
        settings, app_name="fraud-integration-tests", shuffle_partitions=2, preload=SPARK_PRELOAD
    )
    try:
        yield session
    finally:
        session.stop()
