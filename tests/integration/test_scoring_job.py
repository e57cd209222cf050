"""The pipeline end to end on the embedded stack: transactions -> feature job -> scoring job -> alerts.

Real broker, Redis, Spark and MLflow store. Two models are registered; the champion alias moves from the
first to the second while the scoring job runs: every transaction gets exactly one score record, the
scores name the version that made them (the first, then the second, never back), the obvious frauds
(amounts above 220) raise alerts, Redis holds the same alerts, and bad feature records are dead-lettered.

Then the same transactions go through the one-query pipeline (``fraud pipeline run --once``) into topics
and Redis keys of its own, in two runs: the first to the middle of the input, the second from a savepoint
of the first. Together they write the feature job's feature records and the scoring job's scores.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pytest
from confluent_kafka import Message
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from contracts.events import Reason, TxColumns, from_message
from contracts.records import AlertRecord, ScoreRecord
from contracts.redis_keys import card_features_key, card_score_key
from contracts.settings import DEFAULT_MODEL_CHECK_INTERVAL_S, DEFAULT_RETENTION_S, Topics
from features.definitions import EVENT_TIME_MS, FEATURE_COLUMNS, FeatureParams
from fraud import savepoints
from fraud.training import Periods, TrainOptions, run_training
from infra.clients import Clients
from infra.embedded.stack import StackInfo
from infra.kafka.admin import ensure_topics
from infra.kafka.log import read_topic, topic_counts
from infra.redis.connection import RedisTarget
from infra.redis.reads import get_alert
from infra.spark.session import ONCE, Trigger
from ingest.produce import produce_events
from ingest.simulator import SimulatorConfig, simulate
from models.dataset import file_dataset
from models.estimators import ModelSpec
from models.metrics import DEFAULT_ALERTS_PER_DAY
from models.registry import CHAMPION, LoadedModel, load_model, promote
from models.tracking import default_artifact_location
from scoring.core import explanations
from scoring.job import ScoringJobConfig, start_scoring_job
from scoring.pipeline import PipelineConfig, start_pipeline
from tests.support.feature_jobs import (
    MAX_EVENT_BYTES,
    isolated_clients,
    job_config,
    prefix_of,
    run_once,
    simulated,
    stopped,
)
from tests.support.samples import FEATURE

pytestmark = pytest.mark.minutes(3.5)

C = TxColumns
SIMULATION = SimulatorConfig(customers=300, terminals=600, days=35, seed=5)
MAX_RECORDS = 2_500
#: The pipeline's: a few micro-batches in each of its two runs (the scoring job needs more: the alias moves).
PIPELINE_MAX_RECORDS = 10_000
#: Records that are not feature records, produced to the features topic with the real ones.
#: A feature record as another producer might write it, for the bad variants below (never scored).
_FEATURE = {**FEATURE, "tx_id": 10**15, "features": dict.fromkeys(FEATURE_COLUMNS, 1.0)}
BAD_RECORDS = [
    b"{not json",
    b'{"schema_version": 99}',
    b"[1, 2]",
    # Each would fail the model or the scoring, not just this record, if it got through.
    orjson.dumps(_FEATURE).replace(b"1.0", b"Infinity", 1),
    orjson.dumps({**_FEATURE, "features": {**_FEATURE["features"], FEATURE_COLUMNS[0]: "1.0"}}),
    orjson.dumps({**_FEATURE, "features": dict.fromkeys(FEATURE_COLUMNS[1:], 1.0)}),
    orjson.dumps({**_FEATURE, "tx_id": "17"}),
]
TIMEOUT_S = 300


@dataclass
class Scored:
    clients: Clients
    prefix: str
    transactions: dict[int, float]  # tx_id -> amount
    features: list[Message]
    scores: list[Message]
    alerts: list[Message]
    dead: list[Message]
    versions_by_batch: dict[int, int]
    tracking_uri: str


def wait_for(condition: collections.abc.Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


@pytest.fixture(scope="module")
def scored(spark: SparkSession, stack: StackInfo, tmp_path_factory: pytest.TempPathFactory) -> Scored:
    home = tmp_path_factory.mktemp("scoring")
    clients = isolated_clients(stack, home)
    topics = clients.settings.topics
    params = FeatureParams()

    # Two registered models in a registry of this test's own: v1 (the champion) and v2.
    tracking_uri = f"sqlite:///{home / 'mlflow.db'}"
    artifacts = default_artifact_location(tracking_uri, str(home / "artifacts"))
    frame = simulate(SIMULATION)
    dataset = file_dataset(frame, "sim", params, MAX_EVENT_BYTES)
    plans = Periods(train_days=7).plans(dataset.last_ms)
    for spec in (ModelSpec("decision_tree", max_depth=2), ModelSpec("random_forest", n_estimators=30)):
        options = TrainOptions(spec, "handbook", params, plans, DEFAULT_ALERTS_PER_DAY)
        run_training(dataset, options, tracking_uri, artifacts, register=True)

    # Transactions and labels -> the feature job -> the features topic (plus a few bad records).
    sim = simulated(SIMULATION, clients.settings, params)
    produce_events(clients.producer(), topics, sim.events)
    run_once(spark, job_config(clients, topics, home / "features-checkpoint", 20_000, params))
    producer = clients.producer()
    for value in BAD_RECORDS:
        producer.produce(topics.features, value)
    producer.flush()

    # The scoring job, running; the champion alias moves to v2 after a few micro-batches.
    checkpoint = home / "scoring-checkpoint"
    config = ScoringJobConfig(
        kafka_config=clients.kafka_config(),
        topics=topics,
        checkpoint=checkpoint,
        redis=RedisTarget(clients.endpoints.redis_url, prefix_of(topics), DEFAULT_RETENTION_S),
        tracking_uri=tracking_uri,
        max_event_bytes=MAX_EVENT_BYTES,
        max_records_per_trigger=MAX_RECORDS,
        model_check_interval_s=1.0,
    )
    query = start_scoring_job(spark, config, Trigger(interval_s=0.5))
    try:
        wait_for(lambda: len(query.recentProgress) >= 3 or query.exception() is not None, "3 micro-batches")
        promote(tracking_uri, 2, CHAMPION)
        expected = len(sim.transactions) + len(BAD_RECORDS)

        def all_scored() -> bool:
            assert query.exception() is None, f"the scoring job failed: {query.exception()}"
            written = sum(1 for _ in read_topic(clients, topics.scores, idle_timeout_s=2))
            dead = sum(1 for _ in read_topic(clients, topics.dead_letter, idle_timeout_s=2))
            return written + dead >= expected

        wait_for(all_scored, "every record scored")
    finally:
        query.stop()
    versions = {int(k): v for k, v in orjson.loads((checkpoint / "model-versions.json").read_bytes()).items()}
    return Scored(
        clients,
        prefix_of(topics),
        {tx: event.amount for tx, event in sim.transactions.items()},
        [m for m in read_topic(clients, topics.features) if m.value() not in BAD_RECORDS],
        list(read_topic(clients, topics.scores)),
        list(read_topic(clients, topics.alerts)),
        list(read_topic(clients, topics.dead_letter)),
        versions,
        tracking_uri,
    )


def test_every_transaction_has_exactly_one_score(scored: Scored) -> None:
    counts = collections.Counter(
        ScoreRecord.model_validate_json(m.value() or b"").tx_id for m in scored.scores
    )
    assert set(counts) == set(scored.transactions)
    assert max(counts.values()) == 1


def test_moving_the_alias_switches_the_version_without_a_restart(scored: Scored) -> None:
    by_partition: dict[int, list[int]] = collections.defaultdict(list)
    for message in scored.scores:
        record = ScoreRecord.model_validate_json(message.value() or b"")
        assert record.model_name == "fraud-detector"
        by_partition[message.partition()].append(record.model_version)
    assert {v for versions in by_partition.values() for v in versions} == {1, 2}
    for versions in by_partition.values():
        assert versions == sorted(versions), "a partition went back to the old version"
    chosen = [scored.versions_by_batch[batch] for batch in sorted(scored.versions_by_batch)]
    assert chosen == sorted(chosen) and chosen[0] == 1 and chosen[-1] == 2


def test_obvious_frauds_raise_alerts_that_match_redis(scored: Scored) -> None:
    alerts = [AlertRecord.model_validate_json(m.value() or b"") for m in scored.alerts]
    alerted = {alert.tx_id for alert in alerts}
    obvious = {tx for tx, amount in scored.transactions.items() if amount > 220}
    assert obvious, "the simulation has no amount above 220"
    scores = [ScoreRecord.model_validate_json(m.value() or b"") for m in scored.scores]
    missed = [
        (s.tx_id, s.amount, s.model_version, s.score, s.threshold)
        for s in scores
        if s.tx_id in obvious - alerted
    ]
    assert not missed, f"{len(missed)} of {len(obvious)} obvious frauds raised no alert: {missed[:20]}"
    assert len(alerted) == len(alerts), "an alert was written twice"
    redis = scored.clients.redis()
    models: dict[int, LoadedModel] = {}
    for alert in alerts:
        assert alert.score >= alert.threshold
        if alert.model_version not in models:
            models[alert.model_version] = load_model(scored.tracking_uri, version=alert.model_version)
        # Its reasons: the contributions of the model that scored it to its own feature values, strongest
        # first; for these trees (a forest, a tree) the margin they add up to is the score itself.
        (explained,) = explanations(models[alert.model_version], pd.DataFrame([alert.features]))
        assert list(alert.contributions) == list(explained.contributions), (alert.tx_id, alert.features)
        assert alert.contributions == pytest.approx(explained.contributions, abs=1e-12)
        assert alert.contribution_method == "tree_shap"
        assert alert.top_features == list(explained.contributions)[:3]
        assert alert.base_margin is not None
        assert alert.base_margin + sum(alert.contributions.values()) == pytest.approx(alert.score, abs=1e-9)
        assert get_alert(redis, alert.tx_id, scored.prefix) == alert
    latest = {}
    for score in sorted(scores, key=lambda s: (s.event_time_ms, s.tx_id)):
        latest[score.card_id] = score
    for card, score in latest.items():
        stored = redis.hgetall(card_score_key(card, scored.prefix))
        assert int(stored[b"tx_id"]) == score.tx_id


def test_bad_feature_records_are_dead_lettered(scored: Scored) -> None:
    letters = [from_message(m) for m in scored.dead]
    assert sorted(letter.raw for letter in letters) == sorted(BAD_RECORDS)
    reasons = {letter.raw: letter.reason for letter in letters}
    assert [reasons[raw] for raw in BAD_RECORDS] == [
        Reason.MALFORMED_JSON,
        Reason.UNKNOWN_SCHEMA_VERSION,
        Reason.NOT_AN_OBJECT,
        Reason.INVALID_VALUE,
        Reason.WRONG_TYPE,
        Reason.MISSING_FIELD,
        Reason.WRONG_TYPE,
    ]


# --- the one-query pipeline over the same transactions --------------------------------------------------


@dataclass
class Piped:
    prefix: str
    features: list[Message]
    scores: list[Message]
    alerts: list[Message]
    versions_by_batch: dict[int, int]


def run_pipeline(
    spark: SparkSession, config: PipelineConfig, from_savepoint: Path | None = None
) -> StreamingQuery:
    """Run the pipeline once over what its input holds (up to its ending offsets), started as ``fraud
    pipeline run`` starts it (``fraud.savepoints.plan_start``), from ``from_savepoint`` if given."""
    shuffle_partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 0)
    plan = savepoints.plan_start(config, from_savepoint, shuffle_partitions)
    return stopped(
        start_pipeline(spark, config, plan.start, ONCE),
        "pipeline",
        timeout_s=TIMEOUT_S,
        ended=config.ended,
    )


@pytest.fixture(scope="module")
def piped(spark: SparkSession, scored: Scored, tmp_path_factory: pytest.TempPathFactory) -> Piped:
    """The pipeline over the scoring fixture's transactions and labels; the champion is v2 now. It runs up
    to the middle of the input, a savepoint is taken, and a second pipeline goes on from it to the end."""
    home = tmp_path_factory.mktemp("pipeline")
    clients = scored.clients
    inputs = clients.settings.topics
    own = Topics().with_prefix(f"{scored.prefix}pipe-")
    ensure_topics(clients.admin(), own.all(), clients.settings.partitions, 1)
    topics = own.model_copy(update={"transactions": inputs.transactions, "labels": inputs.labels})
    features = replace(
        job_config(clients, topics, home / "first", PIPELINE_MAX_RECORDS),
        redis=RedisTarget(clients.endpoints.redis_url, prefix_of(own), DEFAULT_RETENTION_S),
    )
    config = PipelineConfig(
        features=features,
        tracking_uri=scored.tracking_uri,
        model_check_interval_s=DEFAULT_MODEL_CHECK_INTERVAL_S,
    )
    times = sorted(record[EVENT_TIME_MS] for record in by_tx(scored.features).values())
    half = replace(features, end_ms=times[len(times) // 2])
    run_pipeline(spark, replace(config, features=half))
    savepoint = savepoints.take("pipeline", "", home / "first", home / "savepoint")
    checkpoint = home / "checkpoint"
    query = run_pipeline(
        spark, replace(config, features=replace(features, checkpoint=checkpoint)), savepoint.path
    )
    versions = orjson.loads((home / "checkpoint" / "model-versions.json").read_bytes())
    piped = Piped(
        prefix_of(own),
        list(read_topic(clients, topics.features)),
        list(read_topic(clients, topics.scores)),
        list(read_topic(clients, topics.alerts)),
        {int(k): v for k, v in versions.items()},
    )
    if not piped.features:  # tell records never written from records not readable
        counts = topic_counts(clients, [*own.all(), *inputs.all()])
        progress = [(p["batchId"], p["numInputRows"]) for p in query.recentProgress]
        raise AssertionError(f"the pipeline's features topic reads empty; topics hold {counts}; {progress}")
    return piped


def by_tx(messages: list[Message]) -> dict[int, dict[str, Any]]:
    records = [orjson.loads(m.value() or b"null") for m in messages]
    found = {record[C.TX_ID]: record for record in records}
    assert len(found) == len(records), "a transaction has several records"
    return found


def test_the_pipeline_writes_the_feature_jobs_records_and_the_scoring_jobs_scores(
    scored: Scored, piped: Piped
) -> None:
    assert set(piped.versions_by_batch.values()) == {2}
    features, piped_features = by_tx(scored.features), by_tx(piped.features)
    assert set(piped_features) == set(scored.transactions)
    assert piped_features == features
    scores, piped_scores = by_tx(scored.scores), by_tx(piped.scores)
    assert set(piped_scores) == set(scored.transactions)
    same_version = [tx for tx, record in scores.items() if record["model_version"] == 2]
    assert same_version, "the scoring job scored nothing with version 2"
    for tx in same_version:
        expected, got = scores[tx], piped_scores[tx]
        del expected["scored_at_ms"], got["scored_at_ms"]
        assert got == expected


def test_the_pipelines_alerts_are_in_redis_with_the_latest_features(scored: Scored, piped: Piped) -> None:
    redis, prefix = scored.clients.redis(), piped.prefix
    alerts = [AlertRecord.model_validate_json(m.value() or b"") for m in piped.alerts]
    assert alerts
    assert {alert.tx_id for alert in alerts} == {
        tx for tx, record in by_tx(piped.scores).items() if record["alert"]
    }
    for alert in alerts:
        assert get_alert(redis, alert.tx_id, prefix) == alert
    latest: dict[str, dict[str, Any]] = {}
    for record in sorted(by_tx(piped.features).values(), key=lambda r: (r[EVENT_TIME_MS], r[C.TX_ID])):
        latest[record[C.CARD_ID]] = record
    for card, record in latest.items():
        stored = redis.hgetall(card_features_key(card, prefix))
        assert int(stored[b"tx_id"]) == record[C.TX_ID]
