"""The project's jobs as the bench scripts set them up: input events, a champion model, job configs.

``bench_scoring.py`` runs the jobs in its own process; ``bench_peers.py`` runs the pipeline as a
subprocess (``peers/pipeline.py``) beside the peers. Both build them here, so the two measure the same
thing.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pandas as pd

from contracts.events import TxColumns
from contracts.settings import Topics
from features.definitions import DAY_MS, FeatureParams
from features.job import FeatureJobConfig
from features.state_layout import Start, bind
from fraud.jobs import redis_target
from fraud.training import Periods, TrainOptions, run_training
from infra.clients import Clients
from infra.embedded.stack import HOST, StackInfo
from ingest.files import clean_table
from ingest.produce import EventBatch, events_from_table
from ingest.simulator import SimulatorConfig, simulate
from models.dataset import file_dataset
from models.estimators import DEFAULT_SPEC
from models.metrics import DEFAULT_ALERTS_PER_DAY
from models.tracking import default_artifact_location
from scoring.pipeline import PipelineConfig

LABEL_DELAY_MS = 7 * DAY_MS
#: The simulator's mean transactions per customer and day (at least), to simulate enough for the paced loads.
TX_PER_CUSTOMER_DAY = 1.9
MAX_EVENT_BYTES = 16_384
#: The bench's token key (any key: the simulation has no real card numbers).
TOKEN_KEY = b"bench"
#: How the champion is trained on the latest days of the input: a week of training, 3 days of delay, 3 of
#: test.
CHAMPION_TRAIN_DAYS, CHAMPION_GAP_DAYS, CHAMPION_TEST_DAYS = 7, 3, 3
#: The fewest days of input the champion learns from: a week of training, its delay and test days. On fewer,
#: the training days' frauds are not known yet (their labels come ``LABEL_DELAY_MS`` late): a model of no
#: fraud puts its threshold at zero and alerts on every transaction.
CHAMPION_MIN_DAYS = CHAMPION_TRAIN_DAYS + CHAMPION_GAP_DAYS + CHAMPION_TEST_DAYS
#: The world the champion learns from when the input is shorter (a large world's few days): the features
#: describe one card or terminal, so a model of this world scores another world's transactions as it would
#: its own.
CHAMPION_WORLD = SimulatorConfig(customers=5_000, terminals=10_000, days=31, seed=0)


def events_of(frame: pd.DataFrame) -> EventBatch:
    """The events ``fraud ingest`` makes of a simulated table: tokenised, validated, labels for frauds."""
    return events_from_table(clean_table(frame, "bench"), "bench", TOKEN_KEY, LABEL_DELAY_MS, MAX_EVENT_BYTES)


def train_champion(first: pd.DataFrame, info: StackInfo, params: FeatureParams) -> None:
    """Train the default model (``models.estimators.DEFAULT_SPEC``) on every feature of ``first`` (batch
    path), or of ``CHAMPION_WORLD`` when ``first`` holds fewer than ``CHAMPION_MIN_DAYS`` days, and register
    it in the stack's MLflow store, where the first version becomes the champion."""
    first_day, last_day = first[TxColumns.EVENT_TIME].min(), first[TxColumns.EVENT_TIME].max()
    if (last_day.normalize() - first_day.normalize()).days + 1 < CHAMPION_MIN_DAYS:
        first = simulate(CHAMPION_WORLD)
    dataset = file_dataset(first, "bench", params, MAX_EVENT_BYTES)
    options = TrainOptions(
        DEFAULT_SPEC,
        "all",
        params,
        Periods(
            train_days=CHAMPION_TRAIN_DAYS, gap_days=CHAMPION_GAP_DAYS, test_days=CHAMPION_TEST_DAYS
        ).plans(dataset.last_ms),
        DEFAULT_ALERTS_PER_DAY,
    )
    run_training(
        dataset,
        options,
        info.mlflow_tracking_uri,
        default_artifact_location(info.mlflow_tracking_uri, info.mlflow_artifacts),
        register=True,
    )


def feature_config(
    clients: Clients,
    topics: Topics,
    checkpoint: Path,
    params: FeatureParams,
    max_records: int,
    card_buckets: int,
    terminal_buckets: int,
    redis_prefix: str = "",
) -> FeatureJobConfig:
    """The feature job over ``topics``, its latest features in Redis under ``redis_prefix``."""
    return FeatureJobConfig(
        kafka_config=clients.kafka_config(),
        topics=topics,
        checkpoint=checkpoint,
        redis=redis_target(clients.settings, clients, prefix=redis_prefix),
        params=params,
        max_event_bytes=MAX_EVENT_BYTES,
        max_records_per_trigger=max_records,
        card_buckets=card_buckets,
        terminal_buckets=terminal_buckets,
    )


def pipeline_config(
    clients: Clients,
    info: StackInfo,
    features: FeatureJobConfig,
    topics: Topics,
    checkpoint: Path,
    prefix: str,
) -> PipelineConfig:
    """``fraud pipeline run`` as the feature job ``features`` with scoring, into ``topics``, Redis keys under
    ``prefix`` and a checkpoint of its own; the champion from the stack's MLflow store."""
    return PipelineConfig(
        features=replace(
            features,
            topics=topics,
            checkpoint=checkpoint,
            redis=redis_target(clients.settings, clients, prefix=prefix),
        ),
        tracking_uri=info.mlflow_tracking_uri,
        model_check_interval_s=clients.settings.model_check_interval_s,
    )


def bound(job: FeatureJobConfig | PipelineConfig) -> Start:
    """The start of ``job``'s query that ``fraud features|pipeline run`` makes without a savepoint: its
    checkpoint bound to its state first (``features.state_layout.bind``)."""
    bind(job.checkpoint, job.state)
    return Start()


def fraud_env(info: StackInfo, home: Path, token_key: str, **settings: str) -> dict[str, str]:
    """The environment of a ``fraud`` command run by a bench on the stack ``info`` (this process's
    environment without its ``FRAUD_*`` settings, then the stack's, then ``settings``)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}
    return base | {
        "SPARK_LOCAL_IP": HOST,
        "FRAUD_HOME": str(home),
        "FRAUD_BOOTSTRAP_SERVERS": info.bootstrap_servers,
        "FRAUD_REDIS_URL": info.redis_url,
        "FRAUD_MLFLOW_TRACKING_URI": info.mlflow_tracking_uri,
        "FRAUD_TOKEN_KEY": token_key,
        **settings,
    }
