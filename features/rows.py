"""The rows the feature job's stages pass on: their kinds, columns and Arrow schemas, and frame helpers.

Every stage's rows share :data:`EVENT_FIELDS` (the event, where it came from, and for dead rows why it
was rejected); the feature columns' types come from the feature specs (``features.definitions``).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from contracts.events import TxColumns
from features.definitions import EVENT_TIME_MS, KNOWN_AT_MS, FeatureParams

C = TxColumns


class RowKind(StrEnum):
    """What a row between the stages holds (its :data:`KIND` column; the values are its strings)."""

    TX = "tx"
    LABEL = "label"
    DEAD = "dead"
    #: The micro-batch's frontier, carried to every card bucket.
    TICK = "tick"
    #: The frontier of the final micro-batch of an ``availableNow`` run: it releases every waiting event.
    FINAL_TICK = "final_tick"
    #: A transaction with its features (the terminal stage's output).
    FEATURES = "features"


KIND = "kind"
CARD_BUCKET = "card_bucket"
TERMINAL_BUCKET = "terminal_bucket"
LATE = "late"
SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET = "source_topic", "source_partition", "source_offset"
#: Where a row's record stands in Kafka, in the order of a sort by position.
SOURCE_FIELDS = (SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET)
RAW, REASON, DETAIL = "raw", "reason", "detail"
#: A dead row's record and why it was rejected.
DEAD_FIELDS = (RAW, REASON, DETAIL)

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

#: Arrow types of the feature specs' dtypes.
ARROW_TYPES = {"int64": pa.int64(), "float64": pa.float64()}


def decoded_fields() -> list[tuple[str, pa.DataType]]:
    return [(CARD_BUCKET, pa.int32()), *EVENT_FIELDS]


def card_stage_fields(params: FeatureParams) -> list[tuple[str, pa.DataType]]:
    card = [(spec.name, ARROW_TYPES[spec.dtype]) for spec in params.specs if spec.entity == "card"]
    return [(TERMINAL_BUCKET, pa.int32()), *EVENT_FIELDS, (LATE, pa.bool_()), *card]


def output_fields(params: FeatureParams) -> list[tuple[str, pa.DataType]]:
    features = [(spec.name, ARROW_TYPES[spec.dtype]) for spec in params.specs]
    return [*EVENT_FIELDS, (LATE, pa.bool_()), *features]


def rows_where(frame: pd.DataFrame, mask: npt.ArrayLike) -> pd.DataFrame:
    """The rows of ``frame`` where ``mask`` holds (positionally): the frame itself when all do, none of its
    rows when none do. Most masks of a call are one or the other (no repeats, no late events), and a
    boolean index of a frame as wide as the stages' rows costs about a millisecond."""
    mask = np.asarray(mask, dtype=bool)
    if mask.all():
        return frame
    if not mask.any():
        return frame.iloc[:0]
    return frame[mask]


def concat_frames(*frames: pd.DataFrame) -> pd.DataFrame:
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
    return pd.DataFrame(data, index=pd.RangeIndex(sum(len(frame) for frame in nonempty)), copy=False)


def frame_of(fields: list[tuple[str, pa.DataType]], columns: dict[str, object], n: int) -> pd.DataFrame:
    """A frame with exactly ``fields``: given columns, the rest null (built by NumPy, not from lists).

    The columns are taken as they are, not copied into one block per dtype: a frame as wide as the stages'
    rows took 2 ms to build that way, most of it copying."""
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
    return pd.DataFrame(data, index=pd.RangeIndex(n), copy=False)


# --- 1. decode --------------------------------------------------------------------------------------


def decoded_batch(n: int, columns: Mapping[str, object]) -> pa.RecordBatch:
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


def one_batch(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """The rows of record batches of one schema, as one batch."""
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def empty_events() -> pd.DataFrame:
    return frame_of(decoded_fields(), {}, 0)
