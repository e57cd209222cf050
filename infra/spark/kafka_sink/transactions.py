"""Kafka transactions of the sink's write tasks: one transactional producer and its commit marker per task.

Write task ``p`` of micro-batch ``b`` writes all its rows in ONE Kafka transaction of the transactional
producer ``f"{sink_id}-{p}"``. Inside the same transaction, before any row, it commits the offset ``b + 1``
for the consumer group ``f"{sink_id}-{p}"`` on partition 0 of the marker topic
(``send_offsets_to_transaction``): the marker and the rows become visible atomically, or neither does.
Producers are cached per Python worker and reused across micro-batches.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Literal

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from contracts.provenance import HEADER as PROVENANCE_HEADER
from infra.kafka.outage import is_outage, wait_for_kafka
from infra.spark.kafka_sink.config import (
    KAFKA_CALL_TIMEOUT_S,
    MARKER_PARTITION,
    KafkaSinkConfig,
    SinkIdReusedError,
    SinkWriteError,
)
from infra.spark.kafka_sink.records import kafka_headers

_log = logging.getLogger(__name__)


def marker_decision(committed: int, batch_id: int) -> Literal["write", "skip"]:
    """What to do with ``batch_id`` given the marker group's committed offset (``< 0`` = none).

    Raises:
        SinkIdReusedError: the marker is past this batch. Spark re-runs only its last uncommitted
            micro-batch, so a later batch of the same query cannot have been written already: the
            sink id was used by another checkpoint (skipping would lose rows).
    """
    target = batch_id + 1
    if committed < target:
        return "write"
    if committed == target:
        return "skip"
    raise SinkIdReusedError(
        f"the commit marker says batch {committed - 1} was written, but this query is at batch {batch_id}: "
        "the sink id was used by another checkpoint; give each checkpoint its own sink id "
        "(see checkpoint_sink_id)"
    )


class TransactionalWriter:
    """One transactional producer plus the consumer that reads its commit marker (one per worker process)."""

    def __init__(self, config: KafkaSinkConfig, transactional_id: str) -> None:
        self.config = config
        self.transactional_id = transactional_id
        self.marker = TopicPartition(config.markers, MARKER_PARTITION)
        self.producer: Producer | None = None
        # The marker this process last committed (or read right after init_transactions): if the
        # broker's differs, another worker has written this partition since, fencing our producer.
        self.owned_marker: int | None = None
        self._consumer: Consumer | None = None

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self.config.marker_consumer_config(self.transactional_id))
        return self._consumer

    def start_producer(self) -> Producer:
        """A new producer that owns the transactional id (fences zombies, aborts their open transaction)."""
        self.discard_producer()
        producer = Producer(self.config.producer_config(self.transactional_id))
        retry_call(lambda timeout: producer.init_transactions(timeout))
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
        """The committed marker offset of this writer's group, -1 if there is none (a Kafka outage is waited
        out)."""
        return wait_for_kafka(self._read_marker)

    def _read_marker(self) -> int:
        (result,) = self.consumer.committed([self.marker], timeout=KAFKA_CALL_TIMEOUT_S)
        if result.error is not None:
            raise KafkaException(result.error)
        return max(-1, result.offset)

    def close(self) -> None:
        self.discard_producer()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


#: Writers of this Python worker process, by (kafka_config, transactional id), least recently used first;
#: reused across micro-batches. Bounded: each holds a producer with its own librdkafka threads.
_WRITERS: OrderedDict[tuple[str, str], TransactionalWriter] = OrderedDict()
MAX_CACHED_WRITERS = 16


def cached_writer(config: KafkaSinkConfig, transactional_id: str) -> TransactionalWriter:
    """This process's writer of ``transactional_id`` (kept across micro-batches), made if need be."""
    key = (json.dumps(dict(config.kafka_config), sort_keys=True), transactional_id)
    writer = _WRITERS.get(key)
    if writer is None or writer.config.markers != config.markers:
        if writer is not None:
            writer.close()
        writer = _WRITERS[key] = TransactionalWriter(config, transactional_id)
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


def retry_call(call: Callable[[float], object]) -> None:
    """Run ``call(timeout)``, again while librdkafka says the error is retriable or Kafka is away: a
    transaction's init and commit may be repeated until they go through (``infra.kafka.outage``)."""
    wait_for_kafka(lambda: call(KAFKA_CALL_TIMEOUT_S))


def is_fenced(error: KafkaError) -> bool:
    return error.fatal() or error.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    )


def produce(
    producer: Producer,
    batch: pa.RecordBatch,
    default_topic: str | None,
    provenance: tuple[str, int] | None = None,
) -> int:
    """Produce every row of ``batch`` (inside the open transaction); returns the number of rows.

    ``provenance``: the header prefix of the task's batch and the position of this batch's first row
    (``contracts.provenance``); each row gets its header.
    """
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
    if provenance is not None:
        prefix, first = provenance
        headers = [
            [*(cell or ()), (PROVENANCE_HEADER, f"{prefix}{seq}".encode())]
            for seq, cell in enumerate(headers, first)
        ]
    send = producer.produce
    for value, key, topic, timestamp, partition, header in zip(
        values, keys, topics, timestamps, partitions, headers, strict=True
    ):
        topic = topic or default_topic
        if topic is None:
            raise SinkWriteError("a row has no topic and the sink has no default topic")
        while True:
            try:
                send(
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


def commit(producer: Producer, what: str) -> None:
    """Commit the open transaction, or abort it and raise: rows are never dropped silently."""
    try:
        retry_call(lambda timeout: producer.commit_transaction(timeout))
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        if error.txn_requires_abort():
            try:
                producer.abort_transaction(KAFKA_CALL_TIMEOUT_S)
            except KafkaException as failed:  # Kafka away (said once already): the next owner aborts it
                _log.log(
                    logging.INFO if is_outage(failed) else logging.WARNING,
                    "aborting %s failed; the next owner of its transactional id aborts it",
                    what,
                )
        raise SinkWriteError(f"{what}: the Kafka transaction failed, nothing was written: {error}") from exc
