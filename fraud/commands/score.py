"""``fraud score``: the streaming scoring job; ``fraud pipeline``: features and scoring in one query."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from contracts.settings import JobName
from fraud.console import settings_of
from fraud.options import (
    DEFAULT_MAX_RECORDS,
    DEFAULT_WINDOWS,
    AliasOption,
    AllowedLatenessOption,
    FromOption,
    FromSavepointOption,
    LabelDelayOption,
    MaxRecordsOption,
    ModelCheckOption,
    OnceOption,
    PipelineNamespaceOption,
    ScoringNamespaceOption,
    ShadowOption,
    ToOption,
    TriggerIntervalOption,
    WindowsOption,
    checkpoint_option,
    feature_params,
)
from fraud.streaming import RunOptions, run_streaming_job
from models.registry import CHAMPION

app = typer.Typer(
    help="Score every transaction with the MLflow model; alerts to Kafka and Redis.", no_args_is_help=True
)
pipeline_app = typer.Typer(
    help="Features and scoring in one Spark query: transactions in, alerts out, lowest latency.",
    no_args_is_help=True,
)


@app.command("run")
def run_command(
    ctx: typer.Context,
    once: OnceOption = False,
    alias: AliasOption = CHAMPION,
    model_check_interval_s: ModelCheckOption = None,
    max_records: MaxRecordsOption = DEFAULT_MAX_RECORDS,
    trigger_interval_s: TriggerIntervalOption = 1.0,
    checkpoint: Annotated[Path | None, checkpoint_option(JobName.SCORING)] = None,
    namespace: ScoringNamespaceOption = "",
    from_time: FromOption = None,
    to_time: ToOption = None,
    shadow: ShadowOption = None,
    from_savepoint: FromSavepointOption = None,
) -> None:
    """Run the streaming scoring job: feature records in; scores, alerts and Redis lookups out.

    In a namespace it reads that namespace's features topic; --to ends the run there."""
    from fraud import jobs  # heavy: PySpark and the jobs, imported only when a job runs

    build = partial(
        jobs.scoring_job_config,
        alias=alias,
        model_check_interval_s=model_check_interval_s,
        max_records=max_records,
        shadow_alias=shadow,
    )
    run = RunOptions(once, trigger_interval_s, namespace, checkpoint, from_time, to_time, from_savepoint)
    run_streaming_job(ctx, JobName.SCORING, build, run)


@pipeline_app.command("run")
def pipeline_command(
    ctx: typer.Context,
    once: OnceOption = False,
    alias: AliasOption = CHAMPION,
    model_check_interval_s: ModelCheckOption = None,
    max_records: MaxRecordsOption = DEFAULT_MAX_RECORDS,
    allowed_lateness_s: AllowedLatenessOption = 0.0,
    trigger_interval_s: TriggerIntervalOption = 0.0,
    checkpoint: Annotated[Path | None, checkpoint_option(JobName.PIPELINE)] = None,
    label_delay_days: LabelDelayOption = None,
    namespace: PipelineNamespaceOption = "",
    from_time: FromOption = None,
    to_time: ToOption = None,
    shadow: ShadowOption = None,
    from_savepoint: FromSavepointOption = None,
    windows: WindowsOption = DEFAULT_WINDOWS,
) -> None:
    """Run features and scoring in one streaming query: transactions and labels in; features, scores,
    alerts to Kafka and Redis. --to ends the run there."""
    from fraud import jobs  # heavy: PySpark and the jobs, imported only when a job runs

    build = partial(
        jobs.pipeline_config,
        params=feature_params(settings_of(ctx), allowed_lateness_s, windows),
        alias=alias,
        model_check_interval_s=model_check_interval_s,
        max_records=max_records,
        shadow_alias=shadow,
    )
    run = RunOptions(once, trigger_interval_s, namespace, checkpoint, from_time, to_time, from_savepoint)
    run_streaming_job(ctx, JobName.PIPELINE, build, run)
