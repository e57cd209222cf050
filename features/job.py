"""The streaming feature job in Spark: Kafka source -> card stage -> terminal stage -> sinks.

A thin shell: the stages are the pure functions of ``features.decode`` and ``features.stages``; this module wires them into a
Structured Streaming query with ``transformWithStateInPandas`` (RocksDB state store), keyed by card bucket
and then by terminal bucket. Between stages each key gets one row holding all its events as an Arrow blob.

Delivery guarantee: exactly-once for read_committed consumers of the features and dead-letter topics.
Input offsets and operator state are checkpointed together; a micro-batch re-run after a crash reads the
same offset ranges, sees the same state and writes the same records, which the transactional sink writes
once. Redis holds the latest features per card, written idempotently after each committed batch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, GroupedData, SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from contracts.events import DEFAULT_MAX_CLOCK_SKEW_MS, TxColumns
from contracts.settings import DEFAULT_BUCKETS, Topics
from features.compat import bind_specs
from features.core import CardState, TerminalState
from features.decode import DecodeOptions, decode, ticks
from features.definitions import EVENT_TIME_MS, FeatureParams
from features.records import kafka_records
from features.rescale import Rescale, rekey_card_values, rekey_terminal_values
from features.rows import CARD_BUCKET, FEATURES, KIND, LATE, TERMINAL_BUCKET, card_stage_fields, empty_events
from features.stages import CardBucket, card_stage, terminal_stage
from features.transport import (
    KEY,
    PACKED_FIELDS,
    card_bucket_of,
    card_value,
    pack,
    pack_frame,
    terminal_state_of,
    terminal_value,
    unpack,
)
from infra.arrow_json import newest_rows, read_records, text_arrays
from infra.checkpoints import bind_layout, query_location
from infra.kafka_sink.config import KafkaSinkConfig, checkpoint_sink_id
from infra.kafka_sink.datasource import register as register_sink
from infra.kafka_sink.datasource import write_stream
from infra.kafka_sink.records import PACKED_DDL, RECORDS_COLUMN, newest_per_key, pack_records
from infra.kafka_source.config import EARLIEST, LATEST, KafkaSourceConfig
from infra.kafka_source.datasource import read_stream
from infra.kafka_source.splits import NO_FRONTIER, Split
from infra.metrics import COUNTS_DDL, OBSERVATION, alert_sources, batch_counts, counts_row, observations
from infra.redis_store import RedisTarget, card_features_key, set_latest_encoded
from infra.schemas import spark_ddl
from infra.spark import start_stream
from infra.state_store import StateReader
from infra.timing import Timings

C = TxColumns
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EventDecoder:
    """The Kafka source's decoder: transactions and labels to events packed per card bucket, and ticks."""

    options: DecodeOptions
    schema: str = spark_ddl(PACKED_FIELDS)

    def decode(self, records: pa.RecordBatch, split: Split) -> Iterator[pa.RecordBatch]:
        yield pack(decode(records, self.options, split.clock_ms), CARD_BUCKET)

    def heartbeat(self, split: Split) -> Iterator[pa.RecordBatch]:
        yield pack(ticks(split.frontier_ms, self.options.card_buckets, split.final), CARD_BUCKET)


#: State of a card bucket: card history, events waiting for the frontier (Arrow IPC blobs), the frontier.
CARD_STATE = "history binary, pending binary, frontier bigint"
#: State of a terminal bucket: terminal transactions and labels (Arrow IPC blobs).
TERMINAL_STATE = "transactions binary, labels binary"
#: The names of the two state variables (what Spark's state data source reads them by).
CARD_STATE_VAR, TERMINAL_STATE_VAR = "bucket", "terminals"
#: The fields of each state's value, in order.
CARD_STATE_FIELDS = tuple(part.split()[0] for part in CARD_STATE.split(","))
TERMINAL_STATE_FIELDS = tuple(part.split()[0] for part in TERMINAL_STATE.split(","))


class CardStage(StatefulProcessor):
    """``features.stages.card_stage`` per card bucket; state: history, pending events, frontier."""

    def __init__(self, params: FeatureParams, terminal_buckets: int) -> None:
        self.params = params
        self.terminal_buckets = terminal_buckets

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState(CARD_STATE_VAR, CARD_STATE)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        timings = Timings("card-stage")
        with timings.phase("input"):
            frame = unpack(rows)
        with timings.phase("state-get"):
            stored = self.state.get()
            bucket = (
                card_bucket_of(*stored)
                if stored
                else CardBucket(CardState.empty(), empty_events(), NO_FRONTIER)
            )
        with timings.phase("core"):
            after, out = card_stage(bucket, frame, self.params, self.terminal_buckets)
        with timings.phase("state-put"):
            self.state.update(card_value(after))
        if len(out):
            with timings.phase("output"):
                packed = pack_frame(out, TERMINAL_BUCKET, card_stage_fields(self.params))
            yield packed
        timings.log()

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
        """A rescaled start's first micro-batch: the bucket's re-keyed state (:func:`initial_states`)."""
        for history, pending, frontier in initialState[list(CARD_STATE_FIELDS)].itertuples(index=False):
            self.state.update((history, pending, int(frontier)))

    def close(self) -> None:
        pass


class FeatureRowsHook(Protocol):
    """More sink records made from the feature rows of one state call: ``hook(rows, values)`` gets the
    feature rows (event columns, late flag, features) and their feature records' JSON, and returns a table
    of ``infra.spark_sink.COLUMNS`` or None. The pipeline scores here (``scoring.pipeline``)."""

    def __call__(self, rows: pd.DataFrame, values: pa.Array) -> pa.Table | None: ...


class TerminalStage(StatefulProcessor):
    """``features.stages.terminal_stage`` per terminal bucket; state: terminal transactions and labels.

    Emits the sink's Kafka records, packed: one row per call, built here rather than row by row in the JVM.
    """

    def __init__(self, params: FeatureParams, topics: Topics, hook: FeatureRowsHook | None = None) -> None:
        self.params = params
        self.topics = topics
        self.hook = hook

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState(TERMINAL_STATE_VAR, TERMINAL_STATE)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        timings = Timings("terminal-stage")
        with timings.phase("input"):
            frame = unpack(rows)
        with timings.phase("state-get"):
            stored = self.state.get()
            terminals = terminal_state_of(*stored) if stored else TerminalState.empty()
        with timings.phase("core"):
            terminals, out = terminal_stage(terminals, frame, self.params)
        with timings.phase("state-put"):
            self.state.update(terminal_value(terminals))
        if len(out):
            with timings.phase("records"):  # the hook's scoring included
                records = kafka_records(
                    out, self.topics.features, self.topics.dead_letter, self.params, self.hook
                )
                late = int(out.loc[out[KIND] == FEATURES, LATE].fillna(False).astype(bool).sum())
                counts = counts_row(
                    batch_counts(records, self.topics, late), alert_sources(records, self.topics)
                )
                packed = pd.DataFrame({RECORDS_COLUMN: [pack_records(records)], **counts})
            yield packed
        timings.log()

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
        """A rescaled start's first micro-batch: the bucket's re-keyed state (:func:`initial_states`)."""
        for transactions, labels in initialState[list(TERMINAL_STATE_FIELDS)].itertuples(index=False):
            self.state.update((transactions, labels))

    def close(self) -> None:
        pass


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
    #: Where the input is read from and, for a ``once`` run, up to (``infra.kafka_source.config``): a
    #: time range replays just that range.
    starting_offsets: str = EARLIEST
    ending_offsets: str = LATEST
    #: Keys of the two stateful stages. Every state call costs tens of ms whatever its size, so few large
    #: buckets are faster; Spark hashes keys 0-5 three to each of the 2 shuffle partitions (16 keys split
    #: 7/9, 8 keys 3/5). Fixed for the life of a checkpoint (``infra.checkpoints``).
    card_buckets: int = DEFAULT_BUCKETS
    terminal_buckets: int = DEFAULT_BUCKETS
    #: More records made from the feature rows, written with them (the pipeline's scoring).
    hook: FeatureRowsHook | None = None
    #: Transactions dated further ahead of the planner's clock than this are dead letters
    #: (``future_event_time``) and move no frontier (None: no check).
    max_clock_skew_ms: int | None = DEFAULT_MAX_CLOCK_SKEW_MS
    #: Start a new checkpoint from another layout's state and input position (a savepoint's): its first
    #: micro-batch re-keys that state into this layout (:func:`initial_states`). Only until that batch
    #: commits: later runs resume the checkpoint.
    rescale: Rescale | None = None


def feature_stream(spark: SparkSession, config: FeatureJobConfig) -> DataFrame:
    """The streaming job's output: feature records and dead letters, packed for the Kafka sink."""
    decoder = EventDecoder(
        DecodeOptions(
            transactions_topic=config.topics.transactions,
            labels_topic=config.topics.labels,
            card_buckets=config.card_buckets,
            max_event_bytes=config.max_event_bytes,
            max_clock_skew_ms=config.max_clock_skew_ms,
        )
    )
    source = KafkaSourceConfig(
        kafka_config=config.kafka_config,
        topics=(config.topics.transactions, config.topics.labels),
        max_records_per_trigger=config.max_records_per_trigger,
        starting_offsets=config.starting_offsets,
        ending_offsets=config.ending_offsets,
        allowed_lateness_ms=config.params.max_lateness_ms,
        read_tasks=spark.sparkContext.defaultParallelism,  # one task per core
        decoder=decoder,
        max_clock_skew_ms=config.max_clock_skew_ms,
        initial_position=config.rescale.position if config.rescale is not None else None,
    )
    card_state, terminal_state = initial_states(spark, config)
    card = (
        read_stream(spark, source)
        .groupBy(KEY)
        .transformWithStateInPandas(
            statefulProcessor=CardStage(config.params, config.terminal_buckets),
            outputStructType=spark_ddl(PACKED_FIELDS),
            outputMode="Append",
            timeMode="None",
            initialState=card_state,
        )
    )
    terminal = card.groupBy(KEY).transformWithStateInPandas(
        statefulProcessor=TerminalStage(config.params, config.topics, config.hook),
        outputStructType=f"{PACKED_DDL}, {COUNTS_DDL}",
        outputMode="Append",
        timeMode="None",
        initialState=terminal_state,
    )
    # Each micro-batch's counts (records, late events, dead letters by reason) in its progress report.
    counted = terminal.observe(OBSERVATION, *observations())
    return counted.select(RECORDS_COLUMN)


def initial_states(
    spark: SparkSession, config: FeatureJobConfig
) -> tuple[GroupedData | None, GroupedData | None]:
    """The two stages' initial state for a rescaled start (``config.rescale``), else none: the state the
    other layout's query committed, read with Spark's state data source (every bucket, in the driver) and
    re-keyed into this layout's buckets (``features.rescale``). Spark hands it to the stages in the new
    query's first micro-batch only (``handleInitialState``), before that batch's rows."""
    if config.rescale is None:
        return None, None
    with StateReader(spark, config.rescale.query_dir, config.rescale.batch) as reader:
        cards = reader.all_values(CARD_STATE_VAR)
        terminals = reader.all_values(TERMINAL_STATE_VAR)
    card_rows = rekey_card_values(cards, config.card_buckets)
    terminal_rows = rekey_terminal_values(terminals, config.terminal_buckets)
    return (
        spark.createDataFrame(
            [(key, *value) for key, value in card_rows.items()], f"{KEY} int, {CARD_STATE}"
        ).groupBy(KEY),
        spark.createDataFrame(
            [(key, *value) for key, value in terminal_rows.items()], f"{KEY} int, {TERMINAL_STATE}"
        ).groupBy(KEY),
    )


# --- Redis: the latest features of each card, written after each committed Kafka transaction ----------


@dataclass(frozen=True)
class LatestFeaturesToRedis:
    """The sink's after-commit hook: ``card:{card_id}:features`` gets each card's newest feature record (its
    terminal, amount, late flag and features, as ``infra.redis_store.set_latest`` stores them).

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


def layout_of(config: FeatureJobConfig) -> dict[str, int]:
    """What routes the job's events to its state: its bucket counts (``infra.checkpoints``)."""
    return {"card_buckets": config.card_buckets, "terminal_buckets": config.terminal_buckets}


def prepare_checkpoint(config: FeatureJobConfig) -> None:
    """Bind the checkpoint to the job's bucket counts (refuses one made with others) and feature specs
    (refuses one whose state lacks the history they need; logs how they differ from its state's)."""
    bind_layout(
        config.checkpoint, layout_of(config), made_before_layouts={"card_buckets": 16, "terminal_buckets": 16}
    )
    changes = bind_specs(config.checkpoint, config.params)
    if changes:
        _log.warning("The job takes over state built for other features (%s)", "; ".join(changes))


def feature_sink(config: FeatureJobConfig) -> KafkaSinkConfig:
    """The exactly-once Kafka sink of the feature records, with the latest features to Redis after commit."""
    return KafkaSinkConfig(
        kafka_config=config.kafka_config,
        sink_id=checkpoint_sink_id(config.checkpoint, "features"),
        marker_topic=config.topics.features,
        after_commit=LatestFeaturesToRedis(config.redis, config.topics.features),
    )


def start_feature_job(
    spark: SparkSession, config: FeatureJobConfig, once: bool, trigger_interval_s: float = 1.0
) -> StreamingQuery:
    """Start the streaming feature job: ``once`` processes everything available, then stops."""
    register_sink(spark)
    prepare_checkpoint(config)
    writer = (
        write_stream(feature_stream(spark, config), feature_sink(config))
        .option("checkpointLocation", str(query_location(config.checkpoint)))
        .queryName(f"features-{config.topics.features}")
    )
    return start_stream(writer, once, trigger_interval_s)
