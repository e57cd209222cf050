"""The streaming feature job's stages as pure functions over pandas frames, plus their row schemas.

Three stages, each a thin Spark shell (``features.job``) around a function here:

1. ``decode``: Kafka records of the transactions and labels topics become typed event rows; records that
   fail validation become dead rows with the reason. Each event is routed to a card bucket (cards hashed
   into a few buckets per Spark key, so one state call serves many cards).
2. ``card_stage``: per card bucket, events wait until the source's event-time frontier passes them, then
   go through ``features.core.card_step`` in event-time order. The final micro-batch of an
   ``availableNow`` run moves each bucket's frontier past every event it holds, which releases them all.
   An event that arrives behind the bucket's frontier already passed is *late*: processed at once against
   the state as it is, and marked.
3. ``terminal_stage``: per terminal bucket, the released transactions and labels go through
   ``features.core.terminal_step``; the time features complete the record.

Because every micro-batch releases exactly the events below a frontier, in order, and the core steps give
the same result for any chunking of an ordered stream, the streaming result equals the batch definition
(``features.core.compute_features``) whatever the micro-batch sizes, restarts included.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from contracts.events import (
    SCHEMA_VERSION,
    DeadLetter,
    LabelEvent,
    Reason,
    TransactionEvent,
    TxColumns,
)
from features.core import CardState, TerminalState, card_step, terminal_step, time_features
from features.definitions import EVENT_TIME_MS, KNOWN_AT_MS, TX_TIME_MS, FeatureParams
from infra.arrow_json import json_objects
from infra.kafka_sink.records import HEADERS_ARROW_TYPE, SinkRows, pack_records
from ingest.columnar import validate_many
from ingest.validation import parse_event

C = TxColumns

# Row kinds. Ticks carry the micro-batch's frontier to every card bucket; final ticks end an availableNow run.
TX, LABEL, DEAD, TICK, FINAL_TICK = "tx", "label", "dead", "tick", "final_tick"
FEATURES = "features"

KIND = "kind"
CARD_BUCKET = "card_bucket"
TERMINAL_BUCKET = "terminal_bucket"
LATE = "late"
SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET = "source_topic", "source_partition", "source_offset"
RAW, REASON, DETAIL = "raw", "reason", "detail"

#: Columns shared by every stage: the event, where it came from, and (dead rows) why it was rejected.
EVENT_FIELDS: list[tuple[str, pa.DataType]] = [
    (KIND, pa.string()),
    (C.TX_ID, pa.int64()),
    (C.CARD_ID, pa.string()),
    (C.TERMINAL_ID, pa.string()),
    (C.AMOUNT, pa.float64()),
    (EVENT_TIME_MS, pa.int64()),  # transactions: event time; labels: the transaction's; ticks: frontier
    (KNOWN_AT_MS, pa.int64()),
    (C.IS_FRAUD, pa.bool_()),
    (C.TERMINAL_X, pa.float64()),
    (C.TERMINAL_Y, pa.float64()),
    (SOURCE_TOPIC, pa.string()),
    (SOURCE_PARTITION, pa.int32()),
    (SOURCE_OFFSET, pa.int64()),
    (RAW, pa.binary()),
    (REASON, pa.string()),
    (DETAIL, pa.string()),
]


def decoded_fields() -> list[tuple[str, pa.DataType]]:
    return [(CARD_BUCKET, pa.int32()), *EVENT_FIELDS]


def card_stage_fields(params: FeatureParams) -> list[tuple[str, pa.DataType]]:
    card = [(name, _feature_type(name)) for name in params.card_feature_columns]
    return [(TERMINAL_BUCKET, pa.int32()), *EVENT_FIELDS, (LATE, pa.bool_()), *card]


def output_fields(params: FeatureParams) -> list[tuple[str, pa.DataType]]:
    features = [(name, _feature_type(name)) for name in params.feature_columns]
    return [*EVENT_FIELDS, (LATE, pa.bool_()), *features]


def _feature_type(name: str) -> pa.DataType:
    return pa.int64() if "_nb_tx_" in name or name.startswith("is_") else pa.float64()


def _concat(*frames: pd.DataFrame) -> pd.DataFrame:
    """Rows of all frames (column layout of the first), skipping empty ones.

    Column by column: columns of one NumPy dtype are joined by NumPy. (``pd.concat`` inspects every
    value of an all-null object column, which made it the card stage's largest cost.)
    """
    nonempty = [frame for frame in frames if len(frame)]
    if not nonempty:
        return frames[0].iloc[0:0].reset_index(drop=True)
    if len(nonempty) == 1:
        return nonempty[0].reset_index(drop=True)
    data: dict[str, object] = {}
    for name in nonempty[0].columns:
        parts = [frame[name] for frame in nonempty]
        dtype = parts[0].dtype
        if isinstance(dtype, np.dtype) and all(part.dtype == dtype for part in parts):
            data[name] = np.concatenate([part.to_numpy() for part in parts])
        else:
            data[name] = pd.concat(parts, ignore_index=True)
    return pd.DataFrame(data, index=pd.RangeIndex(sum(len(frame) for frame in nonempty)))


def _frame(fields: list[tuple[str, pa.DataType]], columns: dict[str, object], n: int) -> pd.DataFrame:
    """A frame with exactly ``fields``: given columns, the rest null (built by NumPy, not from lists)."""
    data = {}
    missing = np.ones(n, dtype=bool)
    for name, kind in fields:
        if name in columns:
            data[name] = columns[name]
        elif kind in (pa.string(), pa.binary()):
            data[name] = np.full(n, None, dtype=object)
        elif kind == pa.bool_():
            data[name] = pd.arrays.BooleanArray(np.zeros(n, dtype=bool), missing)
        elif kind == pa.float64():
            data[name] = np.full(n, np.nan)
        else:
            data[name] = pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), missing)
    return pd.DataFrame(data, index=pd.RangeIndex(n))


# --- 1. decode --------------------------------------------------------------------------------------


def card_bucket(card_id: str, buckets: int) -> int:
    """Bucket of a card token (its first 8 hex digits are uniformly distributed)."""
    try:
        return int(card_id[:8], 16) % buckets
    except ValueError:
        return zlib.crc32(card_id.encode()) % buckets


def terminal_buckets(terminal_ids: pd.Series, buckets: int) -> np.ndarray:
    """Bucket of each terminal id (CRC-32, stable across processes and runs)."""
    mapping = {t: zlib.crc32(str(t).encode()) % buckets for t in terminal_ids.unique()}
    return terminal_ids.map(mapping).to_numpy(dtype=np.int32)


@dataclass(frozen=True)
class DecodeOptions:
    transactions_topic: str
    labels_topic: str
    card_buckets: int
    max_event_bytes: int


def decode(records: pa.RecordBatch, options: DecodeOptions) -> pa.RecordBatch:
    """Validate raw records of the transactions or labels topic into event rows (bad ones: dead rows).

    Records are validated in bulk (``ingest.columnar.validate_many``); the few it cannot decide go
    through ``parse_event`` one by one, which also gives the dead letters their reasons. Rows keep the
    records' order.
    """
    topics = records.column("topic").to_numpy(zero_copy_only=False)
    parts: list[tuple[np.ndarray, pa.RecordBatch]] = []
    for topic, model in ((options.transactions_topic, TransactionEvent), (options.labels_topic, LabelEvent)):
        rows = np.flatnonzero(topics == topic)
        if not len(rows):
            continue
        found = validate_many(model, records.column("value").take(pa.array(rows)), options.max_event_bytes)
        if found.table.num_rows:
            columns = {name: found.table.column(name).combine_chunks() for name in found.table.column_names}
            parts.append(
                (rows[found.positions], _event_batch(model, columns, records, rows[found.positions], options))
            )
        if len(found.slow):
            parts.append(_decode_one_by_one(records, rows[found.slow], options))
    others = np.flatnonzero((topics != options.transactions_topic) & (topics != options.labels_topic))
    if len(others):
        parts.append(_decode_one_by_one(records, others, options))
    if not parts:
        return _batch(0, {})
    if len(parts) == 1:
        return parts[0][1]
    order = np.argsort(np.concatenate([positions for positions, _ in parts]), kind="stable")
    combined = _one_batch([batch for _, batch in parts])
    return combined.take(pa.array(order))


def _event_batch(
    model: type[TransactionEvent] | type[LabelEvent],
    columns: dict[str, pa.Array | list[object]],
    records: pa.RecordBatch,
    rows: np.ndarray,
    options: DecodeOptions,
) -> pa.RecordBatch:
    """Event rows of valid transactions or labels, given as columns named like the model's fields."""
    n = len(rows)
    cards = columns[C.CARD_ID]
    codes, distinct = pd.factorize(
        np.asarray(cards if isinstance(cards, list) else cards.to_pylist(), dtype=object)
    )
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
        return _batch(
            n,
            {
                **common,
                KIND: [TX] * n,
                C.AMOUNT: columns[C.AMOUNT],
                EVENT_TIME_MS: columns[EVENT_TIME_MS],
                C.TERMINAL_X: columns[C.TERMINAL_X],
                C.TERMINAL_Y: columns[C.TERMINAL_Y],
            },
        )
    return _batch(
        n,
        {
            **common,
            KIND: [LABEL] * n,
            EVENT_TIME_MS: columns[TX_TIME_MS],
            KNOWN_AT_MS: columns[KNOWN_AT_MS],
            C.IS_FRAUD: columns[C.IS_FRAUD],
        },
    )


def _decode_one_by_one(
    records: pa.RecordBatch, rows: np.ndarray, options: DecodeOptions
) -> tuple[np.ndarray, pa.RecordBatch]:
    """``parse_event`` per record: event rows and dead rows of ``rows``, in their order."""
    kinds: list[list[int]] = [[], [], []]
    events: tuple[list[TransactionEvent], list[LabelEvent], list[DeadLetter]] = ([], [], [])
    topics = records.column("topic").take(pa.array(rows)).to_pylist()
    partitions = records.column("partition").take(pa.array(rows)).to_pylist()
    offsets = records.column("offset").take(pa.array(rows)).to_pylist()
    values = records.column("value").take(pa.array(rows)).to_pylist()
    for row, topic, partition, offset, raw in zip(
        rows.tolist(), topics, partitions, offsets, values, strict=True
    ):
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
        kinds[kind].append(row)
        events[kind].append(event)  # type: ignore[arg-type]
    batches = []
    for kind, model in ((0, TransactionEvent), (1, LabelEvent)):
        if events[kind]:
            fields = model.model_fields
            columns = {name: [getattr(e, name) for e in events[kind]] for name in fields}
            batches.append(_event_batch(model, columns, records, np.asarray(kinds[kind]), options))
    dead = events[2]
    if dead:
        batches.append(
            _batch(
                len(dead),
                {
                    KIND: [DEAD] * len(dead),
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
    positions = np.concatenate([np.asarray(k, dtype=np.int64) for k in kinds if k])
    return positions, _one_batch(batches)


def _batch(n: int, columns: Mapping[str, object]) -> pa.RecordBatch:
    """A record batch of the decoded schema: given columns (Arrow arrays, NumPy arrays or lists), the rest null."""
    schema = pa.schema(decoded_fields())
    arrays = []
    for field in schema:
        value = columns.get(field.name)
        if value is None:
            arrays.append(pa.nulls(n, field.type))
        elif isinstance(value, pa.Array):
            arrays.append(pc.cast(value, field.type))
        else:
            arrays.append(pa.array(value, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _one_batch(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """The rows of record batches of one schema, as one batch."""
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def ticks(frontier_ms: int, card_buckets: int, final: bool = False) -> pa.RecordBatch:
    """One tick per card bucket carrying the micro-batch's frontier; ``final``: the micro-batch is the last
    of an availableNow run (``infra.kafka_source.splits.Split.final``), and the buckets release every event."""
    n = card_buckets
    kind = FINAL_TICK if final else TICK
    return _batch(n, {CARD_BUCKET: list(range(n)), KIND: [kind] * n, EVENT_TIME_MS: [frontier_ms] * n})


# --- 2. card stage ----------------------------------------------------------------------------------


@dataclass
class CardBucket:
    """The state of one card bucket: card history, events waiting for the frontier, the frontier.

    The frontier is past every event the bucket released in order: a later event behind it is late.
    """

    history: CardState
    pending: pd.DataFrame
    frontier_ms: int


def _event_time(events: pd.DataFrame) -> np.ndarray:
    """When an event happens for ordering: a transaction's event time, a label's known time."""
    is_label = (events[KIND] == LABEL).to_numpy()
    return np.where(
        is_label,
        events[KNOWN_AT_MS].fillna(0).to_numpy(dtype=np.int64),
        events[EVENT_TIME_MS].to_numpy(dtype=np.int64),
    )


def card_stage(
    bucket: CardBucket, rows: pd.DataFrame, params: FeatureParams, terminal_buckets_n: int
) -> tuple[CardBucket, pd.DataFrame]:
    """Hold events until the frontier passes them; release them with their card features.

    A final tick moves the frontier past every waiting event, so they are all released (in event-time
    order, as any others). The bucket's frontier after the call is the highest of its frontier, the ticks'
    and the time + 1 of the newest event released in order (not late).

    Returns the new bucket state and the rows for the terminal stage: released transactions (with card
    features and the late flag), released labels, and dead rows passed through.
    """
    kinds = rows[KIND]
    ticks_in = rows.loc[kinds.isin([TICK, FINAL_TICK]), EVENT_TIME_MS]
    frontier = max([bucket.frontier_ms, *ticks_in.astype("int64").tolist()])
    events = rows[(kinds == TX) | (kinds == LABEL)]
    dead = rows[kinds == DEAD]

    late_mask = _event_time(events) < bucket.frontier_ms if len(events) else np.zeros(0, dtype=bool)
    late = events[late_mask]
    waiting = _concat(bucket.pending, events[~late_mask])
    if len(waiting) and (kinds == FINAL_TICK).any():
        frontier = max(frontier, int(_event_time(waiting).max()) + 1)
    if len(waiting):
        due_mask = _event_time(waiting) < frontier
        due, still = waiting[due_mask], waiting[~due_mask]
    else:
        due, still = waiting, waiting
    released = _concat(due.assign(late=False), late.assign(late=True))
    tx = released[released[KIND] == TX].reset_index(drop=True)
    labels = released[released[KIND] == LABEL].reset_index(drop=True)

    history = bucket.history
    columns: dict[str, object] = {}
    if len(tx):
        history, card = card_step(history, tx, params)
        columns = {name: card[name].to_numpy() for name in params.card_feature_columns}
    out_tx = _frame(
        card_stage_fields(params), {**{c: tx[c] for c in tx.columns if c != CARD_BUCKET}, **columns}, len(tx)
    )
    out_labels = _frame(
        card_stage_fields(params), {c: labels[c] for c in labels.columns if c != CARD_BUCKET}, len(labels)
    )
    out_dead = _frame(
        card_stage_fields(params),
        {c: dead[c].to_numpy() for c in dead.columns if c != CARD_BUCKET},
        len(dead),
    )
    out = _concat(out_tx, out_labels, out_dead)
    if len(out):
        is_dead = (out[KIND] == DEAD).to_numpy()
        routed = terminal_buckets(out[C.TERMINAL_ID].fillna(""), terminal_buckets_n)
        by_offset = out[SOURCE_OFFSET].fillna(0).to_numpy(dtype=np.int64) % terminal_buckets_n
        out[TERMINAL_BUCKET] = np.where(is_dead, by_offset, routed).astype(np.int32)
    return CardBucket(history, still.reset_index(drop=True), frontier), out


# --- 3. terminal stage ------------------------------------------------------------------------------


def terminal_stage(
    state: TerminalState, rows: pd.DataFrame, params: FeatureParams
) -> tuple[TerminalState, pd.DataFrame]:
    """Terminal and time features of released transactions; labels update the terminal risk."""
    kinds = rows[KIND]
    tx = rows[kinds == TX].reset_index(drop=True)
    labels = rows[kinds == LABEL]
    dead = rows[kinds == DEAD]
    label_batch = pd.DataFrame(
        {
            C.TX_ID: labels[C.TX_ID].to_numpy(dtype=np.int64),
            C.TERMINAL_ID: labels[C.TERMINAL_ID].to_numpy(dtype=object),
            TX_TIME_MS: labels[EVENT_TIME_MS].to_numpy(dtype=np.int64),
            KNOWN_AT_MS: labels[KNOWN_AT_MS].to_numpy(dtype=np.int64),
            C.IS_FRAUD: labels[C.IS_FRAUD].to_numpy(dtype=bool),
        }
    )
    tx_batch = pd.DataFrame(
        {
            C.TX_ID: tx[C.TX_ID].to_numpy(dtype=np.int64),
            C.TERMINAL_ID: tx[C.TERMINAL_ID].to_numpy(dtype=object),
            EVENT_TIME_MS: tx[EVENT_TIME_MS].to_numpy(dtype=np.int64),
        }
    )
    state, terminal = terminal_step(state, tx_batch, label_batch, params)
    when = time_features(tx_batch[EVENT_TIME_MS].to_numpy())
    columns = {
        c: tx[c].to_numpy() if c not in (KIND,) else np.full(len(tx), FEATURES, dtype=object)
        for c in tx.columns
        if c != TERMINAL_BUCKET
    }
    columns |= {name: terminal[name].to_numpy() for name in params.terminal_feature_columns}
    columns |= {name: when[name].to_numpy() for name in when.columns}
    fields = output_fields(params)
    out_features = _frame(fields, columns, len(tx))
    out_dead = _frame(
        fields, {c: dead[c].to_numpy() for c in dead.columns if c != TERMINAL_BUCKET}, len(dead)
    )
    return state, _concat(out_features, out_dead)


# --- 4. Kafka records ----------------------------------------------------------------------------------


def kafka_records(
    rows: pd.DataFrame,
    features_topic: str,
    dead_letter_topic: str,
    params: FeatureParams,
    hook: Callable[[pd.DataFrame, pa.Array], pa.Table | None] | None = None,
) -> pa.Table:
    """The sink's records of terminal-stage rows (``infra.kafka_sink.records.COLUMNS``).

    Feature rows become ``FeatureRecord`` JSON keyed by card, with the event time as Kafka timestamp;
    dead rows become dead-letter records (original bytes, the reason in ``dlq.*`` headers). ``hook``
    adds the records it makes of the feature rows and their JSON (``features.job.FeatureRowsHook``).
    """
    is_dead = (rows[KIND] == DEAD).to_numpy()
    features, dead = rows[~is_dead], rows[is_dead]
    n = len(features)
    values = feature_record_values(features, params)
    batches = [
        pa.RecordBatch.from_arrays(
            [
                pa.array([features_topic] * n, pa.string()),
                pa.Array.from_pandas(features[C.CARD_ID]).cast(pa.binary()),
                values,
                pa.Array.from_pandas(features[EVENT_TIME_MS]).cast(pa.int64()),
                pa.nulls(n, HEADERS_ARROW_TYPE),
            ],
            names=list(SinkRows.NAMES),
        )
    ]
    if hook is not None and n:
        more = hook(features.reset_index(drop=True), values)
        if more is not None:
            batches += more.to_batches()
    letters = SinkRows()
    for raw, reason, detail, topic, partition, offset in zip(
        *(
            dead[name].tolist()
            for name in (RAW, REASON, DETAIL, SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET)
        ),
        strict=True,
    ):
        letter = DeadLetter(
            raw=raw,
            source=f"kafka:{topic}",
            reason=Reason(reason),
            detail=detail,
            partition=int(partition),
            offset=int(offset),
        )
        letters.add_dead_letter(letter, dead_letter_topic)
    dead_batch = letters.batch()
    return pa.Table.from_batches(batches if dead_batch is None else [*batches, dead_batch])


def feature_record_values(rows: pd.DataFrame, params: FeatureParams) -> pa.Array:
    """``contracts.events.FeatureRecord`` JSON of feature rows: the input event, the late flag, the features."""

    types = dict(output_fields(params))

    def column(name: str) -> pa.Array:
        # As declared: an integer column that met a null on its way (pandas made it float) is cast back,
        # so that the record validates as FeatureRecord (strict: 1522540800000.0 is not an int).
        return pa.Array.from_pandas(rows[name]).cast(types[name])

    return json_objects(
        [
            ("schema_version", SCHEMA_VERSION),
            *((name, column(name)) for name in (C.TX_ID, C.CARD_ID, C.TERMINAL_ID, C.AMOUNT, EVENT_TIME_MS)),
            (C.TERMINAL_X, column(C.TERMINAL_X)),  # NaN: unknown, null in JSON
            (C.TERMINAL_Y, column(C.TERMINAL_Y)),
            ("late", column(LATE).cast(pa.bool_())),
            ("features", [(name, column(name)) for name in params.feature_columns]),
        ],
        len(rows),
    )


# --- state blobs ------------------------------------------------------------------------------------


#: State values are compressed: the bytes go through pickling, the JVM, the state store and its changelog,
#: where their size is what costs (5x fewer bytes for a card history). The rows between stages are not:
#: they are written once, to Spark's shuffle, which compresses them itself.
BLOB_COMPRESSION = "zstd"


def to_blob(frame: pd.DataFrame | pa.RecordBatch, dictionary: tuple[str, ...] = ()) -> bytes:
    """Compressed Arrow IPC bytes of a frame: a state value.

    The ``dictionary`` columns (repeated strings, like card ids in a card history) are stored once per
    distinct value; ``from_blob`` gives them back as plain values.
    """
    table = frame if isinstance(frame, pa.RecordBatch) else pa.Table.from_pandas(frame, preserve_index=False)
    for name in dictionary:
        index = table.schema.get_field_index(name)
        table = table.set_column(index, name, pc.dictionary_encode(table.column(name)))
    return pack_records(table, BLOB_COMPRESSION)


def from_blob(blob: bytes) -> pd.DataFrame:
    """The frame of ``to_blob`` bytes (dictionary columns as object arrays of their values)."""
    frame = pa.ipc.open_stream(blob).read_all().to_pandas()
    for name, column in frame.items():
        if isinstance(column.dtype, pd.CategoricalDtype):
            frame[name] = column.to_numpy()
    return frame


def empty_events() -> pd.DataFrame:
    return _frame(decoded_fields(), {}, 0)


# --- transport between stages -------------------------------------------------------------------------
# Spark moves rows one by one between Python and the JVM; sending each key ONE row that holds all its
# events as an Arrow IPC blob keeps that cost per key instead of per event.

KEY, PAYLOAD = "key", "payload"
#: Rows between stages: the key of the next stage and the Arrow IPC blob of its events.
PACKED_FIELDS: list[tuple[str, pa.DataType]] = [(KEY, pa.int32()), (PAYLOAD, pa.binary())]
PACKED_SCHEMA = pa.schema(PACKED_FIELDS)


def pack(events: pa.RecordBatch, key_column: str) -> pa.RecordBatch:
    """One row per distinct ``key_column`` value: the key and the blob of its events."""
    keys = events.column(key_column).to_numpy(zero_copy_only=False)
    distinct = np.unique(keys)
    payloads = [pack_records(events.take(pa.array(np.flatnonzero(keys == key)))) for key in distinct]
    return pa.RecordBatch.from_arrays(
        [pa.array(distinct, pa.int32()), pa.array(payloads, pa.binary())], schema=PACKED_SCHEMA
    )


def pack_frame(frame: pd.DataFrame, key_column: str, fields: list[tuple[str, pa.DataType]]) -> pd.DataFrame:
    """``pack`` for a pandas frame with the given fields; returns the packed rows as a frame."""
    batch = pa.RecordBatch.from_pandas(frame, schema=pa.schema(fields), preserve_index=False)
    return pack(batch, key_column).to_pandas()


def unpack(rows: Iterator[pd.DataFrame]) -> pd.DataFrame:
    """The events of the packed rows a state call received, as one frame."""
    tables = [pa.ipc.open_stream(blob).read_all() for frame in rows for blob in frame[PAYLOAD]]
    if not tables:
        return empty_events()
    return pa.concat_tables(tables).to_pandas() if len(tables) > 1 else tables[0].to_pandas()
