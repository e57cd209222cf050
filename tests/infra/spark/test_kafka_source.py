"""The options Spark's Kafka connector gets from a job's input: where it starts, what it reads, how the Java
client logs in (translated from librdkafka's options)."""

import json
from pathlib import Path

import pytest

from contracts.errors import ConfigError
from infra.spark.kafka_source import KafkaInput, connector_options, java_client_options, offsets_json

KAFKA = {"bootstrap.servers": "127.0.0.1:9092"}


def test_a_stream_reads_committed_records_from_the_earliest_and_fails_on_a_history_gap() -> None:
    options = connector_options(KafkaInput(KAFKA, ("tx", "labels"), max_records_per_trigger=500))
    assert options["kafka.bootstrap.servers"] == "127.0.0.1:9092"
    assert options["subscribe"] == "tx,labels"
    assert options["kafka.isolation.level"] == "read_committed"
    assert options["failOnDataLoss"] == "true"
    assert options["startingOffsets"] == "earliest"
    assert options["maxOffsetsPerTrigger"] == "500"
    # A broker that does not answer is waited for minutes, not the Java client's one.
    assert (
        int(options["kafka.default.api.timeout.ms"]) == int(options["kafkaConsumer.pollTimeoutMs"]) >= 300_000
    )


def test_a_start_time_starts_each_partition_at_its_first_record_from_then_or_its_end() -> None:
    options = connector_options(KafkaInput(KAFKA, ("tx",), start_ms=1_522_540_800_000))
    assert options["startingTimestamp"] == "1522540800000"
    assert options["startingOffsetsByTimestampStrategy"] == "latest"
    assert "startingOffsets" not in options


def test_a_savepoints_offsets_win_over_a_start_time_and_unnamed_topics_start_at_their_first_record() -> None:
    source = KafkaInput(KAFKA, ("tx", "labels"), start_ms=5, starting_offsets={"tx/0": 12, "tx/1": 3})
    options = connector_options(source)
    assert json.loads(options["startingOffsets"]) == {"tx": {"0": 12, "1": 3}, "labels": {"0": -2}}
    assert "startingTimestamp" not in options
    assert json.loads(offsets_json({"a/b/0": 4}, ("a/b",))) == {"a/b": {"0": 4}}, "topic names with slashes"


def test_sasl_logins_become_a_jaas_line_and_pem_files_pem_stores(tmp_path: Path) -> None:
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    cert.write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\ny\n-----END PRIVATE KEY-----\n")
    options = java_client_options(
        {
            **KAFKA,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "fraud",
            "sasl.password": 'pa"ss',
            "ssl.ca.location": "/etc/ca.pem",
            "ssl.certificate.location": str(cert),
            "ssl.key.location": str(key),
            "ssl.key.password": "k",
        }
    )
    assert options["security.protocol"] == "SASL_SSL" and options["sasl.mechanism"] == "SCRAM-SHA-512"
    assert options["sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="fraud" password="pa\\"ss";'
    )
    assert options["ssl.truststore.type"] == "PEM" and options["ssl.truststore.location"] == "/etc/ca.pem"
    assert options["ssl.keystore.type"] == "PEM"
    assert "BEGIN CERTIFICATE" in options["ssl.keystore.certificate.chain"]
    assert "BEGIN PRIVATE KEY" in options["ssl.keystore.key"] and options["ssl.key.password"] == "k"
    plain = java_client_options(
        {**KAFKA, "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"}
    )
    assert plain["sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.PlainLoginModule")
    assert java_client_options(KAFKA) == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "PLAINTEXT",
    }


def test_the_credentials_never_show_in_a_repr() -> None:
    text = repr(KafkaInput({**KAFKA, "sasl.password": "hunter2"}, ("tx",)))
    assert "hunter2" not in text and "tx" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kafka_config": {}}, "bootstrap.servers"),
        ({"topics": ()}, "at least one topic"),
        ({"topics": ("",)}, "no empty name"),
        ({"max_records_per_trigger": 0}, "max_records_per_trigger must be at least 1"),
    ],
)
def test_bad_inputs_fail_with_a_clear_message(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        KafkaInput(**{"kafka_config": KAFKA, "topics": ("tx",), **kwargs})  # type: ignore[arg-type]
