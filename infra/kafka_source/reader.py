"""Reading in the executors: a split's exact offset range, with consumers kept across micro-batches.

Executors keep one consumer per topic-partition per Python worker, paused, with the records it fetched past
the last range's end: the next micro-batch usually continues there, without re-reading from the range's
start.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql.datasource import InputPartition

from contracts.provenance import Provenance, provenance_of
from infra.clients import KAFKA_LOGGER
from infra.kafka_log import consumed
from infra.kafka_source.config import RAW_FIELDS, KafkaSourceConfig
from infra.kafka_source.offsets import tp_name
from infra.kafka_source.planner import FETCH_WAIT_MS, POLL_S, check_deadline, deadline
from infra.kafka_source.splits import Split, SplitGroup
from infra.timing import Timings

_Record = tuple[int, int, bytes | None, bytes | None, Provenance | None]  # offset, timestamp, key, value, ...
_CONSUMERS: dict[tuple[str, str, int], tuple[Consumer, int, list[_Record]]] = {}
_BATCH_ROWS = 20_000
_log = logging.getLogger(__name__)


def read_group(config: KafkaSourceConfig, group: InputPartition) -> Iterator[pa.RecordBatch]:
    """The records of a task's splits, decoded when the config has a decoder, plus the heartbeat."""
    if not isinstance(group, SplitGroup):
        raise TypeError(f"unexpected input partition {group!r}")
    decoder = config.decoder
    timings = Timings("source-read")
    for split in group.splits:
        for records in timings.timed("kafka", _read_range(config.kafka_config, split)):
            if decoder is None:
                yield records
            else:
                yield from timings.timed("decode", decoder.decode(records, split))
        if decoder is not None and split.heartbeat:
            yield from timings.timed("decode", decoder.heartbeat(split))
    timings.log()


def _source_consumer(kafka_config: Mapping[str, Any], split: Split) -> tuple[Consumer, list[_Record]]:
    """A consumer positioned at ``split.start`` (cached one when it is there), with records already fetched."""
    cache_key = (json.dumps(dict(kafka_config), sort_keys=True), split.topic, split.partition)
    cached = _CONSUMERS.pop(cache_key, None)
    if cached is not None:
        consumer, position, leftovers = cached
        if position == split.start:
            tp = TopicPartition(split.topic, split.partition)
            consumer.resume([tp])
            # librdkafka's fetcher sees a resumed partition only when it next wakes up, about 500 ms later
            # when idle; a seek to where the consumer stands wakes it at once (1-3 ms on Tansu).
            at = consumer.position([tp])[0]
            if at.offset >= 0:
                consumer.seek(at)
            return consumer, leftovers
        consumer.close()
    consumer = Consumer(
        {
            **kafka_config,
            "group.id": "fraud-spark-source",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",  # a planned offset outside the log fails the read, never skips
            "fetch.wait.max.ms": FETCH_WAIT_MS,
        },
        logger=KAFKA_LOGGER,
    )
    consumer.assign([TopicPartition(split.topic, split.partition, split.start)])
    return consumer, []


def _read_range(kafka_config: Mapping[str, Any], split: Split) -> Iterator[pa.RecordBatch]:
    """Records [start, end) of one partition as Arrow batches, in offset order."""
    if split.end <= split.start:
        return
    consumer, pending = _source_consumer(kafka_config, split)
    tp = TopicPartition(split.topic, split.partition)
    name = tp_name(split.topic, split.partition)
    copies = split.copy_filter()
    position = split.start
    chunk: list[_Record] = []
    until = deadline()
    while position < split.end:
        if not pending:
            # consume() waits until it has as many messages as asked for, or the timeout: ask for the
            # range's rest, so that a range whose records are all there costs no wait.
            wanted = min(_BATCH_ROWS, split.end - position)
            for message, at_end in consumed(consumer, wanted, timeout=POLL_S):
                if not at_end:
                    headers = message.headers()
                    provenance = provenance_of(headers) if headers else None
                    pending.append(
                        (
                            message.offset() or 0,
                            message.timestamp()[1],
                            message.key(),
                            message.value(),
                            provenance,
                        )
                    )
            if pending:
                until = deadline()
            else:
                # Transaction markers take offsets but are never delivered: the consumer's position passes
                # them. Ask it every time, not only at the end-of-partition event, which comes once: a
                # cached consumer may have reached the log end while reading the previous range.
                position = max(position, consumer.position([tp])[0].offset)
        taken = 0
        for record in pending:
            if record[0] >= split.end:
                break
            if record[4] is None or not copies.is_copy_of(name, record[4]):
                chunk.append(record)
            position = max(position, record[0] + 1)
            taken += 1
        pending = pending[taken:]
        if pending and pending[0][0] >= split.end:
            position = split.end
        if len(chunk) >= _BATCH_ROWS:
            yield _records(split, chunk)
            chunk = []
        until = check_deadline(until, {name} if position < split.end else set(), consumer)
    if chunk:
        yield _records(split, chunk)
    if copies.copies:
        _log.info(
            "%s offsets %d..%d: skipped %d copies of records that an aborted attempt of their writer left "
            "in the log",
            name,
            split.start,
            split.end - 1,
            copies.copies,
        )
    # Paused until the next range: a cached consumer that fetched on would cost the broker a fetch every
    # FETCH_WAIT_MS, and the workers together keep many (one per partition each, most of them stale).
    consumer.pause([tp])
    cache_key = (json.dumps(dict(kafka_config), sort_keys=True), split.topic, split.partition)
    _CONSUMERS[cache_key] = (consumer, split.end, pending)


def _records(split: Split, chunk: list[_Record]) -> pa.RecordBatch:
    offsets, stamps, keys, values, _ = zip(*chunk, strict=True)
    n = len(chunk)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([split.topic] * n, pa.string()),
            pa.array([split.partition] * n, pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(stamps, pa.int64()),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
        ],
        schema=RAW_FIELDS,
    )
