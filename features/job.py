"""The streaming feature job in Spark: Kafka source -> card stage -> terminal stage -> sinks.

A thin shell: the stages are the pure functions of ``features.stream``; this module wires them into a
Structured Streaming query with ``transformWithStateInPandas`` (RocksDB state store), keyed by card bucket
and then by terminal bucket.

Delivery guarantee: exactly-once for read_committed consumers of the features and dead-letter topics.
Input offsets and operator state are checkpointed together; a micro-batch re-run after a crash reads the
same offset ranges, sees the same state and writes the same records, which the transactional sink writes
once. Redis holds the latest features per card, written idempotently after each committed batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from features.core import CardState, TerminalState
from features.definitions import FeatureParams
from features.stream import (
    CARD_BUCKET,
    TERMINAL_BUCKET,
    CardBucket,
    DecodeOptions,
    card_stage,
    card_stage_fields,
    ddl,
    decode,
    decoded_fields,
    empty_events,
    from_blob,
    iter_frames,
    output_fields,
    terminal_stage,
    ticks,
    to_blob,
)
from infra.spark_source import KafkaDataSource, Split

_BLOB = StructType([StructField("blob", BinaryType())])
_LONG = StructType([StructField("value", LongType())])


class EventDecoder:
    """Decoder for ``fraud-kafka``: transactions and labels to event rows, ticks for every card bucket."""

    schema = ddl(decoded_fields())

    def decode(
        self, records: pa.RecordBatch, split: Split, options: dict[str, str]
    ) -> Iterator[pa.RecordBatch]:
        yield decode(records, _decode_options(options))

    def heartbeat(self, split: Split, options: dict[str, str]) -> Iterator[pa.RecordBatch]:
        yield ticks(split.frontier_ms, int(options["cardbuckets"]))


DECODER = EventDecoder()


def _decode_options(options: dict[str, str]) -> DecodeOptions:
    return DecodeOptions(
        transactions_topic=options["topic.transactions"],
        labels_topic=options["topic.labels"],
        card_buckets=int(options["cardbuckets"]),
        max_event_bytes=int(options["maxeventbytes"]),
    )


class CardStage(StatefulProcessor):
    """``features.stream.card_stage`` per card bucket; state: history, pending events, frontier."""

    def __init__(self, params: FeatureParams, terminal_buckets: int) -> None:
        self.params = params
        self.terminal_buckets = terminal_buckets

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.history = handle.getValueState("history", _BLOB)
        self.pending = handle.getValueState("pending", _BLOB)
        self.frontier = handle.getValueState("frontier", _LONG)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        frame = iter_frames(rows)
        stored = self.history.get()
        pending = self.pending.get()
        frontier = self.frontier.get()
        bucket = CardBucket(
            history=CardState.from_frame(from_blob(stored[0])) if stored else CardState.empty(),
            pending=from_blob(pending[0]) if pending else empty_events(),
            frontier_ms=int(frontier[0]) if frontier else -(2**62),
        )
        after, out = card_stage(bucket, frame, self.params, self.terminal_buckets)
        if after.history is not bucket.history:
            self.history.update((to_blob(after.history.to_frame()),))
        if len(after.pending) or pending:
            self.pending.update((to_blob(after.pending),))
        self.frontier.update((after.frontier_ms,))
        if len(out):
            yield out

    def close(self) -> None:
        pass


class TerminalStage(StatefulProcessor):
    """``features.stream.terminal_stage`` per terminal bucket; state: terminal transactions and labels."""

    def __init__(self, params: FeatureParams) -> None:
        self.params = params

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.transactions = handle.getValueState("transactions", _BLOB)
        self.labels = handle.getValueState("labels", _BLOB)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        frame = iter_frames(rows)
        transactions, labels = self.transactions.get(), self.labels.get()
        state = (
            TerminalState.from_frames(from_blob(transactions[0]), from_blob(labels[0]))
            if transactions and labels
            else TerminalState.empty()
        )
        state, out = terminal_stage(state, frame, self.params)
        tx_frame, label_frame = state.to_frames()
        self.transactions.update((to_blob(tx_frame),))
        self.labels.update((to_blob(label_frame),))
        if len(out):
            yield out

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class FeatureJobConfig:
    """What one run of the feature job reads, keeps and writes (all from parameters: replays are isolated)."""

    kafka_config: dict[str, Any]
    transactions_topic: str
    labels_topic: str
    checkpoint: Path
    max_event_bytes: int
    params: FeatureParams
    max_records_per_trigger: int | None = None
    card_buckets: int = 16
    terminal_buckets: int = 16


def feature_stream(spark: SparkSession, config: FeatureJobConfig) -> DataFrame:
    """The feature rows (and dead rows) of the streaming job, before any sink."""
    spark.dataSource.register(KafkaDataSource)
    reader = (
        spark.readStream.format("fraud-kafka")
        .option("kafka.config", json.dumps(config.kafka_config))
        .option("topics", f"{config.transactions_topic},{config.labels_topic}")
        .option("topic.transactions", config.transactions_topic)
        .option("topic.labels", config.labels_topic)
        .option("startingOffsets", "earliest")
        .option("allowedLatenessMs", str(config.params.max_lateness_ms))
        .option("decoder", "features.job:DECODER")
        .option("cardBuckets", str(config.card_buckets))
        .option("maxEventBytes", str(config.max_event_bytes))
    )
    if config.max_records_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", str(config.max_records_per_trigger))
    events = reader.load()
    card = events.groupBy(CARD_BUCKET).transformWithStateInPandas(
        statefulProcessor=CardStage(config.params, config.terminal_buckets),
        outputStructType=ddl(card_stage_fields(config.params)),
        outputMode="Append",
        timeMode="None",
    )
    return card.groupBy(TERMINAL_BUCKET).transformWithStateInPandas(
        statefulProcessor=TerminalStage(config.params),
        outputStructType=ddl(output_fields(config.params)),
        outputMode="Append",
        timeMode="None",
    )
