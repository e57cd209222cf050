"""Planning in the driver: where each micro-batch's offset ranges end, and its event-time frontier.

Planning reads, it does not ask for watermarks: Tansu, the embedded broker, reports a high watermark short
of the log end, and on Tansu a seek costs time proportional to the partition's size. The planner keeps one
read_committed consumer that is positioned once and reads on as records come (:class:`Tail`); it knows
where each partition's records end (past transaction markers) and the timestamps the frontier needs, so
planning a micro-batch costs milliseconds.
"""

from __future__ import annotations

import time
from array import array
from bisect import bisect_left
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from contracts.errors import ServiceUnavailableError
from contracts.provenance import CopyFilter, Provenance, WriterMarks, provenance_of
from infra.clients import KAFKA_LOGGER, TRANSACTION_TIMEOUT_MS, cluster_metadata
from infra.kafka_log import HistoryGapError, consumed
from infra.kafka_outage import KafkaUnreachableError, wait_for_kafka
from infra.kafka_source.offsets import NO_FRONTIER, parse_tp, tp_name

POLL_S = 0.05
#: How long a read waits for the records it planned. A read_committed reader cannot pass a transaction that
#: is still open, and the broker aborts a dead writer's transaction only after its timeout: wait longer.
READ_TIMEOUT_S = TRANSACTION_TIMEOUT_MS / 1000 + 60.0
#: How long the broker may hold a fetch that finds nothing new. A caught-up consumer fetches again this
#: often: at 10 ms, eight idle cached consumers cost Tansu ~40 % of a core; at 100 ms ~10 %, and a new
#: record reaches a tailing consumer ~15 ms after it was produced instead of ~5 ms.
FETCH_WAIT_MS = 100
#: How long a continuous run's planner reads new records before it plans a micro-batch with what it has.
DRAIN_S = 0.5
#: The most records the first micro-batch of a run reads, under admission control (``max_records_per_trigger``,
#: when that is larger). That batch also starts Spark's Python workers and loads the state and the model,
#: which takes most of its time; a smaller one brings the first output sooner. The pipeline's first
#: micro-batch over a month's backlog took 18.3-22.9 s with 10,000 records and 21.1-27.5 s with 100,000
#: (three pairs of runs, alternated).
FIRST_BATCH_MAX_RECORDS = 10_000


def planner_consumer(kafka_config: Mapping[str, Any]) -> Consumer:
    return Consumer(
        {
            **kafka_config,
            "group.id": "fraud-spark-source-planner",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",  # a planned offset outside the log fails the read, never skips
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            "queued.max.messages.kbytes": 16_384,  # what librdkafka fetches ahead, per partition
        },
        logger=KAFKA_LOGGER,
    )


class Tail:
    """The planner's view of the input: one consumer, positioned once, that reads on as records come.

    Planning a micro-batch therefore never seeks (on Tansu a seek costs time proportional to the
    partition's size): each call takes what arrived since the last one and learns, per partition, where
    the records end (past transaction markers) and the offset and timestamp of every record not planned
    yet, which the frontier needs.
    """

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.base: dict[str, int] = {}  # the planned position: what is kept is read from here on
        self.end: dict[str, int] = {}  # past the last record or marker read
        self.at_end: dict[str, bool] = {}  # the broker said nothing follows ``end`` (and nothing came since)
        self.reached: dict[str, bool] = {}  # the end was reached once since the partition was positioned
        self._offsets: dict[str, array[int]] = {}  # records read from the planned position on
        self._stamps: dict[str, array[int]] = {}
        self._provenance: dict[str, list[tuple[int, Provenance]]] = {}  # (offset, provenance) of the sink's

    def follow(self, begin: Mapping[str, int]) -> None:
        """Keep what is read from ``begin`` on; a partition not read up to ``begin`` (new, or a restart
        behind or ahead of it) is read again from there."""
        added: list[TopicPartition] = []
        moved: list[TopicPartition] = []
        for name, offset in begin.items():
            if name in self.base and self.base[name] <= offset <= self.end[name]:
                cut = bisect_left(self._offsets[name], offset)
                if cut:
                    self._offsets[name] = self._offsets[name][cut:]
                    self._stamps[name] = self._stamps[name][cut:]
                    provenance = self._provenance[name]
                    del provenance[: bisect_left(provenance, offset, key=lambda entry: entry[0])]
                self.base[name] = offset
                continue
            (moved if name in self.base else added).append(TopicPartition(*parse_tp(name), offset))
            self._offsets[name], self._stamps[name] = array("q"), array("q")
            self._provenance[name] = []
            self.base[name], self.end[name] = offset, offset
            self.at_end[name] = self.reached[name] = False
        if added:
            self.consumer.incremental_assign(added)
        for tp in moved:
            self.consumer.seek(tp)

    def drain(self, budget_s: float, target: Mapping[str, int] | None, enough: int | None) -> None:
        """Read what has arrived: until nothing more is waiting and every partition was read to its end
        once (or to its ``target``), ``enough`` records wait to be planned, or ``budget_s`` has passed.

        Records keep coming in a live stream: a partition that got records after its end was reported
        is not ``at_end`` when this returns, which the frontier takes into account."""
        deadline = time.monotonic() + budget_s
        timeout = 0.0
        while True:
            arrived = False
            for message, at_end in consumed(self.consumer, 100_000, timeout=timeout):
                arrived = True
                name = tp_name(message.topic() or "", message.partition() or 0)
                if at_end:
                    self.end[name] = max(self.end[name], message.offset() or 0)
                    self.at_end[name] = self.reached[name] = True
                    continue
                offset = message.offset() or 0
                self._offsets[name].append(offset)
                self._stamps[name].append(message.timestamp()[1])
                headers = message.headers()
                if headers and (provenance := provenance_of(headers)) is not None:
                    self._provenance[name].append((offset, provenance))
                self.end[name] = offset + 1
                self.at_end[name] = False
            if time.monotonic() > deadline or (
                enough is not None and sum(map(len, self._offsets.values())) >= enough
            ):
                return
            if arrived:
                timeout = 0.0
                continue
            if all(
                self.reached[name] or (target is not None and self.end[name] >= target.get(name, 0))
                for name in self.end
            ):
                return
            timeout = POLL_S

    def copy_marks(self, name: str, marks: WriterMarks, offset: int) -> WriterMarks:
        """The copy filter's marks of partition ``name`` after its records below ``offset``, given its
        ``marks`` at the planned position: what a reader's ``contracts.provenance.CopyFilter`` remembers
        after reading them."""
        copies = CopyFilter({name: marks})
        for at, provenance in self._provenance[name]:
            if at >= offset:
                break
            copies.is_copy_of(name, provenance)
        return copies.marks(name)

    def stamp_before(self, name: str, offset: int, newest_ms: int | None = None) -> int | None:
        """Timestamp of the last record below ``offset`` read since the planned position, skipping records
        stamped after ``newest_ms`` (None: none)."""
        stamps = self._stamps[name]
        index = bisect_left(self._offsets[name], offset)
        while index and newest_ms is not None and stamps[index - 1] > newest_ms:
            index -= 1
        return stamps[index - 1] if index else None


def check_continuity(begin: Mapping[str, int], bounds: Mapping[str, tuple[int, int]]) -> None:
    """Fail when a partition's next offset is outside its log: below its first record (records were
    deleted: retention, or a deletion by hand) or past its end (the topic was re-created, as the embedded
    broker's topics are on every restart). Either way continuing would skip records without a word.

    Raises:
        HistoryGapError: naming the topic, the partition and the offsets.
    """
    for name, offset in sorted(begin.items()):
        if name not in bounds:
            continue
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
                f"ends at {end}: the topic was deleted and re-created (the embedded broker keeps no topics "
                "over a restart); start over with a new checkpoint"
            )


def share(begin: dict[str, int], available: dict[str, int], budget: int) -> dict[str, int]:
    """End offsets taking ``budget`` records, shared in proportion to each partition's backlog."""
    total = sum(available.values())
    chosen = {}
    for name, count in available.items():
        take = count * budget // total
        if count and not take:
            take = 1
        chosen[name] = begin[name] + min(count, take)
    return chosen


def end_offset(
    start: dict,
    begin: dict[str, int],
    chosen: dict[str, int],
    lagging: Collection[str],
    last_read: dict[str, int],
    lateness_ms: int,
    available_now: bool,
    copies: dict[str, WriterMarks] | None = None,
    clock_ms: int | None = None,
) -> dict:
    """The end offset of a micro-batch that reads ``[begin, chosen)`` of each partition.

    Args:
        start: the micro-batch's start offset (the previous batch's end offset, or the initial one).
        begin: where each partition's range starts (``start``'s offsets, plus partitions added since).
        chosen: where each partition's range ends.
        lagging: partitions that may hold records past ``chosen`` (more were seen, or the end was not).
        last_read: timestamp of the last record of each partition the batch reads records of.
        lateness_ms: the allowed lateness.
        available_now: the query runs with the ``availableNow`` trigger.
        copies: the copy filter's marks at ``chosen``, per partition that has any (``Tail.copy_marks``).
        clock_ms: the planner's clock, for a source that keeps one (``max_clock_skew_ms``).
    """
    progress: dict[str, int] = dict(start.get("progress", {}))
    for name, stamp in last_read.items():
        progress[name] = max(progress.get(name, NO_FRONTIER), stamp)
    # The last micro-batch of an availableNow run is final: the job releases every event it holds, as
    # nothing older can come within this run (the frontier cannot say so: a partition's progress is its
    # last record read, not its newest). Its frontier drops the lateness for the same reason.
    final = available_now and not lagging
    frontier = _frontier(progress, sorted(lagging), 0 if final else lateness_ms)
    read = int(start.get("read", 0)) + sum(chosen[name] - begin[name] for name in chosen)
    end = {
        "offsets": chosen,
        "progress": progress,
        "frontier": max(int(start["frontier"]), frontier),
        "read": read,  # records read since the query started: progress reports use it
        "final": final,
    }
    if copies:  # where the next batch's readers start judging copies (contracts.provenance)
        end["copies"] = copies
    if clock_ms is not None:
        end["clock"] = clock_ms
    return end


@dataclass(frozen=True)
class Position:
    """Where the source stood at the end of a micro-batch (its end offset, as a checkpoint keeps it)."""

    #: The next offset to read of each topic-partition (``topic/partition``).
    offsets: dict[str, int]
    #: The event-time frontier (None: before any event).
    frontier_ms: int | None
    #: The batch was the final one of an ``availableNow`` run: it released every event the job held.
    final: bool

    @property
    def topics(self) -> set[str]:
        return {parse_tp(name)[0] for name in self.offsets}


def position(end: Mapping[str, Any]) -> Position:
    """Where an end offset (``end_offset``) leaves the source."""
    frontier = int(end.get("frontier", NO_FRONTIER))
    return Position(
        {name: int(offset) for name, offset in end.get("offsets", {}).items()},
        None if frontier <= NO_FRONTIER else frontier,
        bool(end.get("final", False)),
    )


def release_without_records(start: dict, available_now: bool, heartbeats: bool) -> bool:
    """Whether an ``availableNow`` run that finds no new record plans a final micro-batch anyway.

    It does when records were read before and the batch that read the last of them was not final (a
    continuous run, or a batch from before the flag existed): its heartbeats release what the job holds.
    """
    return available_now and heartbeats and bool(start.get("progress")) and not start.get("final", False)


def frontier_moves(start: dict, lagging: Collection[str], lateness_ms: int) -> bool:
    """Whether a micro-batch without records would move the frontier past ``start``'s: partitions that still
    had records coming when the last micro-batch was planned have been read to their end since. A continuous
    run then plans one, whose heartbeats release the events the job holds, rather than holding them until
    the next record arrives."""
    progress = start.get("progress") or {}
    return bool(progress) and _frontier(progress, sorted(lagging), lateness_ms) > int(start["frontier"])


def _frontier(progress: dict[str, int], lagging: list[str], lateness_ms: int) -> int:
    """Event time below which every record has been read (see the module docstring)."""
    if not progress:
        return NO_FRONTIER
    behind = [progress.get(name, NO_FRONTIER) for name in lagging]
    if behind:
        return min(behind) - lateness_ms
    return max(progress.values()) + 1 - lateness_ms


def _read_at(consumer: Consumer, at: list[TopicPartition]) -> dict[str, int]:
    """Timestamp of the record at each given offset."""
    if not at:
        return {}
    consumer.assign(at)
    wanted = {tp_name(tp.topic, tp.partition): tp.offset for tp in at}
    found: dict[str, int] = {}
    until = deadline()
    while len(found) < len(wanted):
        for message, at_end in consumed(consumer, 100_000, timeout=POLL_S):
            name = tp_name(message.topic() or "", message.partition() or 0)
            if not at_end and name not in found and (message.offset() or 0) >= wanted[name]:
                found[name] = message.timestamp()[1]
        until = check_deadline(until, set(wanted) - set(found), consumer)
    consumer.unassign()
    return found


def offset_for_time(consumer: Consumer, topic: str, partition: int, at_ms: int, first: int, end: int) -> int:
    """First offset with a timestamp >= ``at_ms``, by binary search over record timestamps.

    Assumes timestamps do not decrease within the partition (records produced in event-time order).
    Works on brokers whose time index lookups are unreliable.
    """
    low, high = first, end
    while low < high:
        middle = (low + high) // 2
        stamp = _read_at(consumer, [TopicPartition(topic, partition, middle)])[tp_name(topic, partition)]
        if stamp < at_ms:
            low = middle + 1
        else:
            high = middle
    return low


def deadline() -> float:
    """When a read that starts now must have seen its records."""
    return time.monotonic() + READ_TIMEOUT_S


def check_deadline(until: float, pending: set[str], consumer: Consumer) -> float:
    """The deadline of a read whose ``pending`` partitions are still unread: ``until``, or a new one when it
    passed while Kafka was away. Only time the broker answers counts: past the deadline, a broker that
    does not answer a metadata request is an outage, waited out (``infra.kafka_outage``); one that answers
    and still delivers nothing holds the records back.

    Raises:
        ServiceUnavailableError: the broker answers, and the records did not come by the deadline.
    """
    if not pending or time.monotonic() <= until:
        return until
    topics = sorted({parse_tp(name)[0] for name in pending})
    try:
        for topic in topics:
            cluster_metadata(consumer, topic)
    except KafkaUnreachableError:
        wait_for_kafka(lambda: [cluster_metadata(consumer, topic) for topic in topics])
        return deadline()
    raise ServiceUnavailableError(
        f"no answer from Kafka for {sorted(pending)} within {READ_TIMEOUT_S:.0f} s (longer than a "
        "writer's transaction may stay open: the planned records are not readable)"
    )
