"""A/B replays end to end, as a data scientist runs them: the simulator's world in the topics, the feature
job's records, two registered models of clearly different quality (one trained on shuffled labels), and
`fraud ab run` over a week of history, in a process of its own. Then the live job's shadow mode.

The world's label delay is 3 days, not the default 7: `fraud features run`, `fraud train` and the A/B
replay's recomputed features must all take it from ``FRAUD_LABEL_DELAY_DAYS`` and agree."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest
import redis
from pyspark.sql import SparkSession
from selenium.webdriver.remote.webdriver import WebDriver

from contracts.events import DAY_MS
from contracts.settings import DEFAULT_MODEL_CHECK_INTERVAL_S, DEFAULT_RETENTION_S, Topics, redis_prefix
from features.definitions import FeatureParams
from fraud.training import Periods, topics_training_set
from infra.clients import Clients
from infra.embedded.stack import StackInfo
from infra.kafka.admin import create_project_topics
from infra.kafka.log import read_topic, topic_counts
from infra.redis.connection import RedisTarget
from infra.spark.session import ONCE
from ingest.produce import produce_events
from models.dataset import Dataset, file_dataset
from models.estimators import ModelSpec, feature_set
from models.registry import CHALLENGER, CHAMPION, registry_client, resolve_version
from models.splits import SplitPlan
from models.tracking import default_artifact_location, log_training
from models.training import train_and_evaluate
from scoring.job import ScoringJobConfig, start_scoring_job
from tests.support.feature_jobs import (
    MAX_EVENT_BYTES,
    Simulated,
    assert_each_transaction_once,
    assert_same_as_batch,
    features_topic,
    isolated_clients,
    simulated,
)
from tests.support.samples import SMALL
from tests.support.scripts import FRAUD

pytestmark = pytest.mark.minutes(6)

#: The week after the models' training period (SplitPlan(2018-04-20): train 7 days, a gap of 7 days).
RANGE = ("2018-05-04", "2018-05-11")
TIMEOUT_S = 600
#: The world's label delay (days): not the default, so a command that ignores the setting computes other
#: terminal features.
LABEL_DELAY_DAYS = 3
#: The namespace the world's feature job runs in (its features topic and Redis keys).
NAMESPACE = "d3"


@dataclasses.dataclass(frozen=True)
class World:
    clients: Clients
    store: str
    home: Path
    sim: Simulated
    dataset: Dataset

    @property
    def topics(self) -> Topics:
        """The topics the A/B runs read: the live inputs and the world's feature job's outputs."""
        return self.clients.settings.topics.in_namespace(NAMESPACE)

    @property
    def params(self) -> FeatureParams:
        return FeatureParams(label_delay_ms=self.clients.settings.label_delay_ms)


def register(store: str, dataset: Dataset, params: FeatureParams) -> int:
    spec = ModelSpec("random_forest", max_depth=6, n_estimators=40)
    result = train_and_evaluate(dataset, [SplitPlan(dt.date(2018, 4, 20))], spec, feature_set("all", params))
    logged = log_training(store, result, {}, {}, True, default_artifact_location(store))
    assert logged.version is not None
    return logged.version


@pytest.fixture(scope="module")
def world(stack: StackInfo, small_frame: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> World:
    """The topics hold the world (labels known 3 days late) and the records of `fraud features run`; v1
    (shuffled labels) is the champion, v2 (the real labels) the challenger, both trained on the batch
    path's features at the same delay."""
    home = tmp_path_factory.mktemp("ab")
    clients = isolated_clients(stack, home, label_delay_days=LABEL_DELAY_DAYS)
    params = FeatureParams(label_delay_ms=clients.settings.label_delay_ms)
    sim = simulated(SMALL, clients.settings, params)
    produce_events(clients.producer(), clients.settings.topics, sim.events)
    dataset = file_dataset(small_frame, "simulator", params, MAX_EVENT_BYTES)
    store = f"sqlite:///{home / 'mlflow.db'}"
    world = World(clients, store, home, sim, dataset)
    fraud(
        world,
        *("features", "run", "--once", "--max-records", "20000", "--namespace", NAMESPACE),
        *("--checkpoint", str(home / "features-checkpoint")),
        topics=clients.settings.topics,
    )
    rows = dataset.rows
    shuffled = dataset.labels.assign(
        tx_id=np.random.default_rng(1).choice(rows["tx_id"].to_numpy(), len(dataset.labels), replace=False)
    )
    assert register(store, dataclasses.replace(dataset, labels=shuffled), params) == 1  # the champion
    assert register(store, dataset, params) == 2
    registry_client(store).set_registered_model_alias("fraud-detector", CHALLENGER, "2")
    return world


def fraud(
    world: World, *args: str, topics: Topics | None = None, code: int = 0
) -> subprocess.CompletedProcess[str]:
    settings = world.clients.settings
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}
    env |= {
        "FRAUD_HOME": str(world.home),
        "FRAUD_BOOTSTRAP_SERVERS": str(settings.bootstrap_servers),
        "FRAUD_REDIS_URL": str(settings.redis_url),
        "FRAUD_MLFLOW_TRACKING_URI": world.store,
        "FRAUD_PARTITIONS": str(settings.partitions),
        "FRAUD_LABEL_DELAY_DAYS": str(settings.label_delay_days),
        "COLUMNS": "200",
        **{
            f"FRAUD_TOPICS__{role.upper()}": name
            for role, name in (topics or world.topics).model_dump().items()
        },
    }
    result = subprocess.run(
        [FRAUD, *args],
        env=env,
        cwd=world.home,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert result.returncode == code, (
        f"fraud {' '.join(args)}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    )
    return result


def ab(world: World, *args: str, topics: Topics | None = None) -> dict[str, Any]:
    result = fraud(world, "ab", "run", "--from", RANGE[0], "--to", RANGE[1], "--json", *args, topics=topics)
    return dict(json.loads(result.stdout))


def numbers(document: dict[str, Any]) -> dict[str, Any]:
    """The comparison's figures, without what names the run."""
    return {
        k: v for k, v in document.items() if k not in ("run_id", "report", "decision", "reason", "promoted")
    }


def snapshot(world: World) -> tuple[Any, ...]:
    """What a replay must not touch: the live topics' records, the live Redis keys, the checkpoints."""
    client = redis.Redis.from_url(str(world.clients.settings.redis_url))
    keys = sorted(client.scan_iter(match=f"{redis_prefix(NAMESPACE)}*"))
    values = [client.dump(key) for key in keys]
    checkpoints = sorted(
        (str(path), path.stat().st_mtime_ns) for path in (world.home / "features-checkpoint").rglob("*")
    )
    return topic_counts(world.clients, world.topics.all()), keys, values, checkpoints


def scoring_run(spark: SparkSession, world: World, name: str, shadow: str | None) -> Topics:
    """The scoring job once over the world's features, writing its own outputs (``name``)."""
    outputs = world.topics.model_copy(
        update={
            role: f"{getattr(world.topics, role)}-{name}"
            for role in ("scores", "shadow_scores", "alerts", "dead_letter")
        }
    )
    create_project_topics(world.clients.admin(), world.clients.settings, outputs)
    config = ScoringJobConfig(
        kafka_config=world.clients.kafka_config(),
        topics=outputs,
        checkpoint=world.home / f"scoring-{name}",
        redis=RedisTarget(str(world.clients.settings.redis_url), f"{name}:", DEFAULT_RETENTION_S),
        tracking_uri=world.store,
        max_event_bytes=MAX_EVENT_BYTES,
        model_check_interval_s=DEFAULT_MODEL_CHECK_INTERVAL_S,
        max_records_per_trigger=20_000,
        shadow_alias=shadow,
    )
    query = start_scoring_job(spark, config, ONCE)
    try:
        assert query.awaitTermination(TIMEOUT_S), "the scoring job did not finish"
    finally:
        query.stop()
    assert query.exception() is None
    return outputs


def records(world: World, topic: str) -> dict[int, dict[str, Any]]:
    return {r["tx_id"]: r for r in (orjson.loads(m.value() or b"") for m in read_topic(world.clients, topic))}


def test_the_live_job_and_training_compute_the_features_at_the_label_delay_set(
    world: World, small_dataset: Dataset
) -> None:
    """`fraud features run` and `fraud train` (over the topics) take the label delay from the setting: the
    live records and the training set hold the batch path's features at 3 days, which differ from those at
    the default 7 (so a command that kept 7 would fail here)."""
    output = features_topic(world.clients, world.topics.features)
    assert_each_transaction_once(output, world.sim.transactions)
    live = output.by_tx()
    assert_same_as_batch(live, world.sim, world.params)
    default = small_dataset.rows.set_index("tx_id")["terminal_risk_7d"]
    at_delay = world.sim.reference["terminal_risk_7d"]
    assert (default.loc[at_delay.index] != at_delay).mean() > 0.2, "the delay changes the terminal risk"

    metrics = world.home / "train-metrics.json"
    fraud(
        world,
        *("train", "--train-start", "2018-04-20", "--train-days", "7", "--test-days", "7", "--no-register"),
        *(
            "--model",
            "random_forest",
            "--max-depth",
            "6",
            "--n-estimators",
            "40",
            "--metrics-out",
            str(metrics),
        ),
    )
    run = registry_client(world.store).get_run(json.loads(metrics.read_text())["run_id"])
    assert run.data.params["label_delay_ms"] == str(LABEL_DELAY_DAYS * DAY_MS)
    assert run.data.params["gap_days"] == str(LABEL_DELAY_DAYS), "the gap follows the label delay"
    trained, _ = topics_training_set(
        world.clients.settings, world.params, Periods(train_start="2018-04-20", gap_days=LABEL_DELAY_DAYS)
    )
    rows = trained.rows.set_index("tx_id")
    shared = rows.index.intersection(world.sim.reference.index)
    assert len(shared) > 10_000
    columns = list(world.params.feature_columns)
    assert np.allclose(
        rows.loc[shared, columns].to_numpy(np.float64),
        world.sim.reference.loc[shared, columns].to_numpy(np.float64),
        rtol=0,
        atol=1e-9,
    ), "the training set's features differ from the live job's"


def test_shadow_scores_every_transaction_raises_no_alert_and_changes_no_live_output(
    spark: SparkSession, world: World
) -> None:
    """The scoring job with --shadow challenger beside one without: the same scores and alerts; a shadow
    score of v2 for every transaction, never an alert of v2. Then `fraud ab run --shadow` reports on them."""
    plain = scoring_run(spark, world, "plain", None)
    shadowed = scoring_run(spark, world, "shadowed", CHALLENGER)

    def same(left: dict[int, dict[str, Any]], right: dict[int, dict[str, Any]]) -> None:
        """Equal but for the scoring time, and the last bits of a score: a random forest sums its trees'
        probabilities in threads, in whatever order they finish."""
        assert left.keys() == right.keys()
        for tx, record in left.items():
            other = right[tx]
            assert record["score"] == pytest.approx(other["score"], rel=1e-12, abs=1e-15)
            drop = ("scored_at_ms", "score")
            assert {k: v for k, v in record.items() if k not in drop} == {
                k: v for k, v in other.items() if k not in drop
            }

    scores = records(world, shadowed.scores)
    same(scores, records(world, plain.scores))
    same(records(world, shadowed.alerts), records(world, plain.alerts))
    shadow = records(world, shadowed.shadow_scores)
    assert shadow.keys() == scores.keys() and len(scores) > 10_000
    assert {r["model_version"] for r in shadow.values()} == {2}
    assert {r["model_version"] for r in records(world, shadowed.alerts).values()} == {1}

    report = ab(world, "--shadow", "--report", str(world.home / "shadow.html"), topics=shadowed)
    assert (report["champion_version"], report["challenger_version"]) == (1, 2)
    assert report["rows"] > 1_000


@pytest.fixture(scope="module")
def first(world: World) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """The A/B test of version 1 against 2 on the features topic, with a report; and the live pipeline's
    topics, Redis keys and checkpoints before it."""
    before = snapshot(world)
    report = str(world.home / "ab.html")
    return ab(
        world, "--champion", "1", "--challenger", "2", "--features", "topic", "--report", report
    ), before


@dataclasses.dataclass(frozen=True)
class Gate:
    """What the promotion gate did, step by step: the worse challenger refused, a promotion without
    evidence refused, the better one promoted, then a forced promotion back."""

    worse: dict[str, Any]
    champion_after_worse: int
    refused: subprocess.CompletedProcess[str]
    better: dict[str, Any]
    champion_after_better: int
    better_tags: dict[str, str]
    champion_after_force: int


@pytest.fixture(scope="module")
def gate(world: World, first: tuple[dict[str, Any], tuple[Any, ...]]) -> Gate:
    """The gate's runs, after the first A/B test. The worse challenger is judged on recomputed features (no
    Spark: where the features come from does not change the gate's logic, and the recompute test checks
    them equal); the better one by the alias and a models:/ reference, on the features topic, so that it
    is also the first run's reproduction."""
    worse = ab(
        world,
        *("--champion", "2", "--challenger", "1", "--features", "recompute"),
        *("--promote-if-better", "average_precision"),
    )
    champion_after_worse = resolve_version(world.store, CHAMPION)
    refused = fraud(world, "models", "promote", "1", code=2)
    better = ab(
        world,
        *("--champion", "champion", "--challenger", "models:/fraud-detector/2"),
        *("--promote-if-better", "average_precision"),
    )
    champion_after_better = resolve_version(world.store, CHAMPION)
    tags = dict(registry_client(world.store).get_model_version("fraud-detector", "2").tags)
    fraud(world, "models", "promote", "1", "--force")  # without evidence, on purpose
    return Gate(
        worse,
        champion_after_worse,
        refused,
        better,
        champion_after_better,
        tags,
        resolve_version(world.store, CHAMPION),
    )


def test_ab_ranks_the_models_reproducibly_and_leaves_the_live_pipeline_alone(
    world: World, first: tuple[dict[str, Any], tuple[Any, ...]], gate: Gate
) -> None:
    first, before = first
    assert numbers(first) == numbers(gate.better), "the same comparison twice gives the same numbers"
    assert snapshot(world) == before, "a replay touched live topics, Redis keys or checkpoints"
    for metric in ("roc_auc", "average_precision"):
        diff = first["differences"][metric]
        assert diff["diff"] > 0, diff
        assert diff["ci_days"]["low"] > 0 and diff["ci_cards"]["low"] > 0, (
            f"{metric}: an interval includes zero: {diff}"
        )


def test_features_recomputed_from_the_transactions_judge_the_same(
    world: World, first: tuple[dict[str, Any], tuple[Any, ...]]
) -> None:
    """The batch path of the feature definitions over the transactions topic gives the features the feature
    job wrote: the same transactions, frauds and figures as the replay of the features topic."""
    topic, _ = first
    recomputed = ab(world, "--champion", "1", "--challenger", "2", "--features", "recompute")
    assert (recomputed["rows"], recomputed["frauds"], recomputed["days"]) == (
        topic["rows"],
        topic["frauds"],
        topic["days"],
    )
    for metric, diff in topic["differences"].items():
        for side in ("a", "b", "diff"):
            assert recomputed["differences"][metric][side] == pytest.approx(
                diff[side], rel=1e-9, abs=1e-12
            ), (
                metric,
                side,
            )


def test_the_gate_promotes_only_the_better_model(gate: Gate) -> None:
    assert gate.worse["decision"] is False and gate.worse["promoted"] is False
    assert gate.champion_after_worse == 1
    assert "no A/B evidence that version 1 beats the champion" in gate.refused.stderr
    assert gate.better["decision"] is True and gate.better["promoted"] is True
    assert gate.champion_after_better == 2
    tags = gate.better_tags
    assert tags["fraud.ab.decision"] == "promote" and tags["fraud.ab.run_id"] == gate.better["run_id"]
    assert gate.champion_after_force == 1


def test_the_report_renders_its_plots_in_chromium(world: World, browser: WebDriver) -> None:
    report = world.home / "ab.html"
    assert report.exists(), "the ranking test writes the report"
    browser.get(report.as_uri())
    sizes = browser.execute_script(
        "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight]);"
    )
    assert len(sizes) == 4
    assert all(done and width > 100 and height > 100 for done, width, height in sizes), sizes
    assert "average_precision" in browser.page_source
