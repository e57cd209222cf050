"""A running job shows no secret: with a SASL password and an API token set, neither appears in what the
`fraud` command prints or logs (Spark's JVM and Python workers included), in the files it leaves under
FRAUD_HOME (checkpoints), in the streaming query's plans and progress reports, nor in the reprs of the
settings and the job's config.

The embedded broker speaks PLAINTEXT, and librdkafka takes ``sasl.password`` with PLAINTEXT (it applies
it only to SASL protocols), so FRAUD_SASL_PASSWORD is carried all the way as with a secured Kafka: in the
Kafka settings of the job's config, which travel to the Spark executors inside the data sources' one
option. The API token is a setting every command loads. Values are also looked for base64-encoded (Spark
options carry the config so), by decoding every base64 run found.
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from pathlib import Path

import orjson
import pytest
from pydantic import SecretStr
from pyspark.sql import SparkSession

from contracts.settings import Settings
from features.definitions import FeatureParams
from features.job import feature_stream
from features.state_layout import Start
from fraud.jobs import feature_job_config
from infra.clients import Clients
from infra.kafka.log import topic_counts
from tests.support.feature_jobs import finished_query
from tests.support.samples import GOOD as TX
from tests.support.scripts import run_fraud

pytestmark = pytest.mark.minutes(2.5)

SASL_PASSWORD = f"sasl-{uuid.uuid4().hex}"
API_TOKEN = f"api-{uuid.uuid4().hex}"
SECRETS = {"FRAUD_SASL_PASSWORD": SASL_PASSWORD, "FRAUD_API_TOKEN": API_TOKEN}
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{24,}={0,2}")


def revealed(text: str) -> str:
    """``text`` and what every base64 run in it decodes to (at each of the 4 alignments)."""
    decoded = [text]
    for run in _BASE64_RUN.findall(text):
        for start in range(4):
            body = run[start:].rstrip("=")
            body = body[: len(body) - len(body) % 4]
            try:
                decoded.append(base64.b64decode(body).decode("latin-1"))
            except (binascii.Error, ValueError):
                continue
    return "\n".join(decoded)


def assert_no_secret(where: str, text: str) -> None:
    shown = revealed(text)
    for secret in SECRETS.values():
        assert secret not in shown, f"{secret!r} shows in {where}"


def write_events(path: Path, count: int = 20) -> Path:
    lines = [
        orjson.dumps({**TX, "tx_id": tx_id, "event_time_ms": TX["event_time_ms"] + tx_id * 60_000})
        for tx_id in range(1, count + 1)
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_the_feature_command_prints_logs_and_stores_no_secret(
    settings: Settings, clients: Clients, tmp_path: Path
) -> None:
    """`fraud ingest`, then `fraud features run --once` as a user runs them, secrets set: their output,
    Spark's included, and every file under their FRAUD_HOME (checkpoints) hold neither secret."""
    home = settings.model_copy(update={"home": tmp_path / "home"})
    outputs = []
    for args in (("ingest", str(write_events(tmp_path / "events.jsonl"))), ("features", "run", "--once")):
        result = run_fraud(home, *args, **SECRETS)
        assert result.returncode == 0, result.stderr
        outputs.append((args, result))
    assert topic_counts(clients, [settings.topics.features])[settings.topics.features] == 20
    for args, result in outputs:
        assert_no_secret(f"the stdout of fraud {' '.join(args)}", result.stdout)
        assert_no_secret(f"the stderr of fraud {' '.join(args)}", result.stderr)
    stored = [path for path in (tmp_path / "home").rglob("*") if path.is_file()]
    assert any("checkpoints" in path.parts for path in stored)
    for path in stored:
        assert_no_secret(str(path), path.read_bytes().decode("latin-1"))


def test_the_feature_query_plans_progress_and_configs_show_no_secret(
    spark: SparkSession, settings: Settings, clients: Clients, tmp_path: Path
) -> None:
    """The job as `fraud features run` configures it, in this process's Spark: its query's plans
    (explain, extended), progress reports and status, and the reprs of the settings and the config."""
    secret_settings = settings.model_copy(
        update={"sasl_password": SecretStr(SASL_PASSWORD), "api_token": SecretStr(API_TOKEN)}
    )
    result = run_fraud(settings, "ingest", str(write_events(tmp_path / "events.jsonl")))
    assert result.returncode == 0, result.stderr
    config = feature_job_config(
        secret_settings,
        Clients.from_settings(secret_settings),
        topics=settings.topics,
        checkpoint=tmp_path / "checkpoint",
        params=FeatureParams(),
    )
    assert config.kafka_config["sasl.password"] == SASL_PASSWORD  # the secret is really carried
    query = finished_query(spark, config)
    assert topic_counts(clients, [settings.topics.features])[settings.topics.features] == 20
    frame = feature_stream(
        spark, config, Start()
    )  # the job's streaming DataFrame, as start_feature_job builds it
    shown = {
        "the job's plan": frame._jdf.queryExecution().toString(),
        "the job's logical plan": frame._jdf.queryExecution().logical().toString(),
        "the query's logical plan": query._jsq.streamingQuery().logicalPlan().toString(),
        "explain(extended)": query._jsq.explainInternal(True),
        "the last progress": str(query.lastProgress),
        "the progress reports": orjson.dumps([dict(p) for p in query.recentProgress], default=str).decode(),
        "the status": str(query.status),
        "repr(settings)": repr(secret_settings),
        "str(settings)": str(secret_settings),
        "repr(config)": repr(config),
        "repr(redis connection)": repr(secret_settings.redis),
        "repr(kafka connection)": repr(secret_settings.kafka),
    }
    for plan in (shown["the job's logical plan"], shown["explain(extended)"]):  # the job's plans
        assert "fraud-frontier" in plan, plan[:3000]
    for where, text in shown.items():
        assert_no_secret(where, text)
