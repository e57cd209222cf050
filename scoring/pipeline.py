"""The pipeline: the feature job and the scoring stage in ONE Spark query, for the lowest alert latency.

Transactions and labels in; feature records, score records and alerts out, all written in the same Kafka
transactions, and the latest features, scores and alerts in Redis. The terminal stage of the feature job
(``features.job``) scores each state call's feature rows right where it made them
(``features.job.FeatureRowsHook``), with the model version the driver chose for the micro-batch: no second
query, no second read and validation of the features topic, no second micro-batch on the way to an alert.
The separate jobs (``fraud features run`` + ``fraud score run``) stay what replays and A/B runs use; both
ways score with the same code (``scoring.core.score_rows``) and give the same scores.

Model updates without restart and exactly-once work as in the scoring job (``scoring.job``): the driver
re-reads the alias every ``model_check_interval_s``, records the version of each micro-batch in the
checkpoint before the batch runs, and hands it to the Python workers as a Spark local property of the
batch's tasks. Each micro-batch is written by ``foreachBatch`` with the sink's commit markers under its
batch id: exactly-once for read_committed consumers of every output topic, and a re-run batch is scored by
the version it was scored by the first time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from contracts.records import source_position
from contracts.settings import JobName, Topics
from features.counts import BatchObserver
from features.job import FeatureJobConfig, LatestFeaturesToRedis, feature_sink, feature_stream
from features.rows import EVENT_FIELDS, SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TOPIC
from features.state_layout import Start, StateSpec
from infra.redis.connection import RedisTarget
from infra.spark.kafka_sink.config import AfterCommitAll
from infra.spark.kafka_sink.datasource import write_micro_batch
from infra.spark.kafka_sink.records import SinkRows
from infra.spark.session import Trigger
from infra.spark.timing import Timings
from models.registry import CHAMPION
from scoring.core import SCORED_EVENT_FIELDS, now_ms, score_rows, shadow_rows
from scoring.job import ScoringJobConfig
from scoring.model_cache import worker_model
from scoring.query import ScoredBatch, ScoresWithModels, start_scoring_query
from scoring.redis_hook import ScoresToRedis

#: Spark local properties carrying the model version of a micro-batch (and the shadow's) and its scoring
#: time to its tasks.
MODEL_VERSION_PROPERTY = "fraud.model.version"
SHADOW_VERSION_PROPERTY = "fraud.shadow.version"
SCORED_AT_PROPERTY = "fraud.scored.at"


#: The Arrow type of each event field.
EVENT_TYPES = dict(EVENT_FIELDS)


@dataclass(frozen=True)
class PipelineConfig(ScoresWithModels):
    """The feature job's configuration plus what scoring needs (all from parameters, never globals)."""

    features: FeatureJobConfig
    tracking_uri: str
    model_check_interval_s: float
    alias: str = CHAMPION
    #: A second alias scored beside the serving one, to the shadow scores topic (``scoring.job``).
    shadow_alias: str | None = None

    #: The job's name (``contracts.settings.JobName``), and what its Python workers import before their
    #: first task (``infra.spark.daemon``), a model's loading included.
    name: ClassVar[JobName] = JobName.PIPELINE
    preload: ClassVar[tuple[str, ...]] = ScoringJobConfig.preload

    @property
    def topics(self) -> Topics:
        return self.features.topics

    @property
    def checkpoint(self) -> Path:
        return self.features.checkpoint

    @property
    def kafka_config(self) -> dict[str, Any]:
        return self.features.kafka_config

    @property
    def redis(self) -> RedisTarget:
        return self.features.redis

    @property
    def description(self) -> str:
        return f"Pipeline running (model alias {self.alias!r}, checkpoint {self.checkpoint})"

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.features.inputs

    @property
    def alert_inputs(self) -> tuple[str, ...]:
        """The topic whose records its alerts come from (its alert latency is measured from their append)."""
        return (self.topics.transactions,)

    @property
    def state(self) -> StateSpec:
        """What its feature stages keep their state for (``features.state_layout``)."""
        return self.features.state

    def ended(self, progress: dict[str, Any]) -> bool:
        return self.features.ended(progress)

    def start(
        self, spark: SparkSession, start: Start, trigger: Trigger, on_batch: BatchObserver | None = None
    ) -> StreamingQuery:
        return start_pipeline(spark, self, start, trigger, on_batch)


@dataclass(frozen=True)
class RowScorer:
    """``features.job.FeatureRowsHook``: score records and alerts of the feature rows of one state call."""

    tracking_uri: str
    topics: Topics
    feature_columns: tuple[str, ...]

    def __call__(self, rows: pd.DataFrame, values: pa.Array) -> pa.Table | None:
        context = TaskContext.get()
        version = context.getLocalProperty(MODEL_VERSION_PROPERTY) if context is not None else None
        if context is None or version is None:
            raise RuntimeError(
                f"no model version for this micro-batch: {MODEL_VERSION_PROPERTY} is set by start_pipeline"
            )
        timings = Timings("scoring")
        with timings.phase("model"):
            model = worker_model(self.tracking_uri, int(version))
        scored_at_ms = int(context.getLocalProperty(SCORED_AT_PROPERTY) or now_ms())
        # As declared: an integer column that met a null on its way (pandas made it float, as when dead rows
        # shared the frame) is cast back, so that score records carry ints (1525135586000, not 1.525135586e+12).
        event = {
            name: pa.Array.from_pandas(rows[name]).cast(EVENT_TYPES[name]) for name in SCORED_EVENT_FIELDS
        }
        others = SinkRows()
        features = rows[list(self.feature_columns)]

        def source_of(i: int) -> str:
            return source_position(
                *(rows[name].iat[i] for name in (SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET))
            )

        with timings.phase("score"):
            scored = [
                score_rows(model, event, features, values, self.topics, others, scored_at_ms, source_of)
            ]
        shadow = context.getLocalProperty(SHADOW_VERSION_PROPERTY)
        if shadow:
            scored.append(
                shadow_rows(
                    worker_model(self.tracking_uri, int(shadow)),
                    event,
                    features,
                    topics=self.topics,
                    scored_at_ms=scored_at_ms,
                )
            )
        batches = [batch for batch in (*scored, others.batch()) if batch is not None]
        timings.log()
        return pa.Table.from_batches(batches) if batches else None


def start_pipeline(
    spark: SparkSession,
    config: PipelineConfig,
    start: Start,
    trigger: Trigger,
    on_batch: BatchObserver | None = None,
) -> StreamingQuery:
    """Start the pipeline in its checkpoint, bound to its state before (``features.state_layout.bind``).
    ``on_batch`` gets each micro-batch's model versions
    (its counts come with Spark's progress reports, ``fraud.metrics``).

    Raises:
        ModelNotFoundError: no model holds the alias (train one with ``fraud train``).
    """
    features = config.features
    scorer = RowScorer(config.tracking_uri, config.topics, features.params.feature_columns)
    # Alerts and the latest score of each card first (what alert consumers wait for), then its features.
    to_redis = AfterCommitAll(
        (
            ScoresToRedis(features.redis, config.topics.alerts, config.topics.scores),
            LatestFeaturesToRedis(features.redis, config.topics.features),
        )
    )
    sink = feature_sink(features, after_commit=to_redis)

    def write_batch(records: DataFrame, batch: ScoredBatch) -> Mapping[str, Any]:
        context = records.sparkSession.sparkContext
        context.setLocalProperty(SCORED_AT_PROPERTY, str(batch.scored_at_ms))
        context.setLocalProperty(MODEL_VERSION_PROPERTY, str(batch.versions["model"]))
        context.setLocalProperty(SHADOW_VERSION_PROPERTY, str(batch.versions.get("shadow") or ""))
        write_micro_batch(records, sink, batch.batch_id)
        return {}

    return start_scoring_query(
        spark,
        config,
        query_name=f"pipeline-{config.topics.features}",
        stream=lambda: feature_stream(spark, features, start, hook=scorer),
        write=write_batch,
        trigger=trigger,
        on_batch=on_batch,
    )
