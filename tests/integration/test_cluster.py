"""The cluster path: a real Spark standalone master and worker (the pyspark wheel's spark-class, loopback
only) run the feature job and the scoring job over the embedded broker, Redis and an MLflow store, through
the `fraud` command as a user runs it. The feature job migrates: it starts in Spark's local mode on the
first part of the input, a savepoint is taken, and it goes on from the savepoint on the cluster when the
rest arrives. The features of both equal the batch path's, the scores and alerts the champion's own,
transaction by transaction. A job also says clearly when the executors lack what it needs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from contracts.records import AlertRecord, ScoreRecord
from contracts.settings import OUTPUT_ROLES, Settings, Topics
from features.definitions import FeatureParams
from infra.clients import Clients
from infra.kafka.admin import create_project_topics
from infra.kafka.log import read_topic
from infra.spark.cluster import SPARK_ENV, Cluster, standalone_cluster
from ingest.produce import produce_events
from tests.support.cli_stack import register_champion
from tests.support.feature_jobs import (
    TOLERANCE,
    assert_each_transaction_once,
    assert_same_as_batch,
    expected_results,
    features_topic,
    simulated,
)
from tests.support.samples import SMALL
from tests.support.scripts import FRAUD

pytestmark = pytest.mark.minutes(7)

JOB_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as running:
        yield running


def fraud(settings: Settings, home: Path, master: str, outputs: Topics, *args: str) -> None:
    """Run a `fraud` command with the test's services, ``master`` and the output topics ``outputs``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}
    env |= {
        **SPARK_ENV,
        "FRAUD_HOME": str(home),
        "FRAUD_BOOTSTRAP_SERVERS": str(settings.bootstrap_servers),
        "FRAUD_REDIS_URL": str(settings.redis_url),
        "FRAUD_MLFLOW_TRACKING_URI": str(settings.mlflow_tracking_uri),
        "FRAUD_SPARK_MASTER": master,
        "FRAUD_PARTITIONS": str(settings.partitions),
        **{f"FRAUD_TOPICS__{role.upper()}": name for role, name in outputs.model_dump().items()},
    }
    result = subprocess.run(
        [FRAUD, *args], env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False
    )
    assert result.returncode == 0, (
        f"fraud {' '.join(args)} on {master}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    )


def test_jobs_migrated_to_a_standalone_cluster_equal_the_batch_path_and_the_model(
    cluster: Cluster, settings: Settings, small_frame: pd.DataFrame, tmp_path: Path
) -> None:
    clients = Clients.from_settings(settings)
    params = FeatureParams()
    sim = simulated(SMALL, settings, params)
    first, rest = sim.events.split_at(sorted(sim.events.tx_times)[len(sim.events.tx_times) * 6 // 10])
    produce_events(clients.producer(), settings.topics, first)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    settings = settings.model_copy(update={"mlflow_tracking_uri": store})  # a registry of this test only
    register_champion(Clients.from_settings(settings), small_frame, params, tmp_path / "artifacts")

    outputs = settings.topics.model_copy(
        update={role: f"{getattr(settings.topics, role)}-cluster" for role in OUTPUT_ROLES}
    )
    create_project_topics(clients.admin(), settings, outputs)
    local, home, savepoint = tmp_path / "local", tmp_path / "cluster", tmp_path / "savepoint"
    job = ("features", "run", "--once", "--max-records", "5000")
    fraud(settings, local, "local[2]", outputs, *job)
    fraud(settings, local, "local[2]", outputs, "savepoint", "create", "features", "--to", str(savepoint))
    produce_events(clients.producer(), settings.topics, rest)
    fraud(settings, home, cluster.master_url, outputs, *job, "--from-savepoint", str(savepoint))
    fraud(settings, home, cluster.master_url, outputs, "score", "run", "--once", "--max-records", "5000")

    features = features_topic(clients, outputs.features)
    assert_each_transaction_once(features, sim.transactions)
    assert_same_as_batch(features.by_tx(), sim, params)
    expected = expected_results(sim, store, params)
    scores = {
        record.tx_id: record.score
        for record in map(
            ScoreRecord.model_validate_json, (m.value() or b"" for m in read_topic(clients, outputs.scores))
        )
    }
    assert scores.keys() == set(sim.transactions)
    want = expected.scores.loc[list(scores)].to_numpy()
    assert np.allclose(list(scores.values()), want, rtol=0, atol=TOLERANCE), (
        "a score differs from the model's"
    )
    alerts = [AlertRecord.model_validate_json(m.value() or b"") for m in read_topic(clients, outputs.alerts)]
    flagged = set(expected.scores.index[expected.scores >= expected.threshold])
    assert flagged, "the model raised no alert: nothing to compare"
    assert sorted(alert.tx_id for alert in alerts) == sorted(flagged)


#: Run in a process of its own: a Spark session started here on the cluster would set the JVM of the
#: whole test session (its classpath is fixed at the first session), which the local-mode tests share.
EXECUTOR_CHECKS = """
import sys
from pathlib import Path
from contracts.errors import ConfigError
from contracts.settings import Settings
from fraud.jobs import SPARK_PRELOAD, job_spark_session
from infra.spark.session import check_executors

master, home = sys.argv[1], Path(sys.argv[2])
spark = job_spark_session(Settings(spark_master=master, home=home), "executor-check")
check_executors(spark, SPARK_PRELOAD, (home,))
print("all there")


def heap(_):
    # The executor's JVM is an ancestor of its Python workers: its -Xmx is the heap it got.
    import os

    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            arguments = cmdline.read().decode().split("\\0")
        if any(argument.endswith("/java") or argument == "java" for argument in arguments[:1]):
            return [argument for argument in arguments if argument.startswith("-Xmx")]
        with open(f"/proc/{pid}/stat") as stat:
            pid = int(stat.read().rsplit(")", 1)[1].split()[1])
    return ["no JVM"]


print(sorted(set(spark.sparkContext.parallelize(range(2), 2).mapPartitions(heap).collect())))
for modules, directories in (((*SPARK_PRELOAD, "no_such_stage"), ()), (SPARK_PRELOAD, (home / "nowhere",))):
    try:
        check_executors(spark, modules, directories)
    except ConfigError as exc:
        print(exc)
spark.stop()
# An executor bigger than the worker offers never starts: the check says so instead of waiting.
settings = Settings(
    spark_master=master, home=home, spark_executor_memory="64g", spark_executor_start_timeout_s=5
)
spark = job_spark_session(settings, "too-big")
try:
    check_executors(spark, SPARK_PRELOAD, (home,), settings.spark_executor_start_timeout_s)
except ConfigError as exc:
    print(exc)
spark.stop()
"""


def test_a_job_says_what_the_executors_lack(cluster: Cluster, tmp_path: Path) -> None:
    """Executors that cannot import the job's modules, do not see its checkpoint directory, or cannot start
    (more memory asked for than the worker offers): one clear message each (the same machine shares
    everything, so the lack is asked for on purpose). The executors get the heap the setting gives."""
    result = subprocess.run(
        [sys.executable, "-c", EXECUTOR_CHECKS, cluster.master_url, str(tmp_path)],
        env={**os.environ, **SPARK_ENV, "FRAUD_SPARK_EXECUTOR_MEMORY": "1536m"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines[0] == "all there"
    assert lines[1] == "['-Xmx1536M']", "the executors' heap is not FRAUD_SPARK_EXECUTOR_MEMORY"
    assert "cannot import no_such_stage (ModuleNotFoundError" in lines[2]
    assert "install the project, the same version" in lines[2]
    assert f"do not see {tmp_path / 'nowhere'}: checkpoints must be on storage" in lines[3]
    assert "no Spark executor at spark://" in lines[4] and "64g of memory" in lines[4], lines[4:]
    assert "within 5 s" in lines[4] and "FRAUD_SPARK_EXECUTOR_START_TIMEOUT_S" in lines[4], lines[4]
