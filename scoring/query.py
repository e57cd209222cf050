"""The shell of the two queries that score, the scoring job (``scoring.job``) and the pipeline
(``scoring.pipeline``): each micro-batch's model versions are chosen and recorded in the checkpoint by the
driver (``scoring.chooser``), its scoring time is fixed and recorded too, its rows are written with the
sink's commit markers under its batch id (``foreachBatch``), then its counts and versions go to the job's
observer. A re-run micro-batch finds its versions and its time recorded and writes the same records."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from contracts.settings import JobName
from features.counts import BatchObserver
from infra.spark.checkpoint import PerBatch, query_location
from infra.spark.kafka_sink.datasource import register as register_sink
from infra.spark.session import Trigger, start_stream
from infra.spark.timing import Timings
from scoring.chooser import batch_versions, model_choosers
from scoring.core import now_ms


def scoring_clock(checkpoint: Path) -> PerBatch:
    """When each micro-batch is scored (its records' ``scored_at_ms``), recorded in the checkpoint before
    the batch is written: a re-run writes the same records, and Redis agrees with the topic."""
    return PerBatch(checkpoint / "scored-at.json")


@dataclass(frozen=True)
class ScoredBatch:
    """What the driver fixed for one micro-batch before its rows are written."""

    batch_id: int
    #: The model versions that score it: ``model``, and ``shadow`` when a challenger is scored beside it.
    versions: Mapping[str, int]
    scored_at_ms: int


#: Writes one micro-batch's rows; returns its summed counts (``features.counts.COUNTS``), or nothing when
#: they come with the query's progress reports instead.
BatchWriter = Callable[[DataFrame, ScoredBatch], Mapping[str, Any]]


@dataclass(frozen=True, kw_only=True)
class ModelChoice:
    """Which models score, and how often the driver looks for a new version of them."""

    tracking_uri: str
    alias: str
    shadow_alias: str | None
    check_interval_s: float


class ScoresWithModels:
    """A job that scores (the scoring job, the pipeline): its ``tracking_uri``, ``alias``, ``shadow_alias``
    and ``model_check_interval_s`` say which models score it."""

    tracking_uri: str
    alias: str
    shadow_alias: str | None
    model_check_interval_s: float

    @property
    def models(self) -> ModelChoice:
        return ModelChoice(
            tracking_uri=self.tracking_uri,
            alias=self.alias,
            shadow_alias=self.shadow_alias,
            check_interval_s=self.model_check_interval_s,
        )


class ScoringQueryJob(Protocol):
    """What the shell needs of a job that scores: its name, its checkpoint and its models."""

    name: ClassVar[JobName]

    @property
    def checkpoint(self) -> Path: ...
    @property
    def models(self) -> ModelChoice: ...


def start_scoring_query(
    spark: SparkSession,
    job: ScoringQueryJob,
    *,
    query_name: str,
    stream: Callable[[], DataFrame],
    write: BatchWriter,
    trigger: Trigger,
    on_batch: BatchObserver | None = None,
) -> StreamingQuery:
    """Start ``job``'s scoring query over ``stream()`` (built once the models are found), ``write`` writing
    each micro-batch.

    Raises:
        ModelNotFoundError: no model holds the alias (train one with ``fraud train``).
    """
    register_sink(spark)
    models, checkpoint = job.models, job.checkpoint
    chooser, shadow = model_choosers(
        models.tracking_uri,
        alias=models.alias,
        shadow_alias=models.shadow_alias,
        interval_s=models.check_interval_s,
        checkpoint=checkpoint,
    )
    clock = scoring_clock(checkpoint)

    def micro_batch(records: DataFrame, batch_id: int) -> None:
        timings = Timings(f"{job.name}-batch", batch=batch_id)
        with timings.phase("versions"):
            versions = batch_versions(batch_id, chooser, shadow)
            batch = ScoredBatch(batch_id, versions, clock.get(batch_id, now_ms))
        with timings.phase("write"):
            counts = write(records, batch)
        timings.log()
        if on_batch is not None:
            on_batch(counts, versions)

    writer = (
        stream()
        .writeStream.foreachBatch(micro_batch)
        .option("checkpointLocation", str(query_location(checkpoint)))
        .queryName(query_name)
    )
    return start_stream(writer, trigger)
