"""The exactly-once Kafka sink (``fraud-kafka-sink``) on a real Apache Kafka broker and real Spark (local mode).

Input is a directory of JSON files read with ``maxFilesPerTrigger=1``: finite and replayable, one file per
micro-batch, hash-partitioned on ``id`` into 2 Spark partitions, so a re-run batch has the same rows per
partition. Outputs are counted with a read_committed consumer: every input id exactly once.

The chaos test's streaming job is ``tests/support/sink_chaos_job.py`` (``python -m
tests.support.sink_chaos_job ...`` from the project root), killed and restarted in a subprocess.
"""

from __future__ import annotations

import collections
import json
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from contracts.provenance import provenance_of
from contracts.settings import Settings
from infra.clients import Clients
from infra.kafka.connection import TRANSACTION_TIMEOUT_MS
from infra.kafka.log import read_topic
from infra.spark.kafka_sink import datasource, transactions
from infra.spark.kafka_sink.config import (
    MARKER_PARTITION,
    KafkaSinkConfig,
    SinkIdReusedError,
    checkpoint_sink_id,
)
from infra.spark.kafka_sink.datasource import (
    SINK_NAME,
    FraudKafkaStreamWriter,
    KafkaSinkCommit,
    register,
    sink_options,
)
from tests.support.chaos import Pause, held_back, kill_tree, logged_tasks, pause_args, pause_reports
from tests.support.sink_stream import PARTITIONS, sink_frame

pytestmark = pytest.mark.minutes(4.5)

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 150
#: The transaction timeout of the run left down (set through ``kafka_config``, as a user may): readers wait
#: this long, plus the broker's abort check (10 s), instead of the sink's 2 minutes.
HELD_TRANSACTION_TIMEOUT_MS = 20_000


# --- helpers -----------------------------------------------------------------------------------------


def write_inputs(directory: Path, files: int, rows_per_file: int) -> int:
    """``files`` JSON-lines files of consecutive ids (one micro-batch each); returns the row count."""
    directory.mkdir(parents=True, exist_ok=True)
    next_id = 0
    for number in range(files):
        lines = []
        for _ in range(rows_per_file):
            lines.append(json.dumps({"id": next_id, "payload": f"tx-{next_id:08d}-" + "x" * 40}))
            next_id += 1
        # Write then rename: the file source must never list a half-written file.
        partial = directory / f".part-{number:04d}.tmp"
        partial.write_text("\n".join(lines) + "\n")
        partial.rename(directory / f"part-{number:04d}.json")
    return next_id


def run_to_end(
    frame: DataFrame, options: dict[str, str], checkpoint: Path, name: str
) -> list[dict[str, Any]]:
    """Run the query with the availableNow trigger until the input is exhausted; its progress reports."""
    query = (
        frame.writeStream.format(SINK_NAME)
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .queryName(name)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(JOB_TIMEOUT_S)
    finally:
        query.stop()
    if query.exception() is not None:
        raise AssertionError(f"query {name} failed: {query.exception()}")
    return list(query.recentProgress)


def read_committed(clients: Clients, topic: str) -> list[Message]:
    """Every record of ``topic`` a read_committed consumer sees now, up to the last stable offset."""
    return list(read_topic(clients, topic))


def read_settled(clients: Clients, topic: str, timeout_s: float = 60.0) -> list[Message]:
    """``read_committed`` once no transaction holds records of ``topic`` back: a commit returns to the
    producer before the broker has written its markers, and only those move the last stable offset."""
    admin, deadline = clients.admin(), time.monotonic() + timeout_s
    while held := held_back(admin, [topic]):
        assert time.monotonic() < deadline, f"records held back after {timeout_s:.0f} s: {held}"
        time.sleep(0.05)
    return read_committed(clients, topic)


def id_counts(records: list[Message]) -> collections.Counter[int]:
    return collections.Counter(json.loads(record.value() or b"null")["id"] for record in records)


def assert_each_id_once(records: list[Message], expected: int) -> None:
    counts = id_counts(records)
    duplicated = {record_id: n for record_id, n in counts.items() if n > 1}
    missing = sorted(set(range(expected)) - set(counts))
    assert not duplicated, f"duplicated ids (id: times): {dict(list(duplicated.items())[:10])}"
    assert not missing, f"{len(missing)} ids missing, e.g. {missing[:10]}"
    assert len(records) == expected


def markers(clients: Clients, sink_id: str, marker_topic: str, partitions: int = PARTITIONS) -> list[int]:
    """The committed marker offset of each write partition's group (-1001 = none)."""
    found = []
    for partition in range(partitions):
        consumer: Consumer = clients.consumer(group_id=f"{sink_id}-{partition}")
        try:
            (committed,) = consumer.committed([TopicPartition(marker_topic, MARKER_PARTITION)], timeout=10)
            found.append(committed.offset)
        finally:
            consumer.close()
    return found


def arrow_rows(ids: range) -> list[pa.RecordBatch]:
    return [
        pa.record_batch(
            {
                "key": pa.array([str(i).encode() for i in ids], pa.binary()),
                "value": pa.array([json.dumps({"id": i}).encode() for i in ids], pa.binary()),
            }
        )
    ]


@pytest.fixture(scope="module", autouse=True)
def registered(spark: SparkSession) -> None:
    register(spark)


@pytest.fixture
def writer(clients: Clients, settings: Settings) -> Iterator[FraudKafkaStreamWriter]:
    """A stream writer used directly, outside Spark, as one Python worker would."""
    config = KafkaSinkConfig(
        clients.kafka_config(), f"direct-{uuid.uuid4().hex[:8]}", topic=settings.topics.alerts
    )
    yield FraudKafkaStreamWriter(config)
    transactions.close_cached_writers()


# --- streaming queries in this process ----------------------------------------------------------------


def test_streaming_query_writes_every_row_once(
    spark: SparkSession, clients: Clients, settings: Settings, tmp_path: Path
) -> None:
    """Three micro-batches routed to two topics by the ``topic`` column: each row once, fields intact."""
    expected = write_inputs(tmp_path / "in", files=3, rows_per_file=200)
    topics = (settings.topics.alerts, settings.topics.scores)
    sink_id = f"q-{uuid.uuid4().hex[:8]}"
    options = sink_options(
        KafkaSinkConfig(clients.kafka_config(), sink_id, marker_topic=settings.topics.alerts)
    )

    progress = run_to_end(sink_frame(spark, tmp_path / "in", topics), options, tmp_path / "cp", sink_id)

    assert [p["batchId"] for p in progress if p["numInputRows"]] == [0, 1, 2]
    even, odd = (read_committed(clients, topic) for topic in topics)
    assert_each_id_once(even + odd, expected)
    positions: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
    for topic, records in ((topics[0], even), (topics[1], odd)):
        for record in records:
            record_id = json.loads(record.value() or b"")["id"]
            assert record.topic() == topic
            assert record_id % 2 == (0 if topic == topics[0] else 1)
            assert record.key() == str(record_id).encode()
            assert record.timestamp()[1] == 1_700_000_000_000 + record_id
            # The row's own headers, then where it comes from (contracts.provenance).
            own, provenance = record.headers() or []
            assert own == ("source-id", str(record_id).encode())
            found = provenance_of([provenance])
            assert found is not None and found.writer.startswith(f"{sink_id}-"), provenance
            positions[(found.writer, found.batch)].append(found.seq)
    for seqs in positions.values():  # a write task's records are numbered 0, 1, ... across topics
        assert sorted(seqs) == list(range(len(seqs)))
    assert markers(clients, sink_id, settings.topics.alerts) == [3, 3]  # last batch 2, + 1


def test_rerun_of_a_written_batch_writes_nothing_again(
    spark: SparkSession, clients: Clients, settings: Settings, tmp_path: Path
) -> None:
    """Deleting the last entry of the checkpoint's commit log makes Spark re-run that micro-batch (as after
    a crash between the Kafka commit and Spark's): its tasks find their markers and write nothing."""
    expected = write_inputs(tmp_path / "in", files=2, rows_per_file=150)
    checkpoint = tmp_path / "cp"
    sink_id = checkpoint_sink_id(checkpoint, "alerts")
    options = sink_options(KafkaSinkConfig(clients.kafka_config(), sink_id, topic=settings.topics.alerts))
    run_to_end(sink_frame(spark, tmp_path / "in"), options, checkpoint, sink_id)
    assert len(read_settled(clients, settings.topics.alerts)) == expected

    for name in ("1", ".1.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    assert checkpoint_sink_id(checkpoint, "alerts") == sink_id
    progress = run_to_end(sink_frame(spark, tmp_path / "in"), options, checkpoint, sink_id)

    assert [(p["batchId"], p["numInputRows"]) for p in progress if p["numInputRows"]] == [(1, 150)]
    assert_each_id_once(read_settled(clients, settings.topics.alerts), expected)
    assert markers(clients, sink_id, settings.topics.alerts) == [2, 2]


def test_batch_write_puts_each_task_in_one_transaction(
    spark: SparkSession, clients: Clients, settings: Settings
) -> None:
    """``frame.write`` (a backfill) through the same sink: rows land once; overwrite is refused."""
    rows = spark.range(0, 500, numPartitions=3).select(
        F.col("id").cast("string").cast("binary").alias("key"),
        F.to_json(F.struct("id")).cast("binary").alias("value"),
    )
    config = KafkaSinkConfig(
        clients.kafka_config(), f"b-{uuid.uuid4().hex[:8]}", topic=settings.topics.scores
    )
    options = sink_options(config)
    rows.write.format(SINK_NAME).options(**options).mode("append").save()
    assert_each_id_once(read_settled(clients, settings.topics.scores), 500)
    with pytest.raises(Exception, match="overwrite mode is not possible"):
        rows.write.format(SINK_NAME).options(**options).mode("overwrite").save()


# --- the writer used directly, as Python workers do ---------------------------------------------------


def test_same_batch_and_partition_written_twice_is_written_once(
    writer: FraudKafkaStreamWriter, clients: Clients, settings: Settings
) -> None:
    """A second write of (batch 0, partition 0), e.g. a task retry after its Kafka commit, is a no-op."""
    first = writer.write_partition(iter(arrow_rows(range(100))), batch_id=0, partition_id=0)
    again = writer.write_partition(iter(arrow_rows(range(100))), batch_id=0, partition_id=0)
    later = writer.write_partition(iter(arrow_rows(range(100, 150))), batch_id=1, partition_id=0)
    empty = writer.write_partition(iter([]), batch_id=2, partition_id=0)

    assert (first.status, first.rows) == ("written", 100)
    assert (again.status, again.rows) == ("already-written", 100)
    assert (later.status, later.rows) == ("written", 50)
    assert empty == KafkaSinkCommit(writer.config.sink_id, 2, 0, 0, "empty")
    assert_each_id_once(read_settled(clients, settings.topics.alerts), 150)
    assert markers(clients, writer.config.sink_id, settings.topics.alerts, partitions=1) == [2]


def test_partition_moving_between_workers_keeps_exactly_once(
    writer: FraudKafkaStreamWriter, clients: Clients, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Spark runs partition 0 on whichever Python worker is free. Worker A caches a producer; worker B
    writes the next batch (fencing A); A's next batch must take the transactional id back, not fail.
    Then B starts a producer (fencing A) without writing: A finds out at its marker, before any row."""
    writer.write_partition(iter(arrow_rows(range(0, 10))), batch_id=0, partition_id=0)
    (key,) = [key for key in transactions._WRITERS if key[1] == writer.config.transactional_id(0)]
    worker_a = transactions._WRITERS.pop(key)  # "worker B" starts with an empty cache
    writer.write_partition(iter(arrow_rows(range(10, 20))), batch_id=1, partition_id=0)
    worker_b = transactions._WRITERS[key]

    caplog.set_level(logging.INFO, logger=datasource.__name__)
    transactions._WRITERS[key] = worker_a  # batch 2 lands on worker A: the marker moved (1 -> 2)
    moved = writer.write_partition(iter(arrow_rows(range(20, 30))), batch_id=2, partition_id=0)
    assert moved.status == "written"
    assert "another worker wrote this partition since (marker 2, ours 1)" in caplog.text

    worker_b.start_producer()  # fences A; the marker does not move
    fenced = writer.write_partition(iter(arrow_rows(range(30, 40))), batch_id=3, partition_id=0)
    assert fenced.status == "written"
    assert "cached producer cannot begin (fenced by another worker" in caplog.text

    assert_each_id_once(read_settled(clients, settings.topics.alerts), 40)
    assert markers(clients, writer.config.sink_id, settings.topics.alerts, partitions=1) == [4]
    worker_b.close()


def test_marker_ahead_of_the_batch_fails_loudly(writer: FraudKafkaStreamWriter) -> None:
    """A new checkpoint with an old sink id starts at batch 0 again: skipping would lose its rows."""
    writer.write_partition(iter(arrow_rows(range(5))), batch_id=7, partition_id=0)
    with pytest.raises(SinkIdReusedError, match="another checkpoint"):
        writer.write_partition(iter(arrow_rows(range(5))), batch_id=0, partition_id=0)


def test_kafka_transaction_semantics_the_sink_relies_on(clients: Clients, settings: Settings) -> None:
    """What Apache Kafka does with transactions, checked on the embedded broker: a fenced producer fails when
    it sends offsets, before any record; offsets sent in an aborted or fenced transaction never apply; and a
    read_committed reader never sees the records of an aborted or fenced transaction."""
    from confluent_kafka import Producer

    topic, group = settings.topics.alerts, f"probe-{uuid.uuid4().hex[:8]}"
    group_consumer = clients.consumer(group_id=group)
    marker = TopicPartition(topic, 0)

    def producer() -> Producer:
        made = Producer({**clients.kafka_config(), "transactional.id": group})
        made.init_transactions(30)
        return made

    def committed() -> int:
        (result,) = group_consumer.committed([marker], timeout=10)
        return int(result.offset)

    first = producer()
    first.begin_transaction()
    first.produce(topic, b'{"id": 0}', partition=0)
    first.send_offsets_to_transaction(
        [TopicPartition(topic, 0, 1)], group_consumer.consumer_group_metadata(), 30
    )
    first.commit_transaction(30)
    assert committed() == 1

    first.begin_transaction()
    first.produce(topic, b'{"id": 1}', partition=0)
    first.send_offsets_to_transaction(
        [TopicPartition(topic, 0, 2)], group_consumer.consumer_group_metadata(), 30
    )
    first.flush(10)  # on the broker (an abort purges records still queued locally)
    first.abort_transaction(30)
    assert committed() == 1, "offsets of an aborted transaction must not apply"

    first.begin_transaction()
    first.produce(topic, b'{"id": 2}', partition=0)
    first.send_offsets_to_transaction(
        [TopicPartition(topic, 0, 3)], group_consumer.consumer_group_metadata(), 30
    )
    first.flush(10)
    second = producer()  # fences `first` and aborts its open transaction
    assert committed() == 1, "offsets of a fenced transaction must not apply"
    second.begin_transaction()
    with pytest.raises(KafkaException):
        first.send_offsets_to_transaction(
            [TopicPartition(topic, 0, 4)], group_consumer.consumer_group_metadata(), 10
        )
    second.abort_transaction(30)
    group_consumer.close()

    seen = sorted(json.loads(record.value() or b"")["id"] for record in read_committed(clients, topic))
    assert seen == [0], "read_committed readers saw records of an aborted or fenced transaction"


# --- chaos: SIGKILL the job in a subprocess, restart it from its checkpoint ----------------------------


class ChaosRun:
    """One run of the chaos job (``tests.support.sink_chaos_job``) in its own session."""

    def __init__(
        self,
        tmp_path: Path,
        clients: Clients,
        topic: str,
        sink_id: str,
        run: int,
        transaction_timeout_ms: int | None = None,
    ) -> None:
        self.control = tmp_path / f"control-{run}"
        self.control.mkdir()
        self.log = tmp_path / f"job-{run}.log"
        self.args = [
            sys.executable,
            "-m",
            "tests.support.sink_chaos_job",
            f"--bootstrap={clients.endpoints.bootstrap_servers}",
            f"--inputs={tmp_path / 'in'}",
            f"--checkpoint={tmp_path / 'cp'}",
            f"--topic={topic}",
            f"--sink-id={sink_id}",
            f"--control={self.control}",
            f"--home={tmp_path / 'home'}",
        ]
        if transaction_timeout_ms is not None:
            self.args.append(f"--transaction-timeout-ms={transaction_timeout_ms}")

    def start(self, pauses: list[Pause] | None = None) -> subprocess.Popen[bytes]:
        with self.log.open("wb") as log:
            return subprocess.Popen(
                self.args + pause_args(pauses or []),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=ROOT,
            )

    def kill_when_paused(self, job: subprocess.Popen[bytes], pauses: list[Pause]) -> None:
        """Wait until every task reached its pause point, then SIGKILL the whole application: the driver,
        its JVM, the PySpark daemon and the Python workers."""
        reports = pause_reports(self.control, pauses)
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not all(report.exists() for report in reports):
            if job.poll() is not None or time.monotonic() > deadline:
                job.kill()
                raise AssertionError(f"the job never reached {pauses}:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        kill_tree(job)


@pytest.mark.chaos
def test_sigkill_mid_stream_and_restart_gives_every_row_once(
    clients: Clients, settings: Settings, tmp_path: Path
) -> None:
    """SIGKILLs the streaming job (a subprocess) mid-stream, restarts it from its checkpoint: every row once.

    The kill comes in micro-batch 1 when task 0 has committed its Kafka transaction (rows and marker)
    and task 1 holds an open transaction with its marker sent but no row yet; Spark has not recorded the
    batch. The restart re-runs batch 1: task 0 finds its marker and writes nothing; task 1's
    init_transactions aborts the zombie transaction, whose marker therefore never applies, and writes.
    The restarted job then finishes the input (availableNow); a read_committed consumer sees every id once.
    """
    files, rows_per_file = 4, 100
    expected = write_inputs(tmp_path / "in", files, rows_per_file)
    topic, sink_id = settings.topics.alerts, f"chaos-{uuid.uuid4().hex[:8]}"
    checkpoint = tmp_path / "cp"
    kill_points: list[Pause] = [(1, 0, "committed"), (1, 1, "opened")]

    first = ChaosRun(tmp_path, clients, topic, sink_id, run=1)
    first.kill_when_paused(first.start(kill_points), kill_points)
    assert (checkpoint / "offsets" / "1").exists() and not (checkpoint / "commits" / "1").exists()
    # Batch 1's tasks never returned.
    assert sorted(logged_tasks(first.control)) == [(0, 0, "written"), (0, 1, "written")]

    second = ChaosRun(tmp_path, clients, topic, sink_id, run=2)
    job = second.start()
    assert job.wait(timeout=JOB_TIMEOUT_S) == 0, second.log.read_text()[-3000:]
    tasks = logged_tasks(second.control)
    assert sorted(t for t in tasks if t[0] == 1) == [(1, 0, "already-written"), (1, 1, "written")]
    assert {batch for batch, _, status in tasks if status == "written"} == set(range(1, files))

    assert_each_id_once(read_committed(clients, topic), expected)
    assert markers(clients, sink_id, topic) == [files, files]


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_a_writer_killed_inside_a_transaction_holds_readers_until_it_times_out_or_is_fenced(
    clients: Clients, settings: Settings, tmp_path: Path
) -> None:
    """SIGKILLs the job while its two write tasks of micro-batch 1 hold Kafka transactions open with their
    rows in the log, and leaves it down: read_committed readers stop at the last stable offset (they see
    batch 0's rows, none of batch 1's) until the broker aborts the transactions at the
    ``transaction.timeout.ms`` that run set (``HELD_TRANSACTION_TIMEOUT_MS``); then they go on, and never
    see the aborted rows. The job restarted, with the sink's own timeout, writes batch 1 again and is
    killed the same way in batch 2, task 0; started again at once, its new producer fences the dead one's
    transaction, and readers go on without waiting for that timeout. The last run finishes the input:
    every id once (lost 0, duplicated 0). Prints the timeouts and how long readers waited.
    """
    files, rows_per_file = 4, 100
    expected = write_inputs(tmp_path / "in", files, rows_per_file)
    topic, sink_id = settings.topics.alerts, f"held-{uuid.uuid4().hex[:8]}"
    admin = clients.admin()

    def killed_inside(run: int, kill_points: list[Pause], transaction_timeout_ms: int | None = None) -> float:
        """The job run until its tasks are inside their transactions at ``kill_points``, then killed; when."""
        job_run = ChaosRun(tmp_path, clients, topic, sink_id, run, transaction_timeout_ms)
        job_run.kill_when_paused(job_run.start(kill_points), kill_points)
        killed_at = time.monotonic()
        assert held_back(admin, [topic]), "the killed writers' transactions are not open"
        return killed_at

    def wait_released(since: float, timeout_s: float) -> float:
        """Seconds from ``since`` until no transaction holds readers of the topic back."""
        deadline = since + timeout_s
        while held_back(admin, [topic]):
            assert time.monotonic() < deadline, f"readers still held after {timeout_s:.0f} s"
            time.sleep(0.2)
        return time.monotonic() - since

    killed_at = killed_inside(1, [(1, 0, "produced"), (1, 1, "produced")], HELD_TRANSACTION_TIMEOUT_MS)
    ids = set(id_counts(read_committed(clients, topic)))
    assert ids == set(range(rows_per_file)), "readers got past the last stable offset"
    timed_out = wait_released(killed_at, HELD_TRANSACTION_TIMEOUT_MS / 1000 + 60)
    assert set(id_counts(read_committed(clients, topic))) == ids, "an aborted transaction's rows were read"

    killed_at = killed_inside(2, [(2, 0, "produced")])
    restart = ChaosRun(tmp_path, clients, topic, sink_id, run=3)
    restarted_at = time.monotonic()
    job = restart.start()
    fenced = wait_released(restarted_at, JOB_TIMEOUT_S)
    assert job.wait(timeout=JOB_TIMEOUT_S) == 0, restart.log.read_text()[-3000:]

    records = read_committed(clients, topic)
    counts = id_counts(records)
    lost = len(set(range(expected)) - set(counts))
    duplicated = sum(n - 1 for n in counts.values())
    print(
        f"transaction.timeout.ms {HELD_TRANSACTION_TIMEOUT_MS:,} (set): readers held {timed_out:.1f} s after "
        f"the kill until the broker aborted; the sink's {TRANSACTION_TIMEOUT_MS:,}: {fenced:.1f} s after a "
        f"restart until its producer fenced the dead one ({time.monotonic() - killed_at:.1f} s after that "
        f"kill, the restart's start-up included); {expected} rows: lost {lost}, duplicated {duplicated}"
    )
    assert timed_out < HELD_TRANSACTION_TIMEOUT_MS / 1000 + 30, "the timeout set in kafka_config was not used"
    assert fenced < TRANSACTION_TIMEOUT_MS / 1000, "the restart waited for the timeout instead of fencing"
    assert_each_id_once(records, expected)
