"""The embedded stack as `fraud up` / `fraud down` run it: real binaries, real health checks."""

import socket
from pathlib import Path

import pytest
import redis
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from infra.clients import Clients
from infra.embedded.stack import EmbeddedStack, StackError, StackInfo, pid_runs
from infra.kafka.admin import ensure_topics
from infra.kafka.log import read_topic


def test_session_stack_serves_kafka_and_redis(stack: StackInfo) -> None:
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    assert admin.list_topics(timeout=10).brokers
    client = redis.Redis.from_url(stack.redis_url)
    client.set("probe", "yes")
    assert client.get("probe") == b"yes"
    assert stack.mlflow_tracking_uri.startswith("sqlite:///")


def test_up_status_down_stops_exactly_what_it_started(tmp_path: Path, stack: StackInfo) -> None:
    embedded = EmbeddedStack(tmp_path)
    info = embedded.start()
    try:
        assert embedded.running() == info
        assert info.broker.port != stack.broker.port
        with pytest.raises(StackError, match="already running"):
            embedded.start()
    finally:
        stopped = embedded.stop()
    assert sorted(stopped) == ["broker", "redis"]
    assert not pid_runs(info.broker.pid, info.broker.binary)
    assert not pid_runs(info.redis.pid, info.redis.binary)
    assert pid_runs(stack.broker.pid, stack.broker.binary), "the session stack must be untouched"
    assert embedded.running() is None
    assert embedded.stop() == []


def test_taken_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        with pytest.raises(StackError, match=f"port {port} on 127.0.0.1 is already in use"):
            EmbeddedStack(tmp_path).start(broker_port=port)
    assert EmbeddedStack(tmp_path).running() is None


def test_down_and_up_keeps_topics_records_and_redis_keys(tmp_path: Path) -> None:
    """`fraud up`, records produced (in a transaction too) and a Redis key set, `fraud down`, `fraud up` again
    on other ports: the topic, every record and the key are back (the broker's log directory and Valkey's
    append-only file live under the stack's home)."""
    embedded = EmbeddedStack(tmp_path)
    info = embedded.start()
    try:
        ensure_topics(AdminClient({"bootstrap.servers": info.bootstrap_servers}), ["kept"], 2, 1)
        producer = Producer({"bootstrap.servers": info.bootstrap_servers, "enable.idempotence": True})
        for i in range(500):
            producer.produce("kept", key=str(i % 7), value=f"record {i}")
        assert producer.flush(30) == 0
        transactional = Producer({"bootstrap.servers": info.bootstrap_servers, "transactional.id": "kept-tx"})
        transactional.init_transactions(30)
        transactional.begin_transaction()
        for i in range(100):
            transactional.produce("kept", value=f"committed {i}", partition=i % 2)
        transactional.commit_transaction(30)
        redis.Redis.from_url(info.redis_url).set("kept-key", "yes")
    finally:
        stopped = embedded.stop()
    assert sorted(stopped) == ["broker", "redis"]
    assert not pid_runs(info.broker.pid, info.broker.binary)

    again = embedded.start()
    try:
        values = [m.value() for m in read_topic(Clients.for_stack(again, tmp_path / "client"), "kept")]
        assert len(values) == 600 and values.count(b"committed 99") == 1
        assert redis.Redis.from_url(again.redis_url).get("kept-key") == b"yes"
    finally:
        embedded.stop()
