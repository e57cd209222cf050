"""Credentials never show: not in the reprs of the configs that carry them."""

from __future__ import annotations

from pydantic import SecretStr

from contracts.sections import RedisConnection
from features.job import CardTicks
from infra.redis.connection import RedisTarget
from infra.spark.frontier import FrontierConfig
from infra.spark.kafka_sink.config import KafkaSinkConfig
from infra.spark.kafka_source import KafkaInput

PASSWORD = "hunter2-kafka-secret"  # noqa: S105 - the secret the test looks for
KAFKA = {"bootstrap.servers": "kafka:9092", "sasl.username": "fraud", "sasl.password": PASSWORD}


def test_configs_carrying_credentials_do_not_show_them() -> None:
    shown = [
        repr(KafkaInput(KAFKA, ("transactions",))),
        repr(FrontierConfig(KAFKA, ("transactions",), "query", CardTicks(6))),
        repr(KafkaSinkConfig(KAFKA, "sink-1", topic="alerts")),
        repr(RedisTarget("redis://default:hunter2-redis-secret@cache:6379/0", "ab:", 60)),
        repr(
            RedisTarget(
                "rediss://cache:6380/0",
                "",
                60,
                RedisConnection(username="fraud", password=SecretStr("hunter2-redis-secret"), tls=True),
            )
        ),
    ]
    for text in shown:
        assert PASSWORD not in text and "hunter2-redis-secret" not in text, text
    assert "cache:6379" in shown[3] and "'ab:'" in shown[3]
    assert "username='fraud'" in shown[4] and "tls=True" in shown[4]
