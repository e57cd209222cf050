"""Command-line options that several ``fraud`` commands share, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from contracts.settings import Settings
from features.definitions import DAY_MS, FeatureParams
from models.registry import ALIASES

#: Records per micro-batch unless a command says otherwise (admission control).
DEFAULT_MAX_RECORDS = 100_000

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
OnceOption = Annotated[bool, typer.Option("--once", help="Process everything available now, then stop.")]
AliasOption = Annotated[str, typer.Option(help=f"Model alias to serve: {', '.join(ALIASES)}.")]
ModelCheckOption = Annotated[
    float | None,
    typer.Option(
        min=1.0,
        help="Seconds between checks of where the alias points (default: FRAUD_MODEL_CHECK_INTERVAL_S).",
    ),
]
PrefixOption = Annotated[
    str, typer.Option(help="Redis key prefix (empty for the live pipeline; an isolated run's own prefix).")
]


def checkpoint_dir(settings: Settings, given: Path | None, job: str) -> Path:
    """A job's checkpoint directory: the one given, else ``FRAUD_HOME/checkpoints/<job>``."""
    return (given or settings.home / "checkpoints" / job).resolve()


def feature_params(label_delay_days: float, allowed_lateness_s: float = 0.0) -> FeatureParams:
    """The feature parameters of the options: the terminal features' label delay, the allowed lateness."""
    return FeatureParams(
        label_delay_ms=round(label_delay_days * DAY_MS), max_lateness_ms=round(allowed_lateness_s * 1000)
    )
