"""The embedded stack as `fraud up` / `fraud down` run it: real binaries, real health checks."""

import socket
from pathlib import Path

import pytest
import redis

from infra.embedded import EmbeddedStack, StackError, StackInfo, pid_runs


def test_session_stack_serves_kafka_and_redis(stack: StackInfo) -> None:
    from confluent_kafka.admin import AdminClient

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
