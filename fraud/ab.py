"""``fraud ab run``: judge a challenger against the champion on a replayed range of history.

Wiring only (the parts are ``scoring.ab``, ``models.comparison``, ``models.ab_report``): resolve the two
versions, score the range with both (a Spark replay of the features topic, or the live job's shadow
scores), join the labels known by the end of the range plus the label delay, compare, write the HTML
report, log an MLflow evaluation run that names both versions, and apply the promotion gate. It reads
topics and writes none: live topics, Redis keys and checkpoints stay as they were. This module imports
PySpark and MLflow: the CLI imports it when the command runs.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from contracts.errors import NotFoundError
from contracts.events import TxColumns
from contracts.records import ScoreRecord
from contracts.settings import Settings
from features.definitions import DAY_MS
from fraud.console import console
from fraud.jobs import job_spark_session
from fraud.options import FeatureSource, feature_params
from infra.clients import Clients, mlflow_store
from infra.kafka.log import read_topic
from models.ab_report import render_html
from models.comparison import Comparison, Decision, compare, decide
from models.registry import (
    AB_DECISION_TAG,
    AB_REASON_TAG,
    AB_RUN_TAG,
    CHAMPION,
    KEEP,
    MODEL_NAME,
    PROMOTE,
    LoadedModel,
    load_model,
    promote,
    resolve_reference,
    tag_version,
)
from models.replay import replay_labels, replay_topics
from models.splits import DEFAULT_KNOWN_FRAUDS, EvalProtocol, KnownFrauds, day_of
from models.tracking import default_artifact_location, log_evaluation
from scoring.ab import (
    PairScorer,
    evaluation_frame,
    recomputed_pairs,
    score_range,
    shadow_pairs,
)
from scoring.chooser import check_computable

C = TxColumns


@dataclass(frozen=True)
class ABRequest:
    """What ``fraud ab run`` was asked for."""

    start_ms: int
    end_ms: int
    champion: str
    challenger: str
    shadow: bool
    report: Path
    n_boot: int
    seed: int
    alerts_per_day: float | None
    promote_if_better: str | None
    max_precision_drop: float
    features: FeatureSource = FeatureSource.AUTO
    known_frauds: KnownFrauds = DEFAULT_KNOWN_FRAUDS


@dataclass(frozen=True)
class ABResult:
    """What the run found and did."""

    comparison: Comparison
    versions: tuple[int, int]
    names: tuple[str, str]
    run_id: str
    report: Path
    decision: Decision | None
    promoted: bool
    seconds: float


def run_ab(settings: Settings, request: ABRequest) -> ABResult:
    """Score, compare, report, log and (if asked) promote; see the module docstring."""
    started = time.monotonic()
    clients = Clients.from_settings(settings)
    tracking_uri, artifacts = mlflow_store(settings)
    if request.shadow:
        pairs, (version_a, version_b), thresholds = _shadow(clients, settings, request)
    else:
        version_a = resolve_reference(tracking_uri, request.champion)
        version_b = resolve_reference(tracking_uri, request.challenger)
        pairs, thresholds = _replay(clients, settings, request, tracking_uri, (version_a, version_b))
    with console.status(f"Reading the labels of {settings.topics.labels!r}..."):
        labels = replay_labels(clients, settings.topics.labels, settings.max_event_bytes)
    protocol = EvalProtocol(request.known_frauds, settings.label_delay_ms)
    frame = evaluation_frame(pairs, labels, request.start_ms, request.end_ms, protocol)
    if frame.empty:
        raise NotFoundError(
            f"no scored transaction in {_range(request)}: check --from/--to against the features topic"
        )
    with console.status(f"Comparing on {len(frame):,} transactions ({request.n_boot} bootstrap samples)..."):
        comparison = compare(
            frame,
            thresholds[0],
            thresholds[1],
            alerts_per_day=request.alerts_per_day,
            n_boot=request.n_boot,
            seed=request.seed,
        )
    names = (f"{MODEL_NAME} v{version_a}", f"{MODEL_NAME} v{version_b}")
    title = f"Challenger v{version_b} against champion v{version_a}, {_range(request)}"
    html = render_html(comparison, frame, names, title)
    request.report.parent.mkdir(parents=True, exist_ok=True)
    request.report.write_text(html)
    decision = (
        None
        if request.promote_if_better is None
        else decide(comparison, request.promote_if_better, request.max_precision_drop)
    )
    run_id = log_evaluation(
        tracking_uri,
        params={
            "from": _iso(request.start_ms),
            "to": _iso(request.end_ms),
            "mode": "shadow" if request.shadow else "replay",
            "champion_version": version_a,
            "challenger_version": version_b,
            "n_boot": request.n_boot,
            "seed": request.seed,
            "rows": len(frame),
            "known_frauds": request.known_frauds,
        },
        metrics=comparison.flat_metrics(),
        files={"report.html": html, "comparison.json": json.dumps(comparison.to_dict(), indent=2)},
        tags={
            "fraud.ab.champion_version": str(version_a),
            "fraud.ab.challenger_version": str(version_b),
            **({"fraud.ab.decision": PROMOTE if decision.promote else KEEP} if decision else {}),
        },
        artifact_location=default_artifact_location(tracking_uri, artifacts),
        run_name=f"ab-v{version_b}-vs-v{version_a}",
    )
    promoted = False
    if decision is not None:
        tag_version(
            tracking_uri,
            version_b,
            {
                AB_DECISION_TAG: PROMOTE if decision.promote else KEEP,
                AB_RUN_TAG: run_id,
                AB_REASON_TAG: decision.reason,
            },
        )
        if decision.promote:
            promote(tracking_uri, version_b, CHAMPION)
            promoted = True
    seconds = time.monotonic() - started
    return ABResult(
        comparison, (version_a, version_b), names, run_id, request.report, decision, promoted, seconds
    )


def _replay(
    clients: Clients, settings: Settings, request: ABRequest, tracking_uri: str, versions: tuple[int, int]
) -> tuple[pd.DataFrame, tuple[float, float]]:
    """Both versions' scores of the range: the features topic replayed by one Spark job, or the features
    recomputed from the transactions and labels topics."""
    models = (load_model(tracking_uri, version=versions[0]), load_model(tracking_uri, version=versions[1]))
    thresholds = (models[0].threshold, models[1].threshold)
    needed = _check_features(models)
    if _features_source(clients, settings, request, needed) == FeatureSource.RECOMPUTE:
        with console.status(f"Recomputing the features of {_range(request)} from the transactions..."):
            events = replay_topics(clients, settings.topics, settings.max_event_bytes)
            return recomputed_pairs(
                models,
                events,
                feature_params(settings),
                start_ms=request.start_ms,
                end_ms=request.end_ms,
            ), thresholds
    scorer = PairScorer(
        tracking_uri=tracking_uri,
        version_a=versions[0],
        version_b=versions[1],
        topics=settings.topics,
        max_event_bytes=settings.max_event_bytes,
        start_ms=request.start_ms,
        end_ms=request.end_ms,
    )
    with console.status("Starting Spark..."):
        spark = job_spark_session(settings, "fraud-ab")
    try:
        with console.status(f"Scoring {_range(request)} of {settings.topics.features!r} with both models..."):
            pairs = score_range(spark, clients.kafka_config(), scorer)
    finally:
        spark.stop()
    return pairs, thresholds


def _check_features(models: tuple[LoadedModel, LoadedModel]) -> set[str]:
    """The features the two models need; an error if this code does not compute one of them."""
    needed: set[str] = set()
    for model in models:
        check_computable(model, f"{MODEL_NAME} v{model.version}")
        needed |= set(model.feature_columns) - {C.AMOUNT}
    return needed


def _features_source(
    clients: Clients, settings: Settings, request: ABRequest, needed: set[str]
) -> FeatureSource:
    """Where the features come from: as asked, or (auto) the topic unless its first record lacks a
    feature a model needs, or it is empty."""
    if request.features != FeatureSource.AUTO:
        return request.features
    topic = settings.topics.features
    held = _features_held(clients, topic)
    if held is None:
        console.print(f"[yellow]note:[/yellow] {topic!r} is empty: recomputing the features")
        return FeatureSource.RECOMPUTE
    lacking = sorted(needed - held)
    if lacking:
        console.print(
            f"[yellow]note:[/yellow] {topic!r} lacks {', '.join(lacking)} (written by an older feature job): "
            "recomputing the features from the transactions"
        )
        return FeatureSource.RECOMPUTE
    return FeatureSource.TOPIC


def _features_held(clients: Clients, topic: str) -> set[str] | None:
    """The feature names of the first record of ``topic`` (None if it has none): an older feature job's
    records come first."""
    messages = read_topic(clients, topic)
    try:
        first = next(messages, None)
    finally:
        messages.close()
    if first is None:
        return None
    features = json.loads(first.value() or b"{}").get("features")
    return set(features) if isinstance(features, dict) else set()


def _shadow(
    clients: Clients, settings: Settings, request: ABRequest
) -> tuple[pd.DataFrame, tuple[int, int], tuple[float, float]]:
    """The live job's scores and shadow scores of the range, paired by transaction."""
    # Whole topics: written in processing order, their offsets do not follow event time.
    with console.status("Reading the live scores and the shadow scores..."):
        scores, shadow = (
            [ScoreRecord.model_validate_json(m.value() or b"") for m in read_topic(clients, topic)]
            for topic in (settings.topics.scores, settings.topics.shadow_scores)
        )
    if not shadow:
        raise NotFoundError(
            f"{settings.topics.shadow_scores!r} holds no shadow score: run the scoring job with --shadow first"
        )
    versions, thresholds = [], []
    for records in (scores, shadow):
        counts = Counter(record.model_version for record in records)
        version, _ = counts.most_common(1)[0]
        if len(counts) > 1:
            console.print(
                f"[yellow]note:[/yellow] versions {sorted(counts)} scored the range; comparing v{version}"
            )
        versions.append(version)
        thresholds.append(next(record.threshold for record in records if record.model_version == version))
    return shadow_pairs(scores, shadow), (versions[0], versions[1]), (thresholds[0], thresholds[1])


def _iso(ms: int) -> str:
    return pd.Timestamp(ms, unit="ms", tz="UTC").isoformat()


def _range(request: ABRequest) -> str:
    days = (request.end_ms - request.start_ms) / DAY_MS
    return f"{day_of(request.start_ms)}..{day_of(request.end_ms - 1)} ({days:g} days)"
