"""The Kafka source against the real broker: exact ranges, admission control, time starts."""

import time
import uuid
from pathlib import Path

from confluent_kafka import Producer, TopicPartition
from infra.kafka_source import reader
from infra.kafka_source.config import LATEST, KafkaSourceConfig, at_time
from infra.kafka_source.datasource import read_batch, read_stream, source_options
from infra.kafka_source.offsets import NO_FRONTIER
from infra.kafka_source.planner import FIRST_BATCH_MAX_RECORDS, Tail, planner_consumer
from infra.kafka_source.splits import Split
from pyspark.sql import SparkSession

from contracts.settings import Settings
from infra.clients import Clients
from infra.kafka_log import read_topic
from infra.metrics import records_read
from infra.spark_config import CONFIG_OPTION

T0 = 1_522_540_800_000


def produce(clients: Clients, topic: str, n: int) -> None:
    producer = clients.producer()
    for i in range(n):
        producer.produce(topic, key=str(i % 7).encode(), value=f"v{i}".encode(), timestamp=T0 + i * 1000)
    assert producer.flush(30) == 0


def batch_read(
    spark: SparkSession, clients: Clients, topic: str, start: str = "earliest", end: str = LATEST
) -> list[tuple[int, int, bytes]]:
    config = KafkaSourceConfig(clients.kafka_config(), (topic,), starting_offsets=start, ending_offsets=end)
    frame = read_batch(spark, config)
    return [(r.partition, r.offset, bytes(r.value)) for r in frame.collect()]


def test_batch_range_reads_are_exact_and_repeatable(
    spark: SparkSession, settings: Settings, clients: Clients
) -> None:
    topic = settings.topics.transactions
    produce(clients, topic, 500)
    first = batch_read(spark, clients, topic)
    second = batch_read(spark, clients, topic)
    assert first == second
    on_topic = sorted((m.partition(), m.offset(), m.value()) for m in read_topic(clients, topic))
    assert sorted(first) == on_topic
    assert len(first) == 500


def test_time_bounds_select_the_records_of_the_range(
    spark: SparkSession, settings: Settings, clients: Clients
) -> None:
    topic = settings.topics.transactions
    produce(clients, topic, 300)
    start, end = T0 + 100_000, T0 + 200_000  # records 100..199
    rows = batch_read(spark, clients, topic, at_time(start), at_time(end))
    assert sorted(int(value[1:]) for _, _, value in rows) == list(range(100, 200))


def test_admission_control_and_available_now(
    spark: SparkSession, settings: Settings, clients: Clients, tmp_path: Path
) -> None:
    topic = settings.topics.transactions
    produce(clients, topic, 1_000)
    stream = read_stream(
        spark, KafkaSourceConfig(clients.kafka_config(), (topic,), max_records_per_trigger=300)
    )
    query = (
        stream.writeStream.format("memory")
        .queryName("admission_test")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    sizes = [records_read(p) for p in query.recentProgress if records_read(p)]
    assert sum(sizes) == 1_000
    assert max(sizes) <= 300 and len(sizes) >= 4
    values = [r.value for r in spark.sql("select value from admission_test").collect()]
    assert sorted(int(bytes(v)[1:]) for v in values) == list(range(1_000))


def test_a_runs_first_micro_batch_is_small_and_the_next_take_the_whole_limit(
    spark: SparkSession, settings: Settings, clients: Clients, tmp_path: Path
) -> None:
    topic = settings.topics.transactions
    total, limit = FIRST_BATCH_MAX_RECORDS + 15_000, FIRST_BATCH_MAX_RECORDS + 10_000
    produce(clients, topic, total)
    stream = read_stream(
        spark, KafkaSourceConfig(clients.kafka_config(), (topic,), max_records_per_trigger=limit)
    )
    query = (
        stream.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    sizes = [records_read(p) for p in query.recentProgress if records_read(p)]
    assert sum(sizes) == total
    assert len(sizes) == 2 and sizes[0] <= FIRST_BATCH_MAX_RECORDS < sizes[1] <= limit, sizes


def test_a_range_ending_at_a_commit_marker_completes_after_the_consumer_read_ahead(
    settings: Settings, clients: Clients
) -> None:
    """The executor's consumer is cached between ranges and may reach the log end (its one end-of-partition
    event) while reading a range that stops earlier; a next range ending after the final commit marker must
    still complete: the marker's offset is never delivered, only the consumer's position passes it."""
    topic = settings.topics.features
    producer = Producer({**clients.kafka_config(), "transactional.id": f"marker-test-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(50):
        producer.produce(topic, value=f"v{i}".encode(), partition=0, timestamp=T0 + i)
    producer.commit_transaction(30)
    consumer = clients.consumer(group_id=f"marker-test-{uuid.uuid4().hex[:8]}")
    end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
    end = max(end, max(m.offset() for m in read_topic(clients, topic) if m.partition() == 0) + 2)
    consumer.close()
    config = clients.kafka_config()

    try:
        first = [b for b in reader._read_range(config, Split(topic, 0, 0, 20, NO_FRONTIER, heartbeat=False))]
        time.sleep(1)  # the cached consumer fetches ahead to the log end meanwhile
        rest = [b for b in reader._read_range(config, Split(topic, 0, 20, end, NO_FRONTIER, heartbeat=False))]
    finally:
        while reader._CONSUMERS:  # the executors' cache, here in the test process
            _, (cached, *_) = reader._CONSUMERS.popitem()
            cached.close()

    values = [v for batch in first + rest for v in batch.column("value").to_pylist()]
    assert values == [f"v{i}".encode() for i in range(50)]


def test_the_planner_reads_on_without_seeking_and_knows_ends_past_markers(
    settings: Settings, clients: Clients
) -> None:
    """The driver's tail consumer: ends (past a transaction's commit marker), the timestamps the frontier
    needs, records arriving after the end, and a planned position behind what it kept (a restart)."""
    topic = settings.topics.transactions
    name = f"{topic}/0"
    producer = clients.producer()
    for i in range(100):
        producer.produce(topic, value=f"v{i}".encode(), partition=0, timestamp=T0 + i)
    assert producer.flush(30) == 0
    transactional = Producer({**clients.kafka_config(), "transactional.id": f"tail-{uuid.uuid4().hex[:8]}"})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    for i in range(100, 105):
        transactional.produce(topic, value=f"v{i}".encode(), partition=0, timestamp=T0 + i)
    transactional.commit_transaction(30)

    tail = Tail(planner_consumer(clients.kafka_config()))
    try:
        tail.follow({name: 0})
        tail.drain(30.0, None, None)
        assert tail.at_end[name]
        assert tail.end[name] == 106, "5 committed records and their marker follow the first 100"
        assert tail.stamp_before(name, 50) == T0 + 49
        assert tail.stamp_before(name, tail.end[name]) == T0 + 104

        tail.follow({name: 50})
        assert tail.stamp_before(name, 50) is None, "nothing below the planned position is kept"
        for i in range(105, 115):
            producer.produce(topic, value=f"v{i}".encode(), partition=0, timestamp=T0 + i)
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 30
        while not (tail.end[name] == 116 and tail.at_end[name]) and time.monotonic() < deadline:
            tail.drain(1.0, None, None)
        assert (tail.end[name], tail.at_end[name]) == (116, True)
        assert tail.stamp_before(name, 116) == T0 + 114

        tail.follow({name: 20})  # behind what it kept: read again from there
        tail.drain(30.0, None, None)
        assert tail.stamp_before(name, 30) == T0 + 29
        assert tail.end[name] == 116
    finally:
        tail.consumer.close()


def test_the_source_configuration_is_redacted_in_query_plans(spark: SparkSession) -> None:
    """The one option that carries the Kafka settings (a SASL password among them) is shown redacted."""
    password = "hunter2-plan-secret"  # noqa: S105 - the secret the test looks for
    config = KafkaSourceConfig(
        {"bootstrap.servers": "127.0.0.1:9", "sasl.password": password}, ("transactions",)
    )
    encoded = source_options(config)[CONFIG_OPTION]
    frame = read_stream(spark, config)
    plans = frame._jdf.queryExecution().toString() + frame._jdf.queryExecution().logical().toString()
    assert password not in plans and encoded not in plans and encoded[:40] not in plans
