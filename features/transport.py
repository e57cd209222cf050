"""State values and the rows between stages, as Arrow IPC bytes.

Spark moves rows one by one between Python and the JVM; sending each key ONE row that holds all its events
as an Arrow IPC blob keeps that cost per key instead of per event. A card bucket's waiting events are kept
as such a blob too; the entries of the stages' state are packed by ``features.entries``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from contracts.events import TxColumns
from features.rows import empty_events
from infra.spark.kafka_sink.records import pack_records

C = TxColumns

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
