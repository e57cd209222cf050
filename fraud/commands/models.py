"""``fraud train`` and ``fraud models list|promote``: training runs, evaluation and the model registry."""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from contracts.settings import Settings
from features.definitions import DAY_MS, FeatureParams
from fraud.commands.features import FeatureDelayOption, feature_params
from fraud.console import console, progress_bar, settings_of
from infra.clients import Clients, NotConfiguredError
from infra.embedded import EmbeddedStack
from ingest.files import parse_mapping, read_table
from models.dataset import Dataset, event_times_ms, file_dataset
from models.estimators import (
    CLASS_WEIGHTS,
    FEATURE_SETS,
    MODEL_KINDS,
    FeatureSet,
    ModelSpec,
    feature_set,
)
from models.metrics import DEFAULT_ALERTS_PER_DAY, card_precision_key
from models.registry import ALIASES, MODEL_NAME, list_versions, promote
from models.splits import SplitPlan, day_of, fold_plans, latest_plan

if TYPE_CHECKING:
    from models.tracking import LoggedRun
    from models.training import TrainingResult

app = typer.Typer(help="The model registry: versions, aliases, promotion.", no_args_is_help=True)


@dataclass(frozen=True)
class TrainOptions:
    """What `fraud train` was asked for, resolved (the plans cover every fold, oldest first)."""

    spec: ModelSpec
    features: FeatureSet
    params: FeatureParams
    plans: list[SplitPlan]
    alerts_per_day: float


def tracking_target(settings: Settings) -> tuple[str, str | None]:
    """MLflow tracking URI and the artifact root for a new experiment: the setting, else the running
    embedded stack's store."""
    from models.tracking import default_artifact_location

    if settings.mlflow_tracking_uri is not None:
        return settings.mlflow_tracking_uri, default_artifact_location(settings.mlflow_tracking_uri)
    info = EmbeddedStack(settings.home).running()
    if info is None:
        raise NotConfiguredError(
            f"no embedded stack is running under {settings.home.resolve()}: start one with `fraud up`, "
            "or set FRAUD_MLFLOW_TRACKING_URI"
        )
    return info.mlflow_tracking_uri, default_artifact_location(
        info.mlflow_tracking_uri, info.mlflow_artifacts
    )


@dataclass(frozen=True)
class Periods:
    """The split options: a first training day (None: the latest the data allows) and period lengths."""

    train_start: str | None = None
    train_days: int = 7
    delay_days: int = 7
    test_days: int = 7
    folds: int = 1

    def plans(self, last_ms: int) -> list[SplitPlan]:
        """One plan per fold, oldest first, for data whose last event time is ``last_ms``."""
        if self.train_start is None:
            latest = latest_plan(last_ms, self.train_days, self.delay_days, self.test_days)
        else:
            try:
                first = SplitPlan(
                    dt.date.fromisoformat(self.train_start), self.train_days, self.delay_days, self.test_days
                )
            except ValueError as exc:
                raise typer.BadParameter(f"--train-start {self.train_start!r}: {exc}") from exc
            latest = first.shifted((self.folds - 1) * self.test_days)
        return fold_plans(latest, self.folds)


def file_training_set(
    settings: Settings, path: Path, mapping: str, params: FeatureParams, periods: Periods
) -> tuple[Dataset, list[SplitPlan]]:
    """The dataset of a labelled file, for the rows the plans need."""
    with console.status(f"Reading {path}..."):
        table = read_table(path, parse_mapping(mapping))
        plans = periods.plans(int(event_times_ms(table).max()))
    with console.status(f"Computing features ({plans[0].train_start}..{plans[-1].test_start})..."):
        dataset = file_dataset(
            table,
            f"file:{path}",
            params,
            round(settings.label_delay_days * DAY_MS),
            settings.max_event_bytes,
            plans[0].train_start_ms,
            plans[-1].test_end_ms,
        )
    return dataset, plans


def topics_training_set(
    settings: Settings, params: FeatureParams, periods: Periods
) -> tuple[Dataset, list[SplitPlan]]:
    """The dataset of a replay of the transactions and labels topics (with progress), for the plans."""
    from models.replay import replay_dataset, replay_topics

    events = replay_topics(
        Clients.from_settings(settings), settings.topics, settings.max_event_bytes, progress_bar
    )
    plans = periods.plans(events.last_ms)
    with console.status(f"Computing features ({plans[0].train_start}..{plans[-1].test_start})..."):
        dataset = replay_dataset(events, params, plans[0].train_start_ms, plans[-1].test_end_ms)
    return dataset, plans


def train_command(
    ctx: typer.Context,
    input_file: Annotated[
        Path | None,
        typer.Option(
            "--input",
            exists=True,
            dir_okay=False,
            help="Labelled CSV or Parquet file. Default: replay the transactions and labels topics.",
        ),
    ] = None,
    mapping: Annotated[
        str,
        typer.Option(help="Column mapping of --input, as for `fraud ingest`: canonical, handbook, SRC=DST."),
    ] = "canonical",
    model: Annotated[
        str, typer.Option(help=f"Classifier: {', '.join(MODEL_KINDS)}.")
    ] = "hist_gradient_boosting",
    max_depth: Annotated[int | None, typer.Option(min=1, help="Maximum tree depth (trees only).")] = None,
    n_estimators: Annotated[
        int,
        typer.Option(min=1, help="Trees (random_forest) or boosting iterations (hist_gradient_boosting)."),
    ] = 100,
    class_weight: Annotated[
        str, typer.Option(help="Class imbalance: 'balanced' (inverse class frequency) or 'none'.")
    ] = "balanced",
    seed: Annotated[int, typer.Option(min=0, help="Random seed of the classifier.")] = 0,
    features: Annotated[
        str,
        typer.Option(
            help="Inputs: 'handbook' (its 15 features) or 'all' (everything the feature job computes)."
        ),
    ] = "all",
    train_start: Annotated[
        str | None,
        typer.Option(
            help="First training day (YYYY-MM-DD) of the first fold. Default: the latest period the data allows."
        ),
    ] = None,
    train_days: Annotated[int, typer.Option(min=1, help="Days of training data.")] = 7,
    delay_days: Annotated[
        int, typer.Option(min=0, help="Gap between training and test: the label delay.")
    ] = 7,
    test_days: Annotated[int, typer.Option(min=1, help="Test days after the gap.")] = 7,
    folds: Annotated[
        int,
        typer.Option(min=1, help="Consecutive folds, each test-days later than the previous: mean and std."),
    ] = 1,
    alerts_per_day: Annotated[
        float,
        typer.Option(
            min=0.001, help="Alert budget: the threshold is chosen on the training period to meet it."
        ),
    ] = DEFAULT_ALERTS_PER_DAY,
    feature_delay_days: FeatureDelayOption = 7.0,
    metrics_out: Annotated[Path | None, typer.Option(help="Write the metrics to this JSON file.")] = None,
    register: Annotated[
        bool,
        typer.Option(
            "--register/--no-register", help="Register the model as a new version of fraud-detector."
        ),
    ] = True,
) -> None:
    """Train a model on an honest split, evaluate it as fraud teams do, and log it to MLflow.

    Train on --train-days, skip --delay-days (labels of the training period arrive during it), test on
    --test-days; on each test day, cards with a fraud known before that day are left out.
    """
    settings = settings_of(ctx)
    for name, value, allowed in (
        ("--model", model, MODEL_KINDS),
        ("--features", features, FEATURE_SETS),
        ("--class-weight", class_weight, CLASS_WEIGHTS),
    ):
        if value not in allowed:
            raise typer.BadParameter(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    tracking_uri, artifacts = tracking_target(settings)
    spec = ModelSpec(model, max_depth, n_estimators, class_weight, seed)  # type: ignore[arg-type]
    params = feature_params(feature_delay_days)
    periods = Periods(train_start, train_days, delay_days, test_days, folds)
    if input_file is not None:
        dataset, plans = file_training_set(settings, input_file, mapping, params, periods)
    else:
        dataset, plans = topics_training_set(settings, params, periods)
    options = TrainOptions(spec, features, params, plans, alerts_per_day)  # type: ignore[arg-type]
    result, logged = run_training(dataset, options, tracking_uri, artifacts, register)
    print_result(result, logged, tracking_uri)
    if metrics_out is not None:
        metrics_out.parent.mkdir(parents=True, exist_ok=True)
        metrics_out.write_text(json.dumps(metrics_document(result, logged), indent=2, allow_nan=False) + "\n")
        console.print(f"Wrote {metrics_out}")


def run_training(
    dataset: Dataset, options: TrainOptions, tracking_uri: str, artifacts: str | None, register: bool
) -> tuple[TrainingResult, LoggedRun]:
    """Train and evaluate on every fold, log the run to MLflow and (optionally) register the model."""
    from models.tracking import log_training
    from models.training import train_and_evaluate

    columns = feature_set(options.features, options.params)
    with console.status(f"Training {options.spec.kind} on {len(options.plans)} fold(s)..."):
        result = train_and_evaluate(dataset, options.plans, options.spec, columns, options.alerts_per_day)
    latest = options.plans[-1]
    run_params = {
        "features": options.features,
        "n_features": len(columns),
        "feature_label_delay_ms": options.params.label_delay_ms,
        "train_start": options.plans[0].train_start,
        "train_days": latest.train_days,
        "delay_days": latest.delay_days,
        "test_days": latest.test_days,
        "folds": len(options.plans),
        "alerts_per_day_budget": options.alerts_per_day,
        "data_source": dataset.source,
        "data_first_day": day_of(dataset.first_ms),
        "data_last_day": day_of(dataset.last_ms),
        **{f"fold_{i}": plan.describe() for i, plan in enumerate(options.plans)},
    }
    data_metrics = {
        "data_rows": float(len(dataset.rows)),
        "data_labels": float(len(dataset.labels)),
        "data_rejected": float(dataset.rejected),
        **{k: float(v) for k, v in result.latest.counts.items()},
    }
    with console.status("Logging to MLflow..."):
        logged = log_training(
            tracking_uri,
            result,
            run_params,
            data_metrics,
            register,
            artifact_location=artifacts,
            run_name=f"{options.spec.kind}-{options.features}",
        )
    return result, logged


def _clean(value: float) -> float | None:
    return None if math.isnan(value) else value


def metrics_document(result: TrainingResult, logged: LoggedRun) -> dict[str, object]:
    """The --metrics-out JSON: the summary metrics (roc_auc, average_precision, card_precision_at_100,
    ...), each fold, the counts, the run and the registered version."""
    return {
        **{k: _clean(v) for k, v in result.metrics.items()},
        "model": result.spec.kind,
        "feature_columns": list(result.feature_columns),
        "folds": [
            {
                "train": f"{fold.plan.train_start}",
                "test": f"{fold.plan.test_start}",
                **{k: _clean(v) for k, v in fold.metrics.items()},
                **fold.counts,
                "card_precision_per_day": [round(v, 6) for v in fold.card_precision.per_day],
            }
            for fold in result.folds
        ],
        "run_id": logged.run_id,
        "version": logged.version,
        "aliases": list(logged.aliases),
    }


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def metrics_table(result: TrainingResult) -> Table:
    """One row per fold and the mean (± std) over folds."""
    key = card_precision_key(result.latest.card_precision.k)
    columns = ("roc_auc", "average_precision", key, "alert_precision", "alert_recall", "alerts_per_day")
    headers = (
        "AUC",
        "AP",
        f"CP@{result.latest.card_precision.k}",
        "alert prec",
        "alert recall",
        "alerts/day",
    )
    table = Table(title=f"{result.spec.kind}, {len(result.feature_columns)} features", title_justify="left")
    table.add_column("test from", no_wrap=True)
    table.add_column("train rows/frauds", justify="right")
    table.add_column("test rows/frauds", justify="right")
    for header in headers:
        table.add_column(header, justify="right", no_wrap=True)
    for fold in result.folds:
        c = fold.counts
        table.add_row(
            str(fold.plan.test_start),
            f"{c['train_rows']:,}/{c['train_frauds']:,}",
            f"{c['test_rows']:,}/{c['test_frauds']:,}",
            *(_fmt(fold.metrics[name], 1 if name == "alerts_per_day" else 3) for name in columns),
        )
    if len(result.folds) > 1:
        m = result.metrics
        table.add_row(
            "mean ± std",
            "",
            "",
            *(f"{_fmt(m[n], 1 if n == 'alerts_per_day' else 3)} ± {_fmt(m[n + '_std'])}" for n in columns),
        )
    return table


def print_result(result: TrainingResult, logged: LoggedRun, tracking_uri: str) -> None:
    console.print(metrics_table(result))
    for fold in result.folds:
        console.print(f"  {fold.plan.describe()}")
    console.print(
        f"Alert threshold {result.threshold:.4f} (chosen on the training period for the alert budget). "
        f"MLflow run {logged.run_id} in {tracking_uri}."
    )
    if logged.version is None:
        console.print("Not registered (--no-register).")
    else:
        aliases = f" with alias {', '.join(logged.aliases)}" if logged.aliases else ""
        console.print(f"Registered [bold]{MODEL_NAME}[/bold] version [bold]{logged.version}[/bold]{aliases}.")


@app.command("list")
def list_command(ctx: typer.Context) -> None:
    """Registered versions of fraud-detector with their aliases and test metrics."""
    tracking_uri, _ = tracking_target(settings_of(ctx))
    versions = list_versions(tracking_uri)
    if not versions:
        console.print(f"No version of {MODEL_NAME} is registered in {tracking_uri}.")
        return
    table = Table(title=f"{MODEL_NAME} in {tracking_uri}", title_justify="left")
    for name in ("version", "aliases", "model", "created", "AUC", "AP", "CP@100", "threshold"):
        left = name in ("aliases", "model", "created")
        table.add_column(name, justify="left" if left else "right", no_wrap=name != "model")
    for info in versions:
        m = info.metrics
        created = dt.datetime.fromtimestamp(info.created_ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d")
        table.add_row(
            str(info.version),
            ", ".join(info.aliases),
            info.tags.get("fraud.model", "").replace("_", " "),
            created,
            _fmt(m.get("roc_auc")),
            _fmt(m.get("average_precision")),
            _fmt(m.get(card_precision_key(100))),
            _fmt(m.get("threshold"), 4),
        )
    console.print(table)


@app.command("promote")
def promote_command(
    ctx: typer.Context,
    version: Annotated[int, typer.Argument(min=1, help="Version to promote.")],
    alias: Annotated[str, typer.Option(help=f"Alias to move: {' or '.join(ALIASES)}.")] = "champion",
) -> None:
    """Point an alias (champion or challenger) at a version; the scoring stage follows the champion."""
    if alias not in ALIASES:
        raise typer.BadParameter(f"--alias must be one of {', '.join(ALIASES)}")
    tracking_uri, _ = tracking_target(settings_of(ctx))
    previous = promote(tracking_uri, version, alias)
    before = f" (was version {previous})" if previous is not None else ""
    console.print(f"{MODEL_NAME}@{alias} -> version {version}{before}.")
