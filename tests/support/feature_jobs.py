"""The streaming feature job as the integration tests run it: simulated input with the batch path's
features as reference, clients with topics of their own, the job's config over a test's topics, and one
availableNow run of the job."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from contracts.events import TransactionEvent, TxColumns
from contracts.settings import DEFAULT_RETENTION_S, Settings, Topics
from features.batch import transactions_features
from features.definitions import FeatureParams
from features.job import FeatureJobConfig, start_feature_job
from infra.clients import Clients, Endpoints, ensure_topics
from infra.embedded import StackInfo
from infra.redis_store import RedisTarget
from ingest.files import clean_table
from ingest.produce import EventBatch, events_from_table
from ingest.simulator import SimulatorConfig, simulate
from tests.support.samples import LABEL_DELAY_MS

C = TxColumns
MAX_EVENT_BYTES = 16_384
JOB_TIMEOUT_S = 240


@dataclass
class Simulated:
    """A simulated table's events as ingest builds them, and the batch path's features of the table."""

    events: EventBatch
    reference: pd.DataFrame  # tx_id (index), then the feature columns
    transactions: dict[int, TransactionEvent]  # the events as produced, by tx_id


def simulated(config: SimulatorConfig, settings: Settings, params: FeatureParams) -> Simulated:
    """Simulate, build the events (tokenised with the settings' key, labels a week later) and the reference."""
    frame = simulate(config)
    key = settings.token_key.get_secret_value().encode()
    events = events_from_table(clean_table(frame, "sim"), "sim", key, LABEL_DELAY_MS, MAX_EVENT_BYTES)
    assert not events.dead_letters
    reference = transactions_features(frame, "sim", params, LABEL_DELAY_MS, MAX_EVENT_BYTES)
    assert len(reference.features) == len(frame) and not reference.rejected
    transactions = {
        event.tx_id: event for event in map(TransactionEvent.model_validate_json, events.tx_values)
    }
    return Simulated(events, reference.features.set_index(C.TX_ID).sort_index(), transactions)


def prefix_of(topics: Topics) -> str:
    """The prefix of topics made by ``Topics.with_prefix`` (the jobs use it for their Redis keys too)."""
    return topics.features.removesuffix(Topics().features)


def job_config(
    clients: Clients,
    topics: Topics,
    checkpoint: Path,
    max_records: int | None,
    params: FeatureParams | None = None,
) -> FeatureJobConfig:
    """The job over ``topics`` with Redis keys under the topics' prefix."""
    return FeatureJobConfig(
        kafka_config=clients.kafka_config(),
        topics=topics,
        checkpoint=checkpoint,
        redis=RedisTarget(clients.endpoints.redis_url, prefix_of(topics), DEFAULT_RETENTION_S),
        params=params or FeatureParams(),
        max_event_bytes=MAX_EVENT_BYTES,
        max_records_per_trigger=max_records,
    )


def finished_query(spark: SparkSession, config: FeatureJobConfig) -> StreamingQuery:
    """Run the job with the availableNow trigger until it stops; the stopped query (its plans and
    progress reports can still be read)."""
    query = start_feature_job(spark, config, once=True)
    try:
        finished = query.awaitTermination(JOB_TIMEOUT_S)
    finally:
        query.stop()
    assert finished, f"the feature job did not finish within {JOB_TIMEOUT_S} s"
    assert query.exception() is None, f"the feature job failed: {query.exception()}"
    return query


def run_once(spark: SparkSession, config: FeatureJobConfig) -> list[dict[str, Any]]:
    """Run the job with the availableNow trigger until it stops; its micro-batches' progress reports."""
    return [dict(progress) for progress in finished_query(spark, config).recentProgress]


def isolated_clients(stack: StackInfo, home: Path) -> Clients:
    """Clients of settings with topics of their own (created), for fixtures wider than one test."""
    settings = Settings(
        home=home,
        bootstrap_servers=stack.bootstrap_servers,
        redis_url=stack.redis_url,
        mlflow_tracking_uri=stack.mlflow_tracking_uri,
        topics=Topics().with_prefix(f"test-{uuid.uuid4().hex[:10]}-"),
        partitions=3,
    )
    clients = Clients(
        settings, Endpoints(stack.bootstrap_servers, stack.redis_url, stack.mlflow_tracking_uri)
    )
    ensure_topics(clients.admin(), settings.topics.all(), settings.partitions, settings.replication_factor)
    return clients
