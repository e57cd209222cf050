"""Stage 1 of the feature job: Kafka records of the transactions and labels topics become typed event rows;
records that fail validation become dead rows with the reason. Each event is routed to its card bucket."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from contracts.events import DeadLetter, LabelEvent, Reason, TransactionEvent, TxColumns, future_detail
from contracts.privacy import mask_card_numbers_bytes
from features.buckets import card_bucket
from features.definitions import EVENT_TIME_MS, KNOWN_AT_MS, TX_TIME_MS
from features.rows import (
    CARD_BUCKET,
    DETAIL,
    KIND,
    RAW,
    REASON,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    RowKind,
    decoded_batch,
    one_batch,
)
from validation.parse import parse_event

C = TxColumns


@dataclass(frozen=True)
class DecodeOptions:
    transactions_topic: str
    labels_topic: str
    card_buckets: int
    max_event_bytes: int
    #: Transactions dated further ahead of the micro-batch's clock than this are dead (None: no check).
    max_clock_skew_ms: int | None = None


def decode(records: pa.RecordBatch, options: DecodeOptions, clock_ms: int | None = None) -> pa.RecordBatch:
    """Validate raw records of the transactions or labels topic into event rows (bad ones: dead rows).

    Each record is validated by ``validation.parse.parse_event`` (pydantic), which also gives the dead
    letters their reasons. Rows keep the records' order, one per record. With ``clock_ms`` (the micro-batch's clock: Spark's batch timestamp) and
    ``options.max_clock_skew_ms``, transactions dated too far ahead of it are dead rows
    (``future_event_time``): their time would move their card bucket's frontier and make every later
    event of its cards late.
    """
    decoded = _decode(records, options)
    if clock_ms is None or options.max_clock_skew_ms is None or not decoded.num_rows:
        return decoded
    return _future_as_dead(decoded, records, clock_ms, options.max_clock_skew_ms)


def _future_as_dead(
    decoded: pa.RecordBatch, records: pa.RecordBatch, clock_ms: int, max_skew_ms: int
) -> pa.RecordBatch:
    """``decoded`` with its transactions dated more than ``max_skew_ms`` after ``clock_ms`` made dead rows."""
    is_future = pc.and_(
        pc.equal(decoded.column(KIND), RowKind.TX),
        pc.greater(decoded.column(EVENT_TIME_MS), clock_ms + max_skew_ms),
    )
    rows = np.flatnonzero(pc.fill_null(is_future, False).to_numpy(zero_copy_only=False))
    if not len(rows):
        return decoded
    columns = {name: decoded.column(name).to_pylist() for name in (KIND, RAW, REASON, DETAIL)}
    times = decoded.column(EVENT_TIME_MS).to_pylist()
    values = records.column("value").to_pylist()
    for row in rows.tolist():
        columns[KIND][row] = RowKind.DEAD
        columns[RAW][row] = mask_card_numbers_bytes(values[row] or b"")
        columns[REASON][row] = Reason.FUTURE_EVENT_TIME.value
        columns[DETAIL][row] = future_detail(times[row], clock_ms, "the micro-batch's clock")
    for name, cells in columns.items():
        index = decoded.schema.get_field_index(name)
        decoded = decoded.set_column(
            index, decoded.schema.field(index), pa.array(cells, decoded.schema.field(index).type)
        )
    return decoded


def _event_batch(
    model: type[TransactionEvent] | type[LabelEvent],
    columns: dict[str, list[object]],
    records: pa.RecordBatch,
    rows: np.ndarray,
    options: DecodeOptions,
) -> pa.RecordBatch:
    """Event rows of valid transactions or labels, given as columns named like the model's fields."""
    n = len(rows)
    codes, distinct = pd.factorize(np.asarray(columns[C.CARD_ID], dtype=object))
    buckets = np.asarray([card_bucket(card, options.card_buckets) for card in distinct], dtype=np.int32)
    where = {
        SOURCE_TOPIC: records.column("topic").take(pa.array(rows)),
        SOURCE_PARTITION: records.column("partition").take(pa.array(rows)),
        SOURCE_OFFSET: records.column("offset").take(pa.array(rows)),
    }
    common = {
        CARD_BUCKET: buckets[codes],
        C.CARD_ID: columns[C.CARD_ID],
        C.TX_ID: columns[C.TX_ID],
        C.TERMINAL_ID: columns[C.TERMINAL_ID],
        **where,
    }
    if model is TransactionEvent:
        return decoded_batch(
            n,
            {
                **common,
                KIND: [RowKind.TX] * n,
                C.AMOUNT: columns[C.AMOUNT],
                EVENT_TIME_MS: columns[EVENT_TIME_MS],
                C.TERMINAL_X: columns[C.TERMINAL_X],
                C.TERMINAL_Y: columns[C.TERMINAL_Y],
            },
        )
    return decoded_batch(
        n,
        {
            **common,
            KIND: [RowKind.LABEL] * n,
            EVENT_TIME_MS: columns[TX_TIME_MS],
            KNOWN_AT_MS: columns[KNOWN_AT_MS],
            C.IS_FRAUD: columns[C.IS_FRAUD],
        },
    )


def _decode(records: pa.RecordBatch, options: DecodeOptions) -> pa.RecordBatch:
    """``parse_event`` per record: event rows and dead rows, in the records' order."""
    if not records.num_rows:
        return decoded_batch(0, {})
    rows: list[list[int]] = [[], [], []]  # of the transactions, the labels, the dead
    events: tuple[list[TransactionEvent], list[LabelEvent], list[DeadLetter]] = ([], [], [])
    columns = (records.column(name).to_pylist() for name in ("topic", "partition", "offset", "value"))
    for row, (topic, partition, offset, raw) in enumerate(zip(*columns, strict=True)):
        source = f"kafka:{topic}"
        if topic == options.transactions_topic:
            event: TransactionEvent | LabelEvent | DeadLetter = parse_event(
                TransactionEvent, raw or b"", source, options.max_event_bytes, partition, offset
            )
        elif topic == options.labels_topic:
            event = parse_event(LabelEvent, raw or b"", source, options.max_event_bytes, partition, offset)
        else:
            event = DeadLetter(
                raw=raw or b"",
                source=source,
                reason=Reason.INVALID_VALUE,
                detail=f"record from unexpected topic {topic}",
                partition=partition,
                offset=offset,
            )
        kind = 0 if isinstance(event, TransactionEvent) else 1 if isinstance(event, LabelEvent) else 2
        rows[kind].append(row)
        events[kind].append(event)  # type: ignore[arg-type]
    batches = []
    for kind, model in ((0, TransactionEvent), (1, LabelEvent)):
        if events[kind]:
            fields = model.model_fields
            columns_of = {name: [getattr(e, name) for e in events[kind]] for name in fields}
            batches.append(_event_batch(model, columns_of, records, np.asarray(rows[kind]), options))
    dead = events[2]
    if dead:
        batches.append(
            decoded_batch(
                len(dead),
                {
                    KIND: [RowKind.DEAD] * len(dead),
                    CARD_BUCKET: [(e.offset or 0) % options.card_buckets for e in dead],
                    RAW: [e.raw for e in dead],
                    REASON: [e.reason.value for e in dead],
                    DETAIL: [e.detail for e in dead],
                    SOURCE_TOPIC: [e.source.removeprefix("kafka:") for e in dead],
                    SOURCE_PARTITION: [e.partition for e in dead],
                    SOURCE_OFFSET: [e.offset for e in dead],
                },
            )
        )
    decoded = one_batch(batches)
    positions = np.concatenate([np.asarray(k, dtype=np.int64) for k in rows if k])
    if bool(np.all(positions[1:] > positions[:-1])):
        return decoded  # in order already (one kind of record, say)
    return decoded.take(pa.array(np.argsort(positions, kind="stable")))


def ticks(frontier_ms: int, card_buckets: int, final: bool = False) -> pa.RecordBatch:
    """One tick per card bucket carrying the micro-batch's frontier; ``final``: the micro-batch is the last
    of an availableNow run (``infra.spark.frontier``), and the buckets release every event."""
    n = card_buckets
    kind = RowKind.FINAL_TICK if final else RowKind.TICK
    return decoded_batch(n, {CARD_BUCKET: list(range(n)), KIND: [kind] * n, EVENT_TIME_MS: [frontier_ms] * n})
