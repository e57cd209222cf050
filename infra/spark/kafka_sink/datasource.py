"""Exactly-once Kafka sink for Spark Structured Streaming, as a Python data source (``fraud-kafka-sink``).

Spark's own Kafka sink is at-least-once (a re-run micro-batch writes its rows again; transactions per
micro-batch were proposed, SPARK-28908, and never merged), so Kafka output goes through PySpark 4's Python
Data Source API on confluent-kafka, with a Kafka transaction per write task. A job describes the sink once,
as a
:class:`~infra.spark.kafka_sink.config.KafkaSinkConfig`, and hands it over whole::

    config = KafkaSinkConfig(clients.kafka_config(), checkpoint_sink_id(checkpoint, "alerts"), topic="alerts")
    write_stream(frame, config).option("checkpointLocation", checkpoint).start()

The rows it writes are described in :mod:`infra.spark.kafka_sink.records` (plain Kafka record columns, or
packed record batches).

How it is exactly-once: write task ``p`` of micro-batch ``b`` writes all its rows in ONE Kafka
transaction of the transactional producer ``f"{sink_id}-{p}"``. Inside the same transaction, before
any row, it commits the offset ``b + 1`` for the consumer group ``f"{sink_id}-{p}"`` on partition 0 of
the marker topic (``send_offsets_to_transaction``): the marker and the rows become visible atomically,
or neither does. Before writing, the task reads that group's committed offset: ``b + 1`` means this
batch's rows are already in Kafka (Spark re-runs the last micro-batch after a crash that came between
the Kafka commit and its own checkpoint commit), so it writes nothing and reports success. A fresh
producer calls ``init_transactions`` first, which fences any zombie of an earlier attempt and aborts its
open transaction (marker included), so the marker it then reads is final. Producers are cached per
Python worker and reused across micro-batches; a cached producer whose partition another worker has
written since (the marker moved), or that the broker reports fenced, is replaced. A marker already past
the batch being written means the sink id belongs to another checkpoint: the task fails with
:class:`~infra.spark.kafka_sink.config.SinkIdReusedError` rather than skip rows.

Delivery guarantee:

* ``read_committed`` consumers on Apache Kafka see every row of every micro-batch exactly once, under
  task retries, worker loss and SIGKILL of the whole application at any point followed by a restart
  from the same checkpoint, provided the re-run batch has the same rows per Spark partition (true for
  Spark's replayable sources and deterministic plans). Row order within a partition is preserved per
  Kafka partition; a micro-batch's partitions become visible independently (one transaction each).
* ``read_uncommitted`` consumers see rows before their transaction commits, and also the rows of
  aborted attempts (a failed task, or a crash mid-transaction): at-least-once, duplicates possible.
* A writer killed inside an open transaction holds back ``read_committed`` readers of its partitions at
  the last stable offset until the broker aborts the transaction (``transaction.timeout.ms``,
  :data:`~infra.kafka.connection.TRANSACTION_TIMEOUT_MS`) or the restarted task's producer fences it, whichever
  comes first; then they go on, and never see its records.
* Provenance: each record of a micro-batch write carries the header ``fraud.provenance``
  (``{transactional id}/{batch}/{attempt}/{position}``, :mod:`contracts.provenance`): which write task,
  micro-batch and attempt wrote it.
* The marker is a consumer-group offset: Kafka expires the offsets of a group without members after
  ``offsets.retention.minutes`` (7 days by default). A query stopped in the crash window for longer
  than that rewrites its last micro-batch on restart.
* A batch write (``frame.write``) puts each task's rows in one transaction: a failed task attempt leaves
  nothing for ``read_committed`` consumers, but running the job again writes the rows again; unless it
  names its micro-batch (``KafkaSinkConfig.batch_id``, in ``foreachBatch``): then it is exactly-once as
  above.
"""

from __future__ import annotations

import functools
import gc
import itertools
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from contracts.provenance import header_prefix
from infra.kafka.outage import cut_off, is_outage, wait_for_kafka
from infra.spark.config import config_from, config_options
from infra.spark.internals import BATCH_ID_PROPERTY, task_batch_id
from infra.spark.kafka_sink.config import (
    KAFKA_CALL_TIMEOUT_S,
    MARKER_PARTITION,
    KafkaSinkConfig,
    SinkConfigError,
    SinkWriteError,
)
from infra.spark.kafka_sink.records import unpacked
from infra.spark.kafka_sink.schema import validate_schema
from infra.spark.kafka_sink.transactions import (
    TransactionalWriter,
    cached_writer,
    commit,
    is_fenced,
    marker_decision,
    produce,
)
from infra.spark.logs import mark_worker_logs
from infra.spark.timing import Timings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

_log = logging.getLogger(__name__)

#: The short name the data source is registered under: ``writeStream.format(SINK_NAME)``.
SINK_NAME = "fraud-kafka-sink"

# Imported by the Python processes Spark starts (and preloaded by its daemon): there, the project's
# warnings are marked for the driver to show (``infra.spark.logs``); elsewhere this does nothing.
mark_worker_logs()


TransactionEvent = Literal["opened", "produced", "committed"]
WriteStatus = Literal["written", "already-written", "empty"]


@dataclass(frozen=True)
class KafkaSinkCommit(WriterCommitMessage):
    """What one write task did, sent to the driver's ``commit``/``abort``."""

    sink_id: str
    batch_id: int | None
    partition_id: int
    rows: int
    status: WriteStatus


@functools.cache
def _freeze_imports() -> None:
    """Move what this process holds now, its imported modules above all, out of the garbage collector's
    sight (``gc.freeze``), once per process.

    Spark plans the sink's writer and commits its micro-batches in pooled Python workers of PySpark's
    stock daemon (not ``infra.spark.daemon``), which import pandas, PyArrow and the project after they
    fork, and the daemon runs a full collection after every task: 40-60 ms per planning and per commit,
    twice a micro-batch between the driver's steps.
    """
    gc.freeze()


def _peek(batches: Iterator[pa.RecordBatch]) -> pa.RecordBatch | None:
    """The first non-empty record batch, or None when the partition has no rows."""
    for batch in batches:
        if batch.num_rows:
            return batch
    return None


class _ArrowKafkaWriter:
    """The shared write path of the streaming and batch writers."""

    def __init__(self, config: KafkaSinkConfig) -> None:
        self.config = config

    def on_transaction_event(self, event: TransactionEvent, batch_id: int | None, partition_id: int) -> None:
        """Called after ``opened`` (transaction begun, marker sent, no row produced yet), ``produced`` (every row
        handed to the producer, the transaction not committed) and ``committed`` (Kafka commit done, Spark
        not told yet). Does nothing; chaos tests override it to kill the job there.
        """

    def write_partition(
        self, batches: Iterator[pa.RecordBatch], batch_id: int, partition_id: int
    ) -> KafkaSinkCommit:
        """Write the rows of micro-batch ``batch_id``, Spark partition ``partition_id``, exactly once.

        The rows are kept until they are in Kafka: a transaction that a Kafka outage cut off (its records or
        its commit timed out, and it was aborted) is written again once Kafka answers, from the marker
        check on, so a running job waits an outage out instead of failing the micro-batch."""
        timings = Timings("sink-write")
        batches = timings.timed("input", unpacked(batches))
        first = _peek(batches)
        if first is None:
            return self._message(batch_id, partition_id, 0, "empty")
        kept = [first, *batches]
        writer = cached_writer(self.config, self.config.transactional_id(partition_id))
        what = f"{SINK_NAME} {writer.transactional_id} batch {batch_id}"
        while True:
            with timings.phase("begin"):
                producer = wait_for_kafka(lambda: self._begin(writer, batch_id, what))
            if producer is None:
                drained = sum(batch.num_rows for batch in kept)
                _log.info("%s: already written (marker %d), skipping %d rows", what, batch_id + 1, drained)
                self.config.run_after_commit(kept)
                return self._message(batch_id, partition_id, drained, "already-written")
            self.on_transaction_event("opened", batch_id, partition_id)
            prefix = header_prefix(writer.transactional_id, batch_id, uuid.uuid4().hex[:8])
            try:
                with timings.phase("produce"):
                    rows = self._produce_all(producer, writer, first, iter(kept[1:]), what, prefix)
                self.on_transaction_event("produced", batch_id, partition_id)
                with timings.phase("commit"):
                    commit(producer, what)
                break
            except SinkWriteError as error:
                writer.discard_producer()
                if not cut_off(error.__cause__):
                    raise
                _log.info("%s: a Kafka outage cut the transaction off (%s); writing it again", what, error)
        writer.owned_marker = batch_id + 1
        self.on_transaction_event("committed", batch_id, partition_id)
        with timings.phase("after-commit"):
            self.config.run_after_commit(kept)
        timings.log()
        return self._message(batch_id, partition_id, rows, "written")

    def _begin(self, writer: TransactionalWriter, batch_id: int, what: str) -> Producer | None:
        """Own the transactional id, check the marker, begin the transaction and send the marker first.

        Returns None when the batch is already written. Sending the marker before any row makes a
        fenced producer fail while its transaction is still empty; a cached producer that fails here
        (fenced by another worker, or in a bad state) is replaced once.
        """
        for attempt in range(2):
            if writer.producer is None:
                committed = writer.open_producer()
            else:
                committed = writer.read_marker()
                if committed != writer.owned_marker and marker_decision(committed, batch_id) == "write":
                    _log.info(
                        "%s: another worker wrote this partition since (marker %d, ours %s), "
                        "taking the transactional id back",
                        what,
                        committed,
                        writer.owned_marker,
                    )
                    committed = writer.open_producer()
            if marker_decision(committed, batch_id) == "skip":
                return None
            producer = writer.producer
            if producer is None:  # pragma: no cover - open_producer sets it
                raise AssertionError("no producer after open_producer")
            try:
                producer.begin_transaction()
                marker = TopicPartition(writer.marker.topic, MARKER_PARTITION, batch_id + 1)
                producer.send_offsets_to_transaction(
                    [marker], writer.consumer.consumer_group_metadata(), KAFKA_CALL_TIMEOUT_S
                )
                return producer
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                writer.discard_producer()
                if is_outage(exc):  # waited out by the caller: a new producer once Kafka answers
                    raise
                if attempt:
                    raise SinkWriteError(f"{what}: cannot begin the Kafka transaction: {error}") from exc
                _log.info(
                    "%s: the cached producer cannot begin (%s: %s), taking the transactional id back "
                    "with a new producer",
                    what,
                    "fenced by another worker" if is_fenced(error) else "error",
                    error,
                )
        raise AssertionError("unreachable")

    def _produce_all(
        self,
        producer: Producer,
        writer: TransactionalWriter,
        first: pa.RecordBatch,
        rest: Iterator[pa.RecordBatch],
        what: str,
        provenance: str | None = None,
    ) -> int:
        """Produce the rows; with a ``provenance`` header prefix (micro-batch writes), each row gets its
        header (``contracts.provenance``)."""
        try:
            rows = 0
            for batch in itertools.chain((first,), rest):
                rows += produce(
                    producer, batch, self.config.topic, None if provenance is None else (provenance, rows)
                )
            return rows
        except BaseException as exc:
            writer.discard_producer()  # never reuse a producer whose transaction is in an unknown state
            if isinstance(exc, Exception):
                try:
                    producer.abort_transaction(KAFKA_CALL_TIMEOUT_S)
                except KafkaException:
                    _log.warning("%s: abort failed; the next owner of the transactional id aborts it", what)
            raise

    def _message(
        self, batch_id: int | None, partition_id: int, rows: int, status: WriteStatus
    ) -> KafkaSinkCommit:
        return KafkaSinkCommit(self.config.sink_id, batch_id, partition_id, rows, status)


def _task_context() -> tuple[int, int | None]:
    """(partition id, micro-batch id or None) of the running Spark task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError(f"{SINK_NAME} writers run inside Spark tasks only")
    return context.partitionId(), task_batch_id(context)


class FraudKafkaStreamWriter(_ArrowKafkaWriter, DataSourceStreamArrowWriter):
    """Streaming writer: one Kafka transaction with a commit marker per (micro-batch, partition)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KafkaSinkCommit:
        partition_id, batch_id = _task_context()
        if batch_id is None:
            raise RuntimeError(f"{SINK_NAME}: Spark did not set {BATCH_ID_PROPERTY!r} on this streaming task")
        return self.write_partition(iterator, batch_id, partition_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """All tasks succeeded; their transactions are committed already, so this only reports."""
        _freeze_imports()
        done = [m for m in messages if isinstance(m, KafkaSinkCommit)]
        written = sum(m.rows for m in done if m.status == "written")
        skipped = [m.partition_id for m in done if m.status == "already-written"]
        _log.info(
            "%s %s batch %d: %d rows written by %d tasks%s",
            SINK_NAME,
            self.config.sink_id,
            batchId,
            written,
            len(done),
            f"; partitions {skipped} were written before (re-run batch)" if skipped else "",
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Some task failed. Committed tasks stay committed (their markers make the re-run skip them);
        failed ones were aborted or are aborted by the next ``init_transactions``: nothing to undo."""
        done = [m for m in messages if isinstance(m, KafkaSinkCommit)]
        _log.warning(
            "%s %s batch %d failed: %d of %d tasks had committed; the re-run writes only the others",
            SINK_NAME,
            self.config.sink_id,
            batchId,
            len(done),
            len(messages),
        )


class FraudKafkaBatchWriter(_ArrowKafkaWriter, DataSourceArrowWriter):
    """Batch writer: each task's rows in one transaction.

    With option ``batch.id`` (a ``foreachBatch`` micro-batch), exactly the streaming writer's protocol:
    commit markers per task, a re-run of the micro-batch skips what is written. Without it, no markers:
    running the job again writes again.
    """

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KafkaSinkCommit:
        partition_id, _ = _task_context()
        if self.config.batch_id is not None:
            return self.write_partition(iterator, self.config.batch_id, partition_id)
        iterator = unpacked(iterator)
        first = _peek(iterator)
        if first is None:
            return self._message(None, partition_id, 0, "empty")
        transactional_id = f"{self.config.sink_id}-batch-{partition_id}"
        what = f"{SINK_NAME} {transactional_id}"
        writer = TransactionalWriter(self.config, transactional_id)  # fresh: fences earlier attempts
        try:
            producer = writer.start_producer()
            producer.begin_transaction()
            rows = self._produce_all(producer, writer, first, iterator, what)
            commit(producer, what)
        finally:
            writer.close()
        return self._message(None, partition_id, rows, "written")

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _freeze_imports()
        rows = sum(m.rows for m in messages if isinstance(m, KafkaSinkCommit))
        _log.info("%s %s: %d rows written", SINK_NAME, self.config.sink_id, rows)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _log.warning(
            "%s %s: batch write failed; committed tasks stay written", SINK_NAME, self.config.sink_id
        )


class FraudKafkaSink(DataSource):
    """``fraud-kafka-sink``: exactly-once Kafka output for Structured Streaming (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def _checked(self, schema: StructType) -> KafkaSinkConfig:
        _freeze_imports()
        config = config_from(self.options, KafkaSinkConfig)
        validate_schema(schema, config.topic)
        return config

    def streamWriter(self, schema: StructType, overwrite: bool) -> FraudKafkaStreamWriter:
        return FraudKafkaStreamWriter(self._checked(schema))

    def writer(self, schema: StructType, overwrite: bool) -> FraudKafkaBatchWriter:
        if overwrite:
            raise SinkConfigError(f"{SINK_NAME} appends to Kafka topics; overwrite mode is not possible")
        return FraudKafkaBatchWriter(self._checked(schema))


def register(spark: SparkSession) -> None:
    """Make ``format(SINK_NAME)`` available in ``spark`` (once per session, before the first write)."""
    spark.dataSource.register(FraudKafkaSink)


def sink_options(config: KafkaSinkConfig) -> dict[str, str]:
    """Options for ``.format(SINK_NAME).options(**...)``: the config, whole."""
    return config_options(config)


def write_stream(frame: DataFrame, config: KafkaSinkConfig) -> DataStreamWriter:
    """``frame.writeStream`` into the sink (registered in the session already), ready for its checkpoint."""
    return frame.writeStream.format(SINK_NAME).options(**sink_options(config))


def write_micro_batch(frame: DataFrame, config: KafkaSinkConfig, batch_id: int) -> None:
    """Write a ``foreachBatch`` micro-batch exactly once: the sink's commit markers under its batch id."""
    options = sink_options(replace(config, batch_id=batch_id))
    frame.write.format(SINK_NAME).options(**options).mode("append").save()
