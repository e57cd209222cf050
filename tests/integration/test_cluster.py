"""The cluster path: a real Spark standalone master and worker (the pyspark wheel's spark-class, loopback
only) run the feature job and the scoring job over the embedded broker, Redis and an MLflow store, through
the `fraud` command as a user runs it; their features and alerts equal a local-mode run on the same input,
record for record. A job also says clearly when the executors lack what it needs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from contracts.settings import Settings, Topics
from infra.clients import Clients, create_project_topics, read_topic
from ingest.files import clean_table
from ingest.produce import events_from_table, produce_events
from ingest.simulator import simulate
from tests.support.samples import LABEL_DELAY_MS, SMALL
from tests.support.scripts import FRAUD
from tests.support.spark_cluster import SPARK_ENV, Cluster, standalone_cluster

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


def values_by_tx(clients: Clients, topic: str) -> dict[int, dict[str, object]]:
    records = [orjson.loads(message.value() or b"") for message in read_topic(clients, topic)]
    by_tx = {record["tx_id"]: record for record in records}
    assert len(by_tx) == len(records), f"{topic}: a transaction appears twice"
    return by_tx


def test_jobs_on_a_standalone_cluster_equal_local_mode(
    cluster: Cluster, settings: Settings, tmp_path: Path
) -> None:
    clients = Clients.from_settings(settings)
    frame = simulate(SMALL)
    batch = events_from_table(
        clean_table(frame, "sim"), "sim", b"k", LABEL_DELAY_MS, settings.max_event_bytes
    )
    produce_events(clients.producer(), settings.topics, batch)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    settings = settings.model_copy(update={"mlflow_tracking_uri": store})  # a registry of this test only
    fraud(settings, tmp_path / "train", "local[2]", settings.topics, "train")  # the champion

    runs = {}
    for name, master in (("local", "local[2]"), ("cluster", cluster.master_url)):
        outputs = settings.topics.model_copy(
            update={
                role: f"{getattr(settings.topics, role)}-{name}"
                for role in ("features", "scores", "alerts", "dead_letter")
            }
        )
        create_project_topics(clients.admin(), settings, outputs)
        home = tmp_path / name
        fraud(settings, home, master, outputs, "features", "run", "--once", "--max-records", "5000")
        fraud(settings, home, master, outputs, "score", "run", "--once", "--max-records", "5000")
        runs[name] = (values_by_tx(clients, outputs.features), values_by_tx(clients, outputs.alerts))

    (local_features, local_alerts), (cluster_features, cluster_alerts) = runs["local"], runs["cluster"]
    assert len(local_features) == len(frame)
    assert cluster_features == local_features
    assert local_alerts, "the model raised no alert: nothing to compare"
    assert cluster_alerts.keys() == local_alerts.keys()
    for tx_id, alert in local_alerts.items():
        assert {k: v for k, v in cluster_alerts[tx_id].items() if k != "scored_at_ms"} == {
            k: v for k, v in alert.items() if k != "scored_at_ms"
        }


#: Run in a process of its own: a Spark session started here on the cluster would set the JVM of the
#: whole test session (its classpath is fixed at the first session), which the local-mode tests share.
EXECUTOR_CHECKS = """
import sys
from pathlib import Path
from contracts.errors import ConfigError
from contracts.settings import Settings
from fraud.jobs import SPARK_PRELOAD, job_spark_session
from infra.spark import check_executors

master, home = sys.argv[1], Path(sys.argv[2])
spark = job_spark_session(Settings(spark_master=master, home=home), "executor-check")
check_executors(spark, SPARK_PRELOAD, (home,))
print("all there")
for modules, directories in (((*SPARK_PRELOAD, "no_such_stage"), ()), (SPARK_PRELOAD, (home / "nowhere",))):
    try:
        check_executors(spark, modules, directories)
    except ConfigError as exc:
        print(exc)
spark.stop()
"""


def test_a_job_says_what_the_executors_lack(cluster: Cluster, tmp_path: Path) -> None:
    """Executors that cannot import the job's modules, or do not see its checkpoint directory: one clear
    message each (the same machine shares everything, so the lack is asked for on purpose)."""
    result = subprocess.run(
        [sys.executable, "-c", EXECUTOR_CHECKS, cluster.master_url, str(tmp_path)],
        env={**os.environ, **SPARK_ENV},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines[0] == "all there"
    assert "cannot import no_such_stage (ModuleNotFoundError" in lines[1]
    assert "install the project, the same version" in lines[1]
    assert f"do not see {tmp_path / 'nowhere'}: checkpoints must be on storage" in lines[2]
