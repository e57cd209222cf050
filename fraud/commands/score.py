"""``fraud score``: the streaming scoring job; ``fraud pipeline``: features and scoring in one query."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from contracts.settings import Settings, Topics
from features.definitions import FeatureParams
from fraud.commands.features import (
    AllowedLatenessOption,
    FeatureDelayOption,
    MaxRecordsOption,
    TriggerIntervalOption,
    feature_job_config,
    feature_params,
)
from fraud.console import settings_of
from fraud.progress import QueryReport, run_streaming_job
from models.registry import ALIASES, CHAMPION

if TYPE_CHECKING:
    from scoring.job import ScoringJobConfig
app = typer.Typer(
    help="Score every transaction with the MLflow model; alerts to Kafka and Redis.", no_args_is_help=True
)
pipeline_app = typer.Typer(
    help="Features and scoring in one Spark query: transactions in, alerts out, lowest latency.",
    no_args_is_help=True,
)

AliasOption = Annotated[str, typer.Option(help=f"Model alias to serve: {', '.join(ALIASES)}.")]
ModelCheckOption = Annotated[
    float, typer.Option(min=1.0, help="Seconds between checks of where the alias points.")
]


@app.command("run")
def run_command(
    ctx: typer.Context,
    once: Annotated[bool, typer.Option("--once", help="Score everything available now, then stop.")] = False,
    alias: AliasOption = CHAMPION,
    model_check_interval_s: ModelCheckOption = 30.0,
    max_records: MaxRecordsOption = 100_000,
    trigger_interval_s: TriggerIntervalOption = 1.0,
    checkpoint: Annotated[
        Path | None, typer.Option(help="Checkpoint directory (default: FRAUD_HOME/checkpoints/scoring).")
    ] = None,
) -> None:
    """Run the streaming scoring job: feature records in; scores, alerts and Redis lookups out."""
    settings = settings_of(ctx)
    run_scoring_job(
        settings,
        settings.topics,
        (checkpoint or settings.home / "checkpoints" / "scoring").resolve(),
        once=once,
        alias=alias,
        model_check_interval_s=model_check_interval_s,
        max_records=max_records,
        trigger_interval_s=trigger_interval_s,
    )


def scoring_job_config(
    settings: Settings,
    topics: Topics,
    checkpoint: Path,
    alias: str = CHAMPION,
    model_check_interval_s: float = 30.0,
    max_records: int | None = 100_000,
) -> ScoringJobConfig:
    """The scoring job over ``topics`` with the connections of ``settings`` (topics created if missing)."""
    from infra.clients import Clients, ensure_topics
    from scoring.job import ScoringJobConfig

    clients = Clients.from_settings(settings)
    ensure_topics(clients.admin(), topics.all(), settings.partitions, settings.replication_factor)
    return ScoringJobConfig(
        kafka_config=clients.kafka_config(),
        topics=topics,
        checkpoint=checkpoint,
        redis_url=clients.endpoints.redis_url,
        tracking_uri=clients.endpoints.mlflow_tracking_uri,
        max_event_bytes=settings.max_event_bytes,
        alias=alias,
        retention_s=settings.alert_retention_s,
        max_records_per_trigger=max_records,
        model_check_interval_s=model_check_interval_s,
    )


def run_scoring_job(
    settings: Settings,
    topics: Topics,
    checkpoint: Path,
    once: bool,
    alias: str = CHAMPION,
    model_check_interval_s: float = 30.0,
    max_records: int | None = 100_000,
    trigger_interval_s: float = 1.0,
) -> QueryReport:
    """Start the scoring job, show its progress until it stops, and print a summary."""
    from scoring.job import start_scoring_job

    config = scoring_job_config(settings, topics, checkpoint, alias, model_check_interval_s, max_records)
    return run_streaming_job(
        settings,
        "fraud-scoring",
        lambda spark: (
            start_scoring_job(spark, config, once=once, trigger_interval_s=trigger_interval_s),
            f"Scoring job running (model alias {alias!r}, checkpoint {config.checkpoint})",
        ),
        once,
    )


@pipeline_app.command("run")
def pipeline_command(
    ctx: typer.Context,
    once: Annotated[
        bool, typer.Option("--once", help="Process everything available now, then stop.")
    ] = False,
    alias: AliasOption = CHAMPION,
    model_check_interval_s: ModelCheckOption = 30.0,
    max_records: MaxRecordsOption = 100_000,
    allowed_lateness_s: AllowedLatenessOption = 0.0,
    trigger_interval_s: TriggerIntervalOption = 0.0,
    checkpoint: Annotated[
        Path | None, typer.Option(help="Checkpoint directory (default: FRAUD_HOME/checkpoints/pipeline).")
    ] = None,
    feature_delay_days: FeatureDelayOption = 7.0,
) -> None:
    """Run features and scoring in one streaming query: transactions and labels in; features, scores,
    alerts to Kafka and Redis."""
    settings = settings_of(ctx)
    run_pipeline(
        settings,
        settings.topics,
        (checkpoint or settings.home / "checkpoints" / "pipeline").resolve(),
        feature_params(feature_delay_days, allowed_lateness_s),
        once=once,
        alias=alias,
        model_check_interval_s=model_check_interval_s,
        max_records=max_records,
        trigger_interval_s=trigger_interval_s,
    )


def run_pipeline(
    settings: Settings,
    topics: Topics,
    checkpoint: Path,
    params: FeatureParams,
    once: bool,
    alias: str = CHAMPION,
    model_check_interval_s: float = 30.0,
    max_records: int | None = 100_000,
    trigger_interval_s: float = 0.0,
) -> QueryReport:
    """Start the pipeline, show its progress until it stops, and print a summary."""
    from infra.clients import Clients
    from scoring.pipeline import PipelineConfig, start_pipeline

    config = PipelineConfig(
        features=feature_job_config(settings, topics, checkpoint, params, max_records),
        tracking_uri=Clients.from_settings(settings).endpoints.mlflow_tracking_uri,
        alias=alias,
        retention_s=settings.alert_retention_s,
        model_check_interval_s=model_check_interval_s,
    )
    return run_streaming_job(
        settings,
        "fraud-pipeline",
        lambda spark: (
            start_pipeline(spark, config, once=once, trigger_interval_s=trigger_interval_s),
            f"Pipeline running (model alias {alias!r}, checkpoint {config.checkpoint})",
        ),
        once,
    )
