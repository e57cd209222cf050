"""Kafka keeps the history, and a reader never skips it: topics are created with retention configs from
the settings, shorter ones are reported, and a query whose history is gone fails naming the offsets."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka.admin import NewTopic
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from contracts.settings import Settings, TopicRetention
from infra.clients import Clients
from infra.kafka.admin import create_project_topics, delete_topics, topic_configs
from infra.kafka.log import HistoryGapError, consumed, log_bounds, read_topic
from infra.spark.kafka_source import KafkaInput, check_resume, read_stream

FRAUD = str(Path(sys.executable).parent / "fraud")
T0 = 1_522_540_800_000


def run_fraud(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}
    env |= {
        "FRAUD_HOME": str(settings.home),
        "FRAUD_BOOTSTRAP_SERVERS": settings.bootstrap_servers or "",
        "FRAUD_REDIS_URL": settings.redis_url or "",
        "FRAUD_MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri or "",
        "FRAUD_TOPICS__FEATURES": settings.topics.features,
        "FRAUD_RETENTION_MS__FEATURES": "86400000",
        "COLUMNS": "200",
    }
    for role, name in settings.topics.model_dump().items():
        env[f"FRAUD_TOPICS__{role.upper()}"] = name
    return subprocess.run([FRAUD, *args], env=env, capture_output=True, text=True, timeout=120, check=False)


def test_topics_are_created_keeping_history_and_shorter_retention_is_reported(settings: Settings) -> None:
    clients = Clients.from_settings(settings)
    admin = clients.admin()
    delete_topics(admin, settings.topics.all())  # the fixture made them; the command makes them again
    short = settings.topics.labels
    futures = admin.create_topics([NewTopic(short, 1, 1, config={"retention.ms": "604800000"})])
    futures[short].result()

    created = run_fraud(settings, "topics", "create")

    assert created.returncode == 0, created.stderr
    warnings = [line for line in created.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and short in warnings[0] and "retention.ms=604800000" in warnings[0]
    configs = topic_configs(admin, settings.topics.all())
    assert configs[settings.topics.transactions]["retention.ms"] == "-1"
    assert configs[settings.topics.transactions]["retention.bytes"] == "-1"
    assert configs[settings.topics.features]["retention.ms"] == "86400000"  # FRAUD_RETENTION_MS__FEATURES
    described = run_fraud(settings, "topics", "describe")
    assert described.returncode == 0, described.stderr
    assert "86400000" in described.stdout and "604800000" in described.stdout


def test_settings_give_each_topic_its_retention() -> None:
    settings = Settings(retention_ms=TopicRetention(scores=3_600_000))
    configs = settings.topic_configs()
    assert configs["scores"] == {"retention.ms": "3600000", "retention.bytes": "-1"}
    assert configs["transactions"] == {"retention.ms": "-1", "retention.bytes": "-1"}
    prefixed = settings.topic_configs(settings.topics.with_prefix("ab-"))
    assert set(prefixed) == {f"ab-{name}" for name in settings.topics.all()}


def test_a_query_whose_history_is_gone_is_refused_naming_the_offsets(
    spark: SparkSession, settings: Settings, tmp_path: Path
) -> None:
    """100 records read into a checkpoint, then their topic deleted and re-created with 10; and 100 records
    of another topic read, then the first 80 deleted (as retention does): the job's check before it resumes
    says which topic, partition and offsets in one line, and Spark's connector refuses to skip them too."""
    clients = Clients.from_settings(settings)
    recreated, trimmed = settings.topics.transactions, settings.topics.labels

    def produce(topic: str, n: int) -> None:
        producer = clients.producer()
        for i in range(n):
            producer.produce(topic, value=f"v{i}".encode(), partition=0, timestamp=T0 + i)
        assert producer.flush(30) == 0

    def query(topic: str) -> StreamingQuery:
        stream = read_stream(spark, KafkaInput(clients.kafka_config(), (topic,)))
        return (
            stream.writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / topic))
            .trigger(availableNow=True)
            .start()
        )

    for topic in (recreated, trimmed):
        produce(topic, 100)
        assert query(topic).awaitTermination(120), "the query did not stop"
    delete_topics(clients.admin(), [recreated])
    create_project_topics(clients.admin(), settings)
    produce(recreated, 10)
    produce(trimmed, 50)
    admin = clients.admin()  # kept: its futures fail once it is collected
    for future in admin.delete_records([TopicPartition(trimmed, 0, 130)]).values():
        future.result(30)

    with pytest.raises(HistoryGapError) as gone:
        check_resume(clients.kafka_config(), tmp_path / recreated)
    assert str(gone.value) == (
        f"topic {recreated!r} partition 0: this query continues at offset 100, but the log ends at 10: the "
        "topic was deleted and re-created; start over with a new checkpoint"
    )
    with pytest.raises(HistoryGapError) as trimmed_away:
        check_resume(clients.kafka_config(), tmp_path / trimmed)
    assert str(trimmed_away.value) == (
        f"topic {trimmed!r} partition 0: this query continues at offset 100, but the log now starts at 130: "
        "records 100..129 were deleted (check the topic's retention: `fraud topics describe`); replay into a "
        "new checkpoint to go on"
    )
    for topic in (recreated, trimmed):
        with pytest.raises(StreamingQueryException, match="Some data may have been lost"):
            query(topic).awaitTermination(120)


def test_the_log_end_counts_the_markers_a_reader_passes_while_a_transaction_is_open(
    settings: Settings,
) -> None:
    """A committed transaction's marker ends the partition, and the next transaction is still open: a reader
    that read to the end stands past the marker, and the log's end must not be found short of it (a query
    restarted from that position would be refused as if the topic had been re-created)."""
    clients = Clients.from_settings(settings)
    topic = settings.topics.features
    producer = clients.producer(**{"transactional.id": "open-transaction-test"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(20):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"pending", partition=0)
    assert producer.flush(30) == 0
    try:
        last = list(read_topic(clients, topic))[-1]
        assert last.offset() == 19 and last.value() == b"v19"
        position = consumer_position_at_end(clients, topic)
        assert position > 20  # past the commit marker

        assert log_bounds(clients.admin(), [(topic, 0)])[f"{topic}/0"] == (0, position)
    finally:
        producer.abort_transaction(30)


def consumer_position_at_end(clients: Clients, topic: str) -> int:
    """Where a read_committed reader of partition 0 stands when the broker says it reached the end."""
    consumer = clients.consumer(overrides={"enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for message, at_end in consumed(consumer, 1000, timeout=0.1):
                if at_end:
                    return message.offset() or 0
        raise AssertionError("no end of partition within 30 s")
    finally:
        consumer.close()


def test_consumed_turns_an_offset_outside_the_log_into_a_history_gap() -> None:
    """librdkafka's auto.offset.reset=error event: a HistoryGapError."""

    class Event:
        def error(self) -> KafkaError:
            return KafkaError(KafkaError._AUTO_OFFSET_RESET, "fetch offset 5 is out of range")

        def topic(self) -> str:
            return "transactions"

        def partition(self) -> int:
            return 2

        def offset(self) -> int:
            return 5

    class FakeConsumer:
        def consume(self, count: int, timeout: float) -> list[Event]:
            return [Event()]

    with pytest.raises(HistoryGapError, match="topic 'transactions' partition 2: offset 5 is no longer"):
        list(consumed(FakeConsumer(), 10, 0.1))  # type: ignore[arg-type]
