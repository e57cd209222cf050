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

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql.streaming import StreamingQuery

from contracts.settings import JobName, Topics
from features import job as feature_job
from features.counts import COUNTS_DDL, OBSERVATION, BatchObserver
from features.state_layout import Start
from infra.kafka.log import offsets_for_time
from infra.redis.connection import RedisTarget
from infra.spark.checkpoint import pinned_layout, query_location
from infra.spark.kafka_sink.config import KafkaSinkConfig, checkpoint_sink_id
from infra.spark.kafka_sink.datasource import write_micro_batch
from infra.spark.kafka_sink.records import PACKED_DDL, RECORDS_COLUMN
from infra.spark.kafka_source import KafkaInput, check_resume, new_admin, read_stream
from infra.spark.offset_log import record_ending
from infra.spark.session import Trigger
from models.registry import CHAMPION, MODEL_LOADING_MODULES
from scoring.core import Scorer
from scoring.query import ScoredBatch, ScoresWithModels, start_scoring_query
from scoring.redis_hook import ScoresToRedis


@dataclass(frozen=True)
class ScoringJobConfig(ScoresWithModels):
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
    #: Where a new query's input starts (its first records at or after, epoch ms; None: the earliest) and
    #: where a run ends (None: a stream without end, or a ``once`` run's end of the log): a time range
    #: scores just that range.
    start_ms: int | None = None
    end_ms: int | None = None

    #: The job's name (``contracts.settings.JobName``), and what its Python workers import before their
    #: first task (``infra.spark.daemon``): loading a model takes seconds of MLflow and skops imports.
    name: ClassVar[JobName] = JobName.SCORING
    preload: ClassVar[tuple[str, ...]] = (feature_job.__name__, *MODEL_LOADING_MODULES)
    #: What it keeps keyed state for: nothing (a start from a savepoint is the savepoint's copy).
    state: ClassVar[None] = None

    @property
    def description(self) -> str:
        return f"Scoring job running (model alias {self.alias!r}, checkpoint {self.checkpoint})"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.topics.features,)

    @property
    def alert_inputs(self) -> tuple[str, ...]:
        """The topic whose records its alerts come from (its alert latency is measured from their append)."""
        return self.inputs

    def ended(self, progress: dict[str, Any]) -> bool:
        """Never before its ``once`` run reaches the log's end: the records past a range's end are dropped."""
        return False

    def start(
        self, spark: SparkSession, start: Start, trigger: Trigger, on_batch: BatchObserver | None = None
    ) -> StreamingQuery:
        return start_scoring_job(spark, self, trigger, on_batch)  # never rescaled: it keeps no keyed state


def feature_records(spark: SparkSession, config: ScoringJobConfig) -> DataFrame:
    """The records of the features topic, as a stream (cut at the run's end, if it has one). A ``once`` run
    with an end reads on to the log's end as the connector does, and drops what it reads past the end."""
    source = KafkaInput(
        kafka_config=config.kafka_config,
        topics=config.inputs,
        start_ms=config.start_ms,
        max_records_per_trigger=config.max_records_per_trigger,
    )
    ending = None
    if config.end_ms is not None:
        ending = offsets_for_time(new_admin(config.kafka_config), config.inputs, config.end_ms)
    record_ending(config.checkpoint, ending)
    check_resume(config.kafka_config, query_location(config.checkpoint))
    return read_stream(spark, replace(source, ending_offsets=ending))


def by_input_partition(records: DataFrame, tasks: int) -> DataFrame:
    """``records`` in ``tasks`` partitions, each Kafka partition's records in one, by a hash of its topic and
    number: a micro-batch re-run after a crash gives each write task of the sink (and its exactly-once
    marker) the rows it had the first time. (The connector reads a partition's range in a task of its own,
    but may list the tasks in another order when a micro-batch is re-run.)"""
    return records.repartition(tasks, "topic", "partition")


def start_scoring_job(
    spark: SparkSession, config: ScoringJobConfig, trigger: Trigger, on_batch: BatchObserver | None = None
) -> StreamingQuery:
    """Start the streaming scoring job. ``on_batch`` gets each micro-batch's counts and model versions
    (``fraud.metrics.JobMetrics.on_batch``). Its write tasks are as many as its checkpoint's first run
    pinned (``infra.spark.checkpoint.pinned_layout``): a first run takes Spark's cores, so this is decided
    here, once Spark runs, not before it starts.

    Raises:
        ModelNotFoundError: no model holds the alias (train one with ``fraud train``).
    """
    # One write task per core when the checkpoint starts; a restart elsewhere keeps the count.
    default_tasks = spark.sparkContext.defaultParallelism
    write_tasks = pinned_layout(config.checkpoint, {"write_tasks": default_tasks})["write_tasks"]
    sink = KafkaSinkConfig(
        kafka_config=config.kafka_config,
        sink_id=checkpoint_sink_id(config.checkpoint, "scores"),
        marker_topic=config.topics.scores,
        after_commit=ScoresToRedis(config.redis, config.topics.alerts, config.topics.scores),
    )

    def score_micro_batch(records: DataFrame, batch: ScoredBatch) -> Mapping[str, Any]:
        scorer = Scorer(
            tracking_uri=config.tracking_uri,
            version=batch.versions["model"],
            topics=config.topics,
            max_event_bytes=config.max_event_bytes,
            shadow_version=batch.versions.get("shadow"),
            scored_at_ms=batch.scored_at_ms,
        )
        counted = Observation(OBSERVATION)
        scored = by_input_partition(records, write_tasks).mapInArrow(scorer, f"{PACKED_DDL}, {COUNTS_DDL}")
        observed = scored.observe(counted, *feature_job.observations())
        write_micro_batch(observed.select(RECORDS_COLUMN), sink, batch.batch_id)
        return counted.get

    return start_scoring_query(
        spark,
        config,
        query_name=f"scoring-{config.topics.scores}",
        stream=lambda: feature_records(spark, config),
        write=score_micro_batch,
        trigger=trigger,
        on_batch=on_batch,
    )
