"""Every ``FRAUD_*`` name reaches its setting, and the connection sections (Kafka, Redis, Spark) built from the
flat settings turn into their clients' configurations."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import SecretStr

from contracts.settings import (
    KafkaConnection,
    RedisConnection,
    Settings,
    TopicRetention,
    Topics,
    known_env_names,
    load_settings,
)

CERT, KEY = "/pki/client.pem", "/pki/client.key"
#: A client certificate goes with its key (and, for Redis, TLS).
KAFKA_CERT = {"FRAUD_SSL_CERTIFICATE_LOCATION": CERT, "FRAUD_SSL_KEY_LOCATION": KEY}
REDIS_CERT = {"FRAUD_REDIS_CERT_FILE": CERT, "FRAUD_REDIS_KEY_FILE": KEY, "FRAUD_REDIS_TLS": "1"}

#: Each variable, a value of it, where the settings show it (a dotted path from ``Settings``: a connection
#: setting through its section) and what they show; with the variables a value needs beside it.
NAMES: list[tuple[str, str, str, object, dict[str, str]]] = [
    ("FRAUD_BOOTSTRAP_SERVERS", "kafka:9092", "bootstrap_servers", "kafka:9092", {}),
    ("FRAUD_SECURITY_PROTOCOL", "SASL_SSL", "kafka.security_protocol", "SASL_SSL", {}),
    ("FRAUD_SASL_MECHANISM", "SCRAM-SHA-512", "kafka.sasl_mechanism", "SCRAM-SHA-512", {}),
    ("FRAUD_SASL_USERNAME", "fraud", "kafka.sasl_username", "fraud", {}),
    ("FRAUD_SASL_PASSWORD", "hunter2-sasl", "kafka.sasl_password", "hunter2-sasl", {}),
    ("FRAUD_SSL_CA_LOCATION", "/pki/ca.pem", "kafka.ssl_ca_location", Path("/pki/ca.pem"), {}),
    ("FRAUD_SSL_CERTIFICATE_LOCATION", CERT, "kafka.ssl_certificate_location", Path(CERT), KAFKA_CERT),
    ("FRAUD_SSL_KEY_LOCATION", KEY, "kafka.ssl_key_location", Path(KEY), KAFKA_CERT),
    ("FRAUD_SSL_KEY_PASSWORD", "hunter2-key", "kafka.ssl_key_password", "hunter2-key", {}),
    ("FRAUD_REDIS_URL", "redis://cache:6379/1", "redis_url", "redis://cache:6379/1", {}),
    ("FRAUD_REDIS_USERNAME", "fraud", "redis.username", "fraud", {}),
    ("FRAUD_REDIS_PASSWORD", "hunter2-redis", "redis.password", "hunter2-redis", {}),
    ("FRAUD_REDIS_TLS", "true", "redis.tls", True, {}),
    ("FRAUD_REDIS_CA_FILE", "/pki/ca.pem", "redis.ca_file", Path("/pki/ca.pem"), {"FRAUD_REDIS_TLS": "1"}),
    ("FRAUD_REDIS_CERT_FILE", CERT, "redis.cert_file", Path(CERT), REDIS_CERT),
    ("FRAUD_REDIS_KEY_FILE", KEY, "redis.key_file", Path(KEY), REDIS_CERT),
    ("FRAUD_MLFLOW_TRACKING_URI", "http://mlflow:5000", "mlflow_tracking_uri", "http://mlflow:5000", {}),
    ("FRAUD_SPARK_MASTER", "spark://master:7077", "spark.master", "spark://master:7077", {}),
    ("FRAUD_SPARK_DRIVER_HOST", "pipeline", "spark.driver_host", "pipeline", {}),
    ("FRAUD_SPARK_SHUFFLE_PARTITIONS", "8", "spark.shuffle_partitions", 8, {}),
    ("FRAUD_SPARK_DRIVER_MEMORY", "6144m", "spark.driver_memory", "6144m", {}),
    ("FRAUD_SPARK_EXECUTOR_MEMORY", "3g", "spark.executor_memory", "3g", {}),
    ("FRAUD_SPARK_EXECUTOR_START_TIMEOUT_S", "900", "spark.executor_start_timeout_s", 900.0, {}),
    ("FRAUD_SPARK_UI_PORT", "4040", "spark.ui_port", 4040, {}),
    ("FRAUD_PARTITIONS", "12", "partitions", 12, {}),
    ("FRAUD_REPLICATION_FACTOR", "3", "replication_factor", 3, {}),
    ("FRAUD_TOPICS", '{"alerts": "fraud-alerts"}', "topics.alerts", "fraud-alerts", {}),
    ("FRAUD_RETENTION_MS", '{"alerts": 86400000}', "retention_ms.alerts", 86_400_000, {}),
    *[
        (f"FRAUD_TOPICS__{role.upper()}", f"x-{role}", f"topics.{role}", f"x-{role}", {})
        for role in Topics.model_fields
    ],
    *[
        (f"FRAUD_RETENTION_MS__{role.upper()}", "3600000", f"retention_ms.{role}", 3_600_000, {})
        for role in TopicRetention.model_fields
    ],
    ("FRAUD_HOME", "/var/lib/fraud", "home", Path("/var/lib/fraud"), {}),
    ("FRAUD_LABEL_DELAY_DAYS", "3.5", "label_delay_days", 3.5, {}),
    ("FRAUD_MAX_EVENT_BYTES", "4096", "max_event_bytes", 4096, {}),
    ("FRAUD_MAX_CLOCK_SKEW_S", "60", "max_clock_skew_s", 60.0, {}),
    ("FRAUD_TOKEN_KEY", "hunter2-token-key", "token_key", "hunter2-token-key", {}),
    ("FRAUD_CARD_BUCKETS", "12", "card_buckets", 12, {}),
    ("FRAUD_TERMINAL_BUCKETS", "10", "terminal_buckets", 10, {}),
    ("FRAUD_CARD_SLOTS", "1024", "card_slots", 1024, {}),
    ("FRAUD_TERMINAL_SLOTS", "512", "terminal_slots", 512, {}),
    ("FRAUD_PAGE_BYTES", "8192", "page_bytes", 8192, {}),
    ("FRAUD_ALERT_RETENTION_S", "3600", "alert_retention_s", 3600, {}),
    ("FRAUD_MODEL_CHECK_INTERVAL_S", "5", "model_check_interval_s", 5.0, {}),
    ("FRAUD_API_HOST", "10.0.0.5", "api_host", "10.0.0.5", {}),
    ("FRAUD_API_PORT", "8080", "api_port", 8080, {}),
    ("FRAUD_METRICS_PORT", "9400", "metrics_port", 9400, {}),
    ("FRAUD_METRICS_HOST", "0.0.0.0", "metrics_host", "0.0.0.0", {}),  # noqa: S104 - a value read back
    ("FRAUD_LOG_LEVEL", "debug", "log_level", "debug", {}),
    ("FRAUD_LOG_FORMAT", "json", "log_format", "json", {}),
    ("FRAUD_API_TOKEN", "hunter2-api-token", "api_token", "hunter2-api-token", {}),
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.upper().startswith("FRAUD_")]:
        monkeypatch.delenv(name)


def shown(settings: Settings, path: str) -> object:
    value: Any = settings
    for part in path.split("."):
        value = getattr(value, part)
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def test_the_table_names_every_setting() -> None:
    assert sorted(name for name, *_ in NAMES) == sorted(known_env_names())


@pytest.mark.parametrize(("name", "value", "path", "expected", "beside"), NAMES, ids=[n for n, *_ in NAMES])
def test_every_variable_reaches_its_setting(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    value: str,
    path: str,
    expected: object,
    beside: dict[str, str],
) -> None:
    for other, other_value in {name: value, **beside}.items():
        monkeypatch.setenv(other, other_value)
    settings = load_settings()
    assert shown(settings, path) == expected
    if "." in path and path.split(".")[0] in ("kafka", "redis", "spark"):  # the flat setting holds it too
        section, field = path.split(".")
        flat = getattr(settings, field if section == "kafka" else f"{section}_{field}")
        assert (flat.get_secret_value() if isinstance(flat, SecretStr) else flat) == expected


def test_the_defaults_give_the_client_configs_the_clients_had() -> None:
    settings = Settings()
    assert settings.kafka.client_config("127.0.0.1:9092") == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "PLAINTEXT",
    }
    assert settings.redis.client_kwargs() == {}
    assert settings.spark.conf() == {
        "spark.master": "local[2]",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "2g",
        "spark.executor.memory": "2g",
    }


def test_kafka_security_settings_become_librdkafka_options_under_its_names() -> None:
    settings = Settings(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="fraud",
        sasl_password="hunter2-sasl",  # noqa: S106 - the secret the test looks for
        ssl_ca_location=Path("/pki/ca.pem"),
        ssl_certificate_location=Path("/pki/client.pem"),
        ssl_key_location=Path("/pki/client.key"),
        ssl_key_password="hunter2-key",  # noqa: S106
    )
    assert settings.kafka.client_config("kafka:9093") == {
        "bootstrap.servers": "kafka:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "fraud",
        "sasl.password": "hunter2-sasl",
        "ssl.ca.location": "/pki/ca.pem",
        "ssl.certificate.location": "/pki/client.pem",
        "ssl.key.location": "/pki/client.key",
        "ssl.key.password": "hunter2-key",
    }
    assert "hunter2" not in repr(settings.kafka) + str(settings.kafka)


def test_redis_settings_become_redis_py_keyword_arguments() -> None:
    settings = Settings(
        redis_username="fraud",
        redis_password="hunter2-redis",  # noqa: S106 - the secret the test looks for
        redis_tls=True,
        redis_ca_file=Path("/pki/ca.pem"),
        redis_cert_file=Path("/pki/client.pem"),
        redis_key_file=Path("/pki/client.key"),
    )
    assert settings.redis.client_kwargs() == {
        "username": "fraud",
        "password": "hunter2-redis",
        "connection_class": redis.SSLConnection,
        "ssl_ca_certs": "/pki/ca.pem",
        "ssl_certfile": "/pki/client.pem",
        "ssl_keyfile": "/pki/client.key",
    }
    assert "hunter2" not in repr(settings.redis) + str(settings.redis)


def test_a_redis_connection_is_one_key_of_the_client_cache() -> None:
    """A process keeps one client per URL and connection: the same settings give equal, hashable sections."""
    one = Settings(redis_username="fraud", redis_password="hunter2-redis").redis  # noqa: S106
    assert one == Settings(redis_username="fraud", redis_password="hunter2-redis").redis  # noqa: S106
    assert hash(one) == hash(RedisConnection(username="fraud", password=SecretStr("hunter2-redis")))
    assert one != Settings(redis_username="fraud", redis_password="other-secret").redis  # noqa: S106


def test_spark_settings_become_spark_conf_entries() -> None:
    settings = Settings(
        spark_master="spark://master:7077",
        spark_driver_host="pipeline",
        spark_shuffle_partitions=8,
        spark_ui_port=4040,
        spark_executor_memory="3g",
    )
    conf = settings.spark.conf()
    assert (conf["spark.master"], conf["spark.sql.shuffle.partitions"]) == ("spark://master:7077", "8")
    assert (conf["spark.ui.enabled"], conf["spark.ui.port"]) == ("true", "4040")
    assert conf["spark.executor.memory"] == "3g"
    assert (conf["spark.driver.host"], conf["spark.driver.bindAddress"]) == ("pipeline", "0.0.0.0")  # noqa: S104


def test_a_section_follows_a_copy_of_the_settings() -> None:
    """A section is built from the settings it is asked of, never kept: an updated copy gives its own."""
    settings = Settings()
    local = settings.model_copy(update={"spark_master": "local[1]", "security_protocol": "SSL"})
    assert (settings.spark.master, local.spark.master) == ("local[2]", "local[1]")
    assert local.kafka == KafkaConnection(security_protocol="SSL")
