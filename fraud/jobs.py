"""The streaming jobs wired from the settings, in one place: their typed configs, Spark, progress.

Every job (``fraud features run``, ``fraud score run``, ``fraud pipeline run``, the demo) gets its
configuration from here, built from the settings the CLI loaded; the jobs themselves read nothing global.
This module imports PySpark and the jobs: the CLI imports it when a job runs, not at start-up.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from contracts.settings import Settings, Topics, redis_prefix
from features import job as feature_job
from features.definitions import FeatureParams
from features.job import FeatureJobConfig, start_feature_job
from fraud import savepoints
from fraud.console import console, summary_table
from fraud.options import DEFAULT_MAX_RECORDS, JobName
from fraud.progress import QueryReport, ctrl_c_interrupts_the_command_only, watch_query
from fraud.running import registered, this_job
from infra.checkpoints import check_intact
from infra.clients import Clients
from infra.input_watch import InputWatch, observer_group
from infra.kafka_source.config import EARLIEST, LATEST, at_time
from infra.metrics import JobMetrics
from infra.redis_connection import RedisTarget
from infra.spark import check_executors, spark_session, stop_between_batches, stop_session
from infra.topic_admin import create_project_topics
from models.registry import CHAMPION, MODEL_LOADING_MODULES
from scoring.job import BatchObserver, ScoringJobConfig, start_scoring_job
from scoring.pipeline import PipelineConfig, start_pipeline

#: Modules every Python worker of the jobs imports before its first task (``infra.spark_daemon``).
SPARK_PRELOAD = (feature_job.__name__,)
#: The same and what loading a model imports, for the jobs that score: each scoring worker would otherwise
#: spend seconds importing MLflow and skops in its first micro-batch (5 s each, two at once, on 2 cores).
SCORING_PRELOAD = (*SPARK_PRELOAD, *MODEL_LOADING_MODULES)


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


def _clients_with_topics(settings: Settings, topics: Topics) -> Clients:
    clients = Clients.from_settings(settings)
    create_project_topics(clients.admin(), settings, topics)
    return clients


@dataclass(frozen=True)
class Scope:
    """Where a job runs: its namespace (its own output topics, Redis keys and checkpoints; the live
    pipeline's is empty) and, for a replay, the event-time range of the input it reads."""

    namespace: str = ""
    start_ms: int | None = None
    end_ms: int | None = None

    @property
    def starting_offsets(self) -> str:
        return EARLIEST if self.start_ms is None else at_time(self.start_ms)

    @property
    def ending_offsets(self) -> str:
        return LATEST if self.end_ms is None else at_time(self.end_ms)


def redis_target(settings: Settings, clients: Clients, *, prefix: str = "", writer: str = "") -> RedisTarget:
    """Where a job (``writer``) in the key space ``prefix`` keeps its lookups, for the settings' retention;
    a Redis that refuses the credentials stops the job here, before Spark starts (``RedisAccessError``)."""
    target = RedisTarget(
        clients.endpoints.redis_url, prefix, settings.alert_retention_s, clients.redis_options(), writer
    )
    target.check_access()
    return target


def feature_job_config(
    settings: Settings,
    topics: Topics,
    checkpoint: Path,
    params: FeatureParams,
    max_records: int | None = DEFAULT_MAX_RECORDS,
    scope: Scope = Scope(),
    writer: str = JobName.FEATURES.value,
) -> FeatureJobConfig:
    """The feature job over ``topics`` with the connections of ``settings`` (topics created if missing)."""
    clients = _clients_with_topics(settings, topics)
    return FeatureJobConfig(
        kafka_config=clients.kafka_config(),
        topics=topics,
        checkpoint=checkpoint,
        redis=redis_target(settings, clients, prefix=redis_prefix(scope.namespace), writer=writer),
        params=params,
        max_event_bytes=settings.max_event_bytes,
        max_records_per_trigger=max_records,
        starting_offsets=scope.starting_offsets,
        ending_offsets=scope.ending_offsets,
        max_clock_skew_ms=round(settings.max_clock_skew_s * 1000),
        card_buckets=settings.card_buckets,
        terminal_buckets=settings.terminal_buckets,
        card_slots=settings.card_slots,
        terminal_slots=settings.terminal_slots,
    )


def scoring_job_config(
    settings: Settings,
    topics: Topics,
    checkpoint: Path,
    alias: str = CHAMPION,
    model_check_interval_s: float | None = None,
    max_records: int | None = DEFAULT_MAX_RECORDS,
    scope: Scope = Scope(),
    shadow_alias: str | None = None,
) -> ScoringJobConfig:
    """The scoring job over ``topics`` with the connections of ``settings`` (topics created if missing)."""
    clients = _clients_with_topics(settings, topics)
    return ScoringJobConfig(
        kafka_config=clients.kafka_config(),
        topics=topics,
        checkpoint=checkpoint,
        redis=redis_target(
            settings, clients, prefix=redis_prefix(scope.namespace), writer=JobName.SCORING.value
        ),
        tracking_uri=clients.endpoints.mlflow_tracking_uri,
        max_event_bytes=settings.max_event_bytes,
        model_check_interval_s=model_check_interval_s or settings.model_check_interval_s,
        alias=alias,
        max_records_per_trigger=max_records,
        shadow_alias=shadow_alias,
        starting_offsets=scope.starting_offsets,
        ending_offsets=scope.ending_offsets,
    )


def pipeline_config(
    settings: Settings,
    topics: Topics,
    checkpoint: Path,
    params: FeatureParams,
    alias: str = CHAMPION,
    model_check_interval_s: float | None = None,
    max_records: int | None = DEFAULT_MAX_RECORDS,
    scope: Scope = Scope(),
    shadow_alias: str | None = None,
) -> PipelineConfig:
    """The one-query pipeline over ``topics`` with the connections of ``settings``."""
    features = feature_job_config(
        settings,
        topics,
        checkpoint,
        params=params,
        max_records=max_records,
        scope=scope,
        writer=JobName.PIPELINE.value,
    )
    return PipelineConfig(
        features=features,
        tracking_uri=Clients.from_settings(settings).endpoints.mlflow_tracking_uri,
        model_check_interval_s=model_check_interval_s or settings.model_check_interval_s,
        alias=alias,
        shadow_alias=shadow_alias,
    )


JobConfig = FeatureJobConfig | ScoringJobConfig | PipelineConfig


def preload_of(config: JobConfig) -> tuple[str, ...]:
    """The modules the workers of a job import ahead: the feature job loads no model."""
    return SPARK_PRELOAD if isinstance(config, FeatureJobConfig) else SCORING_PRELOAD


def start_job(
    spark: SparkSession,
    config: JobConfig,
    *,
    once: bool,
    trigger_interval_s: float,
    on_batch: BatchObserver | None = None,
) -> StreamingQuery:
    """Start the job ``config`` describes: the feature job, the scoring job or the pipeline. ``on_batch``:
    see ``scoring.job.start_scoring_job`` (the feature job's counts come with its progress reports)."""
    if isinstance(config, FeatureJobConfig):
        return start_feature_job(spark, config, once=once, trigger_interval_s=trigger_interval_s)
    if isinstance(config, ScoringJobConfig):
        return start_scoring_job(
            spark, config, once=once, trigger_interval_s=trigger_interval_s, on_batch=on_batch
        )
    return start_pipeline(spark, config, once=once, trigger_interval_s=trigger_interval_s, on_batch=on_batch)


def describe(config: JobConfig) -> tuple[str, str]:
    """The name of a job (features, scoring, pipeline), and the line that says what runs."""
    if isinstance(config, FeatureJobConfig):
        return JobName.FEATURES.value, f"Feature job running (checkpoint {config.checkpoint})"
    name, what = (
        (JobName.SCORING.value, "Scoring job")
        if isinstance(config, ScoringJobConfig)
        else (JobName.PIPELINE.value, "Pipeline")
    )
    return name, f"{what} running (model alias {config.alias!r}, checkpoint {config.checkpoint})"


def alert_inputs(config: JobConfig) -> list[str]:
    """The topic whose records a job's alerts come from (its alert latency is measured from their append);
    none for the feature job, which writes no alerts."""
    if isinstance(config, FeatureJobConfig):
        return []
    if isinstance(config, ScoringJobConfig):
        return [config.topics.features]
    return [config.features.topics.transactions]


def job_metrics(settings: Settings, config: JobConfig, namespace: str) -> JobMetrics:
    """The metrics of a job, with its watch on its input topic and its Redis writes."""
    job, _ = describe(config)
    kafka_config = (
        config.kafka_config if not isinstance(config, PipelineConfig) else config.features.kafka_config
    )
    redis = config.redis if not isinstance(config, PipelineConfig) else config.features.redis
    watch = InputWatch(kafka_config, alert_inputs(config), observer_group(job, namespace))
    return JobMetrics(job, watch=watch, redis_failures=redis.write_failures)


def feature_config_of(config: JobConfig) -> FeatureJobConfig | None:
    """The feature job's part of a job (the feature job itself, or the pipeline's); None for the scoring job."""
    if isinstance(config, ScoringJobConfig):
        return None
    return config if isinstance(config, FeatureJobConfig) else config.features


def start_from_savepoint(settings: Settings, config: JobConfig, path: Path) -> JobConfig:
    """Start the job's checkpoint (new and empty) from the savepoint at ``path`` once it is found to fit the
    job (``fraud.savepoints.start_from``): a copy in the savepoint's layout, a rescale into another
    (``FRAUD_CARD_BUCKETS``, ``FRAUD_TERMINAL_BUCKETS``, ``FRAUD_SPARK_SHUFFLE_PARTITIONS``), or the
    checkpoint an earlier start from it made. The job's config, with the rescale's first state and
    source position while the rescaled checkpoint's first micro-batch has not committed.

    Raises:
        StateError: the savepoint does not fit the job, or the checkpoint holds another state.
    """
    job, _ = describe(config)
    features = feature_config_of(config)
    inputs: tuple[str, ...]
    if features is None:
        layout, params, inputs = None, None, (config.topics.features,)
    else:
        layout, params = feature_job.layout_of(features), features.params
        inputs = (features.topics.transactions, features.topics.labels)
    start = savepoints.start_from(
        path, config.checkpoint, job, layout, params, inputs, settings.spark_shuffle_partitions
    )
    savepoint = start.savepoint
    where = f"savepoint {path} (batch {savepoint.batch}, frontier {savepoints.iso_ms(savepoint.frontier_ms)})"
    if start.how == "copied":
        console.print(f"Starting from {where} in checkpoint {config.checkpoint}.")
    elif start.how == "resumed":
        console.print(f"Resuming checkpoint {config.checkpoint}, started from {where}.")
    else:
        console.print(
            f"Starting from {where} in checkpoint {config.checkpoint}, rescaled ({start.change}): the first "
            "micro-batch re-keys the savepoint's state."
        )
    if start.rescale is None or features is None:
        return config
    rescaled = replace(features, rescale=start.rescale)
    if isinstance(config, PipelineConfig):
        return replace(config, features=rescaled)
    return rescaled


def prepare_start(settings: Settings, config: JobConfig, from_savepoint: Path | None) -> JobConfig:
    """Before Spark starts: start the job's checkpoint from ``from_savepoint``, or from the savepoint it was
    rescaled from while its first micro-batch has not committed (``start_from_savepoint``); then check that
    the files Spark needs to resume it are there and whole (``infra.checkpoints.check_intact``), and its
    layout and feature specs against the job's (``features.job.prepare_checkpoint``). The job's config to
    run.

    Raises:
        StateError: the savepoint or the checkpoint does not fit the job, or the checkpoint is damaged.
    """
    path = from_savepoint or savepoints.unfinished_rescale(config.checkpoint)
    if path is not None:
        config = start_from_savepoint(settings, config, path)
    check_intact(config.checkpoint)
    features = feature_config_of(config)
    if features is not None:
        feature_job.prepare_checkpoint(features)
    return config


def run_job(
    settings: Settings,
    config: JobConfig,
    once: bool,
    trigger_interval_s: float,
    namespace: str = "",
    from_savepoint: Path | None = None,
) -> QueryReport:
    """Start Spark and the job, show its progress until it stops (``once``: when it has processed what was
    there; a bar shows how far), stop Spark, and print a summary. The job serves its metrics
    (``FRAUD_METRICS_PORT``, else a free port of ``FRAUD_METRICS_HOST``) and is listed for ``fraud status``
    while it runs. With ``from_savepoint``, the job starts from that savepoint (``prepare_start``)."""
    config = prepare_start(settings, config, from_savepoint)
    job, what = describe(config)
    metrics = job_metrics(settings, config, namespace)
    try:
        port = metrics.serve(settings.metrics_port or 0, settings.metrics_host)
        url = f"http://{settings.metrics_host}:{port}/metrics"
        entry = this_job(job, namespace, url, metrics.watch.group if metrics.watch else "")
        with registered(settings.home, entry):
            with console.status("Starting Spark..."):
                spark = job_spark_session(settings, f"fraud-{job}", preload_of(config))
            ctrl_c_interrupts_the_command_only()
            try:
                config.checkpoint.mkdir(parents=True, exist_ok=True)
                check_executors(
                    spark, preload_of(config), (config.checkpoint,), settings.spark_executor_start_timeout_s
                )
                query = start_job(
                    spark, config, once=once, trigger_interval_s=trigger_interval_s, on_batch=metrics.on_batch
                )
                console.print(f"{what}; {'until done' if once else 'Ctrl-C stops it'}; metrics at {url}.")
                report = watch_query(query, on_progress=metrics.on_progress, bar=once)
            finally:
                stop_session(spark)  # also stops the Python workers and their Kafka consumers
    finally:
        metrics.close()
    console.print(
        f"Done: {report.records:,} records in {report.batches} micro-batches, {report.seconds:,.1f} s "
        f"({report.records / report.seconds if report.seconds else 0:,.0f} records/s)."
    )
    console.print(summary_table(metrics.totals()))
    return report


def start_live_jobs(
    spark: SparkSession, features: FeatureJobConfig, scoring: ScoringJobConfig, trigger_interval_s: float
) -> list[StreamingQuery]:
    """The feature job and the scoring job, running side by side in one session until stopped."""
    return [
        start_job(spark, config, once=False, trigger_interval_s=trigger_interval_s)
        for config in (features, scoring)
    ]


def stop_live_jobs(queries: list[StreamingQuery], timeout_s: float = 60.0) -> None:
    """Let each query finish what has arrived, in order (the feature job before the scoring job that reads
    its output), then stop it; a second Ctrl-C stops them all at once."""
    try:
        for query in queries:
            stop_between_batches(query, timeout_s=timeout_s)
    except KeyboardInterrupt:
        for query in queries:
            query.stop()
