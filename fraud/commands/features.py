"""``fraud features``: the streaming feature job and its batch reference path."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from contracts.settings import JobName
from features.batch import file_features
from fraud.console import console, settings_of
from fraud.options import (
    DEFAULT_MAX_RECORDS,
    DEFAULT_WINDOWS,
    AllowedLatenessOption,
    FeaturesNamespaceOption,
    FromOption,
    FromSavepointOption,
    LabelDelayOption,
    MaxRecordsOption,
    OnceOption,
    ToOption,
    TriggerIntervalOption,
    WindowsOption,
    check_output_file,
    checkpoint_option,
    feature_params,
)
from fraud.streaming import RunOptions, run_streaming_job
from ingest.files import parse_mapping

app = typer.Typer(
    help="Per-card and per-terminal features: streaming job and batch reference path.", no_args_is_help=True
)


@app.command("batch")
def batch_command(
    ctx: typer.Context,
    input_file: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="CSV or Parquet of transactions.")
    ],
    out: Annotated[
        Path, typer.Option(callback=check_output_file, help="Parquet file: tx_id and the feature columns.")
    ],
    mapping: Annotated[
        str,
        typer.Option(help="Column mapping, as for `fraud ingest`: canonical, handbook, or SRC=DST pairs."),
    ] = "canonical",
    label_delay_days: LabelDelayOption = None,
    windows: WindowsOption = DEFAULT_WINDOWS,
) -> None:
    """Compute the features over a file, exactly as the streaming job would after ingesting it."""
    settings = settings_of(ctx)
    params = feature_params(settings, windows=windows)
    with console.status(f"Computing features over {input_file}..."):
        result = file_features(
            input_file,
            parse_mapping(mapping),
            params,
            settings.max_event_bytes,
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    result.features.to_parquet(out, index=False)
    console.print(
        f"Wrote features of [bold]{len(result.features):,}[/bold] transactions to {out} "
        f"({len(params.feature_columns)} feature columns); {len(result.rejected):,} rows rejected."
    )


@app.command("list")
def list_command(
    ctx: typer.Context, label_delay_days: LabelDelayOption = None, windows: WindowsOption = DEFAULT_WINDOWS
) -> None:
    """The features the jobs compute, as declared in features/definitions.py: name, type, window, meaning."""
    params = feature_params(settings_of(ctx), windows=windows)
    table = Table(
        title=f"{len(params.specs)} features of a transaction at event time t", title_justify="left"
    )
    for name in ("column", "type", "window", "meaning"):
        table.add_column(name, overflow="fold")
    for spec in params.specs:
        table.add_row(spec.name, spec.dtype, spec.window or "-", spec.meaning)
    console.print(table)


@app.command("run")
def run_command(
    ctx: typer.Context,
    once: OnceOption = False,
    max_records: MaxRecordsOption = DEFAULT_MAX_RECORDS,
    allowed_lateness_s: AllowedLatenessOption = 0.0,
    trigger_interval_s: TriggerIntervalOption = 1.0,
    checkpoint: Annotated[Path | None, checkpoint_option(JobName.FEATURES)] = None,
    label_delay_days: LabelDelayOption = None,
    namespace: FeaturesNamespaceOption = "",
    from_time: FromOption = None,
    to_time: ToOption = None,
    from_savepoint: FromSavepointOption = None,
    windows: WindowsOption = DEFAULT_WINDOWS,
) -> None:
    """Run the streaming feature job: transactions and labels in; features to Kafka and Redis.

    With --from/--to it replays a range of event time (the state starts empty at --from: start the
    longest window plus the label delay earlier for exact features); --to ends the run there."""
    from fraud import jobs  # heavy: PySpark and the jobs, imported only when a job runs

    build = partial(
        jobs.feature_job_config,
        params=feature_params(settings_of(ctx), allowed_lateness_s, windows),
        max_records=max_records,
    )
    run = RunOptions(once, trigger_interval_s, namespace, checkpoint, from_time, to_time, from_savepoint)
    run_streaming_job(ctx, JobName.FEATURES, build, run)
