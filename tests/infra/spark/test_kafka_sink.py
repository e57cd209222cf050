"""The sink's pure logic: its config, schema checks, marker decisions, row-to-record mapping (no broker, no Spark)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, StringType, StructType

from contracts.errors import ConfigError
from infra.kafka.connection import TRANSACTION_TIMEOUT_MS
from infra.spark.config import config_from
from infra.spark.kafka_sink import records, transactions
from infra.spark.kafka_sink.config import (
    AfterCommitAll,
    KafkaSinkConfig,
    SinkConfigError,
    SinkIdReusedError,
    SinkWriteError,
    checkpoint_sink_id,
)
from infra.spark.kafka_sink.datasource import sink_options
from infra.spark.kafka_sink.records import (
    HEADERS_ARROW_TYPE,
    RECORDS_COLUMN,
    kafka_headers,
    newest_per_key,
    pack_records,
)
from infra.spark.kafka_sink.schema import validate_schema
from infra.spark.kafka_sink.transactions import marker_decision

KAFKA = {"bootstrap.servers": "127.0.0.1:9092", "security.protocol": "PLAINTEXT"}
HEADERS = ArrayType(StructType().add("key", StringType()).add("value", BinaryType()))


def test_marker_topic_defaults_to_the_topic() -> None:
    config = KafkaSinkConfig(KAFKA, "alerts-sink", topic="alerts")
    assert config.markers == "alerts"
    explicit = KafkaSinkConfig(KAFKA, "alerts-sink", marker_topic="markers")
    assert (explicit.topic, explicit.markers) == (None, "markers")
    assert explicit.transactional_id(3) == "alerts-sink-3"


@dataclass(frozen=True)
class Collect:
    """An after-commit hook of a module-level class, as the jobs' are."""

    name: str

    def __call__(self, batches: list[pa.RecordBatch]) -> None:
        SEEN.append((self.name, sum(batch.num_rows for batch in batches)))


SEEN: list[tuple[str, int]] = []


def test_the_config_travels_whole_through_spark_options_hook_included() -> None:
    hook = AfterCommitAll((Collect("a"), Collect("b")))
    config = KafkaSinkConfig(KAFKA, "s", topic="t", after_commit=hook)
    options = sink_options(config)
    assert all(isinstance(value, str) for value in options.values())
    upper = {key.upper(): value for key, value in options.items()}  # Spark's option keys ignore case
    back = config_from(upper, KafkaSinkConfig)
    assert back == config
    SEEN.clear()
    back.run_after_commit([pa.record_batch({"value": pa.array([b"1", b"2"])})])
    assert SEEN == [("a", 2), ("b", 2)]
    with pytest.raises(ConfigError, match="missing"):
        config_from({}, KafkaSinkConfig)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kafka_config": {}, "sink_id": "s", "topic": "t"}, "bootstrap.servers"),
        ({"kafka_config": KAFKA, "sink_id": " ", "topic": "t"}, "sink_id"),
        ({"kafka_config": KAFKA, "sink_id": "s"}, "marker_topic or topic"),
        ({"kafka_config": KAFKA, "sink_id": "s", "topic": "t", "batch_id": -1}, "batch_id"),
        (
            {"kafka_config": {**KAFKA, "transactional.id": "x", "acks": "1"}, "sink_id": "s", "topic": "t"},
            "may not set acks, transactional.id",
        ),
    ],
)
def test_bad_configs_fail_with_a_clear_message(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(SinkConfigError, match=message):
        KafkaSinkConfig(**kwargs)


def test_producer_config_user_settings_win_except_the_owned_ones() -> None:
    config = KafkaSinkConfig({**KAFKA, "linger.ms": 5, "compression.type": "lz4"}, "s", topic="t")
    producer = config.producer_config("s-1")
    assert producer["linger.ms"] == 5
    assert producer["compression.type"] == "lz4"
    assert producer["transaction.timeout.ms"] == TRANSACTION_TIMEOUT_MS
    assert (producer["enable.idempotence"], producer["acks"], producer["transactional.id"]) == (
        True,
        "all",
        "s-1",
    )
    consumer = config.marker_consumer_config("s-1")
    assert (consumer["group.id"], consumer["enable.auto.commit"]) == ("s-1", False)
    assert consumer["isolation.level"] == "read_committed"


def test_full_schema_is_accepted() -> None:
    schema = (
        StructType()
        .add("topic", StringType())
        .add("key", BinaryType())
        .add("value", StringType())
        .add("timestamp_ms", LongType())
        .add("headers", HEADERS)
        .add("partition", IntegerType())
    )
    validate_schema(schema, default_topic=None)
    validate_schema(StructType().add("value", BinaryType(), nullable=False), default_topic="alerts")


def test_schema_problems_are_listed_together() -> None:
    schema = StructType().add("key", LongType()).add("timestamp", LongType()).add("headers", BinaryType())
    with pytest.raises(SinkConfigError) as caught:
        validate_schema(schema, default_topic=None)
    message = str(caught.value)
    for problem in (
        "unknown column 'timestamp'",
        "column 'key' is bigint, expected binary or string",
        "column 'headers' is binary, expected array<struct<key:string,value:binary>>",
        "column 'value' is required",
        "column 'topic' is required",
    ):
        assert problem in message


def test_packed_input_is_one_binary_records_column() -> None:
    validate_schema(StructType().add(RECORDS_COLUMN, BinaryType()), default_topic=None)
    for schema in (
        StructType().add(RECORDS_COLUMN, BinaryType()).add("key", BinaryType()),
        StructType().add(RECORDS_COLUMN, StringType()),
    ):
        with pytest.raises(SinkConfigError, match="packed input is a single binary column"):
            validate_schema(schema, default_topic=None)


def test_packed_records_unpack_into_their_rows_in_order() -> None:
    first = pa.record_batch(
        {
            "topic": pa.array(["a", "b"], pa.string()),
            "value": pa.array([b"1", b"2"], pa.binary()),
            "headers": pa.array([None, [{"key": "h", "value": b"x"}]], HEADERS_ARROW_TYPE),
        }
    )
    second = pa.record_batch({"value": pa.array([b"3"], pa.binary())})
    plain = pa.record_batch({"value": pa.array([b"4"], pa.binary())})
    packed = pa.record_batch(
        {RECORDS_COLUMN: pa.array([pack_records(first), None, pack_records(second)], pa.binary())}
    )

    rows = [row for batch in records.unpacked(iter([packed, plain])) for row in batch.to_pylist()]

    assert [row["value"] for row in rows] == [b"1", b"2", b"3", b"4"]
    assert rows[1]["headers"] == [{"key": "h", "value": b"x"}]


def test_a_packed_cell_with_unknown_columns_fails_the_write() -> None:
    bad = pa.record_batch({"value": pa.array([b"1"]), "colour": pa.array(["red"])})
    packed = pa.record_batch({RECORDS_COLUMN: pa.array([pack_records(bad)], pa.binary())})
    with pytest.raises(SinkWriteError, match="colour"):
        list(records.unpacked(iter([packed])))


def test_marker_decides_write_skip_or_reuse_error() -> None:
    assert marker_decision(-1, 0) == "write"  # no marker yet
    assert marker_decision(5, 5) == "write"  # batch 4 was the last one written
    assert marker_decision(6, 5) == "skip"  # batch 5 is in Kafka already: a re-run
    with pytest.raises(SinkIdReusedError, match="another checkpoint"):
        marker_decision(9, 5)


def test_headers_become_confluent_kafka_tuples() -> None:
    assert kafka_headers(None) is None
    assert kafka_headers([]) is None
    assert kafka_headers([{"key": "a", "value": b"1"}, {"key": "b", "value": None}]) == [
        ("a", b"1"),
        ("b", None),
    ]


def test_checkpoint_sink_id_lives_and_dies_with_the_checkpoint(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoints" / "scoring"
    first = checkpoint_sink_id(checkpoint, "alerts")
    assert first.startswith("alerts-")
    assert checkpoint_sink_id(checkpoint, "alerts") == first
    assert checkpoint_sink_id(checkpoint, "scores") != first
    (checkpoint / "fraud-sink-alerts.id").unlink()
    assert checkpoint_sink_id(checkpoint, "alerts") != first


class FakeProducer:
    """Records produce() calls; the first call raises BufferError like a full local queue."""

    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []
        self.polls = 0
        self.full_once = True

    def produce(self, topic: str, value: Any, key: Any, partition: int, timestamp: int, headers: Any) -> None:
        if self.full_once:
            self.full_once = False
            raise BufferError("queue full")
        self.records.append((topic, value, key, partition, timestamp, headers))

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0


def test_arrow_rows_map_to_kafka_records() -> None:
    header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    batch = pa.record_batch(
        {
            "topic": pa.array(["alerts", None], pa.string()),
            "key": pa.array([b"card-1", None], pa.binary()),
            "value": pa.array([b"{}", b"[]"], pa.binary()),
            "timestamp_ms": pa.array([1_700_000_000_000, None], pa.int64()),
            "headers": pa.array([[{"key": "v", "value": b"1"}], None], header_type),
            "partition": pa.array([None, 2], pa.int32()),
        }
    )
    producer = FakeProducer()
    assert transactions.produce(producer, batch, default_topic="fallback") == 2  # type: ignore[arg-type]
    assert producer.records == [
        ("alerts", b"{}", b"card-1", -1, 1_700_000_000_000, [("v", b"1")]),
        ("fallback", b"[]", None, 2, 0, None),
    ]
    assert producer.polls >= 2  # once for the full queue, once after the batch


def test_a_row_without_any_topic_fails_the_write() -> None:
    batch = pa.record_batch({"value": pa.array([b"x"], pa.binary())})
    producer = FakeProducer()
    producer.full_once = False
    with pytest.raises(SinkWriteError, match="no topic"):
        transactions.produce(producer, batch, default_topic=None)  # type: ignore[arg-type]


def test_newest_per_key_keeps_each_keys_newest_values_of_the_topic() -> None:
    def batch(rows: list[tuple[str | None, bytes | None, bytes | None, int]]) -> pa.RecordBatch:
        topic, key, value, at = zip(*rows, strict=True)
        return pa.RecordBatch.from_pydict(
            {
                "topic": pa.array(topic, pa.string()),
                "key": pa.array(key, pa.binary()),
                "value": pa.array(value, pa.binary()),
                "timestamp_ms": pa.array(at, pa.int64()),
            }
        )

    first = batch(
        [("f", b"a", b"a1", 1), ("f", b"b", b"b5", 5), ("dlq", b"a", b"x9", 9), ("f", b"a", None, 7)]
    )
    second = batch(
        [("f", b"a", b"a3", 3), ("f", b"b", b"b5'", 5), ("f", None, b"n2", 2), ("f", None, b"n1", 1)]
    )
    assert sorted(newest_per_key([first, second], "f")) == [b"a3", b"b5", b"b5'", b"n2"]
    assert newest_per_key([first], "other") == []
    assert newest_per_key([], "f") == []
