"""The streaming jobs wired from the settings, in one place: their typed configs, Spark, progress.

Every job (``fraud features run``, ``fraud score run``, ``fraud pipeline run``, the demo) gets its
configuration from here, built from the settings the CLI loaded; the jobs themselves read nothing global.
This module imports PySpark and the jobs: the CLI imports it when a job runs, not at start-up.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from contracts.settings import JobName, Settings, Topics, redis_prefix
from features.counts import BatchObserver
from features.definitions import FeatureParams
from features.job import FeatureJobConfig
from features.state_layout import Start, StateSpec
from fraud import savepoints
from fraud.console import console, summary_table
from fraud.metrics import JobMetrics
from fraud.options import DEFAULT_MAX_RECORDS
from fraud.progress import QueryReport, ctrl_c_interrupts_the_command_only, watch_query
from fraud.running import registered, this_job
from infra.clients import Clients
from infra.kafka.admin import create_project_topics
from infra.kafka.input_watch import InputWatch, observer_group
from infra.redis.connection import RedisTarget
from infra.spark.checkpoint import query_location
from infra.spark.offset_log import frontier_ms_at
from infra.spark.session import (
    Trigger,
    check_executors,
    spark_session,
    stop_between_batches,
    stop_session,
)
from models.registry import CHAMPION
from scoring.job import ScoringJobConfig
from scoring.pipeline import PipelineConfig

#: Modules the Python workers of the feature job, and of the jobs that score, import before their first task.
SPARK_PRELOAD = FeatureJobConfig.preload
SCORING_PRELOAD = ScoringJobConfig.preload


def import_ahead(modules: tuple[str, ...]) -> threading.Thread:
    """Import ``modules`` in a thread of their own, started here: the driver imports what loading a model
    needs (seconds of MLflow and skops) while Spark starts, which mostly waits on the JVM. The job's start
    loads the model once Spark is up and finds them imported (or waits for the import under way). A module
    that fails to import is left to fail where the job imports it, with the job's own error."""

    def run() -> None:
        for name in modules:
            with contextlib.suppress(Exception):
                importlib.import_module(name)

    thread = threading.Thread(target=run, name="import-ahead", daemon=True)
    thread.start()
    return thread


def job_spark_session(
    settings: Settings, app_name: str, preload: tuple[str, ...] = SCORING_PRELOAD
) -> SparkSession:
    """The Spark session of a job: the settings' master, the jobs' modules (``preload``) imported in its
    workers before their first task. While Spark starts, the driver imports them too (:func:`import_ahead`;
    done by the time the session is returned, so no import of the job's runs beside it)."""
    importing = import_ahead(preload)
    spark = spark_session(settings, app_name=app_name, preload=preload)
    importing.join()
    return spark


class Job(Protocol):
    """A streaming job as the app runs it: ``FeatureJobConfig``, ``ScoringJobConfig`` and ``PipelineConfig``
    each say what they are, read and write, and start themselves."""

    #: Its name (``contracts.settings.JobName``): its run command's, metrics' label, Spark application's.
    name: ClassVar[JobName]
    #: What its Python workers import before their first task (``infra.spark.daemon``).
    preload: ClassVar[tuple[str, ...]]

    @property
    def topics(self) -> Topics: ...
    @property
    def checkpoint(self) -> Path: ...
    @property
    def kafka_config(self) -> dict[str, Any]: ...
    @property
    def redis(self) -> RedisTarget: ...
    @property
    def description(self) -> str:
        """The line that says what runs."""
        ...

    @property
    def inputs(self) -> tuple[str, ...]:
        """The topics it reads."""
        ...

    @property
    def alert_inputs(self) -> tuple[str, ...]:
        """The topics whose records its alerts come from (its alert latency is measured from their append)."""
        ...

    @property
    def state(self) -> StateSpec | None:
        """What it keeps the features' state for (``features.state_layout``; None: it keeps none)."""
        ...

    def ended(self, progress: dict[str, Any]) -> bool:
        """Whether a run of a time range is done after the micro-batch of this progress report (the query
        reads on otherwise: Spark's Kafka connector has no end for streams)."""
        ...

    def start(
        self, spark: SparkSession, start: Start, trigger: Trigger, on_batch: BatchObserver | None = None
    ) -> StreamingQuery:
        """Start its query in its checkpoint, made ready by ``fraud.savepoints.plan_start`` (``start``)."""
        ...


@dataclass(frozen=True)
class Scope:
    """Where a job runs: its namespace (its own output topics, Redis keys and checkpoints; the live
    pipeline's is empty) and, for a replay, the event-time range of the input it reads."""

    namespace: str = ""
    start_ms: int | None = None
    end_ms: int | None = None


def redis_target(settings: Settings, clients: Clients, *, prefix: str = "", writer: str = "") -> RedisTarget:
    """Where a job (``writer``) in the key space ``prefix`` keeps its lookups, for the settings' retention."""
    return RedisTarget(
        clients.endpoints.redis_url, prefix, settings.alert_retention_s, settings.redis, writer
    )


def feature_job_config(
    settings: Settings,
    clients: Clients,
    *,
    topics: Topics,
    checkpoint: Path,
    params: FeatureParams,
    max_records: int | None = DEFAULT_MAX_RECORDS,
    scope: Scope = Scope(),
    writer: str = JobName.FEATURES,
) -> FeatureJobConfig:
    """The feature job over ``topics`` with the connections of ``clients`` (no I/O: ``prepare_services``)."""
    return FeatureJobConfig(
        kafka_config=clients.kafka_config(),
        topics=topics,
        checkpoint=checkpoint,
        redis=redis_target(settings, clients, prefix=redis_prefix(scope.namespace), writer=writer),
        params=params,
        max_event_bytes=settings.max_event_bytes,
        max_records_per_trigger=max_records,
        start_ms=scope.start_ms,
        end_ms=scope.end_ms,
        max_clock_skew_ms=round(settings.max_clock_skew_s * 1000),
        card_buckets=settings.card_buckets,
        terminal_buckets=settings.terminal_buckets,
        card_slots=settings.card_slots,
        terminal_slots=settings.terminal_slots,
        page_bytes=settings.page_bytes,
    )


def scoring_job_config(
    settings: Settings,
    clients: Clients,
    *,
    topics: Topics,
    checkpoint: Path,
    alias: str = CHAMPION,
    model_check_interval_s: float | None = None,
    max_records: int | None = DEFAULT_MAX_RECORDS,
    scope: Scope = Scope(),
    shadow_alias: str | None = None,
) -> ScoringJobConfig:
    """The scoring job over ``topics`` with the connections of ``clients`` (no I/O: ``prepare_services``)."""
    return ScoringJobConfig(
        kafka_config=clients.kafka_config(),
        topics=topics,
        checkpoint=checkpoint,
        redis=redis_target(settings, clients, prefix=redis_prefix(scope.namespace), writer=JobName.SCORING),
        tracking_uri=clients.endpoints.mlflow_tracking_uri,
        max_event_bytes=settings.max_event_bytes,
        model_check_interval_s=model_check_interval_s or settings.model_check_interval_s,
        alias=alias,
        max_records_per_trigger=max_records,
        shadow_alias=shadow_alias,
        start_ms=scope.start_ms,
        end_ms=scope.end_ms,
    )


def pipeline_config(
    settings: Settings,
    clients: Clients,
    *,
    topics: Topics,
    checkpoint: Path,
    params: FeatureParams,
    alias: str = CHAMPION,
    model_check_interval_s: float | None = None,
    max_records: int | None = DEFAULT_MAX_RECORDS,
    scope: Scope = Scope(),
    shadow_alias: str | None = None,
) -> PipelineConfig:
    """The one-query pipeline over ``topics`` with the connections of ``clients`` (no I/O)."""
    features = feature_job_config(
        settings,
        clients,
        topics=topics,
        checkpoint=checkpoint,
        params=params,
        max_records=max_records,
        scope=scope,
        writer=JobName.PIPELINE,
    )
    return PipelineConfig(
        features=features,
        tracking_uri=clients.endpoints.mlflow_tracking_uri,
        model_check_interval_s=model_check_interval_s or settings.model_check_interval_s,
        alias=alias,
        shadow_alias=shadow_alias,
    )


def prepare_services(settings: Settings, clients: Clients, job: Job) -> None:
    """What a job needs of the services before Spark starts: its topics (created if missing), and a Redis
    that takes its credentials (a refusal stops it here: ``RedisAccessError``)."""
    create_project_topics(clients.admin(), settings, job.topics)
    job.redis.check_access()


def job_metrics(job: Job, namespace: str) -> JobMetrics:
    """The metrics of a job, with its watch on its input topic and its Redis writes."""
    watch = InputWatch(job.kafka_config, list(job.alert_inputs), observer_group(job.name, namespace))
    frontier = None if job.state is None else partial(frontier_ms_at, query_location(job.checkpoint))
    return JobMetrics(job.name, watch=watch, redis_failures=job.redis.write_failures, frontier_ms=frontier)


def prepare_run(settings: Settings, clients: Clients, job: Job, from_savepoint: Path | None = None) -> Start:
    """Before Spark starts: the services ``job`` needs (``prepare_services``), and its checkpoint made ready,
    from ``from_savepoint`` if given, and bound to its state (``fraud.savepoints.plan_start``: what a start
    from a savepoint does is said). How its query starts.

    Raises:
        StateError: the savepoint or the checkpoint does not fit the job, or the checkpoint is damaged.
    """
    prepare_services(settings, clients, job)
    plan = savepoints.plan_start(job, from_savepoint, settings.spark.shuffle_partitions)
    said = plan.describe(job.checkpoint)
    if said is not None:
        console.print(said)
    return plan.start


def run_job(
    settings: Settings,
    clients: Clients,
    job: Job,
    trigger: Trigger,
    *,
    namespace: str = "",
    from_savepoint: Path | None = None,
    spark: SparkSession | None = None,
) -> QueryReport:
    """Run ``job``, top-down: its services and checkpoint made ready, from ``from_savepoint`` if given
    (``prepare_run``); Spark started (unless a session is given: ``spark``, left running); the job's query
    started from there (``job.start``). Its progress shows until it stops (once: when it has processed
    what was there; a bar shows how far), then Spark stops and a summary is printed. The job serves its metrics (``FRAUD_METRICS_PORT``, else a free port of
    ``FRAUD_METRICS_HOST``) and is listed for ``fraud status`` while it runs."""
    start = prepare_run(settings, clients, job, from_savepoint)
    metrics = job_metrics(job, namespace)
    try:
        port = metrics.serve(settings.metrics_port or 0, settings.metrics_host)
        url = f"http://{settings.metrics_host}:{port}/metrics"
        entry = this_job(job.name, namespace, url, metrics.watch.group if metrics.watch else "")
        with registered(settings.home, entry):
            session = spark
            if session is None:
                with console.status("Starting Spark..."):
                    session = job_spark_session(settings, f"fraud-{job.name}", job.preload)
            ctrl_c_interrupts_the_command_only()
            try:
                job.checkpoint.mkdir(parents=True, exist_ok=True)
                check_executors(
                    session, job.preload, (job.checkpoint,), settings.spark_executor_start_timeout_s
                )
                query = job.start(session, start, trigger, metrics.on_batch)
                console.print(
                    f"{job.description}; {'until done' if trigger.once else 'Ctrl-C stops it'}; "
                    f"metrics at {url}."
                )
                report = watch_query(
                    query, on_progress=metrics.on_progress, bar=trigger.once, ended=job.ended
                )
            finally:
                if spark is None:
                    stop_session(session)  # also stops the Python workers and their Kafka consumers
    finally:
        metrics.close()
    console.print(
        f"Done: {report.records:,} records in {report.batches} micro-batches, {report.seconds:,.1f} s "
        f"({report.records / report.seconds if report.seconds else 0:,.0f} records/s)."
    )
    console.print(summary_table(metrics.totals()))
    return report


def stop_live_jobs(queries: list[StreamingQuery], timeout_s: float = 60.0) -> None:
    """Let each query finish what has arrived, in order (the feature job before the scoring job that reads
    its output), then stop it; a second Ctrl-C stops them all at once."""
    try:
        for query in queries:
            stop_between_batches(query, timeout_s=timeout_s)
    except KeyboardInterrupt:
        for query in queries:
            query.stop()
