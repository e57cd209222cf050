"""The Spark types of the Kafka sink's input columns (``infra.spark.kafka_sink.records.COLUMNS``), and the check of a
DataFrame's schema against them: the Spark side of the sink, apart from the records' pure helpers."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructType,
)

from infra.spark.kafka_sink.config import SinkConfigError
from infra.spark.kafka_sink.records import COLUMNS, RECORDS_COLUMN

#: Type of the ``headers`` column (Spark's own Kafka sink uses the same shape), e.g. for ``F.lit(None).cast(...)``.
HEADERS_TYPE = ArrayType(StructType().add("key", StringType()).add("value", BinaryType()))
#: The accepted types of each input column.
COLUMN_TYPES: dict[str, tuple[DataType, ...]] = dict(
    zip(
        COLUMNS,
        (
            (StringType(),),
            (BinaryType(), StringType()),
            (BinaryType(), StringType()),
            (LongType(),),
            (HEADERS_TYPE,),
            (IntegerType(),),
        ),
        strict=True,
    )
)


def validate_schema(schema: StructType, default_topic: str | None) -> None:
    """Check the input columns against :data:`COLUMN_TYPES`.

    Raises:
        SinkConfigError: an unknown column, a wrong type, no ``value``, or no topic at all.
    """
    fields = {field.name: field.dataType for field in schema.fields}
    if RECORDS_COLUMN in fields:
        if list(fields) != [RECORDS_COLUMN] or not isinstance(fields[RECORDS_COLUMN], BinaryType):
            raise SinkConfigError(
                f"the Kafka sink cannot write this schema: packed input is a single binary column "
                f"{RECORDS_COLUMN!r}, got {schema.simpleString()}"
            )
        return
    problems = [f"unknown column {name!r}" for name in fields if name not in COLUMN_TYPES]
    for name, data_type in fields.items():
        allowed = COLUMN_TYPES.get(name)
        if allowed is not None and not any(_same_type(data_type, ok) for ok in allowed):
            wanted = " or ".join(ok.simpleString() for ok in allowed)
            problems.append(f"column {name!r} is {data_type.simpleString()}, expected {wanted}")
    if "value" not in fields:
        problems.append("column 'value' is required")
    if "topic" not in fields and default_topic is None:
        problems.append("column 'topic' is required unless the sink has a default topic")
    if problems:
        raise SinkConfigError(f"the Kafka sink cannot write this schema: {'; '.join(problems)}")


def _same_type(actual: DataType, expected: DataType) -> bool:
    """Type equality that ignores nullability (Spark's equality does not)."""
    if isinstance(expected, ArrayType):
        return isinstance(actual, ArrayType) and _same_type(actual.elementType, expected.elementType)
    if isinstance(expected, StructType):
        return (
            isinstance(actual, StructType)
            and [f.name for f in actual.fields] == [f.name for f in expected.fields]
            and all(
                _same_type(a.dataType, e.dataType)
                for a, e in zip(actual.fields, expected.fields, strict=True)
            )
        )
    return type(actual) is type(expected)
