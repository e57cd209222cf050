"""The rows the Kafka sink writes: their columns, packed records and the helpers stages use to build them.

Input rows (:data:`COLUMNS`): ``topic`` string (optional when the sink has a default topic, which is used
for absent or null topics), ``key`` binary or string (nullable), ``value`` binary or string (nullable: a
tombstone), ``timestamp_ms`` long (nullable: Kafka record timestamp in UTC milliseconds, null = now),
``headers`` array<struct<key string, value binary>> (nullable; the shape of Spark's own Kafka sink),
``partition`` int (nullable: null = the producer's partitioner). Unknown columns are an error.
Instead of those, a stage that builds its records in Python can send many in one row: a single column
``records`` binary, each cell an Arrow IPC stream of rows with the columns above (:func:`pack_records`).
That keeps the cost of the trip through the JVM per packed row instead of per record.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from contracts.events import DeadLetter, to_record
from infra.spark.kafka_sink.config import SinkWriteError

#: Accepted input columns (their Spark types: ``infra.spark.kafka_sink.schema``).
COLUMNS = ("topic", "key", "value", "timestamp_ms", "headers", "partition")
#: The type of the ``headers`` column as Arrow's, for packed records (:func:`pack_records`).
HEADERS_ARROW_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
#: The column of packed input: Arrow IPC streams of rows with :data:`COLUMNS` (see the module docstring).
RECORDS_COLUMN = "records"
#: The schema of packed input, as Arrow and as a Spark DDL string.
PACKED_SCHEMA = pa.schema([(RECORDS_COLUMN, pa.binary())])
PACKED_DDL = f"{RECORDS_COLUMN} binary"


class SinkRows:
    """Sink records (:data:`COLUMNS` but ``partition``) built row by row, for the few rows built that way."""

    NAMES = ("topic", "key", "value", "timestamp_ms", "headers")

    def __init__(self) -> None:
        self.columns: tuple[list[Any], ...] = ([], [], [], [], [])

    def add(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None,
        headers: list[tuple[str, str | bytes | None]] | None,
    ) -> None:
        pairs = None if headers is None else [{"key": k, "value": v} for k, v in headers]
        for column, cell in zip(self.columns, (topic, key, value, timestamp_ms, pairs), strict=True):
            column.append(cell)

    def add_dead_letter(self, letter: DeadLetter, topic: str) -> None:
        """The dead-letter record of ``letter`` (original bytes, ``dlq.*`` headers)."""
        value, headers = to_record(letter)
        self.add(topic, None, value, None, headers)

    def batch(self) -> pa.RecordBatch | None:
        """The rows added so far; None when there are none."""
        if not self.columns[0]:
            return None
        types = (pa.string(), pa.binary(), pa.binary(), pa.int64(), HEADERS_ARROW_TYPE)
        return pa.RecordBatch.from_arrays(
            [pa.array(column, kind) for column, kind in zip(self.columns, types, strict=True)],
            names=list(self.NAMES),
        )


def newest_per_key(batches: list[pa.RecordBatch], topic: str) -> list[bytes]:
    """Values of the rows for ``topic`` with the newest ``timestamp_ms`` of their key (all of them on a tie).

    For ``after.commit`` hooks that keep the latest record per key in a side store: only these few rows
    need parsing (ties are the hook's to break). Rows without a value are skipped; rows without a key
    share one.
    """
    parts = [
        pa.table(
            {
                "topic": batch.column("topic"),
                "key": batch.column("key").cast(pa.binary()),
                "value": batch.column("value").cast(pa.binary()),
                "timestamp_ms": batch.column("timestamp_ms"),
            }
        )
        for batch in batches
    ]
    if not parts:
        return []
    rows = pa.concat_tables(parts)
    rows = rows.filter(pc.and_(pc.equal(rows["topic"], topic), pc.is_valid(rows["value"])))
    if not rows.num_rows:
        return []
    keys = pc.dictionary_encode(rows["key"].combine_chunks())
    codes = pc.fill_null(keys.indices, len(keys.dictionary)).to_numpy()
    times = pc.fill_null(rows["timestamp_ms"], np.iinfo(np.int64).min).to_numpy()
    newest = np.full(len(keys.dictionary) + 1, np.iinfo(np.int64).min)
    np.maximum.at(newest, codes, times)
    return rows["value"].filter(pa.array(times == newest[codes])).to_pylist()


def kafka_headers(raw: list[dict[str, Any]] | None) -> list[tuple[str, bytes | None]] | None:
    """Arrow's ``array<struct<key, value>>`` cells (lists of dicts) as confluent-kafka header tuples."""
    if not raw:
        return None
    return [(header["key"], header["value"]) for header in raw]


def pack_records(records: pa.RecordBatch | pa.Table, compression: str | None = None) -> bytes:
    """Rows as the bytes of an Arrow IPC stream (its buffers compressed with ``compression``, e.g.
    ``"zstd"``, if given): a cell of the ``records`` column when they have the columns of :data:`COLUMNS`."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, records.schema, options=options) as writer:
        writer.write(records)
    return bytes(sink.getvalue().to_pybytes())


def unpacked(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The input rows, with packed ``records`` cells opened into the record batches they hold."""
    for batch in batches:
        if RECORDS_COLUMN not in batch.schema.names:
            yield batch
            continue
        for blob in batch.column(RECORDS_COLUMN).to_pylist():
            if blob is None:
                continue
            reader = pa.ipc.open_stream(blob)
            unknown = [name for name in reader.schema.names if name not in COLUMNS]
            if unknown or "value" not in reader.schema.names:
                raise SinkWriteError(
                    f"a packed {RECORDS_COLUMN!r} cell has columns {reader.schema.names}: expected "
                    f"'value' and others of {list(COLUMNS)}"
                )
            yield from reader
