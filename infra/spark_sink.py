"""Exactly-once Kafka sink for Spark Structured Streaming, as a Python data source (``fraud-kafka-sink``).

Spark's JVM Kafka connector cannot be installed here (DESIGN.md), so Kafka output goes through PySpark 4's
Python Data Source API on confluent-kafka. Register the source once per session with :func:`register`,
then write a DataFrame with :func:`sink_options`::

    register(spark)
    (frame.writeStream.format(SINK_NAME)
        .options(**sink_options(clients.kafka_config(), sink_id, topic=topics.alerts))
        .option("checkpointLocation", checkpoint)
        .start())

Input rows (:data:`COLUMNS`): ``topic`` string (optional with the ``topic`` option, which is the default
for absent or null topics), ``key`` binary or string (nullable), ``value`` binary or string (nullable: a
tombstone), ``timestamp_ms`` long (nullable: Kafka record timestamp in UTC milliseconds, null = now),
``headers`` array<struct<key string, value binary>> (nullable; the shape of Spark's own Kafka sink),
``partition`` int (nullable: null = the producer's partitioner). Unknown columns are an error.
Instead of those, a stage that builds its records in Python can send many in one row: a single column
``records`` binary, each cell an Arrow IPC stream of rows with the columns above (:func:`pack_records`).
That keeps the cost of the trip through the JVM per packed row instead of per record.

Options (strings, as Spark passes them): ``kafka.config`` JSON object of librdkafka client settings
(connection and security, e.g. from ``Clients.kafka_config()``), ``sink.id`` a stable identifier of this
sink within its query (unique per checkpoint: see :func:`checkpoint_sink_id`), ``topic`` the default
topic, ``marker.topic`` the topic whose partition 0 carries the commit markers (defaults to ``topic``;
one of the two is required).

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
the batch being written means the ``sink.id`` belongs to another checkpoint: the task fails with
:class:`SinkIdReusedError` rather than skip rows.

Delivery guarantee:

* ``read_committed`` consumers on Apache Kafka see every row of every micro-batch exactly once, under
  task retries, worker loss and SIGKILL of the whole application at any point followed by a restart
  from the same checkpoint, provided the re-run batch has the same rows per Spark partition (true for
  Spark's replayable sources and deterministic plans). Row order within a partition is preserved per
  Kafka partition; a micro-batch's partitions become visible independently (one transaction each).
* ``read_uncommitted`` consumers see rows before their transaction commits, and also the rows of
  aborted attempts (a failed task, or a crash mid-transaction): at-least-once, duplicates possible.
* Tansu 0.6 (the embedded broker) commits and aborts transactions, holds the last stable offset while
  one is open, applies transactional offset commits only on commit and fences zombies, but its fetch
  responses never list aborted transactions: its ``read_committed`` consumers therefore also see the rows
  of aborted attempts once the abort is written. A clean run, and a re-run after a crash that came
  between transactions, are exactly-once there too; a crash or task failure mid-transaction is
  at-least-once on Tansu. Tansu also drops offset-commit metadata, so the marker is the offset alone.
  Its commits can stay half done when two transactions write one partition at once (the partition then
  holds back read_committed consumers for good), so on Tansu the write tasks of one host take turns per
  topic (:mod:`infra.txn_lock`): each reads its rows first, then produces and commits under the lock.
* The marker is a consumer-group offset: Kafka expires the offsets of a group without members after
  ``offsets.retention.minutes`` (7 days by default). A query stopped in the crash window for longer
  than that rewrites its last micro-batch on restart.
* A batch write (``frame.write``) puts each task's rows in one transaction: a failed task attempt leaves
  nothing for ``read_committed`` consumers, but running the job again writes the rows again; unless it
  names its micro-batch (option ``batch.id``, in ``foreachBatch``): then it is exactly-once as above.
"""

from __future__ import annotations

import functools
import gc
import importlib
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructType,
)

from contracts.errors import ConfigError, FraudError, StateError
from contracts.events import DeadLetter, to_record
from infra.txn_lock import needs_locks, topic_locks, topics_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_log = logging.getLogger(__name__)

#: The short name the data source is registered under: ``writeStream.format(SINK_NAME)``.
SINK_NAME = "fraud-kafka-sink"

OPTION_KAFKA_CONFIG = "kafka.config"
OPTION_SINK_ID = "sink.id"
OPTION_TOPIC = "topic"
OPTION_MARKER_TOPIC = "marker.topic"
#: Batch writes only (``foreachBatch``): the micro-batch id, which makes a batch write exactly-once like a
#: streaming one (commit markers per task), so a re-run of that micro-batch writes nothing twice.
OPTION_BATCH_ID = "batch.id"
#: ``module:function`` called as ``function(batches, options)`` with a streaming task's record batches once
#: they are in Kafka (committed now, or found committed by an earlier attempt): for idempotent side stores.
OPTION_AFTER_COMMIT = "after.commit"

#: The commit markers live on this partition of the marker topic (it exists in every topic).
MARKER_PARTITION = 0

#: Local property Spark's micro-batch execution sets on every task (also used by ``foreach``).
BATCH_ID_PROPERTY = "streaming.sql.batchId"

#: Tansu starves tailing consumers without some producer linger (DESIGN.md).
DEFAULT_LINGER_MS = 20
#: How long the broker keeps a transaction open before aborting it; a crashed writer that is not restarted
#: holds back read_committed consumers of its partitions this long. Override in ``kafka.config``.
DEFAULT_TRANSACTION_TIMEOUT_MS = 120_000
#: Writer processes take transactional ids over from each other often (Spark gives a partition's task to
#: whichever Python worker is idle), and each takeover is a new producer and consumer. librdkafka's sparse
#: connections hold the connection to a broker it has just learned of for about 50 ms; connecting to the
#: cluster's brokers at once brings init_transactions from 53 ms to 2 ms here. Override in ``kafka.config``.
EAGER_CONNECTIONS = {"enable.sparse.connections": False}
#: Upper bound on each blocking Kafka call (init, marker read, commit) before the task fails.
KAFKA_CALL_TIMEOUT_S = 60.0

#: Settings the sink owns: exactly-once needs them, so ``kafka.config`` may not change them.
_OWNED_PRODUCER_SETTINGS = ("transactional.id", "enable.idempotence", "acks", "isolation.level")

#: Type of the ``headers`` column (Spark's own Kafka sink uses the same shape), e.g. for ``F.lit(None).cast(...)``.
HEADERS_TYPE = ArrayType(StructType().add("key", StringType()).add("value", BinaryType()))
#: The same as an Arrow type, for packed records (:func:`pack_records`).
HEADERS_ARROW_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
#: Accepted input columns and their types.
COLUMNS: dict[str, tuple[DataType, ...]] = {
    "topic": (StringType(),),
    "key": (BinaryType(), StringType()),
    "value": (BinaryType(), StringType()),
    "timestamp_ms": (LongType(),),
    "headers": (HEADERS_TYPE,),
    "partition": (IntegerType(),),
}
#: The column of packed input: Arrow IPC streams of rows with :data:`COLUMNS` (see the module docstring).
RECORDS_COLUMN = "records"

TransactionEvent = Literal["opened", "committed"]
WriteStatus = Literal["written", "already-written", "empty"]


class SinkConfigError(ConfigError, ValueError):
    """The sink's options or the input schema are unusable."""


class SinkIdReusedError(StateError):
    """The commit marker is ahead of the batch being written: ``sink.id`` belongs to another checkpoint."""


class SinkWriteError(FraudError):
    """A Kafka transaction could not be committed; its rows were not written (the task fails)."""


@dataclass(frozen=True)
class SinkOptions:
    """The parsed data source options."""

    kafka_config: dict[str, Any]
    sink_id: str
    topic: str | None
    marker_topic: str
    after_commit: str | None = None
    batch_id: int | None = None
    #: All options as given (the ``after.commit`` hook reads its own from them).
    raw: Mapping[str, str] | None = field(default=None, compare=False)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Validate the options Spark passes (keys are case-insensitive there, values strings).

        Raises:
            SinkConfigError: a required option is missing or malformed.
        """
        lowered = {key.lower(): value for key, value in options.items()}
        raw_config = lowered.get(OPTION_KAFKA_CONFIG)
        if not raw_config:
            raise SinkConfigError(
                f"option {OPTION_KAFKA_CONFIG!r} (JSON object of librdkafka settings) is required"
            )
        try:
            kafka_config = json.loads(raw_config)
        except json.JSONDecodeError as exc:
            raise SinkConfigError(f"option {OPTION_KAFKA_CONFIG!r} is not valid JSON: {exc}") from exc
        if not isinstance(kafka_config, dict) or "bootstrap.servers" not in kafka_config:
            raise SinkConfigError(
                f"option {OPTION_KAFKA_CONFIG!r} must be a JSON object with bootstrap.servers"
            )
        owned = sorted(key for key in kafka_config if key in _OWNED_PRODUCER_SETTINGS)
        if owned:
            raise SinkConfigError(
                f"{OPTION_KAFKA_CONFIG!r} may not set {', '.join(owned)}: the sink owns them"
            )
        sink_id = (lowered.get(OPTION_SINK_ID) or "").strip()
        if not sink_id:
            raise SinkConfigError(
                f"option {OPTION_SINK_ID!r} (stable id of this sink in its query) is required"
            )
        topic = lowered.get(OPTION_TOPIC) or None
        marker_topic = lowered.get(OPTION_MARKER_TOPIC) or topic
        if marker_topic is None:
            raise SinkConfigError(
                f"set option {OPTION_MARKER_TOPIC!r} or {OPTION_TOPIC!r}: partition {MARKER_PARTITION} of that "
                "existing topic carries the sink's commit markers"
            )
        batch_id = lowered.get(OPTION_BATCH_ID)
        if batch_id is not None and not batch_id.isdigit():
            raise SinkConfigError(f"option {OPTION_BATCH_ID!r} must be a micro-batch id (an integer >= 0)")
        return cls(
            kafka_config=kafka_config,
            sink_id=sink_id,
            topic=topic,
            marker_topic=marker_topic,
            after_commit=lowered.get(OPTION_AFTER_COMMIT) or None,
            batch_id=None if batch_id is None else int(batch_id),
            raw=lowered,
        )

    def run_after_commit(self, batches: list[pa.RecordBatch]) -> None:
        """Call the ``after.commit`` hook, if any, with rows that are in Kafka."""
        if self.after_commit is None or not batches:
            return
        module, _, name = self.after_commit.partition(":")
        hook = getattr(importlib.import_module(module), name)
        hook(batches, dict(self.raw or {}))

    def transactional_id(self, partition_id: int) -> str:
        """Transactional id (and marker consumer group) of Spark partition ``partition_id``."""
        return f"{self.sink_id}-{partition_id}"

    def producer_config(self, transactional_id: str) -> dict[str, Any]:
        """Transactional, idempotent producer settings: defaults, then ``kafka.config``, then owned ones."""
        return {
            "linger.ms": DEFAULT_LINGER_MS,
            "transaction.timeout.ms": DEFAULT_TRANSACTION_TIMEOUT_MS,
            **EAGER_CONNECTIONS,
            **self.kafka_config,
            # Only failures need a report; commit_transaction fails if any record of the transaction did.
            "delivery.report.only.error": True,
            "enable.idempotence": True,
            "acks": "all",
            "transactional.id": transactional_id,
        }

    def marker_consumer_config(self, group_id: str) -> dict[str, Any]:
        """Settings of the consumer that only reads the group's committed marker."""
        return {
            **EAGER_CONNECTIONS,
            **self.kafka_config,
            "group.id": group_id,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }


class SinkRows:
    """Sink records (:data:`COLUMNS` but ``partition``) built row by row, for the few rows built that way."""

    NAMES = ("topic", "key", "value", "timestamp_ms", "headers")

    def __init__(self) -> None:
        self.columns: tuple[list[Any], ...] = ([], [], [], [], [])

    def add(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None,
        headers: list[tuple[str, str | bytes | None]] | None,
    ) -> None:
        pairs = None if headers is None else [{"key": k, "value": v} for k, v in headers]
        for column, cell in zip(self.columns, (topic, key, value, timestamp_ms, pairs), strict=True):
            column.append(cell)

    def add_dead_letter(self, letter: DeadLetter, topic: str) -> None:
        """The dead-letter record of ``letter`` (original bytes, ``dlq.*`` headers)."""
        value, headers = to_record(letter)
        self.add(topic, None, value, None, headers)

    def batch(self) -> pa.RecordBatch | None:
        """The rows added so far; None when there are none."""
        if not self.columns[0]:
            return None
        types = (pa.string(), pa.binary(), pa.binary(), pa.int64(), HEADERS_ARROW_TYPE)
        return pa.RecordBatch.from_arrays(
            [pa.array(column, kind) for column, kind in zip(self.columns, types, strict=True)],
            names=list(self.NAMES),
        )


def newest_per_key(batches: list[pa.RecordBatch], topic: str) -> list[bytes]:
    """Values of the rows for ``topic`` with the newest ``timestamp_ms`` of their key (all of them on a tie).

    For ``after.commit`` hooks that keep the latest record per key in a side store: only these few rows
    need parsing (ties are the hook's to break). Rows without a value are skipped; rows without a key
    share one.
    """
    parts = [
        pa.table(
            {
                "topic": batch.column("topic"),
                "key": batch.column("key").cast(pa.binary()),
                "value": batch.column("value").cast(pa.binary()),
                "timestamp_ms": batch.column("timestamp_ms"),
            }
        )
        for batch in batches
    ]
    if not parts:
        return []
    rows = pa.concat_tables(parts)
    rows = rows.filter(pc.and_(pc.equal(rows["topic"], topic), pc.is_valid(rows["value"])))
    if not rows.num_rows:
        return []
    keys = pc.dictionary_encode(rows["key"].combine_chunks())
    codes = pc.fill_null(keys.indices, len(keys.dictionary)).to_numpy()
    times = pc.fill_null(rows["timestamp_ms"], np.iinfo(np.int64).min).to_numpy()
    newest = np.full(len(keys.dictionary) + 1, np.iinfo(np.int64).min)
    np.maximum.at(newest, codes, times)
    return rows["value"].filter(pa.array(times == newest[codes])).to_pylist()


def sink_options(
    kafka_config: Mapping[str, Any], sink_id: str, topic: str | None = None, marker_topic: str | None = None
) -> dict[str, str]:
    """Options for ``.options(**...)``, e.g. ``sink_options(clients.kafka_config(), sink_id, topic=...)``."""
    options = {OPTION_KAFKA_CONFIG: json.dumps(dict(kafka_config)), OPTION_SINK_ID: sink_id}
    if topic is not None:
        options[OPTION_TOPIC] = topic
    if marker_topic is not None:
        options[OPTION_MARKER_TOPIC] = marker_topic
    SinkOptions.parse(options)
    return options


def checkpoint_sink_id(checkpoint: Path, name: str) -> str:
    """A ``sink.id`` that lives and dies with a local checkpoint directory.

    The id (``name`` plus a random suffix) is kept in a file inside the checkpoint: restarts from the
    checkpoint reuse it, while a deleted and recreated checkpoint gets a new one, so its batch ids (which
    start again at 0) never meet the old query's commit markers.
    """
    path = checkpoint / f"fraud-sink-{name}.id"
    if path.is_file():
        return path.read_text().strip()
    checkpoint.mkdir(parents=True, exist_ok=True)
    sink_id = f"{name}-{uuid.uuid4().hex[:12]}"
    partial = path.with_suffix(".tmp")
    partial.write_text(sink_id)
    partial.replace(path)
    return sink_id


def validate_schema(schema: StructType, default_topic: str | None) -> None:
    """Check the input columns against :data:`COLUMNS`.

    Raises:
        SinkConfigError: an unknown column, a wrong type, no ``value``, or no topic at all.
    """
    fields = {field.name: field.dataType for field in schema.fields}
    if RECORDS_COLUMN in fields:
        if list(fields) != [RECORDS_COLUMN] or not isinstance(fields[RECORDS_COLUMN], BinaryType):
            raise SinkConfigError(
                f"{SINK_NAME} cannot write this schema: packed input is a single binary column "
                f"{RECORDS_COLUMN!r}, got {schema.simpleString()}"
            )
        return
    problems = [f"unknown column {name!r}" for name in fields if name not in COLUMNS]
    for name, data_type in fields.items():
        allowed = COLUMNS.get(name)
        if allowed is not None and not any(_same_type(data_type, ok) for ok in allowed):
            wanted = " or ".join(ok.simpleString() for ok in allowed)
            problems.append(f"column {name!r} is {data_type.simpleString()}, expected {wanted}")
    if "value" not in fields:
        problems.append("column 'value' is required")
    if "topic" not in fields and default_topic is None:
        problems.append(f"column 'topic' is required unless option {OPTION_TOPIC!r} is set")
    if problems:
        raise SinkConfigError(f"{SINK_NAME} cannot write this schema: {'; '.join(problems)}")


def _same_type(actual: DataType, expected: DataType) -> bool:
    """Type equality that ignores nullability (Spark's equality does not)."""
    if isinstance(expected, ArrayType):
        return isinstance(actual, ArrayType) and _same_type(actual.elementType, expected.elementType)
    if isinstance(expected, StructType):
        return (
            isinstance(actual, StructType)
            and [f.name for f in actual.fields] == [f.name for f in expected.fields]
            and all(
                _same_type(a.dataType, e.dataType)
                for a, e in zip(actual.fields, expected.fields, strict=True)
            )
        )
    return type(actual) is type(expected)


def marker_decision(committed: int, batch_id: int) -> Literal["write", "skip"]:
    """What to do with ``batch_id`` given the marker group's committed offset (``< 0`` = none).

    Raises:
        SinkIdReusedError: the marker is past this batch. Spark re-runs only its last uncommitted
            micro-batch, so a later batch of the same query cannot have been written already: the
            ``sink.id`` was used by another checkpoint (skipping would lose rows).
    """
    target = batch_id + 1
    if committed < target:
        return "write"
    if committed == target:
        return "skip"
    raise SinkIdReusedError(
        f"the commit marker says batch {committed - 1} was written, but this query is at batch {batch_id}: "
        f"{OPTION_SINK_ID!r} was used by another checkpoint; give each checkpoint its own sink id "
        "(see checkpoint_sink_id)"
    )


def kafka_headers(raw: list[dict[str, Any]] | None) -> list[tuple[str, bytes | None]] | None:
    """Arrow's ``array<struct<key, value>>`` cells (lists of dicts) as confluent-kafka header tuples."""
    if not raw:
        return None
    return [(header["key"], header["value"]) for header in raw]


@dataclass(frozen=True)
class KafkaSinkCommit(WriterCommitMessage):
    """What one write task did, sent to the driver's ``commit``/``abort``."""

    sink_id: str
    batch_id: int | None
    partition_id: int
    rows: int
    status: WriteStatus


class _TransactionalWriter:
    """One transactional producer plus the consumer that reads its commit marker (one per worker process)."""

    def __init__(self, options: SinkOptions, transactional_id: str) -> None:
        self.options = options
        self.transactional_id = transactional_id
        self.marker = TopicPartition(options.marker_topic, MARKER_PARTITION)
        self.producer: Producer | None = None
        # The marker this process last committed (or read right after init_transactions): if the
        # broker's differs, another worker has written this partition since, fencing our producer.
        self.owned_marker: int | None = None
        self._consumer: Consumer | None = None

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self.options.marker_consumer_config(self.transactional_id))
        return self._consumer

    def start_producer(self) -> Producer:
        """A new producer that owns the transactional id (fences zombies, aborts their open transaction)."""
        self.discard_producer()
        producer = Producer(self.options.producer_config(self.transactional_id))
        _retry_call(lambda timeout: producer.init_transactions(timeout))
        self.producer = producer
        return producer

    def open_producer(self) -> int:
        """Start a producer and return the marker, which is final from then on.

        ``init_transactions`` aborts a zombie's open transaction, marker included, so nobody but this
        producer can move the marker afterwards (another one would have to fence it first).
        """
        self.start_producer()
        self.owned_marker = self.read_marker()
        return self.owned_marker

    def discard_producer(self) -> None:
        self.producer = None  # librdkafka destroys it; any open transaction is aborted by the next owner
        self.owned_marker = None

    def read_marker(self) -> int:
        """The committed marker offset of this writer's group, -1 if there is none."""
        (result,) = self.consumer.committed([self.marker], timeout=KAFKA_CALL_TIMEOUT_S)
        if result.error is not None:
            raise KafkaException(result.error)
        return max(-1, result.offset)

    def close(self) -> None:
        self.discard_producer()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


#: Writers of this Python worker process, by (kafka.config, transactional id), least recently used first;
#: reused across micro-batches. Bounded: each holds a producer with its own librdkafka threads.
_WRITERS: OrderedDict[tuple[str, str], _TransactionalWriter] = OrderedDict()
MAX_CACHED_WRITERS = 16


def _cached_writer(options: SinkOptions, transactional_id: str) -> _TransactionalWriter:
    key = (json.dumps(options.kafka_config, sort_keys=True), transactional_id)
    writer = _WRITERS.get(key)
    if writer is None or writer.options.marker_topic != options.marker_topic:
        if writer is not None:
            writer.close()
        writer = _WRITERS[key] = _TransactionalWriter(options, transactional_id)
    _WRITERS.move_to_end(key)
    while len(_WRITERS) > MAX_CACHED_WRITERS:
        _, evicted = _WRITERS.popitem(last=False)
        evicted.close()
    return writer


def close_cached_writers() -> None:
    """Close this process's cached producers and consumers (tests; workers just exit)."""
    while _WRITERS:
        _, writer = _WRITERS.popitem()
        writer.close()


@functools.cache
def _freeze_imports() -> None:
    """Move what this process holds now, its imported modules above all, out of the garbage collector's
    sight (``gc.freeze``), once per process.

    Spark plans the sink's writer and commits its micro-batches in pooled Python workers of PySpark's
    stock daemon (not ``infra.spark_daemon``), which import pandas, PyArrow and the project after they
    fork, and the daemon runs a full collection after every task: 40-60 ms per planning and per commit,
    twice a micro-batch between the driver's steps.
    """
    gc.freeze()


def _retry_call(call: Callable[[float], object], deadline_s: float = KAFKA_CALL_TIMEOUT_S) -> None:
    """Run ``call(timeout)``, resuming while librdkafka says the error is retriable."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            call(max(1.0, deadline - time.monotonic()))
            return
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if not error.retriable() or time.monotonic() >= deadline:
                raise


def _is_fenced(error: KafkaError) -> bool:
    return error.fatal() or error.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    )


def _keeping(batches: Iterator[pa.RecordBatch], kept: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The batches, each also appended to ``kept``."""
    for batch in batches:
        kept.append(batch)
        yield batch


def pack_records(records: pa.RecordBatch | pa.Table, compression: str | None = None) -> bytes:
    """Rows as the bytes of an Arrow IPC stream (its buffers compressed with ``compression``, e.g.
    ``"zstd"``, if given): a cell of the ``records`` column when they have the columns of :data:`COLUMNS`."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, records.schema, options=options) as writer:
        writer.write(records)
    return bytes(sink.getvalue().to_pybytes())


def _unpacked(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The input rows, with packed ``records`` cells opened into the record batches they hold."""
    for batch in batches:
        if RECORDS_COLUMN not in batch.schema.names:
            yield batch
            continue
        for blob in batch.column(RECORDS_COLUMN).to_pylist():
            if blob is None:
                continue
            reader = pa.ipc.open_stream(blob)
            unknown = [name for name in reader.schema.names if name not in COLUMNS]
            if unknown or "value" not in reader.schema.names:
                raise SinkWriteError(
                    f"a packed {RECORDS_COLUMN!r} cell has columns {reader.schema.names}: expected "
                    f"'value' and others of {list(COLUMNS)}"
                )
            yield from reader


def _peek(batches: Iterator[pa.RecordBatch]) -> pa.RecordBatch | None:
    """The first non-empty record batch, or None when the partition has no rows."""
    for batch in batches:
        if batch.num_rows:
            return batch
    return None


def _produce(producer: Producer, batch: pa.RecordBatch, default_topic: str | None) -> int:
    """Produce every row of ``batch`` (inside the open transaction); returns the number of rows."""
    names = set(batch.schema.names)
    n = batch.num_rows
    none = [None] * n
    values = batch.column("value").to_pylist()
    keys = batch.column("key").to_pylist() if "key" in names else none
    topics = batch.column("topic").to_pylist() if "topic" in names else none
    timestamps = batch.column("timestamp_ms").to_pylist() if "timestamp_ms" in names else none
    partitions = batch.column("partition").to_pylist() if "partition" in names else none
    headers: list[list[tuple[str, bytes | None]] | None] = none  # type: ignore[assignment]
    if "headers" in names and batch.column("headers").null_count < n:
        headers = [kafka_headers(cell) for cell in batch.column("headers").to_pylist()]
    produce = producer.produce
    for value, key, topic, timestamp, partition, header in zip(
        values, keys, topics, timestamps, partitions, headers, strict=True
    ):
        topic = topic or default_topic
        if topic is None:
            raise SinkWriteError(f"a row has no topic and option {OPTION_TOPIC!r} is not set")
        while True:
            try:
                produce(
                    topic,
                    value,
                    key,
                    partition=-1 if partition is None else partition,
                    timestamp=timestamp or 0,
                    headers=header,
                )
                break
            except BufferError:
                producer.poll(0.05)  # the local queue is full: let librdkafka send
    producer.poll(0)
    return n


def _commit(producer: Producer, what: str) -> None:
    """Commit the open transaction, or abort it and raise: rows are never dropped silently."""
    try:
        _retry_call(lambda timeout: producer.commit_transaction(timeout))
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        if error.txn_requires_abort():
            try:
                producer.abort_transaction(KAFKA_CALL_TIMEOUT_S)
            except KafkaException:
                _log.warning("aborting %s failed; the next owner of its transactional id aborts it", what)
        raise SinkWriteError(f"{what}: the Kafka transaction failed, nothing was written: {error}") from exc


class _ArrowKafkaWriter:
    """The shared write path of the streaming and batch writers."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def on_transaction_event(self, event: TransactionEvent, batch_id: int | None, partition_id: int) -> None:
        """Called after ``opened`` (transaction begun, marker sent, no row produced yet) and after ``committed``
        (Kafka commit done, Spark not told yet). Does nothing; chaos tests override it to kill the job there.
        """

    def write_partition(
        self, batches: Iterator[pa.RecordBatch], batch_id: int, partition_id: int
    ) -> KafkaSinkCommit:
        """Write the rows of micro-batch ``batch_id``, Spark partition ``partition_id``, exactly once."""
        batches = _unpacked(batches)
        first = _peek(batches)
        if first is None:
            return self._message(batch_id, partition_id, 0, "empty")
        kept: list[pa.RecordBatch] = []
        if self.options.after_commit is not None:
            batches = _keeping(batches, kept)
            kept.append(first)
        writer = _cached_writer(self.options, self.options.transactional_id(partition_id))
        what = f"{SINK_NAME} {writer.transactional_id} batch {batch_id}"
        producer = self._begin(writer, batch_id, what)
        if producer is None:
            drained = first.num_rows + sum(batch.num_rows for batch in batches)
            _log.info("%s: already written (marker %d), skipping %d rows", what, batch_id + 1, drained)
            self.options.run_after_commit(kept)
            return self._message(batch_id, partition_id, drained, "already-written")
        self.on_transaction_event("opened", batch_id, partition_id)
        with self._one_at_a_time(writer, first, batches) as batches:
            rows = self._produce_all(producer, writer, first, batches, what)
            try:
                _commit(producer, what)
            except SinkWriteError:
                writer.discard_producer()
                raise
        writer.owned_marker = batch_id + 1
        self.on_transaction_event("committed", batch_id, partition_id)
        self.options.run_after_commit(kept)
        return self._message(batch_id, partition_id, rows, "written")

    @contextmanager
    def _one_at_a_time(
        self, writer: _TransactionalWriter, first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]
    ) -> Iterator[Iterator[pa.RecordBatch]]:
        """The rows after ``first``; on a broker that needs it, with this host's locks of their topics held
        until the block ends (the rows are read first: the lock covers producing and committing only)."""
        bootstrap = str(self.options.kafka_config["bootstrap.servers"])
        if not needs_locks(writer.consumer, bootstrap):
            yield rest
            return
        buffered = list(rest)
        with topic_locks(bootstrap, topics_of([first, *buffered], self.options.topic)):
            yield iter(buffered)

    def _begin(self, writer: _TransactionalWriter, batch_id: int, what: str) -> Producer | None:
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
                if attempt:
                    raise SinkWriteError(f"{what}: cannot begin the Kafka transaction: {error}") from exc
                _log.info(
                    "%s: the cached producer cannot begin (%s: %s), taking the transactional id back "
                    "with a new producer",
                    what,
                    "fenced by another worker" if _is_fenced(error) else "error",
                    error,
                )
        raise AssertionError("unreachable")

    def _produce_all(
        self,
        producer: Producer,
        writer: _TransactionalWriter,
        first: pa.RecordBatch,
        rest: Iterator[pa.RecordBatch],
        what: str,
    ) -> int:
        try:
            rows = _produce(producer, first, self.options.topic)
            for batch in rest:
                rows += _produce(producer, batch, self.options.topic)
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
        return KafkaSinkCommit(self.options.sink_id, batch_id, partition_id, rows, status)


def _task_context() -> tuple[int, int | None]:
    """(partition id, micro-batch id or None) of the running Spark task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError(f"{SINK_NAME} writers run inside Spark tasks only")
    batch = context.getLocalProperty(BATCH_ID_PROPERTY)
    return context.partitionId(), None if batch is None else int(batch)


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
            self.options.sink_id,
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
            self.options.sink_id,
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
        if self.options.batch_id is not None:
            return self.write_partition(iterator, self.options.batch_id, partition_id)
        iterator = _unpacked(iterator)
        first = _peek(iterator)
        if first is None:
            return self._message(None, partition_id, 0, "empty")
        transactional_id = f"{self.options.sink_id}-batch-{partition_id}"
        what = f"{SINK_NAME} {transactional_id}"
        writer = _TransactionalWriter(self.options, transactional_id)  # fresh: fences earlier attempts
        try:
            producer = writer.start_producer()
            producer.begin_transaction()
            with self._one_at_a_time(writer, first, iterator) as rest:
                rows = self._produce_all(producer, writer, first, rest, what)
                _commit(producer, what)
        finally:
            writer.close()
        return self._message(None, partition_id, rows, "written")

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _freeze_imports()
        rows = sum(m.rows for m in messages if isinstance(m, KafkaSinkCommit))
        _log.info("%s %s: %d rows written", SINK_NAME, self.options.sink_id, rows)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _log.warning(
            "%s %s: batch write failed; committed tasks stay written", SINK_NAME, self.options.sink_id
        )


class FraudKafkaSink(DataSource):
    """``fraud-kafka-sink``: exactly-once Kafka output for Structured Streaming (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def _checked(self, schema: StructType) -> SinkOptions:
        _freeze_imports()
        options = SinkOptions.parse(self.options)
        validate_schema(schema, options.topic)
        return options

    def streamWriter(self, schema: StructType, overwrite: bool) -> FraudKafkaStreamWriter:
        return FraudKafkaStreamWriter(self._checked(schema))

    def writer(self, schema: StructType, overwrite: bool) -> FraudKafkaBatchWriter:
        if overwrite:
            raise SinkConfigError(f"{SINK_NAME} appends to Kafka topics; overwrite mode is not possible")
        return FraudKafkaBatchWriter(self._checked(schema))


def register(spark: SparkSession) -> None:
    """Make ``format(SINK_NAME)`` available in ``spark``."""
    spark.dataSource.register(FraudKafkaSink)
