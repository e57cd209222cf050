"""The standard test stream of the sink tests: JSON files of ids, one file per micro-batch, as Kafka rows."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

PARTITIONS = 2
INPUT_SCHEMA = "id long, payload string"


def sink_frame(spark: SparkSession, inputs: Path, topics: tuple[str, str] | None = None) -> DataFrame:
    """The standard test stream: key = id, value = the JSON row, one file per micro-batch.

    With ``topics`` the ``topic`` column routes even ids to the first and odd ids to the second topic,
    and rows carry ``timestamp_ms`` and ``headers`` too.
    """
    rows = (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(inputs))
        .repartition(PARTITIONS, "id")
    )
    columns = [
        F.col("id").cast("string").cast("binary").alias("key"),
        F.to_json(F.struct("id", "payload")).cast("binary").alias("value"),
    ]
    if topics is not None:
        even, odd = topics
        columns += [
            F.when(F.col("id") % 2 == 0, F.lit(even)).otherwise(F.lit(odd)).alias("topic"),
            (F.lit(1_700_000_000_000) + F.col("id")).alias("timestamp_ms"),
            F.array(
                F.struct(
                    F.lit("source-id").alias("key"), F.col("id").cast("string").cast("binary").alias("value")
                )
            ).alias("headers"),
        ]
    return rows.select(*columns)
