"""``fraud train`` and ``fraud models list|promote``: training runs, evaluation and the model registry."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from contracts.errors import ConfigError
from fraud.console import console, fmt_metric, settings_of
from fraud.options import KnownFraudsOption, LabelDelayOption, feature_params
from infra.clients import mlflow_store
from models.estimators import (
    CLASS_WEIGHTS,
    DEFAULT_SPEC,
    DEFAULT_TRAIN_DAYS,
    FEATURE_SETS,
    MODEL_KINDS,
    ModelSpec,
    depth_for,
)
from models.metrics import AVERAGE_PRECISION, DEFAULT_ALERTS_PER_DAY, ROC_AUC, card_precision_key
from models.registry import (
    ALIASES,
    CHAMPION,
    MODEL_NAME,
    ModelNotFoundError,
    list_versions,
    promote,
    promotion_evidence,
    resolve_version,
)
from models.splits import DEFAULT_KNOWN_FRAUDS, EvalProtocol

app = typer.Typer(help="The model registry: versions, aliases, promotion.", no_args_is_help=True)


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
    model: Annotated[str, typer.Option(help=f"Classifier: {', '.join(MODEL_KINDS)}.")] = DEFAULT_SPEC.kind,
    max_depth: Annotated[
        int | None,
        typer.Option(
            min=0,
            help=f"Maximum tree depth (trees only); 0: unlimited. Default: {DEFAULT_SPEC.max_depth} for "
            f"{DEFAULT_SPEC.kind}, unlimited for the others.",
            show_default=False,
        ),
    ] = None,
    n_estimators: Annotated[
        int,
        typer.Option(min=1, help="Trees (random_forest) or boosting iterations (hist_gradient_boosting)."),
    ] = DEFAULT_SPEC.n_estimators,
    class_weight: Annotated[
        str, typer.Option(help="Class imbalance: 'balanced' (inverse class frequency) or 'none'.")
    ] = DEFAULT_SPEC.class_weight,
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
    test_start: Annotated[
        str | None,
        typer.Option(
            help="First test day (YYYY-MM-DD) of the first fold instead: training ends --gap-days before "
            "it, so a fixed test week can be compared across --train-days.",
        ),
    ] = None,
    train_days: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"Days of training data. Default: the default model's, {DEFAULT_TRAIN_DAYS} (chosen on "
            "validation, docs/models.md), fewer when the data is shorter.",
        ),
    ] = None,
    gap_days: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Days between training and test, in which the training period's labels become known "
            "(default: the label delay, rounded up to whole days).",
        ),
    ] = None,
    test_days: Annotated[int, typer.Option(min=1, help="Test days after the gap.")] = 7,
    folds: Annotated[
        int,
        typer.Option(
            min=1,
            help="Consecutive folds, each --test-days later than the previous (counted forward from "
            "--train-start or --test-start, else back from the latest): mean and std.",
        ),
    ] = 1,
    alerts_per_day: Annotated[
        float,
        typer.Option(
            min=0.001, help="Alert budget: the threshold is chosen on the training period to meet it."
        ),
    ] = DEFAULT_ALERTS_PER_DAY,
    label_delay_days: LabelDelayOption = None,
    known_frauds: KnownFraudsOption = DEFAULT_KNOWN_FRAUDS,
    metrics_out: Annotated[Path | None, typer.Option(help="Write the metrics to this JSON file.")] = None,
    wait_s: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Wait up to this many seconds for the topics to hold the history the split needs "
            "(train + delay + test days and the longest feature window), e.g. beside a running simulator.",
        ),
    ] = 0.0,
    register: Annotated[
        bool,
        typer.Option(
            "--register/--no-register", help="Register the model as a new version of fraud-detector."
        ),
    ] = True,
    if_no_champion: Annotated[
        bool,
        typer.Option(
            "--if-no-champion",
            help="Train only if fraud-detector has no champion yet (a one-shot service started again "
            "registers nothing).",
        ),
    ] = False,
) -> None:
    """Train a model on an honest split, evaluate it as fraud teams do, and log it to MLflow.

    Train on --train-days, skip --gap-days (labels of the training period arrive during it), test on
    --test-days; on each test day, cards with a fraud known before that day are left out (--known-frauds),
    as `fraud ab run` does.
    """
    from fraud import training  # heavy: scikit-learn and MLflow, imported only when training

    settings = settings_of(ctx)
    for name, value, allowed in (
        ("--model", model, MODEL_KINDS),
        ("--features", features, FEATURE_SETS),
        ("--class-weight", class_weight, CLASS_WEIGHTS),
    ):
        if value not in allowed:
            raise typer.BadParameter(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    tracking_uri, artifacts = training.tracking_target(settings)
    if if_no_champion:
        try:
            version = resolve_version(tracking_uri, CHAMPION)
        except ModelNotFoundError:
            pass
        else:
            console.print(
                f"{MODEL_NAME}@{CHAMPION} is version {version}: nothing trained (--if-no-champion)."
            )
            return
    params = feature_params(settings)
    gap = training.gap_days(settings) if gap_days is None else gap_days
    periods = training.Periods(train_start, train_days, gap, test_days, folds, test_start)
    if wait_s and input_file is None:
        history = periods.history_days + params.window_days[-1]
        training.wait_for_history(settings, history, wait_s)
    spec = ModelSpec(model, depth_for(model, max_depth), n_estimators, class_weight, seed)  # type: ignore[arg-type]
    protocol = EvalProtocol(known_frauds, settings.label_delay_ms)  # type: ignore[arg-type]
    if input_file is not None:
        dataset, plans = training.file_training_set(settings, input_file, mapping, params, periods, protocol)
    else:
        dataset, plans = training.topics_training_set(settings, params, periods)
    options = training.TrainOptions(spec, features, params, plans, alerts_per_day, protocol)  # type: ignore[arg-type]
    result, logged = training.run_training(dataset, options, tracking_uri, artifacts, register)
    training.print_result(result, logged, tracking_uri)
    if metrics_out is not None:
        metrics_out.parent.mkdir(parents=True, exist_ok=True)
        metrics_out.write_text(
            json.dumps(training.metrics_document(result, logged), indent=2, allow_nan=False) + "\n"
        )
        console.print(f"Wrote {metrics_out}")


@app.command("list")
def list_command(ctx: typer.Context) -> None:
    """Registered versions of fraud-detector with their aliases and test metrics."""
    tracking_uri, _ = mlflow_store(settings_of(ctx))
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
            fmt_metric(m.get(ROC_AUC)),
            fmt_metric(m.get(AVERAGE_PRECISION)),
            fmt_metric(m.get(card_precision_key(100))),
            fmt_metric(m.get("threshold"), 4),
        )
    console.print(table)


@app.command("promote")
def promote_command(
    ctx: typer.Context,
    version: Annotated[int, typer.Argument(min=1, help="Version to promote.")],
    alias: Annotated[str, typer.Option(help=f"Alias to move: {' or '.join(ALIASES)}.")] = "champion",
    force: Annotated[
        bool, typer.Option("--force", help="Make it the champion without A/B evidence (`fraud ab run`).")
    ] = False,
) -> None:
    """Point an alias (champion or challenger) at a version; the scoring stage follows the champion.

    A new champion needs evidence: an A/B comparison (`fraud ab run --promote-if-better`) that found the
    version better than the champion, or --force."""
    if alias not in ALIASES:
        raise typer.BadParameter(f"--alias must be one of {', '.join(ALIASES)}")
    tracking_uri, _ = mlflow_store(settings_of(ctx))
    if alias == CHAMPION and not force and promotion_evidence(tracking_uri, version) is None:
        raise ConfigError(
            f"no A/B evidence that version {version} beats the champion: run `fraud ab run --challenger "
            f"{version} --from ... --to ... --promote-if-better average_precision`, or pass --force"
        )
    previous = promote(tracking_uri, version, alias)
    before = f" (was version {previous})" if previous is not None else ""
    console.print(f"{MODEL_NAME}@{alias} -> version {version}{before}.")
