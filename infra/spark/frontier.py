"""The event-time frontier of a job's Kafka input: a streaming source that runs beside Spark's Kafka connector.

Stateful jobs hold events until a *frontier* passes them, then process them in event-time order, which makes
their result independent of how the records were cut into micro-batches. The frontier F is an event time
below which every record has been read, assuming each partition is written in timestamp order (as ``fraud
ingest`` does) up to ``allowed_lateness_ms`` of disorder: the lowest *progress* (the timestamp of the last
record read) among partitions that still hold unread records, minus the allowed lateness; when every
partition has been read to its end, F is past the highest progress. A record read later with a timestamp
below F is *late*.

Spark's connector reads the records, and keeps each micro-batch's offsets in the query's offset log; it does
not say how far event time has come. This source does, one micro-batch behind the records: when Spark plans
micro-batch N, it reads where the connector's last micro-batch left each partition (the offset log's newest
entry), the timestamp of the last record read there (a short read back from that offset), and each
partition's last stable offset now (a partition read short of it still holds records), and computes F from
them. Its offset (:class:`Frontier`) keeps F and the progress, in the offset log like the connector's, so a
micro-batch re-run after a crash sees the frontier its first run saw. When F moves, the micro-batch reads
this source's one partition, whose rows carry F to every state key (the job's :class:`Ticker`): keys
without new records see time pass too. The events a micro-batch reads are thus released in the next one,
which Spark starts at once (this source has new data).

The last micro-batch of an ``availableNow`` run (``fraud ... run --once``) is marked *final*: nothing older
can arrive within the run, so the job releases every event it holds. The connector's run ends when it stops
advancing (its end was fixed when the run started), which this source sees as a micro-batch of the run in
which the connector's offsets did not move; the next micro-batch is the final one. A run of a range
(``ending_offsets``) is final once every partition has reached its end. A run's first micro-batch always
carries ticks, so that a run which finds nothing new still gets to its final micro-batch and releases what
an earlier continuous run left waiting.

A record stamped further ahead of its micro-batch's clock (Spark's batch timestamp) than
``max_clock_skew_ms`` moves no partition's progress (the job dead-letters it): it would hold the frontier in
the future, making every later event late. When the records since the last frontier were read by several
micro-batches, the first one's clock judges them all (a record a later clock let through then waits for the
next frontier: never ahead of the job).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

from contracts.errors import ConfigError
from infra.kafka.connection import KAFKA_LOGGER
from infra.kafka.log import check_deadline, consumed, list_offsets, partitions_of
from infra.kafka.offsets import NO_FRONTIER, parse_tp, tp_name
from infra.kafka.outage import wait_for_kafka
from infra.spark.checkpoint import newest_batch
from infra.spark.config import config_from, config_options
from infra.spark.kafka_source import new_admin
from infra.spark.logs import mark_worker_logs
from infra.spark.offset_log import (
    Frontier,
    LoggedBatch,
    first_logged_from,
    is_frontier,
    logged_batch,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The short name the data source is registered under.
SOURCE_NAME = "fraud-frontier"
#: How long a read back for progress waits for the records it knows are there (they are committed: the
#: connector read them), counting only the time the broker answers.
READ_TIMEOUT_S = 60.0
#: Records read back from where the connector stopped, at first, to find the last one's timestamp; more
#: (eight times as many each time) when those are all stamped in the future or are transaction markers.
READ_BACK = 64

mark_worker_logs()


class Ticker(Protocol):
    """Turns a frontier into rows for every state key of the job (an importable, module-level class)."""

    @property
    def schema(self) -> str:
        """The Spark DDL of its rows."""
        ...

    def ticks(self, frontier_ms: int, final: bool) -> pa.RecordBatch:
        """The rows that carry ``frontier_ms`` (and the final mark) to every state key."""
        ...


@dataclass(frozen=True)
class FrontierConfig:
    """What the frontier is computed over.

    Args:
        kafka_config: librdkafka's connection and security options.
        topics: the topics the job reads with the connector.
        query_dir: the query's checkpoint location, whose offset log holds the connector's offsets.
        ticker: makes the rows that carry the frontier.
        allowed_lateness_ms: disorder within a partition that still counts as on time.
        max_clock_skew_ms: records stamped further ahead of their micro-batch's clock than this move no
            progress (None: no limit).
        ending_offsets: a range's end, per partition (``topic/partition``): the run is final once the
            connector has reached every one; partitions it does not name are not read.
        initial: where a new query starts instead of nothing read: another query's frontier (a savepoint's).
    """

    kafka_config: Mapping[str, Any] = field(repr=False)
    topics: tuple[str, ...]
    query_dir: str
    ticker: Ticker = field(compare=False)
    allowed_lateness_ms: int = 0
    max_clock_skew_ms: int | None = None
    ending_offsets: Mapping[str, int] | None = None
    initial: Frontier | None = None

    def __post_init__(self) -> None:
        if self.allowed_lateness_ms < 0:
            raise ConfigError("allowed_lateness_ms must not be negative")
        if self.max_clock_skew_ms is not None and self.max_clock_skew_ms < 0:
            raise ConfigError("max_clock_skew_ms must not be negative")


def frontier_of(progress: Mapping[str, int], lagging: Sequence[str], lateness_ms: int) -> int:
    """Event time below which every record has been read (see the module docstring)."""
    if not progress:
        return NO_FRONTIER
    behind = [progress.get(name, NO_FRONTIER) for name in lagging]
    if behind:
        return min(behind) - lateness_ms
    return max(progress.values()) + 1 - lateness_ms


def next_frontier(
    start: Frontier,
    batch: int,
    ends: Mapping[str, int],
    stamps: Mapping[str, int],
    lagging: Sequence[str],
    lateness_ms: int,
    *,
    final: bool = False,
    first_of_run: bool = False,
) -> Frontier | None:
    """The frontier after ``start`` once the connector has read up to ``ends``, or None when it does not
    change (the micro-batch then reads no ticks).

    Args:
        start: the frontier planned last.
        batch: the micro-batch of the offset log that ``ends`` are from.
        ends: the connector's next offset of each partition.
        stamps: the timestamp of the last record read of each partition since ``start`` (the partitions
            that had one).
        lagging: the partitions that hold records past ``ends``.
        lateness_ms: the allowed lateness.
        final: the micro-batch is the last of an ``availableNow`` run.
        first_of_run: the first micro-batch of an ``availableNow`` run, which always carries ticks: a run
            that finds nothing new then gets to its final micro-batch.
    """
    progress = dict(start.progress)
    for name, stamp in stamps.items():
        progress[name] = max(progress.get(name, NO_FRONTIER), stamp)
    frontier = max(start.frontier_ms, frontier_of(progress, lagging, lateness_ms))
    probe = first_of_run and bool(start.progress) and not start.final
    if frontier == start.frontier_ms and final == start.final and not probe:
        return None
    return Frontier(dict(ends), progress, frontier, final, start.planned + 1, batch)


# --- the source ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TickSplit(InputPartition):
    """The one partition of a micro-batch that carries a new frontier."""

    frontier_ms: int
    final: bool


class FrontierDataSource(DataSource):
    """``fraud-frontier``: a stream of tick rows, one set per new frontier. Its one option carries a
    :class:`FrontierConfig` (``infra.spark.config``)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _config(self) -> FrontierConfig:
        return config_from(self.options, FrontierConfig)

    def schema(self) -> str:
        return self._config().ticker.schema

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return FrontierReader(self._config())


class FrontierReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans frontiers in the driver (:meth:`plan`); its partition's reader yields the ticks."""

    def __init__(self, config: FrontierConfig) -> None:
        self.config = config
        self.query_dir = Path(config.query_dir)
        self._admin: AdminClient | None = None
        self._consumer: Consumer | None = None
        #: availableNow: the newest micro-batch before the run (-1: none).
        self._run_start: int | None = None
        #: The newest micro-batch when the last plan found the frontier unchanged: until the connector reads
        #: on, it stays so (the partitions' ends only grow, which holds the frontier back, never forward).
        self._idle_at: int | None = None

    # -- driver side -------------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        return (self.config.initial or Frontier()).as_json()

    def prepareForTriggerAvailableNow(self) -> None:
        newest = newest_batch(self.query_dir)
        self._run_start = -1 if newest is None else newest

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        planned = wait_for_kafka(lambda: self.plan(Frontier.of_json(start)))
        return start if planned is None else planned.as_json()

    def plan(self, start: Frontier) -> Frontier | None:
        """The frontier of the micro-batch being planned, or None when it would not change."""
        newest = newest_batch(self.query_dir)
        if newest is not None and newest == self._idle_at:
            return None
        planned = self._plan(start, newest)
        self._idle_at = newest if planned is None else None
        return planned

    def _plan(self, start: Frontier, newest: int | None) -> Frontier | None:
        admin = self._admin_client()
        logged = None if newest is None else logged_batch(self.query_dir, newest, self.config.topics)
        ends = dict(start.kafka) if logged is None else logged.kafka
        ending = self.config.ending_offsets
        if ending is not None:
            ends = {name: min(end, ending.get(name, end)) for name, end in ends.items()}
        newest_ms = None
        if logged is not None and self.config.max_clock_skew_ms is not None:
            # The clock of the first micro-batch since the last frontier: the records read since were each
            # judged by their own micro-batch's clock, this one's or a later one's.
            first = first_logged_from(self.query_dir, start.batch + 1)
            clock = logged.timestamp_ms if first is None else self._clock_of(first)
            newest_ms = clock + self.config.max_clock_skew_ms
        read_from = {
            name: start.kafka.get(name, 0) for name, end in ends.items() if end > start.kafka.get(name, 0)
        }
        stamps = self.last_stamps(read_from, ends, newest_ms)
        if ending is not None:
            lagging = sorted(name for name, end in ending.items() if ends.get(name, 0) < end)
        else:
            partitions = [(topic, p) for topic in self.config.topics for p in partitions_of(admin, topic)]
            stable = list_offsets(admin, partitions, OffsetSpec.latest())
            lagging = sorted(name for name, end in stable.items() if ends.get(name, 0) < end)
        available_now = self._run_start is not None
        return next_frontier(
            start,
            newest if newest is not None else start.batch,
            ends,
            stamps,
            lagging,
            self.config.allowed_lateness_ms,
            final=available_now and ((ending is not None and not lagging) or self._stalled(newest, logged)),
            first_of_run=available_now and newest == self._run_start,
        )

    def _clock_of(self, batch: int) -> int:
        return logged_batch(self.query_dir, batch, self.config.topics).timestamp_ms

    def _stalled(self, newest: int | None, logged: LoggedBatch | None) -> bool:
        """Whether the connector did not move in the newest micro-batch, which this ``availableNow`` run
        planned: it has reached the end its run fixed."""
        if self._run_start is None or newest is None or logged is None or newest <= self._run_start:
            return False
        before = logged_batch(self.query_dir, newest - 1, self.config.topics).kafka if newest > 0 else {}
        return logged.kafka == before

    def last_stamps(
        self, read_from: Mapping[str, int], ends: Mapping[str, int], newest_ms: int | None
    ) -> dict[str, int]:
        """The timestamp of the last record before ``ends`` of each partition of ``read_from``, not before
        its offset there (skipping records stamped after ``newest_ms``); partitions without one are left out."""
        found: dict[str, int] = {}
        window = READ_BACK
        pending = dict(read_from)
        while pending:
            ranges = {name: (max(low, ends[name] - window), ends[name]) for name, low in pending.items()}
            for name, stamps in self._read(ranges).items():
                stamp = next((s for s in reversed(stamps) if newest_ms is None or s <= newest_ms), None)
                if stamp is not None:
                    found[name] = stamp
            pending = {
                name: low for name, low in pending.items() if name not in found and ranges[name][0] > low
            }
            window *= 8
        return found

    def _read(self, ranges: Mapping[str, tuple[int, int]]) -> dict[str, list[int]]:
        """The timestamps of the committed records in each partition's ``[begin, end)``, in offset order."""
        consumer = self._reader()
        consumer.assign([TopicPartition(*parse_tp(name), begin) for name, (begin, _) in ranges.items()])
        stamps: dict[str, list[int]] = {name: [] for name in ranges}
        pending = {name for name, (begin, end) in ranges.items() if end > begin}
        until = time.monotonic() + READ_TIMEOUT_S
        while pending:
            for message, at_end in consumed(consumer, 10_000, timeout=0.1):
                name = tp_name(message.topic() or "", message.partition() or 0)
                if name not in pending:
                    continue
                offset = message.offset() or 0
                end = ranges[name][1]
                if not at_end and offset < end:
                    stamps[name].append(message.timestamp()[1])
                if at_end or offset >= end - 1:
                    pending.discard(name)
            until = check_deadline(until, pending, consumer, READ_TIMEOUT_S)
        consumer.unassign()
        return stamps

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = new_admin(self.config.kafka_config)
        return self._admin

    def _reader(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(
                {
                    **self.config.kafka_config,
                    "group.id": "fraud-frontier",
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "isolation.level": "read_committed",
                    # Reads back below offsets the connector read: a start below the log's (retention) reads
                    # from its first record.
                    "auto.offset.reset": "earliest",
                    # A read ends at a known offset, often the log's end: no wait for records to come.
                    "fetch.wait.max.ms": 10,
                },
                logger=KAFKA_LOGGER,
            )
        return self._consumer

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if start == end:
            return []
        frontier = Frontier.of_json(end)
        return [TickSplit(frontier.frontier_ms, frontier.final)]

    def commit(self, end: dict) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint."""

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # -- executor side -----------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, TickSplit):
            yield self.config.ticker.ticks(partition.frontier_ms, partition.final)


def read_frontier(spark: SparkSession, config: FrontierConfig) -> DataFrame:
    """The stream of ``config``'s tick rows."""
    spark.dataSource.register(FrontierDataSource)
    return spark.readStream.format(SOURCE_NAME).options(**config_options(config)).load()


def final_in(progress: Mapping[str, Any]) -> bool:
    """Whether a query's progress report (``StreamingQuery.lastProgress``) is of a final micro-batch: one
    whose frontier source's end offset is marked final."""
    for source in progress.get("sources", ()):
        end = source.get("endOffset")
        if isinstance(end, str):
            try:
                end = json.loads(end)
            except ValueError:
                continue
        if is_frontier(end) and end.get("final"):
            return True
    return False
