"""``fraud features``: the streaming feature job and its batch reference path."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from contracts.settings import Settings, Topics
from features.batch import file_features
from features.definitions import DAY_MS, FeatureParams
from fraud.console import console, settings_of
from fraud.progress import QueryReport, run_streaming_job
from ingest.files import parse_mapping

if TYPE_CHECKING:
    from features.job import FeatureJobConfig

app = typer.Typer(
    help="Per-card and per-terminal features: streaming job and batch reference path.", no_args_is_help=True
)


FeatureDelayOption = Annotated[
    float,
    typer.Option(help="Label delay d of the terminal features: windows end d days before each transaction."),
]
MaxRecordsOption = Annotated[
    int | None, typer.Option(min=1, help="Admission control: at most this many records per micro-batch.")
]
TriggerIntervalOption = Annotated[float, typer.Option(min=0.0, help="Seconds between micro-batches.")]
AllowedLatenessOption = Annotated[
    float,
    typer.Option(
        min=0.0,
        help="Event-time disorder within a partition that still counts as on time; "
        "results wait this long in event time.",
    ),
]


def feature_params(label_delay_days: float, allowed_lateness_s: float = 0.0) -> FeatureParams:
    return FeatureParams(
        label_delay_ms=round(label_delay_days * DAY_MS), max_lateness_ms=round(allowed_lateness_s * 1000)
    )


@app.command("batch")
def batch_command(
    ctx: typer.Context,
    input_file: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="CSV or Parquet of transactions.")
    ],
    out: Annotated[Path, typer.Option(help="Parquet file: tx_id and the feature columns.")],
    mapping: Annotated[
        str,
        typer.Option(help="Column mapping, as for `fraud ingest`: canonical, handbook, or SRC=DST pairs."),
    ] = "canonical",
    feature_delay_days: FeatureDelayOption = 7.0,
) -> None:
    """Compute the features over a file, exactly as the streaming job would after ingesting it."""
    settings = settings_of(ctx)
    params = feature_params(feature_delay_days)
    with console.status(f"Computing features over {input_file}..."):
        result = file_features(
            input_file,
            parse_mapping(mapping),
            params,
            round(settings.label_delay_days * DAY_MS),
            settings.max_event_bytes,
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    result.features.to_parquet(out, index=False)
    console.print(
        f"Wrote features of [bold]{len(result.features):,}[/bold] transactions to {out} "
        f"({len(params.feature_columns)} feature columns); {len(result.rejected):,} rows rejected."
    )


@app.command("run")
def run_command(
    ctx: typer.Context,
    once: Annotated[
        bool, typer.Option("--once", help="Process everything available now, then stop.")
    ] = False,
    max_records: MaxRecordsOption = 100_000,
    allowed_lateness_s: AllowedLatenessOption = 0.0,
    trigger_interval_s: TriggerIntervalOption = 1.0,
    checkpoint: Annotated[
        Path | None, typer.Option(help="Checkpoint directory (default: FRAUD_HOME/checkpoints/features).")
    ] = None,
    feature_delay_days: FeatureDelayOption = 7.0,
) -> None:
    """Run the streaming feature job: transactions and labels in; features to Kafka and Redis."""
    settings = settings_of(ctx)
    run_feature_job(
        settings,
        settings.topics,
        (checkpoint or settings.home / "checkpoints" / "features").resolve(),
        feature_params(feature_delay_days, allowed_lateness_s),
        once=once,
        max_records=max_records,
        trigger_interval_s=trigger_interval_s,
    )


def feature_job_config(
    settings: Settings, topics: Topics, checkpoint: Path, params: FeatureParams, max_records: int | None
) -> FeatureJobConfig:
    """The feature job over ``topics`` with the connections of ``settings`` (topics created if missing)."""
    from features.job import FeatureJobConfig
    from infra.clients import Clients, ensure_topics

    clients = Clients.from_settings(settings)
    ensure_topics(clients.admin(), topics.all(), settings.partitions, settings.replication_factor)
    return FeatureJobConfig(
        kafka_config=clients.kafka_config(),
        topics=topics,
        checkpoint=checkpoint,
        redis_url=clients.endpoints.redis_url,
        params=params,
        max_event_bytes=settings.max_event_bytes,
        max_records_per_trigger=max_records,
    )


def run_feature_job(
    settings: Settings,
    topics: Topics,
    checkpoint: Path,
    params: FeatureParams,
    once: bool,
    max_records: int | None = 100_000,
    trigger_interval_s: float = 1.0,
) -> QueryReport:
    """Start the feature job, show its progress until it stops, and print a summary."""
    from features.job import start_feature_job

    config = feature_job_config(settings, topics, checkpoint, params, max_records)
    return run_streaming_job(
        settings,
        "fraud-features",
        lambda spark: (
            start_feature_job(spark, config, once=once, trigger_interval_s=trigger_interval_s),
            f"Feature job running (checkpoint {config.checkpoint})",
        ),
        once,
    )
