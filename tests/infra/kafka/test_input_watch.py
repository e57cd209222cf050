"""The input watch's probe: a job whose only calls to Kafka wait inside Spark's connector still says that
Kafka is away (librdkafka against a loopback port nothing listens on; no broker)."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from infra.kafka import connection, input_watch
from infra.kafka.input_watch import InputWatch


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_watch_says_kafka_is_away_and_closes_without_waiting_for_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(input_watch, "PROBE_EVERY_S", 0.1)
    monkeypatch.setattr(connection, "METADATA_TIMEOUT_S", 0.5)
    with caplog.at_level(logging.WARNING, logger="infra.retry"):
        watch = InputWatch({"bootstrap.servers": f"127.0.0.1:{closed_port()}"}, [], "fraud-observed.test")
        deadline = time.monotonic() + 10
        while not any("Kafka unreachable" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the watch never said Kafka was away"
            time.sleep(0.1)
        started = time.monotonic()
        watch.close()
    assert time.monotonic() - started < 5
    lines = [r.getMessage() for r in caplog.records if r.name == "infra.retry"]
    assert len(lines) == 1 and "fraud up" not in lines[0], lines
