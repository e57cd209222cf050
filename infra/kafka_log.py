"""Kafka's logs probed and read: where each partition's records start and end for a read_committed reader
(found by reading, as Tansu's watermarks are wrong), when a topic's records were written, and every record
of a topic present now."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from contracts.errors import NotFoundError, ServiceUnavailableError, StateError
from contracts.provenance import CopyFilter
from infra.clients import Clients, cluster_metadata
from infra.kafka_outage import is_outage


class HistoryGapError(StateError):
    """Offsets a reader planned, or continues from, are no longer in a topic's log: readers never skip."""


def consumed(
    consumer: Consumer, count: int, timeout: float, gaps: set[str] | None = None
) -> Iterator[tuple[Message, bool]]:
    """The messages of one ``consume`` call as ``(message, at_end)``: a record (False), or the event that the
    consumer reached the end of a partition (True; its offset is that end, with ``enable.partition.eof``).

    An offset outside the log (with ``auto.offset.reset=error``) raises :class:`HistoryGapError`, or is
    added to ``gaps`` as ``topic/partition`` when the caller expects it. A broker that does not answer is
    reported to consumers as an error event too, which the consumer recovers from by itself: such events
    are passed over (the caller's own deadline says when nothing came for too long). Any other error
    raises ``KafkaException``.
    """
    for message in consumer.consume(count, timeout=timeout):
        error = message.error()
        if error is None or error.code() == KafkaError._PARTITION_EOF:
            yield message, error is not None
        elif is_outage(error):
            continue
        elif error.code() == KafkaError._AUTO_OFFSET_RESET and gaps is not None:
            gaps.add(f"{message.topic()}/{message.partition()}")
        elif error.code() == KafkaError._AUTO_OFFSET_RESET:  # auto.offset.reset=error: out of the log
            raise HistoryGapError(
                f"topic {message.topic()!r} partition {message.partition()}: offset {message.offset()} is no "
                f"longer in the log ({error.str()}); the reader stops rather than skip records"
            )
        else:
            raise KafkaException(error)


def partitions_of(consumer: Consumer, topic: str) -> list[int]:
    metadata = cluster_metadata(consumer, topic).topics.get(topic)
    if metadata is None or metadata.error is not None:
        raise NotFoundError(f"topic {topic!r} does not exist; create the topics with `fraud topics create`")
    return sorted(metadata.partitions)


def read_to_end(
    consumer: Consumer, start: list[TopicPartition], timeout_s: float = 60.0, first_only: bool = False
) -> dict[str, tuple[int, int]]:
    """Read each partition from the given offset to its end; (offset, timestamp) of the last record read
    (of the first one, and no further, with ``first_only``).

    The consumer must have ``enable.partition.eof`` set: the end is where the broker says so, which
    also covers partitions whose last offsets hold transaction markers. Keys are ``topic/partition``.
    """
    return _read(consumer, start, timeout_s, first_only)[0]


def _read(
    consumer: Consumer, start: list[TopicPartition], timeout_s: float, first_only: bool = False
) -> tuple[dict[str, tuple[int, int]], dict[str, int]]:
    """:func:`read_to_end`'s records, and the position where the broker said each partition ends (past
    any transaction markers there; not found for a partition left at its first record with ``first_only``)."""
    if not start:
        return {}, {}
    consumer.assign(start)
    last: dict[str, tuple[int, int]] = {}
    ends: dict[str, int] = {}
    pending = {f"{tp.topic}/{tp.partition}" for tp in start}
    gaps: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while pending:
        for message, at_end in consumed(consumer, 100_000, timeout=0.05, gaps=gaps if first_only else None):
            name = f"{message.topic()}/{message.partition()}"
            if at_end:
                ends[name] = message.offset() or 0
                pending.discard(name)
                continue
            if first_only and name not in pending:
                continue
            last[name] = (message.offset() or 0, message.timestamp()[1])
            if first_only:
                pending.discard(name)
        pending -= gaps  # first_only: a start below the log (Kafka's, after deletions) has no record to find
        if pending and time.monotonic() > deadline:
            raise ServiceUnavailableError(
                f"no end of partition from Kafka for {sorted(pending)} within {timeout_s:.0f} s"
            )
    consumer.unassign()
    return last, ends


def first_offsets(consumer: Consumer, lows: list[TopicPartition], timeout_s: float = 60.0) -> dict[str, int]:
    """Each partition's first offset, given its low watermark as the offset: the low watermark, or less.

    Tansu answers "earliest" (the low watermark, and ``OFFSET_BEGINNING``) with the base offset of the
    record batch it stored first, above the lowest when producers wrote the partition at once; the records
    below it are there. Reading from offset 0 finds them. On Apache Kafka a low watermark above 0 is the
    log start, and the read from 0 falls outside the log, so the smaller of the two is right on both. The
    consumer must have ``enable.partition.eof`` set. Keys are ``topic/partition``.
    """
    first = {f"{tp.topic}/{tp.partition}": tp.offset for tp in lows}
    probe = [TopicPartition(tp.topic, tp.partition, 0) for tp in lows if tp.offset > 0]
    for name, (offset, _) in read_to_end(consumer, probe, timeout_s, first_only=True).items():
        first[name] = min(first[name], offset)
    return first


def log_bounds(
    consumer: Consumer, partitions: list[tuple[str, int]], timeout_s: float = 60.0
) -> dict[str, tuple[int, int]]:
    """(first, end) offset of each (topic, partition) for a read_committed reader, end = where such a reader
    reaches the end now: one past the last record it can read, or past the transaction markers after it.
    Keys are ``topic/partition``.

    Found by reading, because Tansu's watermarks are wrong three ways: its high watermark is (base offset
    of the last record batch) + 1, short of the log end when that batch holds several records; a
    read_committed consumer gets (0, 0) while a transaction is open on the partition; and its low
    watermark can be above the first record (:func:`first_offsets`). Each partition is read from its
    high watermark - 1 (from its first offset when that is not below) to the end the broker's fetch
    reports, its last stable offset. On Apache Kafka that read returns just the last record, so the
    result is exact on both. The end counts the markers a reader's position passes, so a reader that
    stopped at the end (a checkpoint's offsets) is never found past it, even while a transaction is open
    and the watermarks read (0, 0). The consumer must have ``enable.partition.eof`` set.
    """
    lows, highs = [], {}
    for topic, partition in partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
        lows.append(TopicPartition(topic, partition, low))
        highs[f"{topic}/{partition}"] = high
    firsts = first_offsets(consumer, lows, timeout_s)
    bounds = {}
    probe = []
    for tp in lows:
        name = f"{tp.topic}/{tp.partition}"
        first, high = firsts[name], highs[name]
        bounds[name] = (first, max(first, high))
        probe.append(TopicPartition(tp.topic, tp.partition, max(first, high - 1)))
    last, ends = _read(consumer, probe, timeout_s)
    for name, (first, end) in bounds.items():
        offset = last[name][0] if name in last else first - 1
        bounds[name] = (first, max(end, offset + 1, ends.get(name, first)))
    return bounds


def offset_bounds(consumer: Consumer, topic: str, timeout_s: float = 60.0) -> dict[int, tuple[int, int]]:
    """:func:`log_bounds` of every partition of ``topic``, by partition number."""
    partitions = [(topic, partition) for partition in partitions_of(consumer, topic)]
    return {
        int(name.rpartition("/")[2]): bounds
        for name, bounds in log_bounds(consumer, partitions, timeout_s).items()
    }


def holds_records(consumer: Consumer, topic: str) -> bool:
    """Whether anything was ever written to ``topic`` (a high watermark above 0, deleted records included);
    False for a topic that does not exist."""
    try:
        partitions = partitions_of(consumer, topic)
    except NotFoundError:
        return False
    return any(
        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] > 0
        for p in partitions
    )


def time_span(consumer: Consumer, topic: str, timeout_s: float = 60.0) -> tuple[int, int] | None:
    """The Kafka timestamps of the first and the last record of ``topic`` (the earliest first record and
    the latest last record over its partitions); None while it is empty. Reads two records a partition.
    The consumer must have ``enable.partition.eof`` set."""
    bounds = {p: span for p, span in offset_bounds(consumer, topic, timeout_s).items() if span[1] > span[0]}
    if not bounds:
        return None
    firsts = read_to_end(
        consumer,
        [TopicPartition(topic, p, first) for p, (first, _) in bounds.items()],
        timeout_s,
        first_only=True,
    )
    lasts = read_to_end(
        consumer,
        [TopicPartition(topic, p, max(first, end - 1)) for p, (first, end) in bounds.items()],
        timeout_s,
    )
    if not firsts or not lasts:
        return None
    return min(stamp for _, stamp in firsts.values()), max(stamp for _, stamp in lasts.values())


def topic_counts(clients: Clients, topics: list[str]) -> dict[str, int]:
    """Number of records in each topic, as a read_committed consumer sees them.

    Counted by reading: offset spans would also count transaction markers (and, on a broker that shows
    records of aborted transactions, their copies, which :func:`read_topic` skips).
    """
    return {topic: sum(1 for _ in read_topic(clients, topic)) for topic in topics}


def offsets_for_time(consumer: Consumer, topic: str, partitions: list[int], time_ms: int) -> dict[int, int]:
    """Per partition, the offset of the first record with a Kafka timestamp at or after ``time_ms``.

    A partition without such a record maps to -1 (the end, ``OFFSET_END``).
    """
    found = consumer.offsets_for_times([TopicPartition(topic, p, time_ms) for p in partitions], timeout=10)
    return {tp.partition: tp.offset if tp.offset >= 0 else -1 for tp in found}


def read_topic(
    clients: Clients,
    topic: str,
    idle_timeout_s: float = 10.0,
    start_ms: int | None = None,
    skip_copies: bool = True,
) -> Generator[Message]:
    """Every record of ``topic`` present now (read_committed), in offset order within each partition.

    With ``start_ms``, each partition starts at its first record with a Kafka timestamp at or after it.
    Stops at the end offsets measured at the start; fails if neither a record nor the end arrives for
    ``idle_timeout_s``. Copies of the project's sink records that an aborted attempt left in the log are
    skipped (``contracts.provenance``; the embedded broker shows them), unless ``skip_copies`` is False.
    """
    consumer = clients.consumer(overrides={"enable.partition.eof": True, "fetch.wait.max.ms": 10})
    try:
        bounds = offset_bounds(consumer, topic)
        if start_ms is not None:
            starts = offsets_for_time(consumer, topic, sorted(bounds), start_ms)
            bounds = {p: (end if starts[p] < 0 else starts[p], end) for p, (_, end) in bounds.items()}
        pending = {p: end for p, (first, end) in bounds.items() if end > first}
        consumer.assign([TopicPartition(topic, p, bounds[p][0]) for p in pending])
        idle_since = time.monotonic()
        copies = CopyFilter()
        while pending:
            idle = True
            for message, at_end in consumed(consumer, 10_000, timeout=0.1):
                idle = False
                partition = message.partition() or 0
                if partition not in pending:
                    continue
                # Done at or past the end measured at the start. The broker's own end can trail it (an open
                # transaction, a high watermark that lags): only the position says the partition is done.
                if (message.offset() or 0) >= pending[partition]:
                    del pending[partition]
                elif not at_end and not (skip_copies and copies.is_copy(str(partition), message.headers())):
                    yield message
            if not idle:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > idle_timeout_s:
                raise ServiceUnavailableError(
                    f"Kafka delivered nothing of {topic}, partitions {sorted(pending)}, for "
                    f"{idle_timeout_s:.0f} s before their end"
                )
    finally:
        consumer.close()
