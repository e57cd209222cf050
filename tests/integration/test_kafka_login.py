"""Kafka refusing the login (SASL) is a setting to correct, not an outage: a command stops at its first
metadata request with one line naming the settings to check, exit 3, where librdkafka would try again
until the timeout and the command would say that Kafka did not answer.

Against a real Apache Kafka broker whose listener requires a SCRAM login and knows no user: every login is
refused.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.settings import Settings
from infra.clients import Clients, Endpoints
from infra.embedded.stack import BROKER_HEAP, HOST, START_TIMEOUT_S, EmbeddedStack, broker_answers, free_port
from infra.kafka.connection import METADATA_TIMEOUT_S, KafkaAccessError, cluster_metadata
from tests.support.scripts import run_fraud

PASSWORD = f"sasl-{uuid.uuid4().hex}"
SASL = {
    "security_protocol": "SASL_PLAINTEXT",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_username": "nobody",
    "sasl_password": PASSWORD,
}


@pytest.fixture(scope="module")
def locked_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker whose clients' listener requires a SASL (SCRAM) login, with no user: its bootstrap servers.
    Its own listener for itself stays plain."""
    home = tmp_path_factory.mktemp("locked-broker")
    inner, outer = free_port(), free_port()
    more = {
        "listeners": f"PLAINTEXT://{HOST}:{inner},SASL_PLAINTEXT://{HOST}:{outer},CONTROLLER://{HOST}:{free_port()}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{inner},SASL_PLAINTEXT://{HOST}:{outer}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
    }
    embedded = EmbeddedStack(home)
    controller = int(more["listeners"].rpartition(":")[2])
    command = embedded.broker_command(inner, controller, more=more)
    log = (home / "broker.log").open("wb")
    broker = subprocess.Popen(
        command.run("kafka.Kafka", str(command.properties), heap=BROKER_HEAP),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not broker_answers(inner):
            assert broker.poll() is None and time.monotonic() < deadline, "the broker did not start"
            time.sleep(0.2)
        yield f"{HOST}:{outer}"
    finally:
        broker.terminate()
        broker.wait(30)
        log.close()


def test_a_refused_login_ends_the_metadata_request_at_once(locked_broker: str) -> None:
    settings = Settings(bootstrap_servers=locked_broker, **SASL)  # type: ignore[arg-type]
    clients = Clients(settings, Endpoints(locked_broker, "redis://127.0.0.1:9/0", "sqlite:///unused.db"))
    admin = clients.admin()
    started = time.monotonic()
    with pytest.raises(KafkaAccessError, match="refused the login") as refused:
        cluster_metadata(admin)
    assert time.monotonic() - started < METADATA_TIMEOUT_S / 2, "it waited for the timeout"
    assert "FRAUD_SASL_PASSWORD" in str(refused.value) and PASSWORD not in str(refused.value)
    assert refused.value.exit_code == 3


def test_a_command_with_a_refused_login_is_one_line_and_exit_3(locked_broker: str, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, bootstrap_servers=locked_broker, redis_url="redis://127.0.0.1:9/0")
    env = {f"FRAUD_{name.upper()}": value for name, value in SASL.items()}
    result = run_fraud(settings, "topics", "create", **env)
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("%")]
    assert result.returncode == 3, result.stderr[-3000:]
    assert len(lines) == 1 and "refused the login" in lines[0], result.stderr[-3000:]
    assert PASSWORD not in result.stdout + result.stderr
