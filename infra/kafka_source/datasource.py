"""Kafka as a Spark source, through Spark 4's Python Data Source API (``fraud-kafka``).

Offsets per topic-partition live in Spark's checkpoint, and every micro-batch reads an exact offset range,
so a micro-batch re-run after a crash reads the same records in the same order: replayable input, the
basis of exactly-once processing. A job describes what it reads once, as a
:class:`~infra.kafka_source.config.KafkaSourceConfig`, and hands it over whole (:func:`read_stream`,
:func:`read_batch`). Supports admission control (``max_records_per_trigger``), the ``availableNow``
trigger, and starting offsets ``earliest``, ``latest`` or a timestamp (``time:<ms>``).

Event-time frontier. Besides offsets, each micro-batch's end offset records a *frontier*: an event time F
such that every record with a timestamp below F has been read, assuming each partition is written in
timestamp order (as ``fraud ingest`` does) up to ``allowed_lateness_ms`` of disorder. F is the lowest
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

A record stamped further ahead of the planner's clock than ``max_clock_skew_ms`` (a producer's bad clock,
an event dated 2099) moves no partition's progress: it would hold the frontier in the future, making every
later event late. The clock of each micro-batch is kept in its end offset (``"clock"``) and reaches the
decoder with the splits (``Split.clock_ms``), so a re-run judges such records as the first run did.

The frontier reaches the job through its decoder (:class:`~infra.kafka_source.config.Decoder`): ``decode``
turns raw records into the job's rows, and ``heartbeat``, called once per micro-batch (on one split),
returns the rows that carry the frontier (and the final mark) to every state key, so that keys without new
records still see time pass.

Planning reads, it does not ask for watermarks: Tansu, the embedded broker, reports a high watermark short of
the log end, and on Tansu a seek costs time proportional to the partition's size. The planner keeps one
read_committed consumer that is positioned once and reads on as records come (``Tail``); it knows where
each partition's records end (past transaction markers) and the timestamps the frontier needs, so planning
a micro-batch costs milliseconds. A partition that received records after the broker last reported its
end counts as possibly holding more, like one that admission control left records in. The start of a
query and of an ``availableNow`` run find each partition's first record and true end by reading
(:func:`infra.kafka_log.log_bounds`, exact on Apache Kafka too).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from contracts.errors import NotFoundError
from infra.clients import cluster_metadata
from infra.kafka_log import first_offsets, log_bounds
from infra.kafka_outage import wait_for_kafka
from infra.kafka_source.config import EARLIEST, KafkaSourceConfig, time_of
from infra.kafka_source.offsets import NO_FRONTIER, parse_tp, tp_name
from infra.kafka_source.planner import (
    DRAIN_S,
    FIRST_BATCH_MAX_RECORDS,
    READ_TIMEOUT_S,
    Tail,
    check_continuity,
    end_offset,
    frontier_moves,
    offset_for_time,
    planner_consumer,
    release_without_records,
    share,
)
from infra.kafka_source.reader import read_group
from infra.kafka_source.splits import Split, group_splits
from infra.spark_config import config_from, config_options
from infra.spark_logs import mark_worker_logs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The short name the data source is registered under.
SOURCE_NAME = "fraud-kafka"

# Imported by the Python processes Spark starts (and preloaded by its daemon): there, the project's
# warnings are marked for the driver to show (``infra.spark_logs``); elsewhere this does nothing.
mark_worker_logs()


class KafkaDataSource(DataSource):
    """``fraud-kafka``: ``spark.readStream`` reads a stream of micro-batches, ``spark.read`` a bounded range
    from ``starting_offsets`` to ``ending_offsets`` (reading the same range twice yields the same records in
    the same order). Its one option carries a :class:`KafkaSourceConfig` (:func:`source_options`)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _config(self) -> KafkaSourceConfig:
        return config_from(self.options, KafkaSourceConfig)

    def reader(self, schema: Any) -> DataSourceReader:
        return KafkaBatchReader(self._config())

    def schema(self) -> str:
        return self._config().schema

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaStreamReader(self._config())


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans offset ranges in the driver; reads them in the executors with cached consumers."""

    def __init__(self, config: KafkaSourceConfig) -> None:
        self.config = config
        self._consumer: Consumer | None = None
        self._tail: Tail | None = None
        self._target: dict[str, int] | None = None  # availableNow: do not read past these

    # -- driver side -------------------------------------------------------------------------------

    def _driver_consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = planner_consumer(self.config.kafka_config)
        return self._consumer

    def _partitions(self) -> list[tuple[str, int]]:
        consumer = self._driver_consumer()
        found = []
        for topic in self.config.topics:
            metadata = cluster_metadata(consumer, topic).topics.get(topic)
            if metadata is None or metadata.error is not None or not metadata.partitions:
                raise NotFoundError(f"topic {topic!r} does not exist; create it with `fraud topics create`")
            found += [(topic, p) for p in sorted(metadata.partitions)]
        return found

    def log_ends(self) -> dict[str, tuple[int, int]]:
        """(first offset, true end offset) of every partition, found by reading (seeks: not per batch)."""
        return log_bounds(self._driver_consumer(), self._partitions(), READ_TIMEOUT_S)

    def offsets_at(self, spec: str, bounds: dict[str, tuple[int, int]]) -> dict[str, int]:
        """Each partition's offset for an offset spec (``earliest``, ``latest``, ``time:<ms>``)."""
        at = time_of(spec)
        if at is not None:
            return {
                name: offset_for_time(self._driver_consumer(), *parse_tp(name), at, first, end)
                for name, (first, end) in bounds.items()
            }
        return {name: first if spec == EARLIEST else end for name, (first, end) in bounds.items()}

    def initialOffset(self) -> dict:
        if self.config.initial_position is not None:  # where another query's micro-batch left the source
            return dict(self.config.initial_position)
        offsets = self.offsets_at(self.config.starting_offsets, self.log_ends())
        return {"offsets": offsets, "progress": {}, "frontier": NO_FRONTIER, "read": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        """An ``availableNow`` run reads up to the log's end now, or to ``ending_offsets`` (a replay)."""
        self._target = self.offsets_at(self.config.ending_offsets, self.log_ends())

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.config.max_records_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def _following(self, start: dict) -> tuple[Tail, dict[str, int]]:
        """The tail, reading every partition from where this micro-batch starts; and those starts."""
        begin: dict[str, int] = dict(start["offsets"])
        if self._tail is None:  # the query starts (or restarts from its checkpoint): is its history there?
            check_continuity(begin, self.log_ends())
            self._tail = Tail(planner_consumer(self.config.kafka_config))
        known = set(begin) | set(self._tail.end)
        # A running query waits a broker outage out (the checks at its start fail fast instead).
        partitions = wait_for_kafka(self._partitions)
        added = [tp for tp in partitions if tp_name(*tp) not in known]
        if added:  # partitions added since the query started: from their first record
            begin.update(wait_for_kafka(lambda: self._first_offsets(added)))
        self._tail.follow(begin)
        return self._tail, begin

    def _first_offsets(self, added: list[tuple[str, int]]) -> dict[str, int]:
        consumer = self._driver_consumer()
        lows = []
        for topic, partition in added:
            low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            lows.append(TopicPartition(topic, partition, low))
        return first_offsets(consumer, lows, READ_TIMEOUT_S)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if self._tail is None and isinstance(limit, ReadMaxRows):  # a run's first micro-batch
            limit = ReadMaxRows(min(limit.max_rows, FIRST_BATCH_MAX_RECORDS))
        tail, begin = self._following(start)
        target = self._target
        enough = 2 * limit.max_rows if isinstance(limit, ReadMaxRows) else None
        tail.drain(READ_TIMEOUT_S if target is not None else DRAIN_S, target, enough)
        ends = {name: tail.end[name] for name in begin}
        if target is not None:
            ends = {name: min(end, target.get(name, begin[name])) for name, end in ends.items()}
            complete = {name for name, end in ends.items() if end >= target.get(name, begin[name])}
        else:
            complete = {name for name in ends if tail.at_end[name]}
        available = {name: max(0, ends[name] - begin[name]) for name in ends}
        chosen = dict(ends)
        if isinstance(limit, ReadMaxRows) and sum(available.values()) > limit.max_rows:
            chosen = share(begin, available, limit.max_rows)
        available_now = target is not None
        lateness_ms = self.config.allowed_lateness_ms
        heartbeats = self.config.decoder is not None
        if chosen == {name: begin[name] for name in chosen} and not (
            release_without_records(start, available_now, heartbeats)
            or (heartbeats and not available_now and frontier_moves(start, set(ends) - complete, lateness_ms))
        ):
            return start
        clock_ms = newest_ms = None  # with a skew limit: the planner's clock, the newest stamp that counts
        if self.config.max_clock_skew_ms is not None:
            clock_ms = time.time_ns() // 1_000_000
            newest_ms = clock_ms + self.config.max_clock_skew_ms
        last_read = {
            name: stamp
            for name, end in chosen.items()
            if end > begin[name] and (stamp := tail.stamp_before(name, end, newest_ms)) is not None
        }
        lagging = {name for name, end in chosen.items() if end < ends[name] or name not in complete}
        marks = start.get("copies", {})
        copies = {
            name: found
            for name, end in chosen.items()
            if (found := tail.copy_marks(name, marks.get(name, {}), end))
        }
        return end_offset(
            start, begin, chosen, lagging, last_read, lateness_ms, available_now, copies, clock_ms
        )

    def reportLatestOffset(self) -> dict | None:
        return None if self._tail is None else {"offsets": dict(self._tail.end)}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return group_splits(self.splits(start, end), self.config.read_tasks)

    def splits(self, start: dict, end: dict) -> list[Split]:
        """Each topic-partition's range from ``start`` to ``end``; the first split carries the heartbeat."""
        frontier = int(end["frontier"])
        final = bool(end.get("final", False))  # offsets from before the flag: not final
        clock_ms = end.get("clock")
        marks = start.get("copies", {})
        splits: list[Split] = []
        for name, stop in sorted(end["offsets"].items()):
            topic, partition = parse_tp(name)
            begin = int(start["offsets"].get(name, stop))
            copies = tuple((writer, int(b), int(s)) for writer, (b, s) in marks.get(name, {}).items())
            splits.append(
                Split(topic, partition, begin, int(stop), frontier, not splits, final, copies, clock_ms)
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
        return read_group(self.config, partition)


class KafkaBatchReader(DataSourceReader):
    """A bounded offset range of each partition, planned once in the driver."""

    def __init__(self, config: KafkaSourceConfig) -> None:
        self.config = config
        planner = KafkaStreamReader(config)
        try:
            bounds = planner.log_ends()
            start = planner.offsets_at(config.starting_offsets, bounds)
            end = planner.offsets_at(config.ending_offsets, bounds)
        finally:
            planner.stop()
        self.splits = [
            Split(*parse_tp(name), start[name], max(start[name], stop), NO_FRONTIER, heartbeat=False)
            for name, stop in sorted(end.items())
        ]

    def partitions(self) -> Sequence[InputPartition]:
        return group_splits(self.splits, self.config.read_tasks)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_group(self.config, partition)


def source_options(config: KafkaSourceConfig) -> dict[str, str]:
    """Options for ``.format(SOURCE_NAME).options(**...)``: the config, whole."""
    return config_options(config)


def read_stream(spark: SparkSession, config: KafkaSourceConfig) -> DataFrame:
    """The stream of what ``config`` reads (decoded rows, or raw records without a decoder)."""
    spark.dataSource.register(KafkaDataSource)
    return spark.readStream.format(SOURCE_NAME).options(**source_options(config)).load()


def read_batch(spark: SparkSession, config: KafkaSourceConfig) -> DataFrame:
    """The records from ``config.starting_offsets`` to ``config.ending_offsets``, as a bounded DataFrame."""
    spark.dataSource.register(KafkaDataSource)
    return spark.read.format(SOURCE_NAME).options(**source_options(config)).load()
