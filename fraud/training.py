"""Training from the command line: the split options, the training set (a file or a replay of the topics),
the run logged to MLflow, and what the terminal shows of it.

This module imports scikit-learn and MLflow: the CLI imports it when it trains, not at start-up.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import typer
from rich.table import Table

from contracts.settings import Settings
from features.definitions import DAY_MS, EVENT_TIME_MS, FeatureParams
from fraud.console import console, fmt_metric, progress_bar
from infra.clients import Clients, mlflow_store
from infra.kafka.log import time_span
from ingest.files import parse_mapping, read_table
from models.dataset import Dataset, DatasetError, event_times_ms, file_dataset
from models.estimators import DEFAULT_TRAIN_DAYS, FeatureSet, ModelSpec, feature_set
from models.metrics import (
    ALERT_PRECISION,
    ALERT_RECALL,
    ALERTS_PER_DAY,
    AVERAGE_PRECISION,
    ROC_AUC,
    card_precision_key,
)
from models.registry import MODEL_NAME
from models.replay import replay_dataset, replay_topics
from models.splits import DEFAULT_PROTOCOL, EvalProtocol, SplitPlan, day_of, fold_plans, latest_plan
from models.tracking import LoggedRun, default_artifact_location, log_training
from models.training import TrainingResult, train_and_evaluate


@dataclass(frozen=True)
class TrainOptions:
    """What `fraud train` was asked for, resolved (the plans cover every fold, oldest first)."""

    spec: ModelSpec
    features: FeatureSet
    params: FeatureParams
    plans: list[SplitPlan]
    alerts_per_day: float
    protocol: EvalProtocol = DEFAULT_PROTOCOL


def gap_days(settings: Settings) -> int:
    """The days between training and test unless told: the label delay, rounded up to whole days (the
    training period's labels are all known when the test starts)."""
    return math.ceil(settings.label_delay_days)


def tracking_target(settings: Settings) -> tuple[str, str | None]:
    """MLflow tracking URI and the artifact root for a new experiment: the setting, else the running
    embedded stack's store."""
    uri, embedded_artifacts = mlflow_store(settings)
    return uri, default_artifact_location(uri, embedded_artifacts)


@dataclass(frozen=True)
class Periods:
    """The split options: a first training day or a first test day (neither: the latest the data allows)
    and period lengths; ``train_days`` None is the default model's (``DEFAULT_TRAIN_DAYS``), fewer when
    the data holds fewer days before the latest test period."""

    train_start: str | None = None
    train_days: int | None = None
    gap_days: int = 7
    test_days: int = 7
    folds: int = 1
    test_start: str | None = None

    @property
    def history_days(self) -> int:
        """Days the split spans: training (the default's, unless given), delay and test."""
        return (self.train_days or DEFAULT_TRAIN_DAYS) + self.gap_days + self.test_days

    def plans(self, last_ms: int, first_ms: int | None = None) -> list[SplitPlan]:
        """One plan per fold, oldest first, for data whose event times run from ``first_ms`` (None: any)
        to ``last_ms``. Without --train-days and --train-start, the default's training length is cut to
        the data when the data starts later."""
        if self.train_start is not None and self.test_start is not None:
            raise typer.BadParameter("give --train-start or --test-start, not both")
        train_days = self.train_days or DEFAULT_TRAIN_DAYS
        if self.train_start is None and self.test_start is None:
            latest = latest_plan(last_ms, train_days, self.gap_days, self.test_days)
            oldest = fold_plans(latest, self.folds)[0]
        else:
            option, text = (
                ("--train-start", self.train_start) if self.train_start else ("--test-start", self.test_start)
            )
            try:
                day = dt.date.fromisoformat(str(text))
                back = 0 if self.train_start else train_days + self.gap_days
                oldest = SplitPlan(day - dt.timedelta(days=back), train_days, self.gap_days, self.test_days)
            except ValueError as exc:
                raise typer.BadParameter(f"{option} {text!r}: {exc}") from exc
        if self.train_days is None and self.train_start is None and first_ms is not None:
            short = (day_of(first_ms) - oldest.train_start).days
            if 0 < short < train_days:
                oldest = replace(oldest, train_start=day_of(first_ms), train_days=train_days - short)
        return fold_plans(oldest.shifted((self.folds - 1) * self.test_days), self.folds)


def file_training_set(
    settings: Settings,
    path: Path,
    mapping: str,
    params: FeatureParams,
    periods: Periods,
    protocol: EvalProtocol = DEFAULT_PROTOCOL,
) -> tuple[Dataset, list[SplitPlan]]:
    """The dataset of a labelled file, for the rows the plans need (all of them when any known fraud
    counts: ``protocol.known_frauds == "all"``)."""
    with console.status(f"Reading {path}..."):
        table = read_table(path, parse_mapping(mapping))
        times = event_times_ms(table)
        plans = periods.plans(int(times.max()), int(times.min()))
    with console.status(f"Computing features ({plans[0].train_start}..{plans[-1].test_start})..."):
        dataset = file_dataset(
            table,
            f"file:{path}",
            params,
            settings.max_event_bytes,
            None if protocol.frauds_since_ms(plans[0].test_start_ms) is None else plans[0].train_start_ms,
            plans[-1].test_end_ms,
        )
    return dataset, plans


def topics_training_set(
    settings: Settings, params: FeatureParams, periods: Periods
) -> tuple[Dataset, list[SplitPlan]]:
    """The dataset of a replay of the transactions and labels topics (with progress), for the plans."""
    events = replay_topics(
        Clients.from_settings(settings), settings.topics, settings.max_event_bytes, progress_bar
    )
    plans = periods.plans(events.last_ms, int(events.transactions[EVENT_TIME_MS].min()))
    with console.status(f"Computing features ({plans[0].train_start}..{plans[-1].test_start})..."):
        dataset = replay_dataset(events, params, plans[0].train_start_ms, plans[-1].test_end_ms)
    return dataset, plans


def wait_for_history(settings: Settings, days: float, timeout_s: float, poll_s: float = 5.0) -> None:
    """Wait until the transactions topic spans ``days`` of event time (its first and last records), showing
    what it holds; for a trainer started beside a simulator that is still producing the history.

    Raises:
        DatasetError: not enough history after ``timeout_s``.
    """
    clients = Clients.from_settings(settings)
    topic = settings.topics.transactions
    deadline = time.monotonic() + timeout_s
    with console.status(f"Waiting for {days:g} days of history in {topic!r}...") as status:
        while True:
            span = time_span(clients, topic)
            held = 0.0 if span is None else (span[1] - span[0]) / DAY_MS
            if held >= days:
                break
            if time.monotonic() > deadline:
                raise DatasetError(
                    f"{topic!r} holds {held:.1f} days of history after {timeout_s:.0f} s; training needs {days:g}"
                )
            status.update(f"Waiting for {days:g} days of history in {topic!r} ({held:.1f} so far)...")
            time.sleep(poll_s)
    console.print(f"{topic!r} holds {held:.1f} days of history.")


def run_training(
    dataset: Dataset, options: TrainOptions, tracking_uri: str, artifacts: str | None, register: bool
) -> tuple[TrainingResult, LoggedRun]:
    """Train and evaluate on every fold, log the run to MLflow and (optionally) register the model."""
    columns = feature_set(options.features, options.params)
    with console.status(f"Training {options.spec.kind} on {len(options.plans)} fold(s)..."):
        result = train_and_evaluate(
            dataset, options.plans, options.spec, columns, options.alerts_per_day, protocol=options.protocol
        )
    latest = options.plans[-1]
    run_params = {
        "features": options.features,
        "n_features": len(columns),
        "label_delay_ms": options.params.label_delay_ms,
        "train_start": options.plans[0].train_start,
        "train_days": latest.train_days,
        "gap_days": latest.gap_days,
        "test_days": latest.test_days,
        "folds": len(options.plans),
        "alerts_per_day_budget": options.alerts_per_day,
        "known_frauds": options.protocol.known_frauds,
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


def metrics_table(result: TrainingResult) -> Table:
    """One row per fold and the mean (± std) over folds."""
    key = card_precision_key(result.latest.card_precision.k)
    columns = (ROC_AUC, AVERAGE_PRECISION, key, ALERT_PRECISION, ALERT_RECALL, ALERTS_PER_DAY)
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
            *(fmt_metric(fold.metrics[name], 1 if name == "alerts_per_day" else 3) for name in columns),
        )
    if len(result.folds) > 1:
        m = result.metrics
        table.add_row(
            "mean ± std",
            "",
            "",
            *(
                f"{fmt_metric(m[n], 1 if n == 'alerts_per_day' else 3)} ± {fmt_metric(m[n + '_std'])}"
                for n in columns
            ),
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
