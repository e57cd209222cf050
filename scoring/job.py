"""The streaming scoring job: features topic -> the champion model -> scores and alerts (Kafka) + Redis.

Each micro-batch of feature records is scored, vectorised, by one registered model version
(``mapInArrow``; each Python worker loads a version once and keeps it). Every transaction gets a score
record on the scores topic; those at or above the model's threshold also become alerts on the alerts
topic, both keyed by card and stamped with the transaction's event time. Records that are not feature
records go to the dead-letter topic with the reason.

Model updates without a restart: the driver re-reads the alias (``champion`` by default) every
``model_check_interval_s``. A new version is loaded once in the driver first; if that fails, the old
version keeps serving and the error is logged. The switch happens between micro-batches, and every
record names the version that scored it.

Delivery guarantee: exactly-once for read_committed consumers of the scores, alerts and dead-letter
topics. Each micro-batch is written with the sink's commit markers under its batch id (``foreachBatch``
plus ``batch.id``), and the model version used for each micro-batch is recorded in the checkpoint before
its rows are written, so a micro-batch re-run after a crash is scored by the same version and writes
nothing twice. Redis (``alert:{tx_id}``, ``card:{card}:alerts``, ``card:{card}:score``) is written after
each committed Kafka transaction, idempotently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql.streaming import StreamingQuery

from contracts.settings import Topics
from infra.checkpoints import PerBatch, pinned_layout, query_location
from infra.kafka_sink.config import KafkaSinkConfig, checkpoint_sink_id
from infra.kafka_sink.datasource import register as register_sink
from infra.kafka_sink.datasource import write_micro_batch
from infra.kafka_sink.records import PACKED_DDL, RECORDS_COLUMN
from infra.kafka_source.config import EARLIEST, LATEST, KafkaSourceConfig
from infra.kafka_source.datasource import read_stream
from infra.redis_connection import RedisTarget
from infra.spark import start_stream
from infra.stage_counts import COUNTS_DDL, OBSERVATION, observations
from models.registry import CHAMPION
from scoring.chooser import batch_versions, model_choosers
from scoring.core import Scorer, now_ms
from scoring.redis_hook import ScoresToRedis


@dataclass(frozen=True)
class ScoringJobConfig:
    """What one run of the scoring job reads, uses and writes (all from parameters, never globals)."""

    kafka_config: dict[str, Any] = field(repr=False)  # credentials: never in a repr
    topics: Topics
    checkpoint: Path
    redis: RedisTarget
    tracking_uri: str = field(repr=False)  # may carry credentials (https://user:password@...)
    max_event_bytes: int
    model_check_interval_s: float
    alias: str = CHAMPION
    max_records_per_trigger: int | None = None
    #: A second alias scored beside the serving one (a challenger): its scores go to the shadow scores
    #: topic, never to alerts or Redis.
    shadow_alias: str | None = None
    #: Where the input is read from and, for a ``once`` run, up to (``infra.kafka_source.config``): a
    #: time range replays just that range.
    starting_offsets: str = EARLIEST
    ending_offsets: str = LATEST


#: Gets each micro-batch's summed counts (``infra.stage_counts.COUNTS``) and the model versions that served it.
BatchObserver = Callable[[Mapping[str, Any], Mapping[str, int | None]], None]


def feature_records(spark: SparkSession, config: ScoringJobConfig) -> DataFrame:
    """The raw records of the features topic, as a stream."""
    source = KafkaSourceConfig(
        kafka_config=config.kafka_config,
        topics=(config.topics.features,),
        max_records_per_trigger=config.max_records_per_trigger,
        starting_offsets=config.starting_offsets,
        ending_offsets=config.ending_offsets,
        # One task per core when the checkpoint starts; a restart elsewhere keeps the count: a re-run
        # micro-batch must give each write task (and its exactly-once marker) the rows it had the first time.
        read_tasks=pinned_layout(config.checkpoint, {"read_tasks": spark.sparkContext.defaultParallelism})[
            "read_tasks"
        ],
    )
    return read_stream(spark, source)


def scoring_clock(checkpoint: Path) -> PerBatch:
    """When each micro-batch is scored (its records' ``scored_at_ms``), recorded in the checkpoint before
    the batch is written: a re-run writes the same records, and Redis agrees with the topic."""
    return PerBatch(checkpoint / "scored-at.json")


def start_scoring_job(
    spark: SparkSession,
    config: ScoringJobConfig,
    *,
    once: bool,
    trigger_interval_s: float = 1.0,
    on_batch: BatchObserver | None = None,
) -> StreamingQuery:
    """Start the streaming scoring job: ``once`` scores everything available, then stops. ``on_batch`` gets
    each micro-batch's counts and model versions (``infra.metrics.JobMetrics.on_batch``).

    Raises:
        ModelNotFoundError: no model holds the alias (train one with ``fraud train``).
    """
    register_sink(spark)
    chooser, shadow = model_choosers(
        config.tracking_uri,
        alias=config.alias,
        shadow_alias=config.shadow_alias,
        interval_s=config.model_check_interval_s,
        checkpoint=config.checkpoint,
    )
    sink = KafkaSinkConfig(
        kafka_config=config.kafka_config,
        sink_id=checkpoint_sink_id(config.checkpoint, "scores"),
        marker_topic=config.topics.scores,
        after_commit=ScoresToRedis(config.redis, config.topics.alerts, config.topics.scores),
    )

    clock = scoring_clock(config.checkpoint)

    def score_micro_batch(records: DataFrame, batch_id: int) -> None:
        versions = batch_versions(batch_id, chooser, shadow)
        scorer = Scorer(
            tracking_uri=config.tracking_uri,
            version=versions["model"],
            topics=config.topics,
            max_event_bytes=config.max_event_bytes,
            shadow_version=versions.get("shadow"),
            scored_at_ms=clock.get(batch_id, now_ms),
        )
        counted = Observation(OBSERVATION)
        scored = records.mapInArrow(scorer, f"{PACKED_DDL}, {COUNTS_DDL}")
        observed = scored.observe(counted, *observations())
        write_micro_batch(observed.select(RECORDS_COLUMN), sink, batch_id)
        if on_batch is not None:
            on_batch(counted.get, versions)

    writer = (
        feature_records(spark, config)
        .writeStream.foreachBatch(score_micro_batch)
        .option("checkpointLocation", str(query_location(config.checkpoint)))
        .queryName(f"scoring-{config.topics.scores}")
    )
    return start_stream(writer, once, trigger_interval_s)
