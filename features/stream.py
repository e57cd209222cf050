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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from features.core import CardState, TerminalState, card_step, terminal_step, time_features
from features.definitions import EVENT_TIME_MS, KNOWN_AT_MS, TX_TIME_MS, FeatureParams
from ingest.schemas import DeadLetter, LabelEvent, Reason, TransactionEvent, TxColumns
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

_DDL_TYPES = {
    pa.string(): "string",
    pa.int64(): "bigint",
    pa.int32(): "int",
    pa.float64(): "double",
    pa.bool_(): "boolean",
    pa.binary(): "binary",
}


def ddl(fields: list[tuple[str, pa.DataType]]) -> str:
    """Spark DDL of a field list."""
    return ", ".join(f"{name} {_DDL_TYPES[kind]}" for name, kind in fields)


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
    """Rows of all frames (column layout of the first), skipping empty ones."""
    nonempty = [frame for frame in frames if len(frame)]
    if not nonempty:
        return frames[0].iloc[0:0].reset_index(drop=True)
    if len(nonempty) == 1:
        return nonempty[0].reset_index(drop=True)
    return pd.concat(nonempty, ignore_index=True)


def _frame(fields: list[tuple[str, pa.DataType]], columns: dict[str, object], n: int) -> pd.DataFrame:
    """A frame with exactly ``fields``: given columns, the rest null."""
    data = {}
    for name, kind in fields:
        if name in columns:
            data[name] = columns[name]
        elif kind in (pa.string(), pa.binary()):
            data[name] = pd.Series([None] * n, dtype=object)
        elif kind == pa.bool_():
            data[name] = pd.Series([None] * n, dtype="boolean")
        elif kind == pa.float64():
            data[name] = np.full(n, np.nan)
        else:
            data[name] = pd.Series([None] * n, dtype="Int64")
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
    """Validate raw records of the transactions or labels topic into event rows (bad ones: dead rows)."""
    txs: list[tuple[TransactionEvent, str, int, int]] = []
    labels: list[tuple[LabelEvent, str, int, int]] = []
    dead: list[tuple[DeadLetter, str, int, int]] = []
    positions: tuple[list[int], list[int], list[int]] = ([], [], [])
    topics = records.column("topic").to_pylist()
    partitions = records.column("partition").to_pylist()
    offsets = records.column("offset").to_pylist()
    values = records.column("value").to_pylist()
    for position, (topic, partition, offset, raw) in enumerate(
        zip(topics, partitions, offsets, values, strict=True)
    ):
        if topic == options.transactions_topic:
            event: TransactionEvent | LabelEvent | DeadLetter = parse_event(
                TransactionEvent, raw or b"", f"kafka:{topic}", options.max_event_bytes, partition, offset
            )
        elif topic == options.labels_topic:
            event = parse_event(
                LabelEvent, raw or b"", f"kafka:{topic}", options.max_event_bytes, partition, offset
            )
        else:
            event = DeadLetter(
                raw=raw or b"",
                source=f"kafka:{topic}",
                reason=Reason.INVALID_VALUE,
                detail=f"record from unexpected topic {topic}",
                partition=partition,
                offset=offset,
            )
        where = (topic, partition, offset)
        if isinstance(event, TransactionEvent):
            txs.append((event, *where))
            positions[0].append(position)
        elif isinstance(event, LabelEvent):
            labels.append((event, *where))
            positions[1].append(position)
        else:
            dead.append((event, *where))
            positions[2].append(position)
    buckets = options.card_buckets
    batches = []
    if txs:
        batches.append(
            _batch(
                len(txs),
                {
                    KIND: [TX] * len(txs),
                    CARD_BUCKET: [card_bucket(e.card_id, buckets) for e, *_ in txs],
                    C.TX_ID: [e.tx_id for e, *_ in txs],
                    C.CARD_ID: [e.card_id for e, *_ in txs],
                    C.TERMINAL_ID: [e.terminal_id for e, *_ in txs],
                    C.AMOUNT: [e.amount for e, *_ in txs],
                    EVENT_TIME_MS: [e.event_time_ms for e, *_ in txs],
                    C.TERMINAL_X: [e.terminal_x for e, *_ in txs],
                    C.TERMINAL_Y: [e.terminal_y for e, *_ in txs],
                    **_where(txs),
                },
            )
        )
    if labels:
        batches.append(
            _batch(
                len(labels),
                {
                    KIND: [LABEL] * len(labels),
                    CARD_BUCKET: [card_bucket(e.card_id, buckets) for e, *_ in labels],
                    C.TX_ID: [e.tx_id for e, *_ in labels],
                    C.CARD_ID: [e.card_id for e, *_ in labels],
                    C.TERMINAL_ID: [e.terminal_id for e, *_ in labels],
                    EVENT_TIME_MS: [e.tx_time_ms for e, *_ in labels],
                    KNOWN_AT_MS: [e.known_at_ms for e, *_ in labels],
                    C.IS_FRAUD: [e.is_fraud for e, *_ in labels],
                    **_where(labels),
                },
            )
        )
    if dead:
        batches.append(
            _batch(
                len(dead),
                {
                    KIND: [DEAD] * len(dead),
                    CARD_BUCKET: [offset % buckets for *_, offset in dead],
                    RAW: [e.raw for e, *_ in dead],
                    REASON: [e.reason.value for e, *_ in dead],
                    DETAIL: [e.detail for e, *_ in dead],
                    **_where(dead),
                },
            )
        )
    if not batches:
        return _batch(0, {})
    if len(batches) == 1:
        return batches[0]
    # Keep the records' order (one topic per range in the job, but callers may mix them).
    order = np.argsort(np.concatenate([np.asarray(p, dtype=np.int64) for p in positions if p]), kind="stable")
    combined = pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
    return combined.take(pa.array(order))


def _where(rows: Sequence[tuple[object, str, int, int]]) -> dict[str, list[object]]:
    return {
        SOURCE_TOPIC: [topic for _, topic, _, _ in rows],
        SOURCE_PARTITION: [partition for _, _, partition, _ in rows],
        SOURCE_OFFSET: [offset for *_, offset in rows],
    }


def _batch(n: int, columns: dict[str, list[object]]) -> pa.RecordBatch:
    """A record batch of the decoded schema: given columns, the rest null."""
    schema = pa.schema(decoded_fields())
    arrays = [
        pa.array(columns[field.name], field.type) if field.name in columns else pa.nulls(n, field.type)
        for field in schema
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def ticks(frontier_ms: int, card_buckets: int, final: bool = False) -> pa.RecordBatch:
    """One tick per card bucket carrying the micro-batch's frontier; ``final``: the micro-batch is the last
    of an availableNow run (``infra.spark_source.Split.final``), and the buckets release every event."""
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


# --- state blobs ------------------------------------------------------------------------------------


def to_blob(frame: pd.DataFrame | pa.RecordBatch) -> bytes:
    """Arrow IPC bytes of a frame: state values, and the rows one stage sends to one key of the next."""
    table = frame if isinstance(frame, pa.RecordBatch) else pa.Table.from_pandas(frame, preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write(table)
    return bytes(sink.getvalue().to_pybytes())


def from_blob(blob: bytes) -> pd.DataFrame:
    return pa.ipc.open_stream(blob).read_all().to_pandas()


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
    payloads = [to_blob(events.take(pa.array(np.flatnonzero(keys == key)))) for key in distinct]
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
