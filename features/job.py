"""The streaming feature job in Spark: Kafka source -> card stage -> terminal stage -> sinks.

A thin shell: the stages are the pure functions of ``features.decode`` and ``features.stages``, called with
their state by ``features.stateful``; this module wires them into a Structured Streaming query with
``transformWithStateInPandas`` (RocksDB state store), keyed by card bucket and then by terminal bucket, each
bucket's state in entries of a map (``features.entries``) that a micro-batch reads only for the cards and
terminals it has events for. Between stages each key gets one row holding all its events as an Arrow blob.

Delivery guarantee: exactly-once for read_committed consumers of the features and dead-letter topics.
Input offsets and operator state are checkpointed together; a micro-batch re-run after a crash reads the
same offset ranges, sees the same state and writes the same records, which the transactional sink writes
once. Redis holds the latest features per card, written idempotently after each committed batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

import orjson
import pandas as pd
import pyarrow as pa
from pyspark.sql import Column, DataFrame, GroupedData, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from contracts.events import DEFAULT_MAX_CLOCK_SKEW_MS, TxColumns
from contracts.redis_keys import card_features_key
from contracts.settings import DEFAULT_BUCKETS, DEFAULT_PAGE_BYTES, DEFAULT_SLOTS, JobName, Topics
from features.bucket_entries import card_entries, terminal_entries, unpack_cards, unpack_terminals
from features.core import TerminalState
from features.counts import (
    ALERT_SOURCES,
    COUNTS,
    COUNTS_DDL,
    OBSERVATION,
    BatchObserver,
    alert_sources,
    batch_counts,
    counts_row,
)
from features.decode import DecodeOptions, decode, ticks
from features.definitions import EVENT_TIME_MS, FeatureParams
from features.entries import Layout, Pages
from features.entry_store import ENTRY_KEY, ENTRY_VALUE, INDEX_KEY, INDEX_VALUE, EntryStore, entry_bytes
from features.records import kafka_records
from features.rescale import Rescale, rekey_cards, rekey_terminals
from features.rows import (
    CARD_BUCKET,
    KIND,
    LATE,
    TERMINAL_BUCKET,
    RowKind,
    card_stage_fields,
)
from features.stages import CardBucket
from features.state_layout import Start, StateSpec
from features.stateful import (
    CARD_BUCKET_STATE,
    TERMINAL_BUCKET_STATE,
    BucketState,
    card_call,
    card_start,
    terminal_call,
    terminal_start,
)
from features.transport import (
    KEY,
    PACKED_FIELDS,
    from_blob,
    pack,
    pack_frame,
    to_blob,
    unpack,
)
from infra.arrow_json import newest_rows, read_records, text_arrays
from infra.kafka.log import offsets_for_time
from infra.redis.connection import RedisTarget
from infra.redis.store import set_latest_encoded
from infra.spark.checkpoint import query_location
from infra.spark.frontier import FrontierConfig, final_in, read_frontier
from infra.spark.internals import PipelinedMap
from infra.spark.kafka_sink.config import AfterCommit, KafkaSinkConfig, checkpoint_sink_id
from infra.spark.kafka_sink.datasource import register as register_sink
from infra.spark.kafka_sink.datasource import write_stream
from infra.spark.kafka_sink.records import PACKED_DDL, RECORDS_COLUMN, newest_per_key, pack_records
from infra.spark.kafka_source import KafkaInput, check_resume, new_admin, read_stream
from infra.spark.offset_log import record_ending
from infra.spark.schemas import spark_ddl
from infra.spark.session import Trigger, start_stream
from infra.spark.state_store import StateReader
from infra.spark.timing import Timings

C = TxColumns


#: The column of each Kafka record's micro-batch clock (Spark's batch timestamp, epoch ms): a re-run sees the
#: same, so it judges a record dated too far ahead of it as the first run did.
CLOCK = "clock"


@dataclass(frozen=True)
class DecodeRecords:
    """The first stage over the connector's records (``mapInArrow``): transactions and labels to events
    packed per card bucket (``features.decode``); transactions dated too far ahead of the micro-batch's
    clock are dead rows."""

    options: DecodeOptions

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        timings = Timings("decode-records")
        for records in timings.timed("input", batches):
            if records.num_rows:
                with timings.phase("decode"):
                    packed = pack(
                        decode(records, self.options, records.column(CLOCK)[0].as_py()), CARD_BUCKET
                    )
                yield packed
        timings.log()


@dataclass(frozen=True)
class CardTicks:
    """The frontier source's ticker (``infra.spark.frontier.Ticker``): one tick per card bucket, packed."""

    card_buckets: int
    schema: str = spark_ddl(PACKED_FIELDS)

    def ticks(self, frontier_ms: int, final: bool) -> pa.RecordBatch:
        return pack(ticks(frontier_ms, self.card_buckets, final), CARD_BUCKET)


#: The names of the state variables (what Spark's state data source reads them by): each stage's value per
#: bucket (``features.stateful``), its entries and their expiry index (``features.entry_store``).
CARD_STATE_VAR, CARD_ENTRIES_VAR, CARD_INDEX_VAR = "card_bucket", "card_entries", "card_expiry"
TERMINAL_STATE_VAR, TERMINAL_ENTRIES_VAR, TERMINAL_INDEX_VAR = (
    "terminal_bucket",
    "terminal_entries",
    "terminal_expiry",
)
#: The initial state of a rescaled start (:func:`initial_states`): per card bucket, a row with its waiting
#: events and frontier (slot -1) and a row per entry; per terminal bucket, a row per entry.
INITIAL_CARD_STATE = f"{KEY} int, slot bigint, value binary, pending binary, frontier bigint"
INITIAL_TERMINAL_STATE = f"{KEY} int, slot bigint, value binary"
BUCKET_ROW = -1


def bucket_state(
    handle: StatefulProcessorHandle, value: str, schema: str, entries: str, index: str
) -> BucketState:
    """A stage's state variables of the bucket a call is for."""
    return BucketState(
        handle.getValueState(value, schema),
        EntryStore(
            PipelinedMap(handle.getMapState(entries, ENTRY_KEY, ENTRY_VALUE)),
            PipelinedMap(handle.getMapState(index, INDEX_KEY, INDEX_VALUE)),
        ),
    )


class FeatureRowsHook(Protocol):
    """More sink records made from the feature rows of one state call: ``hook(rows, values)`` gets the
    feature rows (event columns, late flag, features) and their feature records' JSON, and returns a table
    of ``infra.spark.kafka_sink.records.COLUMNS`` or None. The pipeline scores here (``scoring.pipeline``)."""

    def __call__(self, rows: pd.DataFrame, values: pa.Array) -> pa.Table | None: ...


class BucketStage(StatefulProcessor):
    """The shell of a stateful stage around its pure call (``features.stateful``): per bucket, its events
    unpacked, the stage's call on the bucket's state variables, its output packed into one frame; each
    phase timed (``infra.spark.timing``: ``<stage>.input``, the call's phases, ``<stage>.<output phase>``)."""

    #: The stage's name in the timings, the phase its output is made in, and its state variables: the
    #: bucket's value (name, schema), its entries and their expiry index.
    name: ClassVar[str]
    output_phase: ClassVar[str]
    variables: ClassVar[tuple[str, str, str, str]]

    def __init__(self, params: FeatureParams, layout: Layout) -> None:
        self.params = params
        self.layout = layout

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = bucket_state(handle, *self.variables)

    def call(self, frame: pd.DataFrame, timings: Timings) -> pd.DataFrame:
        """The stage's output rows for the bucket's events ``frame``."""
        raise NotImplementedError

    def output(self, out: pd.DataFrame) -> pd.DataFrame:
        """The rows ``call`` made, packed into the frame the stage emits."""
        raise NotImplementedError

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        timings = Timings(self.name)
        with timings.phase("input"):
            frame = unpack(rows)
        out = self.call(frame, timings)
        if len(out):
            with timings.phase(self.output_phase):
                packed = self.output(out)
            yield packed
        timings.log()

    def close(self) -> None:
        pass


class CardStage(BucketStage):
    """``features.stateful.card_call`` per card bucket: the card features, packed per terminal bucket."""

    name = "card-stage"
    output_phase = "output"
    variables = (CARD_STATE_VAR, CARD_BUCKET_STATE, CARD_ENTRIES_VAR, CARD_INDEX_VAR)

    def call(self, frame: pd.DataFrame, timings: Timings) -> pd.DataFrame:
        return card_call(self.state, frame, self.params, self.layout, timings)

    def output(self, out: pd.DataFrame) -> pd.DataFrame:
        return pack_frame(out, TERMINAL_BUCKET, card_stage_fields(self.params))

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
        """A rescaled start's first micro-batch: the bucket's re-keyed state (:func:`initial_states`)."""
        is_bucket = initialState["slot"] == BUCKET_ROW
        pending, frontier = initialState.loc[is_bucket, ["pending", "frontier"]].iloc[0]
        history, _ = unpack_cards(initialState.loc[~is_bucket, "value"].tolist())
        card_start(self.state, CardBucket(history, from_blob(pending), int(frontier)), self.layout)


class TerminalStage(BucketStage):
    """``features.stateful.terminal_call`` per terminal bucket.

    Emits the sink's Kafka records, packed: one row per call, built here rather than row by row in the JVM.
    """

    name = "terminal-stage"
    output_phase = "records"  # the hook's scoring included
    variables = (TERMINAL_STATE_VAR, TERMINAL_BUCKET_STATE, TERMINAL_ENTRIES_VAR, TERMINAL_INDEX_VAR)

    def __init__(
        self, params: FeatureParams, layout: Layout, topics: Topics, hook: FeatureRowsHook | None = None
    ) -> None:
        super().__init__(params, layout)
        self.topics = topics
        self.hook = hook

    def call(self, frame: pd.DataFrame, timings: Timings) -> pd.DataFrame:
        return terminal_call(self.state, frame, self.params, self.layout, timings)

    def output(self, out: pd.DataFrame) -> pd.DataFrame:
        records = kafka_records(out, self.topics.features, self.topics.dead_letter, self.params, self.hook)
        late = int(out.loc[out[KIND] == RowKind.FEATURES, LATE].fillna(False).astype(bool).sum())
        counts = counts_row(batch_counts(records, self.topics, late), alert_sources(records, self.topics))
        return pd.DataFrame({RECORDS_COLUMN: [pack_records(records)], **counts})

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
        """A rescaled start's first micro-batch: the bucket's re-keyed state (:func:`initial_states`)."""
        terminals, _ = unpack_terminals(initialState["value"].tolist())
        terminal_start(self.state, terminals, self.layout)


@dataclass(frozen=True)
class FeatureJobConfig:
    """What one run of the feature job reads, keeps and writes.

    Everything comes from parameters, never from globals, so an isolated run (a replay into its own
    topics, checkpoint and Redis prefix) cannot touch the live pipeline.
    """

    kafka_config: dict[str, Any] = field(repr=False)  # credentials: never in a repr
    topics: Topics
    checkpoint: Path
    redis: RedisTarget
    params: FeatureParams
    max_event_bytes: int
    max_records_per_trigger: int | None = None
    #: Where a new query's input starts (its first records at or after, epoch ms; None: the earliest) and
    #: where a run ends (None: a stream without end, or a ``once`` run's end of the log): a time range
    #: replays just that range.
    start_ms: int | None = None
    end_ms: int | None = None
    #: Keys of the two stateful stages. Every state call costs tens of ms whatever its size, so few large
    #: buckets are faster; Spark hashes keys 0-5 three to each of the 2 shuffle partitions (16 keys split
    #: 7/9, 8 keys 3/5). Fixed for the life of a checkpoint (``features.state_layout``).
    card_buckets: int = DEFAULT_BUCKETS
    terminal_buckets: int = DEFAULT_BUCKETS
    #: State entries per bucket of each stage (``features.entries``): a micro-batch reads and writes the
    #: entries of the cards and terminals it has events for. Fixed for the life of a checkpoint too.
    card_slots: int = DEFAULT_SLOTS
    terminal_slots: int = DEFAULT_SLOTS
    #: The size past which a page of state is cut: may change on any restart (``Layout.TUNABLE``).
    page_bytes: int = DEFAULT_PAGE_BYTES
    #: Transactions dated further ahead of the planner's clock than this are dead letters
    #: (``future_event_time``) and move no frontier (None: no check).
    max_clock_skew_ms: int | None = DEFAULT_MAX_CLOCK_SKEW_MS

    #: The job's name (``contracts.settings.JobName``), and what its Python workers import before their
    #: first task (``infra.spark.daemon``).
    name: ClassVar[JobName] = JobName.FEATURES
    preload: ClassVar[tuple[str, ...]] = (__name__,)
    #: Where alerts come from: the feature job writes none.
    alert_inputs: ClassVar[tuple[str, ...]] = ()

    @property
    def layout(self) -> Layout:
        """What routes the job's events to its state (``features.entries``)."""
        return Layout(
            self.card_buckets, self.terminal_buckets, self.card_slots, self.terminal_slots, self.page_bytes
        )

    @property
    def state(self) -> StateSpec:
        """What the job keeps its state for (``features.state_layout``): its layout and features."""
        return StateSpec(self.layout, self.params)

    @property
    def description(self) -> str:
        return f"Feature job running (checkpoint {self.checkpoint})"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.topics.transactions, self.topics.labels)

    def ended(self, progress: dict[str, Any]) -> bool:
        """A run of a range ends with its final micro-batch (``infra.spark.frontier``)."""
        return self.end_ms is not None and final_in(query_location(self.checkpoint), progress)

    def start(
        self, spark: SparkSession, start: Start, trigger: Trigger, on_batch: BatchObserver | None = None
    ) -> StreamingQuery:
        return start_feature_job(spark, self, start, trigger)  # its counts come with its progress reports


def feature_stream(
    spark: SparkSession, config: FeatureJobConfig, start: Start, hook: FeatureRowsHook | None = None
) -> DataFrame:
    """The streaming job's output: feature records and dead letters, packed for the Kafka sink (``hook``:
    more records made from the feature rows, written with them: the pipeline's scoring). Finds first where a
    run of a range ends (and settles what an earlier one left: ``infra.spark.offset_log.record_ending``),
    and checks that its checkpoint's input is still in the topics' logs. A rescaled ``start`` reads from
    where the savepoint's state stood, its first micro-batch re-keying that state (:func:`initial_states`)."""
    topics = config.inputs
    ending_offsets = None
    if config.end_ms is not None:
        ending_offsets = offsets_for_time(new_admin(config.kafka_config), topics, config.end_ms)
    record_ending(config.checkpoint, ending_offsets)
    check_resume(config.kafka_config, query_location(config.checkpoint))
    position = start.rescale.position if start.rescale is not None else None
    source = KafkaInput(
        kafka_config=config.kafka_config,
        topics=topics,
        start_ms=config.start_ms,
        starting_offsets=position.offsets if position is not None else None,
        ending_offsets=ending_offsets,
        max_records_per_trigger=config.max_records_per_trigger,
    )
    options = DecodeOptions(
        transactions_topic=config.topics.transactions,
        labels_topic=config.topics.labels,
        card_buckets=config.card_buckets,
        max_event_bytes=config.max_event_bytes,
        max_clock_skew_ms=config.max_clock_skew_ms,
    )
    records = read_stream(spark, source).withColumn(CLOCK, F.unix_millis(F.current_timestamp()))
    events = records.mapInArrow(DecodeRecords(options), spark_ddl(PACKED_FIELDS))
    frontier = FrontierConfig(
        kafka_config=config.kafka_config,
        topics=topics,
        query_dir=str(query_location(config.checkpoint)),
        ticker=CardTicks(config.card_buckets),
        allowed_lateness_ms=config.params.allowed_lateness_ms,
        max_clock_skew_ms=config.max_clock_skew_ms,
        ending_offsets=ending_offsets,
        initial=replace(position.frontier, batch=-1) if position is not None and position.frontier else None,
    )
    card_state, terminal_state = initial_states(spark, config, start.rescale)
    card = (
        events.union(read_frontier(spark, frontier))
        .groupBy(KEY)
        .transformWithStateInPandas(
            statefulProcessor=CardStage(config.params, config.layout),
            outputStructType=spark_ddl(PACKED_FIELDS),
            outputMode="Append",
            timeMode="None",
            initialState=card_state,
        )
    )
    terminal = card.groupBy(KEY).transformWithStateInPandas(
        statefulProcessor=TerminalStage(config.params, config.layout, config.topics, hook),
        outputStructType=f"{PACKED_DDL}, {COUNTS_DDL}",
        outputMode="Append",
        timeMode="None",
        initialState=terminal_state,
    )
    # Each micro-batch's counts (records, late events, dead letters by reason) in its progress report.
    counted = terminal.observe(OBSERVATION, *observations())
    return counted.select(RECORDS_COLUMN)


def observations() -> list[Column]:
    """The aggregates of a micro-batch's observed metrics (``DataFrame.observe``) of a stage's output: the
    counts summed, the alerts' sources collected (``features.counts``)."""
    return [
        *(F.sum(name).alias(name) for name in COUNTS),
        F.flatten(F.collect_list(ALERT_SOURCES)).alias(ALERT_SOURCES),
    ]


def initial_states(
    spark: SparkSession, config: FeatureJobConfig, rescale: Rescale | None
) -> tuple[GroupedData | None, GroupedData | None]:
    """The two stages' initial state for a rescaled start, else none: the state the other layout's query
    committed, read with Spark's state data source (every bucket, in the driver), and re-keyed into this
    layout's buckets and entries (``features.rescale``). Spark hands it to the stages in the new query's
    first micro-batch only (``handleInitialState``), before that batch's rows."""
    if rescale is None:
        return None, None
    with StateReader(spark, rescale.query_dir, rescale.batch) as reader:
        cards, terminals = committed_state(reader)
    card_rows = [
        row
        for key, bucket in rekey_cards(cards, config.card_buckets).items()
        for row in card_state_rows(key, bucket, config.layout)
    ]
    terminal_rows = [
        row
        for key, state in rekey_terminals(terminals, config.terminal_buckets).items()
        for row in terminal_state_rows(key, state, config.layout)
    ]
    return (
        spark.createDataFrame(card_rows, INITIAL_CARD_STATE).groupBy(KEY),
        spark.createDataFrame(terminal_rows, INITIAL_TERMINAL_STATE).groupBy(KEY),
    )


def committed_state(reader: StateReader) -> tuple[list[CardBucket], list[TerminalState]]:
    """Every card bucket and terminal state a committed query holds: each bucket's value (a card bucket's
    waiting events and frontier) and its entries, a page each, whatever the bucket and slot counts."""
    entries = reader.all_map_values(CARD_ENTRIES_VAR, KEY)
    cards = []
    for key, (pending, frontier, *_) in reader.values_by_key(CARD_STATE_VAR, KEY).items():
        history, _ = unpack_cards(entry_bytes(value) for (value,) in entries.get(key, []))
        cards.append(CardBucket(history, from_blob(pending), int(frontier)))
    terminal_entries_by_key = reader.all_map_values(TERMINAL_ENTRIES_VAR, KEY)
    terminals = [
        unpack_terminals(entry_bytes(value) for (value,) in values)[0]
        for values in terminal_entries_by_key.values()
    ]
    return cards, terminals


def card_state_rows(key: int, bucket: CardBucket, layout: Layout) -> list[tuple[Any, ...]]:
    """A card bucket as rows of :data:`INITIAL_CARD_STATE`: its waiting events and frontier, its entries."""
    written, _ = card_entries(bucket.history, layout, Pages.one(), None, {})
    return [
        (key, BUCKET_ROW, None, to_blob(bucket.pending), bucket.frontier_ms),
        *((key, slot, value, None, None) for slot, value in written.values.items()),
    ]


def terminal_state_rows(key: int, state: TerminalState, layout: Layout) -> list[tuple[Any, ...]]:
    """A terminal bucket's entries as rows of :data:`INITIAL_TERMINAL_STATE`."""
    written, _ = terminal_entries(state, layout, Pages.one(), None, {})
    return [(key, slot, value) for slot, value in written.values.items()]


# --- Redis: the latest features of each card, written after each committed Kafka transaction ----------


@dataclass(frozen=True)
class LatestFeaturesToRedis:
    """The sink's after-commit hook: ``card:{card_id}:features`` gets each card's newest feature record (its
    terminal, amount, late flag and features, as ``infra.redis.store.set_latest`` stores them).

    The records are read and their fields written out column by column (Arrow), not record by record: with
    many cards a micro-batch holds a record for almost every transaction (a million cards: about 95,000 of
    100,000), and a Python loop over their fields was the job's largest cost.
    """

    redis: RedisTarget
    topic: str

    def __call__(self, batches: list[pa.RecordBatch]) -> None:
        records = newest_per_key(batches, self.topic)
        if not records:
            return
        latest = newest_rows(_feature_table(records), C.CARD_ID, (EVENT_TIME_MS, C.TX_ID))
        features = latest.column("features").combine_chunks()
        names = [C.TERMINAL_ID, C.AMOUNT, LATE, *(item.name for item in features.type)]
        columns = [latest.column(name) for name in names[:3]] + [features.field(name) for name in names[3:]]
        keys = [card_features_key(card, self.redis.prefix) for card in latest.column(C.CARD_ID).to_pylist()]
        times, tx_ids = latest.column(EVENT_TIME_MS).to_pylist(), latest.column(C.TX_ID).to_pylist()
        values = text_arrays(columns).to_pylist()
        ttl_s = self.redis.retention_s
        self.redis.write(lambda client: set_latest_encoded(client, names, keys, times, tx_ids, values, ttl_s))


def _feature_table(records: list[bytes]) -> pa.Table:
    """The fields of feature records (JSON) that Redis keeps, as columns; the features' names are the first
    record's (a micro-batch's records all come from one version of the job), their values read as doubles."""
    names = list(orjson.loads(records[0])["features"])
    schema = pa.schema(
        [
            (C.TX_ID, pa.int64()),
            (C.CARD_ID, pa.string()),
            (C.TERMINAL_ID, pa.string()),
            (C.AMOUNT, pa.float64()),
            (EVENT_TIME_MS, pa.int64()),
            (LATE, pa.bool_()),
            ("features", pa.struct([(name, pa.float64()) for name in names])),
        ]
    )
    return read_records(records, schema)


def feature_sink(config: FeatureJobConfig, after_commit: AfterCommit | None = None) -> KafkaSinkConfig:
    """The exactly-once Kafka sink of the feature records, ``after_commit`` after each commit (default: the
    latest features to Redis)."""
    return KafkaSinkConfig(
        kafka_config=config.kafka_config,
        sink_id=checkpoint_sink_id(config.checkpoint, "features"),
        marker_topic=config.topics.features,
        after_commit=after_commit or LatestFeaturesToRedis(config.redis, config.topics.features),
    )


def start_feature_job(
    spark: SparkSession, config: FeatureJobConfig, start: Start, trigger: Trigger
) -> StreamingQuery:
    """Start the streaming feature job in its checkpoint, bound to its state before
    (``features.state_layout.bind``)."""
    register_sink(spark)
    writer = (
        write_stream(feature_stream(spark, config, start), feature_sink(config))
        .option("checkpointLocation", str(query_location(config.checkpoint)))
        .queryName(f"features-{config.topics.features}")
    )
    return start_stream(writer, trigger)
