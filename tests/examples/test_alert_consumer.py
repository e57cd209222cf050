"""The consumer-group example's client configuration: it logs in to Kafka as the project's clients do."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "alert_consumer.py"


class Stop(Exception):
    """Raised by the stand-in consumer once it has its configuration."""


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("alert_consumer_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_takes_the_settings_kafka_security(monkeypatch: pytest.MonkeyPatch) -> None:
    module = example()
    seen: dict[str, Any] = {}

    def consumer(config: dict[str, Any]) -> None:
        seen.update(config)
        raise Stop

    monkeypatch.setattr(module, "Consumer", consumer)
    monkeypatch.setenv("FRAUD_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("FRAUD_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("FRAUD_SASL_USERNAME", "reactor")
    monkeypatch.setenv("FRAUD_SASL_PASSWORD", "s3cret")
    monkeypatch.setattr(
        sys, "argv", ["alert_consumer.py", "--bootstrap-servers", "broker:9093", "--group", "g"]
    )
    with pytest.raises(Stop):
        module.main()
    assert seen["bootstrap.servers"] == "broker:9093" and seen["group.id"] == "g"
    assert seen["security.protocol"] == "SASL_SSL" and seen["sasl.mechanism"] == "SCRAM-SHA-512"
    assert seen["sasl.username"] == "reactor" and seen["sasl.password"] == "s3cret"
    assert seen["isolation.level"] == "read_committed" and seen["enable.auto.commit"] is False
