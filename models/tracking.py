"""MLflow tracking of a training run: parameters, data range and counts, metrics, plots and the model.

Everything goes through an explicit ``MlflowClient`` for the given tracking URI (no global MLflow state).
The model is saved with skops (safe loading, see ``models.registry``), with its signature (the feature
columns in, the fraud probability out) and an input example, then optionally registered.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import sklearn
from matplotlib.figure import Figure
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from sklearn.metrics import precision_recall_curve, roc_curve

from models.registry import MODEL_ARTIFACT_PATH, TRUSTED_TYPES, register_version, registry_client
from models.training import TrainingResult

#: The MLflow experiments of training runs and of A/B evaluations.
EXPERIMENT_NAME = "fraud-detector"
EVALUATION_EXPERIMENT = "fraud-detector-ab"
_MLFLOW_BATCH = 100


@dataclass(frozen=True)
class LoggedRun:
    """Where a training run was logged, and the registered version if any."""

    run_id: str
    experiment_id: str
    version: int | None = None
    aliases: tuple[str, ...] = ()


def default_artifact_location(tracking_uri: str, artifacts: str | None = None) -> str | None:
    """Artifact root for a new experiment: the embedded stack's, or next to a SQLite store; else the
    server's default (None)."""
    if artifacts is not None:
        return Path(artifacts).resolve().as_uri()
    if tracking_uri.startswith("sqlite:///"):
        return (Path(tracking_uri.removeprefix("sqlite:///")).parent / "artifacts").resolve().as_uri()
    return None


def experiment_id(client: MlflowClient, artifact_location: str | None, name: str = EXPERIMENT_NAME) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    location = artifact_location  # training runs' artifacts at its root, each other experiment's below it
    if artifact_location is not None and name != EXPERIMENT_NAME:
        location = f"{artifact_location.rstrip('/')}/{name}"
    return str(client.create_experiment(name, artifact_location=location))


def log_evaluation(
    tracking_uri: str,
    params: Mapping[str, object],
    metrics: Mapping[str, float],
    files: Mapping[str, str],
    tags: Mapping[str, str],
    artifact_location: str | None = None,
    run_name: str | None = None,
) -> str:
    """Log an evaluation run (an A/B comparison) in the ``fraud-detector-ab`` experiment: its parameters,
    metrics, tags (the versions compared) and text files (the report); returns the run id."""
    client = registry_client(tracking_uri)
    exp_id = experiment_id(client, artifact_location, EVALUATION_EXPERIMENT)
    run = client.create_run(exp_id, run_name=run_name, tags=dict(tags))
    run_id = run.info.run_id
    try:
        now = int(time.time() * 1000)
        values = [Param(k, str(v)) for k, v in params.items()]
        points = [Metric(k, float(v), now, 0) for k, v in metrics.items() if not math.isnan(v)]
        for start in range(0, max(len(values), len(points)), _MLFLOW_BATCH):
            client.log_batch(
                run_id,
                params=values[start : start + _MLFLOW_BATCH],
                metrics=points[start : start + _MLFLOW_BATCH],
            )
        with tempfile.TemporaryDirectory(prefix="fraud-evaluation-") as tmp:
            for name, text in files.items():
                (Path(tmp) / name).write_text(text)
            client.log_artifacts(run_id, tmp)
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id)
    return str(run_id)


def log_training(
    tracking_uri: str,
    result: TrainingResult,
    params: Mapping[str, object],
    data_metrics: Mapping[str, float],
    register: bool,
    artifact_location: str | None = None,
    run_name: str | None = None,
) -> LoggedRun:
    """Log one training run (and register its model unless ``register`` is False).

    Args:
        tracking_uri: MLflow tracking and registry URI.
        result: the trained model and its evaluation.
        params: run parameters (model, features, split, data range, ...).
        data_metrics: counts of the data and the split (logged as metrics).
        register: register the model as a new version of ``fraud-detector``.
        artifact_location: artifact root if the experiment has to be created.
        run_name: name shown in the MLflow UI.
    """
    client = registry_client(tracking_uri)
    exp_id = experiment_id(client, artifact_location)
    run = client.create_run(exp_id, run_name=run_name, tags={"fraud.model": result.spec.kind})
    run_id = run.info.run_id
    try:
        _log_values(client, run_id, result, params, data_metrics)
        _log_plots(client, run_id, result)
        _log_model(client, run_id, result)
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id)
    if not register:
        return LoggedRun(run_id, exp_id)
    version, aliases = register_version(
        tracking_uri,
        run_id,
        f"{run.info.artifact_uri}/{MODEL_ARTIFACT_PATH}",
        result.threshold,
        result.feature_columns,
        tags={"fraud.model": result.spec.kind, "fraud.run_id": run_id},
    )
    return LoggedRun(run_id, exp_id, version, aliases)


def _log_values(
    client: MlflowClient,
    run_id: str,
    result: TrainingResult,
    params: Mapping[str, object],
    data_metrics: Mapping[str, float],
) -> None:
    now = int(time.time() * 1000)
    all_params = [
        Param(k, "" if v is None else str(v)) for k, v in {**result.spec.params(), **params}.items()
    ]
    metrics = [
        Metric(k, float(v), now, 0)
        for k, v in {**result.metrics, **data_metrics}.items()
        if not math.isnan(v)
    ]
    for i, fold in enumerate(result.folds):  # per-fold values as steps of fold_* metrics
        metrics += [Metric(f"fold_{k}", v, now, i) for k, v in fold.metrics.items() if not math.isnan(v)]
    latest = result.latest.card_precision
    metrics += [
        Metric("card_precision_day", v, now, day) for day, v in zip(latest.days, latest.per_day, strict=True)
    ]
    for start in range(0, len(all_params), _MLFLOW_BATCH):
        client.log_batch(run_id, params=all_params[start : start + _MLFLOW_BATCH])
    for start in range(0, len(metrics), _MLFLOW_BATCH):
        client.log_batch(run_id, metrics=metrics[start : start + _MLFLOW_BATCH])


def _log_plots(client: MlflowClient, run_id: str, result: TrainingResult) -> None:
    fold = result.latest
    title = f"{result.spec.kind}, {fold.plan.describe()}"
    if len(np.unique(fold.y_test)) == 2:
        figure = Figure(figsize=(5, 5))
        axes = figure.subplots()
        fpr, tpr, _ = roc_curve(fold.y_test, fold.test_scores)
        axes.plot(fpr, tpr, label=f"ROC AUC {fold.metrics['roc_auc']:.3f}")
        axes.plot([0, 1], [0, 1], linestyle=":", color="grey")
        axes.set(xlabel="false positive rate", ylabel="true positive rate", title=title)
        axes.title.set_fontsize(8)
        axes.legend(loc="lower right")
        client.log_figure(run_id, figure, "plots/roc.png")

        figure = Figure(figsize=(5, 5))
        axes = figure.subplots()
        precision, recall, _ = precision_recall_curve(fold.y_test, fold.test_scores)
        axes.step(recall, precision, where="post", label=f"AP {fold.metrics['average_precision']:.3f}")
        axes.axhline(float(np.mean(fold.y_test)), linestyle=":", color="grey", label="fraud rate")
        axes.set(xlabel="recall", ylabel="precision", title=title)
        axes.title.set_fontsize(8)
        axes.legend(loc="upper right")
        client.log_figure(run_id, figure, "plots/precision_recall.png")

    cards = fold.card_precision
    figure = Figure(figsize=(6, 4))
    axes = figure.subplots()
    days = [str(fold.plan.test_start + pd.Timedelta(days=d)) for d in cards.days]
    axes.bar(days, cards.per_day)
    axes.axhline(cards.mean, linestyle="--", color="black", label=f"mean {cards.mean:.3f}")
    axes.set(ylabel=f"card precision at {cards.k}", ylim=(0, 1), title=title)
    axes.title.set_fontsize(8)
    axes.tick_params(axis="x", labelrotation=45, labelsize=7)
    axes.legend(loc="upper right")
    figure.tight_layout()
    client.log_figure(run_id, figure, "plots/card_precision_per_day.png")


def _log_model(client: MlflowClient, run_id: str, result: TrainingResult) -> None:
    import mlflow.sklearn
    from mlflow.models import infer_signature

    fold = result.latest
    example = fold.example
    signature = infer_signature(example, fold.pipeline.predict_proba(example))
    with tempfile.TemporaryDirectory(prefix="fraud-model-") as tmp:
        path = Path(tmp) / MODEL_ARTIFACT_PATH
        mlflow.sklearn.save_model(
            fold.pipeline,
            path,
            serialization_format=mlflow.sklearn.SERIALIZATION_FORMAT_SKOPS,
            skops_trusted_types=list(TRUSTED_TYPES),
            signature=signature,
            input_example=example,
            pyfunc_predict_fn="predict_proba",
            pip_requirements=[f"scikit-learn=={sklearn.__version__}", "skops", "pandas", "numpy"],
        )
        client.log_artifacts(run_id, str(path), MODEL_ARTIFACT_PATH)
