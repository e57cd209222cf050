"""``fraud features``: the streaming feature job and its batch reference path."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from features.batch import file_features
from features.definitions import DAY_MS, FeatureParams
from infra.console import console, settings_of
from ingest.files import parse_mapping

app = typer.Typer(help="Per-card and per-terminal features: streaming job and batch reference path.",
                  no_args_is_help=True)  # fmt: skip


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
    feature_delay_days: Annotated[
        float,
        typer.Option(
            help="Label delay d of the terminal features: windows end d days before each transaction."
        ),
    ] = 7.0,
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
