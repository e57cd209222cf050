"""Kafka's logs probed and read: where each partition's records start and end for a read_committed reader
(the broker's offsets: first, and last stable), when a topic's records were written, and every record of a
topic present now."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator, Iterator, Mapping

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from contracts.errors import NotFoundError, ServiceUnavailableError, StateError
from infra.kafka.connection import METADATA_TIMEOUT_S, KafkaClients, cluster_metadata
from infra.kafka.offsets import parse_tp, tp_name
from infra.kafka.outage import KafkaUnreachableError, is_outage, wait_for_kafka


class HistoryGapError(StateError):
    """Offsets a reader continues from are no longer in a topic's log: readers never skip."""


def consumed(consumer: Consumer, count: int, timeout: float) -> Iterator[tuple[Message, bool]]:
    """The messages of one ``consume`` call as ``(message, at_end)``: a record (False), or the event that the
    consumer reached the end of a partition (True; its offset is that end, with ``enable.partition.eof``).

    An offset outside the log (with ``auto.offset.reset=error``) raises :class:`HistoryGapError`. A broker
    that does not answer is reported to consumers as an error event too, which the consumer recovers from
    by itself: such events are passed over (the caller's own deadline says when nothing came for too
    long). Any other error raises ``KafkaException``.
    """
    for message in consumer.consume(count, timeout=timeout):
        error = message.error()
        if error is None or error.code() == KafkaError._PARTITION_EOF:
            yield message, error is not None
        elif is_outage(error):
            continue
        elif error.code() == KafkaError._AUTO_OFFSET_RESET:  # auto.offset.reset=error: out of the log
            raise HistoryGapError(
                f"topic {message.topic()!r} partition {message.partition()}: offset {message.offset()} is no "
                f"longer in the log ({error.str()}); the reader stops rather than skip records"
            )
        else:
            raise KafkaException(error)


def check_deadline(
    until: float, pending: set[str], client: AdminClient | Consumer, timeout_s: float
) -> float:
    """The deadline of a read whose ``pending`` partitions (``topic/partition``) still hold records it knows
    are there: ``until``, or a new one (``timeout_s`` from now) when it passed while Kafka was away. Only
    time the broker answers counts: past the deadline, a broker that does not answer a metadata request is
    an outage, waited out (``infra.kafka.outage``); one that answers and still delivers nothing holds the
    records back.

    Raises:
        ServiceUnavailableError: the broker answers, and the records did not come by the deadline.
    """
    if not pending or time.monotonic() <= until:
        return until
    topics = sorted({parse_tp(name)[0] for name in pending})
    try:
        for topic in topics:
            cluster_metadata(client, topic)
    except KafkaUnreachableError:
        wait_for_kafka(lambda: [cluster_metadata(client, topic) for topic in topics])
        return time.monotonic() + timeout_s
    raise ServiceUnavailableError(
        f"no answer from Kafka for {sorted(pending)} within {timeout_s:.0f} s (longer than a writer's "
        "transaction may stay open: the records below the offsets read are not readable)"
    )


def partitions_of(client: AdminClient | Consumer, topic: str) -> list[int]:
    """The partitions of ``topic``.

    Raises:
        NotFoundError: the topic does not exist.
    """
    metadata = cluster_metadata(client, topic).topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        raise NotFoundError(f"topic {topic!r} does not exist; create the topics with `fraud topics create`")
    return sorted(metadata.partitions)


def list_offsets(admin: AdminClient, partitions: list[tuple[str, int]], spec: OffsetSpec) -> dict[str, int]:
    """Each partition's offset for ``spec`` as a read_committed reader has it (``latest``: the last stable
    offset; a time without a record at or after it: -1), as ``topic/partition`` -> offset."""
    if not partitions:
        return {}
    futures = admin.list_offsets(
        {TopicPartition(topic, partition): spec for topic, partition in partitions},
        isolation_level=IsolationLevel.READ_COMMITTED,
        request_timeout=METADATA_TIMEOUT_S,
    )
    return {tp_name(tp.topic, tp.partition): future.result().offset for tp, future in futures.items()}


def log_bounds(admin: AdminClient, partitions: list[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    """(first offset, last stable offset) of each (topic, partition), as ``topic/partition`` -> bounds: a
    read_committed reader at the end has read every committed record (and the markers after them)."""
    first = list_offsets(admin, partitions, OffsetSpec.earliest())
    last = list_offsets(admin, partitions, OffsetSpec.latest())
    return {name: (first[name], last[name]) for name in first}


def offset_bounds(admin: AdminClient, topic: str) -> dict[int, tuple[int, int]]:
    """:func:`log_bounds` of every partition of ``topic``, by partition number."""
    bounds = log_bounds(admin, [(topic, partition) for partition in partitions_of(admin, topic)])
    return {parse_tp(name)[1]: span for name, span in bounds.items()}


def offsets_for_time(admin: AdminClient, topics: tuple[str, ...], at_ms: int) -> dict[str, int]:
    """Each partition's first offset whose record is stamped at or after ``at_ms`` (its last stable offset
    when none is), as ``topic/partition`` -> offset: where a read of the records before ``at_ms`` ends, and
    one of the records from ``at_ms`` on starts."""
    partitions = [(topic, partition) for topic in topics for partition in partitions_of(admin, topic)]
    found = list_offsets(admin, partitions, OffsetSpec.for_timestamp(at_ms))
    ends = list_offsets(admin, partitions, OffsetSpec.latest())
    return {name: ends[name] if offset < 0 else offset for name, offset in found.items()}


def check_history(admin: AdminClient, next_offsets: Mapping[str, int]) -> None:
    """Fail when a partition's next offset is outside its log: below its first record (records were deleted:
    retention, or a deletion by hand) or past its end (the topic was deleted and re-created). Either way
    continuing would skip records without a word.

    Raises:
        HistoryGapError: naming the topic, the partition and the offsets.
    """
    bounds = log_bounds(admin, [parse_tp(name) for name in next_offsets])
    for name, offset in sorted(next_offsets.items()):
        first, end = bounds[name]
        topic, partition = parse_tp(name)
        if offset < first:
            raise HistoryGapError(
                f"topic {topic!r} partition {partition}: this query continues at offset {offset}, but the log "
                f"now starts at {first}: records {offset}..{first - 1} were deleted (check the topic's "
                "retention: `fraud topics describe`); replay into a new checkpoint to go on"
            )
        if offset > end:
            raise HistoryGapError(
                f"topic {topic!r} partition {partition}: this query continues at offset {offset}, but the log "
                f"ends at {end}: the topic was deleted and re-created; start over with a new checkpoint"
            )


def holds_records(admin: AdminClient, topic: str) -> bool:
    """Whether anything was ever written to ``topic`` (a last offset above 0, deleted records included);
    False for a topic that does not exist."""
    try:
        bounds = offset_bounds(admin, topic)
    except NotFoundError:
        return False
    return any(end > 0 for _, end in bounds.values())


def time_span(clients: KafkaClients, topic: str) -> tuple[int, int] | None:
    """The Kafka timestamps of the first and the last record of ``topic`` (the earliest first record and
    the latest last record over its partitions); None while it is empty. Reads a few records a partition."""
    firsts: list[int] = []
    lasts: list[int] = []
    for partition, (first, end) in offset_bounds(clients.admin(), topic).items():
        with contextlib.closing(read_topic_range(clients, topic, partition, first, end)) as records:
            head = next(records, None)
        if head is None:
            continue
        firsts.append(head.timestamp()[1])
        back = 1
        while not (tail := read_range(clients, topic, partition, max(first, end - back), end)):
            back *= 8  # the offsets before the end may be transaction markers
        lasts.append(tail[-1].timestamp()[1])
    return (min(firsts), max(lasts)) if firsts else None


def read_range(clients: KafkaClients, topic: str, partition: int, start: int, end: int) -> list[Message]:
    """The committed records of one partition in ``[start, end)``."""
    return list(read_topic_range(clients, topic, partition, start, end))


def read_topic_range(
    clients: KafkaClients, topic: str, partition: int, start: int, end: int, idle_timeout_s: float = 10.0
) -> Generator[Message]:
    """The committed records of one partition from ``start`` up to ``end`` (a last stable offset or less)."""
    consumer = clients.consumer(overrides={"enable.partition.eof": True})
    try:
        yield from _read(consumer, topic, {partition: (start, end)}, idle_timeout_s)
    finally:
        consumer.close()


def topic_counts(clients: KafkaClients, topics: list[str]) -> dict[str, int]:
    """Number of records in each topic, as a read_committed consumer sees them.

    Counted by reading: offset spans would also count transaction markers and aborted records.
    """
    return {topic: sum(1 for _ in read_topic(clients, topic)) for topic in topics}


def read_topic(
    clients: KafkaClients, topic: str, idle_timeout_s: float = 10.0, start_ms: int | None = None
) -> Generator[Message]:
    """Every record of ``topic`` present now (read_committed), in offset order within each partition.

    With ``start_ms``, each partition starts at its first record with a Kafka timestamp at or after it.
    Stops at the last stable offsets of the start; fails if neither a record nor the end arrives for
    ``idle_timeout_s``.
    """
    admin = clients.admin()
    bounds = offset_bounds(admin, topic)
    if start_ms is not None:
        starts = offsets_for_time(admin, (topic,), start_ms)
        bounds = {p: (starts[tp_name(topic, p)], end) for p, (_, end) in bounds.items()}
    consumer = clients.consumer(overrides={"enable.partition.eof": True})
    try:
        yield from _read(consumer, topic, bounds, idle_timeout_s)
    finally:
        consumer.close()


def _read(
    consumer: Consumer, topic: str, ranges: Mapping[int, tuple[int, int]], idle_timeout_s: float
) -> Generator[Message]:
    """The committed records of ``topic``'s partitions in their ``[start, end)``; done with a partition at its
    end (the first offset at or past it: a record, or the end of the log)."""
    pending = {p: end for p, (start, end) in ranges.items() if end > start}
    consumer.assign([TopicPartition(topic, p, ranges[p][0]) for p in pending])
    idle_since = time.monotonic()
    while pending:
        idle = True
        for message, at_end in consumed(consumer, 10_000, timeout=0.1):
            idle = False
            partition = message.partition() or 0
            if partition not in pending:
                continue
            if (message.offset() or 0) >= pending[partition]:
                del pending[partition]
            elif not at_end:
                yield message
        if not idle:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > idle_timeout_s:
            raise ServiceUnavailableError(
                f"Kafka delivered nothing of {topic}, partitions {sorted(pending)}, for "
                f"{idle_timeout_s:.0f} s before their end"
            )
