"""Kafka as a Spark source, through Spark 4's Python Data Source API (``fraud-kafka``).

Offsets per topic-partition live in Spark's checkpoint, and every micro-batch reads an exact offset range,
so a micro-batch re-run after a crash reads the same records in the same order: replayable input, the
basis of exactly-once processing. Supports admission control (``maxRecordsPerTrigger``), the
``availableNow`` trigger, and starting offsets ``earliest``, ``latest`` or a timestamp (``time:<ms>``).

Event-time frontier. Besides offsets, each micro-batch's end offset records a *frontier*: an event time F
such that every record with a timestamp below F has been read, assuming each partition is written in
timestamp order (as ``fraud ingest`` does) up to ``allowedLatenessMs`` of disorder. F is the lowest
progress (latest record timestamp read) among partitions that still have unread records, minus the allowed
lateness; when every partition is read to its end, F is past the highest progress. Stateful jobs hold
events until the frontier passes them, then process them in event-time order, which makes the result
independent of how records were split into micro-batches. A record read with a timestamp below an
earlier batch's frontier is *late*.

The last micro-batch of an ``availableNow`` run is marked *final* (``"final": true`` in its end offset,
``Split.final``): nothing older can arrive within the run, so the job releases every event it holds. F
cannot say that by itself: progress is the timestamp of the last record read in each partition, and with
disorder the newest record read may be an earlier one. An ``availableNow`` run that finds nothing new
after a batch that was not final (a continuous run read everything) plans one micro-batch without records
that is final. Offsets written before this flag existed read as not final.

The frontier reaches the job through a decoder: option ``decoder`` names ``module:object`` with a
``schema`` (DDL string), ``decode(records, split, options)`` turning raw records (a pyarrow RecordBatch with
``topic, partition, offset, timestamp, key, value``) into output batches, and ``heartbeat(split, options)``, called
once per micro-batch (on one split), returning the rows that carry the frontier (and the final mark) to
every state key, so that keys without new records still see time pass.

Planning reads, it does not ask for watermarks: Tansu, the embedded broker, reports a high watermark short of
the log end, and on Tansu a seek costs time proportional to the partition's size. The planner keeps one
read_committed consumer that is positioned once and reads on as records come (``_Tail``); it knows where
each partition's records end (past transaction markers) and the timestamps the frontier needs, so planning
a micro-batch costs milliseconds. A partition that received records after the broker last reported its
end counts as possibly holding more, like one that admission control left records in. The start of a
query and of an ``availableNow`` run find each partition's first record and true end by reading
(:func:`infra.clients.log_bounds`, exact on Apache Kafka too).
"""

from __future__ import annotations

import importlib
import json
import time
from array import array
from bisect import bisect_left
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from infra.clients import first_offsets, log_bounds
from infra.spark_sink import DEFAULT_TRANSACTION_TIMEOUT_MS

RAW_SCHEMA = "topic string, partition int, offset long, timestamp long, key binary, value binary"
#: A frontier before any event: nothing is complete yet.
NO_FRONTIER = -(2**62)
_POLL_S = 0.05
#: How long a read waits for the records it planned. A read_committed reader cannot pass a transaction that
#: is still open, and the broker aborts a dead writer's transaction only after its timeout: wait longer.
_READ_TIMEOUT_S = DEFAULT_TRANSACTION_TIMEOUT_MS / 1000 + 60.0
#: How long the broker may hold a fetch that finds nothing new. A caught-up consumer fetches again this
#: often: at 10 ms, eight idle cached consumers cost Tansu ~40 % of a core; at 100 ms ~10 %, and a new
#: record reaches a tailing consumer ~15 ms after it was produced instead of ~5 ms.
FETCH_WAIT_MS = 100


@dataclass(frozen=True)
class Split(InputPartition):
    """One topic-partition's offset range in one micro-batch, plus the batch's frontier.

    ``final``: the last micro-batch of an ``availableNow`` run (see the module docstring).
    """

    topic: str
    partition: int
    start: int
    end: int
    frontier_ms: int
    heartbeat: bool
    final: bool = False


@dataclass(frozen=True)
class SplitGroup(InputPartition):
    """The splits one Spark task reads, one after another (option ``readTasks``)."""

    splits: tuple[Split, ...]


def group_splits(splits: Sequence[Split], tasks: int | None) -> list[SplitGroup]:
    """At most ``tasks`` groups (None: one per split). The i-th split goes to group i mod n: every
    partition of a topic lands in the same group in every micro-batch, and the groups of a topic's
    partitions (similar sizes, usually) are balanced."""
    n = len(splits) if tasks is None else max(1, min(tasks, len(splits)))
    return [SplitGroup(tuple(splits[i::n])) for i in range(n)]


class Decoder(Protocol):
    """Turns raw Kafka records into a job's input rows (see the module docstring)."""

    schema: str

    def decode(
        self, records: pa.RecordBatch, split: Split, options: dict[str, str]
    ) -> Iterator[pa.RecordBatch]: ...

    def heartbeat(self, split: Split, options: dict[str, str]) -> Iterator[pa.RecordBatch]: ...


def load_decoder(path: str) -> Decoder | None:
    """The decoder named ``module:object``; None for raw records."""
    if not path:
        return None
    module, _, name = path.partition(":")
    decoder = getattr(importlib.import_module(module), name)
    return decoder


def _tp_name(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def _parse_tp(name: str) -> tuple[str, int]:
    topic, _, partition = name.rpartition("/")
    return topic, int(partition)


class KafkaDataSource(DataSource):
    """``spark.readStream.format("fraud-kafka")`` with options:

    - ``kafka.config``: JSON object of librdkafka settings (bootstrap.servers, security.*);
    - ``topics``: comma-separated topic names;
    - ``startingOffsets``: ``earliest`` (default), ``latest`` or ``time:<epoch ms>``;
    - ``maxRecordsPerTrigger``: admission control, records per micro-batch (default: all available);
    - ``allowedLatenessMs``: disorder within a partition that still counts as on time (default 0);
    - ``decoder``: ``module:object`` turning raw records into the output rows (default: raw records);
    - ``readTasks``: Spark tasks per micro-batch, each reading its topic-partitions one after another
      (default: one per topic-partition). Every task has a fixed cost; the job's cores are enough.

    ``spark.read.format("fraud-kafka")`` reads a bounded range instead: ``startingOffsets`` as above and
    ``endingOffsets``: ``latest`` (default) or ``time:<epoch ms>`` (exclusive). Reading the same range
    twice yields the same records in the same order.
    """

    @classmethod
    def name(cls) -> str:
        return "fraud-kafka"

    def reader(self, schema: Any) -> DataSourceReader:
        return KafkaBatchReader({key.lower(): value for key, value in self.options.items()})

    def schema(self) -> str:
        decoder = load_decoder(dict(self.options).get("decoder", ""))
        return decoder.schema if decoder is not None else RAW_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaStreamReader({key.lower(): value for key, value in self.options.items()})


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans offset ranges in the driver; reads them in the executors with cached consumers."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options  # keys in lower case, as Spark treats them
        self.kafka_config: dict[str, Any] = json.loads(options["kafka.config"])
        self.topics = [t.strip() for t in options["topics"].split(",") if t.strip()]
        self.max_records = (
            int(options["maxrecordspertrigger"]) if options.get("maxrecordspertrigger") else None
        )
        self.lateness_ms = int(options.get("allowedlatenessms", "0"))
        self.starting = options.get("startingoffsets", "earliest")
        self._consumer: Consumer | None = None
        self._tail: _Tail | None = None
        self._target: dict[str, int] | None = None  # availableNow: do not read past these

    # -- driver side -------------------------------------------------------------------------------

    def _driver_consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = _planner_consumer(self.kafka_config)
        return self._consumer

    def _partitions(self) -> list[tuple[str, int]]:
        consumer = self._driver_consumer()
        found = []
        for topic in self.topics:
            metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if metadata is None or metadata.error is not None or not metadata.partitions:
                raise KafkaException(
                    KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"topic {topic!r} not found")
                )
            found += [(topic, p) for p in sorted(metadata.partitions)]
        return found

    def _log_ends(self) -> dict[str, tuple[int, int]]:
        """(first offset, true end offset) of every partition, found by reading (seeks: not per batch)."""
        return log_bounds(self._driver_consumer(), self._partitions(), _READ_TIMEOUT_S)

    def initialOffset(self) -> dict:
        bounds = self._log_ends()
        if self.starting == "earliest":
            offsets = {name: first for name, (first, _) in bounds.items()}
        elif self.starting == "latest":
            offsets = {name: end for name, (_, end) in bounds.items()}
        elif self.starting.startswith("time:"):
            at = int(self.starting.removeprefix("time:"))
            offsets = {
                name: _offset_for_time(self._driver_consumer(), *_parse_tp(name), at, first, end)
                for name, (first, end) in bounds.items()
            }
        else:
            raise ValueError(f"startingOffsets {self.starting!r}: use earliest, latest or time:<epoch ms>")
        return {"offsets": offsets, "progress": {}, "frontier": NO_FRONTIER, "read": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {name: end for name, (_, end) in self._log_ends().items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records) if self.max_records else ReadAllAvailable()

    def _following(self, start: dict) -> tuple[_Tail, dict[str, int]]:
        """The tail, reading every partition from where this micro-batch starts; and those starts."""
        begin: dict[str, int] = dict(start["offsets"])
        if self._tail is None:
            self._tail = _Tail(_planner_consumer(self.kafka_config))
        known = set(begin) | set(self._tail.end)
        added = [tp for tp in self._partitions() if _tp_name(*tp) not in known]
        if added:  # partitions added since the query started: from their first record
            consumer = self._driver_consumer()
            lows = []
            for topic, partition in added:
                low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                lows.append(TopicPartition(topic, partition, low))
            begin.update(first_offsets(consumer, lows, _READ_TIMEOUT_S))
        self._tail.follow(begin)
        return self._tail, begin

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        tail, begin = self._following(start)
        target = self._target
        enough = 2 * limit.max_rows if isinstance(limit, ReadMaxRows) else None
        tail.drain(_READ_TIMEOUT_S if target is not None else _DRAIN_S, target, enough)
        ends = {name: tail.end[name] for name in begin}
        if target is not None:
            ends = {name: min(end, target.get(name, begin[name])) for name, end in ends.items()}
            complete = {name for name, end in ends.items() if end >= target.get(name, begin[name])}
        else:
            complete = {name for name in ends if tail.at_end[name]}
        available = {name: max(0, ends[name] - begin[name]) for name in ends}
        chosen = dict(ends)
        if isinstance(limit, ReadMaxRows) and sum(available.values()) > limit.max_rows:
            chosen = _share(begin, available, limit.max_rows)
        available_now = target is not None
        if chosen == {name: begin[name] for name in chosen} and not _release_without_records(
            start, available_now, bool(self.options.get("decoder"))
        ):
            return start
        last_read = {
            name: stamp
            for name, end in chosen.items()
            if end > begin[name] and (stamp := tail.stamp_before(name, end)) is not None
        }
        lagging = {name for name, end in chosen.items() if end < ends[name] or name not in complete}
        return _end_offset(start, begin, chosen, lagging, last_read, self.lateness_ms, available_now)

    def reportLatestOffset(self) -> dict | None:
        return None if self._tail is None else {"offsets": dict(self._tail.end)}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return group_splits(self.splits(start, end), _read_tasks(self.options))

    def splits(self, start: dict, end: dict) -> list[Split]:
        """Each topic-partition's range from ``start`` to ``end``; the first split carries the heartbeat."""
        frontier = int(end["frontier"])
        final = bool(end.get("final", False))  # offsets from before the flag: not final
        splits: list[Split] = []
        for name, stop in sorted(end["offsets"].items()):
            topic, partition = _parse_tp(name)
            begin = int(start["offsets"].get(name, stop))
            splits.append(
                Split(topic, partition, begin, int(stop), frontier, heartbeat=not splits, final=final)
            )
        return splits

    def commit(self, end: dict) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, not in Kafka."""

    def stop(self) -> None:
        if self._tail is not None:
            self._tail.consumer.close()
            self._tail = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # -- executor side -----------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_group(self.kafka_config, partition, self.options)


class KafkaBatchReader(DataSourceReader):
    """A bounded offset range of each partition, planned once in the driver."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        planner = KafkaStreamReader(options)
        try:
            start: dict[str, int] = planner.initialOffset()["offsets"]
            ending = options.get("endingoffsets", "latest")
            if ending == "latest":
                end = {name: stop for name, (_, stop) in planner._log_ends().items()}
            elif ending.startswith("time:"):
                at = int(ending.removeprefix("time:"))
                end = {
                    name: _offset_for_time(planner._driver_consumer(), *_parse_tp(name), at, first, stop)
                    for name, (first, stop) in planner._log_ends().items()
                }
            else:
                raise ValueError(f"endingOffsets {ending!r}: use latest or time:<epoch ms>")
        finally:
            planner.stop()
        self.splits = [
            Split(*_parse_tp(name), start[name], max(start[name], stop), NO_FRONTIER, heartbeat=False)
            for name, stop in sorted(end.items())
        ]

    def partitions(self) -> Sequence[InputPartition]:
        return group_splits(self.splits, _read_tasks(self.options))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_group(json.loads(self.options["kafka.config"]), partition, self.options)


def _read_group(
    kafka_config: dict[str, Any], group: InputPartition, options: dict[str, str]
) -> Iterator[pa.RecordBatch]:
    """The records of a task's splits, decoded when the options name a decoder, plus the heartbeat."""
    if not isinstance(group, SplitGroup):
        raise TypeError(f"unexpected input partition {group!r}")
    decoder = load_decoder(options.get("decoder", ""))
    for split in group.splits:
        for records in _read_range(kafka_config, split):
            if decoder is None:
                yield records
            else:
                yield from decoder.decode(records, split, options)
        if decoder is not None and split.heartbeat:
            yield from decoder.heartbeat(split, options)


def _read_tasks(options: dict[str, str]) -> int | None:
    value = options.get("readtasks")
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"readTasks {value!r}: a positive number of tasks")
    return int(value)


#: How long a continuous run's planner reads new records before it plans a micro-batch with what it has.
_DRAIN_S = 0.5


def _planner_consumer(kafka_config: dict[str, Any]) -> Consumer:
    return Consumer(
        {
            **kafka_config,
            "group.id": "fraud-spark-source-planner",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            "queued.max.messages.kbytes": 16_384,  # what librdkafka fetches ahead, per partition
        }
    )


class _Tail:
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
                self.base[name] = offset
                continue
            (moved if name in self.base else added).append(TopicPartition(*_parse_tp(name), offset))
            self._offsets[name], self._stamps[name] = array("q"), array("q")
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
            messages = self.consumer.consume(100_000, timeout=timeout)
            for message in messages:
                name = _tp_name(message.topic() or "", message.partition() or 0)
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(error)
                    self.end[name] = max(self.end[name], message.offset() or 0)
                    self.at_end[name] = self.reached[name] = True
                    continue
                offset = message.offset() or 0
                self._offsets[name].append(offset)
                self._stamps[name].append(message.timestamp()[1])
                self.end[name] = offset + 1
                self.at_end[name] = False
            if time.monotonic() > deadline or (
                enough is not None and sum(map(len, self._offsets.values())) >= enough
            ):
                return
            if messages:
                timeout = 0.0
                continue
            if all(
                self.reached[name] or (target is not None and self.end[name] >= target.get(name, 0))
                for name in self.end
            ):
                return
            timeout = _POLL_S

    def stamp_before(self, name: str, offset: int) -> int | None:
        """Timestamp of the last record below ``offset`` read since the planned position (None: none)."""
        index = bisect_left(self._offsets[name], offset)
        return self._stamps[name][index - 1] if index else None


def _share(begin: dict[str, int], available: dict[str, int], budget: int) -> dict[str, int]:
    """End offsets taking ``budget`` records, shared in proportion to each partition's backlog."""
    total = sum(available.values())
    chosen = {}
    for name, count in available.items():
        take = count * budget // total
        if count and not take:
            take = 1
        chosen[name] = begin[name] + min(count, take)
    return chosen


def _end_offset(
    start: dict,
    begin: dict[str, int],
    chosen: dict[str, int],
    lagging: Collection[str],
    last_read: dict[str, int],
    lateness_ms: int,
    available_now: bool,
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
    return {
        "offsets": chosen,
        "progress": progress,
        "frontier": max(int(start["frontier"]), frontier),
        "read": read,  # records read since the query started: progress reports use it
        "final": final,
    }


def _release_without_records(start: dict, available_now: bool, heartbeats: bool) -> bool:
    """Whether an ``availableNow`` run that finds no new record plans a final micro-batch anyway.

    It does when records were read before and the batch that read the last of them was not final (a
    continuous run, or a batch from before the flag existed): its heartbeats release what the job holds.
    """
    return available_now and heartbeats and bool(start.get("progress")) and not start.get("final", False)


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
    wanted = {_tp_name(tp.topic, tp.partition): tp.offset for tp in at}
    found: dict[str, int] = {}
    deadline = _deadline()
    while len(found) < len(wanted):
        for message in consumer.consume(100_000, timeout=_POLL_S):
            name = _tp_name(message.topic() or "", message.partition() or 0)
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                continue
            if name not in found and (message.offset() or 0) >= wanted[name]:
                found[name] = message.timestamp()[1]
        _check(deadline, set(wanted) - set(found))
    consumer.unassign()
    return found


def _offset_for_time(consumer: Consumer, topic: str, partition: int, at_ms: int, first: int, end: int) -> int:
    """First offset with a timestamp >= ``at_ms``, by binary search over record timestamps.

    Assumes timestamps do not decrease within the partition (records produced in event-time order).
    Works on brokers whose time index lookups are unreliable.
    """
    low, high = first, end
    while low < high:
        middle = (low + high) // 2
        stamp = _read_at(consumer, [TopicPartition(topic, partition, middle)])[_tp_name(topic, partition)]
        if stamp < at_ms:
            low = middle + 1
        else:
            high = middle
    return low


def _deadline() -> float:
    return time.monotonic() + _READ_TIMEOUT_S


def _check(deadline: float, pending: set[str]) -> None:
    if pending and time.monotonic() > deadline:
        raise TimeoutError(
            f"no answer from Kafka for {sorted(pending)} within {_READ_TIMEOUT_S:.0f} s (longer than a "
            "writer's transaction may stay open: the planned records are not readable)"
        )


# Executors keep one consumer per topic-partition per Python worker, paused, with the records it fetched past
# the last range's end: the next micro-batch usually continues there, without re-reading from the range's start.
_Record = tuple[int, int, bytes | None, bytes | None]  # offset, timestamp, key, value
_CONSUMERS: dict[tuple[str, str, int], tuple[Consumer, int, list[_Record]]] = {}
_RAW_FIELDS = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)
_BATCH_ROWS = 20_000


def _source_consumer(kafka_config: dict[str, Any], split: Split) -> tuple[Consumer, list[_Record]]:
    """A consumer positioned at ``split.start`` (cached one when it is there), with records already fetched."""
    cache_key = (json.dumps(kafka_config, sort_keys=True), split.topic, split.partition)
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
            "fetch.wait.max.ms": FETCH_WAIT_MS,
        }
    )
    consumer.assign([TopicPartition(split.topic, split.partition, split.start)])
    return consumer, []


def _read_range(kafka_config: dict[str, Any], split: Split) -> Iterator[pa.RecordBatch]:
    """Records [start, end) of one partition as Arrow batches, in offset order."""
    if split.end <= split.start:
        return
    consumer, pending = _source_consumer(kafka_config, split)
    tp = TopicPartition(split.topic, split.partition)
    position = split.start
    chunk: list[_Record] = []
    deadline = _deadline()
    while position < split.end:
        if not pending:
            # consume() waits until it has as many messages as asked for, or the timeout: ask for the
            # range's rest, so that a range whose records are all there costs no wait.
            wanted = min(_BATCH_ROWS, split.end - position)
            for message in consumer.consume(wanted, timeout=_POLL_S):
                error = message.error()
                if error is None:
                    pending.append(
                        (message.offset() or 0, message.timestamp()[1], message.key(), message.value())
                    )
                elif error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
            if pending:
                deadline = _deadline()
            else:
                # Transaction markers take offsets but are never delivered: the consumer's position passes
                # them. Ask it every time, not only at the end-of-partition event, which comes once: a
                # cached consumer may have reached the log end while reading the previous range.
                position = max(position, consumer.position([tp])[0].offset)
        taken = 0
        for record in pending:
            if record[0] >= split.end:
                break
            chunk.append(record)
            position = max(position, record[0] + 1)
            taken += 1
        pending = pending[taken:]
        if pending and pending[0][0] >= split.end:
            position = split.end
        if len(chunk) >= _BATCH_ROWS:
            yield _records(split, chunk)
            chunk = []
        _check(deadline, {_tp_name(split.topic, split.partition)} if position < split.end else set())
    if chunk:
        yield _records(split, chunk)
    # Paused until the next range: a cached consumer that fetched on would cost the broker a fetch every
    # FETCH_WAIT_MS, and the workers together keep many (one per partition each, most of them stale).
    consumer.pause([tp])
    cache_key = (json.dumps(kafka_config, sort_keys=True), split.topic, split.partition)
    _CONSUMERS[cache_key] = (consumer, split.end, pending)


def _records(split: Split, chunk: list[_Record]) -> pa.RecordBatch:
    offsets, stamps, keys, values = zip(*chunk, strict=True)
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
        schema=_RAW_FIELDS,
    )
