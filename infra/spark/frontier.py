"""The event-time frontier of a job's Kafka input: a streaming source that runs beside Spark's Kafka connector.

Stateful jobs hold events until a *frontier* passes them, then process them in event-time order, which makes
their result independent of how the records were cut into micro-batches. The frontier F is an event time
below which every record has been read, assuming each partition is written in timestamp order (as ``fraud
ingest`` does) up to ``allowed_lateness_ms`` of disorder: the lowest *progress* (the timestamp of the last
record read) among partitions that still hold unread records, minus the allowed lateness; when every
partition has been read to its end, F is past the highest progress. A record read later with a timestamp
below F is *late*.

Spark's connector reads the records, and keeps each micro-batch's offsets in the query's offset log; it does
not say how far event time has come. This source does, in the same micro-batch as the records. Spark plans a
micro-batch in two steps: it asks every source for its end offset (``latestOffset``: the connector first, the
sources in the query's order), writes them all to the offset log's entry for the batch, and only then asks
each source for the input partitions of its range (``partitions``, still on the driver). So this source's
offset (:class:`FrontierPlan`) only fixes what its frontier is computed from: the frontier before the batch,
each partition's last stable offset taken after the connector's end (a partition the connector's end leaves
short of it still holds records: a record written in between holds the frontier back, never forward), and
whether an ``availableNow`` run planned it. Its partitions then read the connector's offsets of the same
batch from the offset log, the timestamp of the last record read in each partition (a short read back from
that offset), and compute F. Everything they read is fixed once the offset log's entry is written (Kafka's
records do not change), so a micro-batch re-run after a crash computes the frontier its first attempt did.
When F moves, the micro-batch reads this source's one partition, whose rows carry F to every state key (the
job's :class:`Ticker`): keys without new records see time pass too. The events a micro-batch reads are thus
released by the same micro-batch, up to the lateness and the partitions read short of their end. The source
moves its offset in every micro-batch the connector may read records in (a partition's last stable offset
past the connector's newest offsets, or a micro-batch ran that it did not plan), and only then, so an idle
input runs no micro-batch.

The frontier each micro-batch computed is kept beside the query (``infra.spark.offset_log.FRONTIER_FILE``), for
whoever reads a checkpoint: savepoints, the state inspection, the metrics, the end of a run of a range
(:func:`final_in`). The next micro-batch's offset starts from it.

The last micro-batch of an ``availableNow`` run (``fraud ... run --once``) is marked *final*: nothing older
can arrive within the run, so the job releases every event it holds. The connector's run ends when it stops
advancing (its end was fixed when the run started): a micro-batch of the run in which the connector's
offsets did not move is final. So the run plans micro-batches until one is final, even when the connector
finds nothing new (what an earlier continuous run left waiting is then released), except when the frontier
it starts from is final and nothing was written since. A run of a range (``ending_offsets``) is final once
every partition has reached its end.

A record stamped further ahead of its micro-batch's clock (Spark's batch timestamp) than
``max_clock_skew_ms`` moves no partition's progress (the job dead-letters it): it would hold the frontier in
the future, making every later event late. When the records since the last frontier were read by several
micro-batches, the first one's clock judges them all (a record a later clock let through then waits for the
next frontier: never ahead of the job).

Checkpoints of the earlier version of this source, whose offset was the frontier itself (computed a
micro-batch behind the records), resume: such an offset is taken as the frontier it holds.
"""

from __future__ import annotations

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

from contracts.errors import ConfigError, StateError
from infra.kafka.connection import KAFKA_LOGGER
from infra.kafka.log import check_deadline, consumed, list_offsets, partitions_of
from infra.kafka.offsets import NO_FRONTIER, parse_tp, tp_name
from infra.kafka.outage import wait_for_kafka
from infra.spark.checkpoint import newest_batch
from infra.spark.config import config_from, config_options
from infra.spark.internals import CHECKED_ON
from infra.spark.kafka_source import new_admin
from infra.spark.logs import mark_worker_logs
from infra.spark.offset_log import (
    Frontier,
    FrontierPlan,
    first_logged_from,
    is_plan,
    logged_batch,
    logged_offsets,
    planned_frontiers,
    record_frontier,
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


def frontier_of(progress: Mapping[str, int], lagging: Sequence[str], allowed_lateness_ms: int) -> int:
    """Event time below which every record has been read (see the module docstring)."""
    if not progress:
        return NO_FRONTIER
    behind = [progress.get(name, NO_FRONTIER) for name in lagging]
    if behind:
        return min(behind) - allowed_lateness_ms
    return max(progress.values()) + 1 - allowed_lateness_ms


def next_frontier(
    start: Frontier,
    batch: int,
    ends: Mapping[str, int],
    stamps: Mapping[str, int],
    lagging: Sequence[str],
    allowed_lateness_ms: int,
    *,
    final: bool = False,
) -> Frontier | None:
    """The frontier after ``start`` once the connector has read up to ``ends``, or None when it does not
    change (the micro-batch then reads no ticks).

    Args:
        start: the frontier before the micro-batch.
        batch: the micro-batch of the offset log that ``ends`` are from.
        ends: the connector's next offset of each partition.
        stamps: the timestamp of the last record read of each partition since ``start`` (the partitions
            that had one).
        lagging: the partitions that hold records past ``ends``.
        allowed_lateness_ms: the allowed lateness.
        final: the micro-batch is the last of an ``availableNow`` run.
    """
    progress = dict(start.progress)
    for name, stamp in stamps.items():
        progress[name] = max(progress.get(name, NO_FRONTIER), stamp)
    frontier = max(start.frontier_ms, frontier_of(progress, lagging, allowed_lateness_ms))
    if frontier == start.frontier_ms and final == start.final:
        return None
    return Frontier(dict(ends), progress, frontier, final, start.planned + 1, batch)


def plans_a_batch(fresh: bool, available_now: bool, after_final: bool, final_planned: bool) -> bool:
    """Whether the source moves its offset for the micro-batch Spark plans, which then reads its partition.

    Args:
        fresh: a partition's last stable offset is past the connector's newest offsets (it may read records).
        available_now: an ``availableNow`` run plans the micro-batch.
        after_final: the frontier before the micro-batch is final (it released every event held).
        final_planned: the run has planned its final micro-batch.
    """
    if not available_now:
        return fresh
    return not final_planned and (fresh or not after_final)


def planned_for(offset: Mapping[str, Any]) -> int:
    """The micro-batch this source's ``offset`` was planned for (-1: a query's start, or an earlier version's
    offset)."""
    return FrontierPlan.of_json(offset).batch if is_plan(offset) else -1


def cut_to(offsets: Mapping[str, int], ending: Mapping[str, int] | None) -> dict[str, int]:
    """The connector's ``offsets`` cut back to a range's end (as they are without one)."""
    if ending is None:
        return dict(offsets)
    return {name: min(end, ending.get(name, end)) for name, end in offsets.items()}


def lagging_of(ends: Mapping[str, int], plan: FrontierPlan) -> list[str]:
    """The partitions that hold records past the connector's ``ends``: short of the range's end, or of their
    last stable offset when the micro-batch was planned."""
    limits = plan.ending if plan.ending is not None else plan.stable
    return sorted(name for name, end in limits.items() if ends.get(name, 0) < end)


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
    """Plans in the driver: its offset in :meth:`plan`, the frontier in :meth:`partitions` (once the offset
    log holds the connector's offsets of the batch); its partition's reader yields the ticks."""

    def __init__(self, config: FrontierConfig) -> None:
        self.config = config
        self.query_dir = Path(config.query_dir)
        self._admin: AdminClient | None = None
        self._consumer: Consumer | None = None
        #: availableNow: the newest micro-batch before the run (-1: none); None: a run without end.
        self._run_start: int | None = None
        #: The availableNow run has planned its final micro-batch: it plans no more.
        self._final_planned = False
        #: The last plan whose frontier was computed, with that frontier: the next plan starts from it.
        self._computed: tuple[FrontierPlan, Frontier] | None = None

    # -- driver side -------------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        return FrontierPlan(self.config.initial or Frontier()).as_json()

    def prepareForTriggerAvailableNow(self) -> None:
        newest = newest_batch(self.query_dir)
        self._run_start = -1 if newest is None else newest

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        planned = wait_for_kafka(lambda: self.plan(start))
        return start if planned is None else planned.as_json()

    def plan(self, start: Mapping[str, Any]) -> FrontierPlan | None:
        """The offset of the micro-batch being planned (``start``: the last one's), or None when the
        connector has nothing to read and no final micro-batch is due."""
        newest = newest_batch(self.query_dir)
        after = self.frontier_after(start)
        ending = self.config.ending_offsets
        stable = {} if ending is not None else self.stable_offsets()
        limits = ending if ending is not None else stable
        if newest is None or newest > planned_for(start):
            # A micro-batch ran that this source did not plan (none here yet: the connector is asked for its
            # end first): the records it read wait for a frontier.
            fresh = True
        else:
            read = logged_batch(self.query_dir, newest, self.config.topics).kafka
            fresh = any(end > read.get(name, 0) for name, end in limits.items())
        available_now = self._run_start is not None
        if not plans_a_batch(fresh, available_now, after.final, self._final_planned):
            return None
        batch = 0 if newest is None else newest + 1
        return FrontierPlan(after, batch, stable, None if ending is None else dict(ending), available_now)

    def frontier_after(self, offset: Mapping[str, Any]) -> Frontier:
        """The frontier after the micro-batch whose offset this source's is ``offset``."""
        if not is_plan(offset):
            return Frontier.of_json(offset)  # an earlier version's offset: the frontier itself
        plan = FrontierPlan.of_json(offset)
        return plan.after if plan.batch < 0 else self.frontier_of(plan)

    def frontier_of(self, plan: FrontierPlan) -> Frontier:
        """The frontier after ``plan``'s micro-batch (computed once per plan)."""
        if self._computed is None or self._computed[0] != plan:
            self._computed = (plan, self._compute(plan))
        return self._computed[1]

    def _compute(self, plan: FrontierPlan) -> Frontier:
        logged = logged_batch(self.query_dir, plan.batch, self.config.topics)
        ends = cut_to(logged.kafka, plan.ending)
        after = plan.after
        newest_ms = None
        if self.config.max_clock_skew_ms is not None:
            # The clock of the first micro-batch since the last frontier: the records read since were each
            # judged by their own micro-batch's clock, this one's or a later one's.
            first = first_logged_from(self.query_dir, after.batch + 1)
            clock = logged.timestamp_ms if first is None or first == plan.batch else self._clock_of(first)
            newest_ms = clock + self.config.max_clock_skew_ms
        read_from = {
            name: after.kafka.get(name, 0) for name, end in ends.items() if end > after.kafka.get(name, 0)
        }
        stamps = self.last_stamps(read_from, ends, newest_ms)
        lagging = lagging_of(ends, plan)
        final = plan.available_now and (
            (plan.ending is not None and not lagging) or self._stalled(plan, ends)
        )
        moved = next_frontier(
            after, plan.batch, ends, stamps, lagging, self.config.allowed_lateness_ms, final=final
        )
        return after if moved is None else moved

    def stable_offsets(self) -> dict[str, int]:
        """Each partition's last stable offset now."""
        admin = self._admin_client()
        partitions = [(topic, p) for topic in self.config.topics for p in partitions_of(admin, topic)]
        return list_offsets(admin, partitions, OffsetSpec.latest())

    def _clock_of(self, batch: int) -> int:
        return logged_batch(self.query_dir, batch, self.config.topics).timestamp_ms

    def _stalled(self, plan: FrontierPlan, ends: Mapping[str, int]) -> bool:
        """Whether the connector did not move in the micro-batch (within a range: what it reads past the end
        is dropped, and a run of a range that follows cuts it from the offset log): it has reached the end
        its ``availableNow`` run fixed."""
        before = plan.batch - 1
        if before < 0 or not (self.query_dir / "offsets" / str(before)).is_file():
            return False
        return dict(ends) == cut_to(
            logged_batch(self.query_dir, before, self.config.topics).kafka, plan.ending
        )

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
        if not is_plan(end):  # planned by an earlier version: the frontier is the offset
            frontier = Frontier.of_json(end)
            newest = newest_batch(self.query_dir)
            if newest is not None:
                record_frontier(self.query_dir, newest, frontier)
            return [TickSplit(frontier.frontier_ms, frontier.final)]
        plan = FrontierPlan.of_json(end)
        self._check_logged(plan)
        frontier = wait_for_kafka(lambda: self.frontier_of(plan))
        record_frontier(self.query_dir, plan.batch, frontier)
        if frontier.final and self._run_start is not None and plan.batch > self._run_start:
            self._final_planned = True
        if frontier == plan.after:
            return []
        return [TickSplit(frontier.frontier_ms, frontier.final)]

    def _check_logged(self, plan: FrontierPlan) -> None:
        """The offset log's entry of the planned batch holds ``plan``: Spark wrote it before it asked for the
        partitions, and it holds the connector's offsets of the same batch."""
        entry = self.query_dir / "offsets" / str(plan.batch)
        if entry.is_file() and any(
            is_plan(o) and FrontierPlan.of_json(o) == plan for o in logged_offsets(self.query_dir, plan.batch)
        ):
            return
        raise StateError(
            f"the offset log of {self.query_dir} does not hold micro-batch {plan.batch}'s offsets when its "
            f"partitions are planned: the frontier source relies on Spark {CHECKED_ON}'s order (every "
            "source's end offset, the offset log, then the partitions)"
        )

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


def final_in(query_dir: Path, progress: Mapping[str, Any]) -> bool:
    """Whether a query's progress report (``StreamingQuery.lastProgress``) is of a final micro-batch: one
    whose frontier source planned a final frontier (kept beside the query checkpointed at ``query_dir``)."""
    batch = progress.get("batchId")
    frontier = None if batch is None else planned_frontiers(query_dir).get(int(batch))
    return frontier is not None and frontier.final
