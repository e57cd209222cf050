"""The feature job's output as Kafka records: feature records (JSON built column by column in Arrow) and
dead letters, in the sink's columns (``infra.spark.kafka_sink.records.COLUMNS``)."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import pyarrow as pa

from contracts.events import SCHEMA_VERSION, DeadLetter, Reason, TxColumns
from features.definitions import EVENT_TIME_MS, FeatureParams
from features.rows import DEAD_FIELDS, KIND, LATE, SOURCE_FIELDS, RowKind, output_fields
from infra.arrow_json import json_objects
from infra.spark.kafka_sink.records import HEADERS_ARROW_TYPE, SinkRows

C = TxColumns


def kafka_records(
    rows: pd.DataFrame,
    features_topic: str,
    dead_letter_topic: str,
    params: FeatureParams,
    hook: Callable[[pd.DataFrame, pa.Array], pa.Table | None] | None = None,
) -> pa.Table:
    """The sink's records of terminal-stage rows (``infra.spark.kafka_sink.records.COLUMNS``).

    Feature rows become ``FeatureRecord`` JSON keyed by card, with the event time as Kafka timestamp;
    dead rows become dead-letter records (original bytes, the reason in ``dlq.*`` headers). ``hook``
    adds the records it makes of the feature rows and their JSON (``features.job.FeatureRowsHook``).
    """
    is_dead = (rows[KIND] == RowKind.DEAD).to_numpy()
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
        *(dead[name].tolist() for name in (*DEAD_FIELDS, *SOURCE_FIELDS)),
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
    """``contracts.records.FeatureRecord`` JSON of feature rows: the input event, the late flag, the
    features."""

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
