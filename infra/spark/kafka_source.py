"""Kafka input of the Spark jobs through Spark's own Kafka connector (``spark-sql-kafka-0-10``, ``infra.maven``).

A job describes what it reads once, as a :class:`KafkaInput`; :func:`read_stream` and :func:`read_batch` turn
it into the connector's options. Offsets per topic-partition live in Spark's checkpoint, and a micro-batch
re-run after a crash reads the same offset ranges: replayable input, the basis of exactly-once processing.
Readers see committed records only (``kafka.isolation.level=read_committed``: the connector's "latest" is
then the last stable offset), and a query whose next offset is gone from the log (retention, a deleted and
re-created topic) fails instead of skipping records (``failOnDataLoss``); :func:`check_resume` says so in one line before
the query starts.

Where a read starts and ends: its first run starts at the earliest records, or at the first record at or
after a time (``startingTimestamp``); a restart goes on from its checkpoint. The connector reads streams
without end, so a range's end is offsets resolved by time before the query starts
(``infra.kafka.log.offsets_for_time``): the rows at or past them are dropped before anything reads them, and the job
stops once every partition has reached its end (``infra.spark.frontier`` marks that micro-batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka.admin import AdminClient

from contracts.errors import ConfigError
from infra.kafka.connection import KAFKA_LOGGER
from infra.kafka.log import check_history
from infra.spark.checkpoint import newest_batch
from infra.spark.offset_log import position_at

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: The connector's name in ``spark.readStream.format``.
KAFKA_FORMAT = "kafka"
#: How long the connector's Kafka clients wait for a broker that does not answer (its offset requests in the
#: driver, its consumers' positions and fetches in the executors) before the micro-batch fails: a running job
#: waits an outage out, as the project's own clients do (``infra.kafka.outage``). The Java client's default
#: is a minute, and Spark's fetch gives up after two: a broker paused for 90 s failed the job.
OUTAGE_WAIT_MS = 600_000
#: The columns a job's stages get of each record: the record's topic, partition, offset, Kafka timestamp
#: (epoch ms), key and value.
RECORD_COLUMNS = ("topic", "partition", "offset", "timestamp", "key", "value")


@dataclass(frozen=True)
class KafkaInput:
    """What a job reads from Kafka, and from where to where.

    Args:
        kafka_config: librdkafka's connection and security options (``Clients.kafka_config()``); the connector
            gets them as the Java client's (:func:`java_client_options`).
        topics: the topics read, together.
        start_ms: a new query's first records are those at or after this time (None: the earliest).
        starting_offsets: a new query's first offset of each topic-partition (``topic/partition``), as a
            savepoint left them; partitions it does not name start at their first record. Wins over
            ``start_ms``.
        ending_offsets: a bounded read ends before these offsets (``infra.kafka.log.offsets_for_time``); partitions it does
            not name are not read. None: no end.
        max_records_per_trigger: admission control, records per micro-batch (None: all available).
    """

    kafka_config: Mapping[str, Any] = field(repr=False)  # credentials: never in a repr
    topics: tuple[str, ...]
    start_ms: int | None = None
    starting_offsets: Mapping[str, int] | None = None
    ending_offsets: Mapping[str, int] | None = None
    max_records_per_trigger: int | None = None

    def __post_init__(self) -> None:
        if "bootstrap.servers" not in self.kafka_config:
            raise ConfigError("kafka_config must hold bootstrap.servers")
        if not self.topics or not all(self.topics):
            raise ConfigError("a Kafka input needs at least one topic, and no empty name")
        if self.max_records_per_trigger is not None and self.max_records_per_trigger < 1:
            raise ConfigError(
                f"max_records_per_trigger must be at least 1, not {self.max_records_per_trigger}"
            )


#: librdkafka's SASL mechanism -> the Java client's login module.
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def java_client_options(kafka_config: Mapping[str, Any]) -> dict[str, str]:
    """The Java Kafka client's options (the connector's ``kafka.*``) for librdkafka's connection and security
    options: SASL credentials as a JAAS line, PEM files as PEM trust and key stores (KIP-651)."""
    config = dict(kafka_config)
    options = {
        "bootstrap.servers": str(config["bootstrap.servers"]),
        "security.protocol": str(config.get("security.protocol", "PLAINTEXT")),
    }
    mechanism = config.get("sasl.mechanism") or config.get("sasl.mechanisms")
    if mechanism:
        username, password = (
            str(config.get(key, "")).replace('"', '\\"') for key in ("sasl.username", "sasl.password")
        )
        options["sasl.mechanism"] = str(mechanism)
        options["sasl.jaas.config"] = (
            f'{_LOGIN_MODULES[str(mechanism)]} required username="{username}" password="{password}";'
        )
    if config.get("ssl.ca.location"):
        options["ssl.truststore.type"] = "PEM"
        options["ssl.truststore.location"] = str(config["ssl.ca.location"])
    if config.get("ssl.certificate.location") and config.get("ssl.key.location"):
        options["ssl.keystore.type"] = "PEM"
        options["ssl.keystore.certificate.chain"] = Path(config["ssl.certificate.location"]).read_text()
        options["ssl.keystore.key"] = Path(config["ssl.key.location"]).read_text()
        if config.get("ssl.key.password"):
            options["ssl.key.password"] = str(config["ssl.key.password"])
    return options


def connector_options(source: KafkaInput) -> dict[str, str]:
    """The connector's options of a stream or bounded read of ``source`` (ends applied by :func:`within_end`)."""
    options = {f"kafka.{key}": value for key, value in java_client_options(source.kafka_config).items()}
    options |= {
        "subscribe": ",".join(source.topics),
        "kafka.isolation.level": "read_committed",
        "kafka.default.api.timeout.ms": str(OUTAGE_WAIT_MS),
        "kafkaConsumer.pollTimeoutMs": str(OUTAGE_WAIT_MS),
        "failOnDataLoss": "true",
        "includeHeaders": "false",
    }
    if source.starting_offsets is not None:
        options["startingOffsets"] = offsets_json(source.starting_offsets, source.topics)
    elif source.start_ms is not None:
        options["startingTimestamp"] = str(source.start_ms)
        # A partition without a record at or after the time starts at its end, not with an error.
        options["startingOffsetsByTimestampStrategy"] = "latest"
    else:
        options["startingOffsets"] = "earliest"
    if source.max_records_per_trigger is not None:
        options["maxOffsetsPerTrigger"] = str(source.max_records_per_trigger)
    return options


def offsets_json(offsets: Mapping[str, int], topics: tuple[str, ...]) -> str:
    """The connector's JSON of per-partition offsets (``{"topic": {"0": 12}}``); a topic of ``topics`` without
    any partition named starts at its first record (-2)."""
    import json

    by_topic: dict[str, dict[str, int]] = {topic: {} for topic in topics}
    for name, offset in offsets.items():
        topic, _, partition = name.rpartition("/")
        if topic in by_topic:
            by_topic[topic][partition] = int(offset)
    return json.dumps({topic: parts or {"0": -2} for topic, parts in by_topic.items()})


def read_stream(spark: SparkSession, source: KafkaInput) -> DataFrame:
    """The stream of ``source``'s records (:data:`RECORD_COLUMNS`), cut at its end if it has one."""
    frame = spark.readStream.format(KAFKA_FORMAT).options(**connector_options(source)).load()
    return within_end(records_of(frame), source.ending_offsets)


def read_batch(spark: SparkSession, source: KafkaInput) -> DataFrame:
    """``source``'s records from its start to its end (or the last stable offsets), as a bounded DataFrame."""
    options = connector_options(source)
    options.pop("maxOffsetsPerTrigger", None)
    if source.ending_offsets is not None:
        options["endingOffsets"] = offsets_json(source.ending_offsets, source.topics)
    frame = spark.read.format(KAFKA_FORMAT).options(**options).load()
    return within_end(records_of(frame), source.ending_offsets)


def records_of(frame: DataFrame) -> DataFrame:
    """The connector's rows as :data:`RECORD_COLUMNS`, the Kafka timestamp in epoch milliseconds."""
    from pyspark.sql import functions as F

    return frame.select(
        "topic", "partition", "offset", F.unix_millis("timestamp").alias("timestamp"), "key", "value"
    )


def within_end(frame: DataFrame, ending_offsets: Mapping[str, int] | None) -> DataFrame:
    """``frame``'s records before ``ending_offsets`` (None: all of them)."""
    if ending_offsets is None:
        return frame
    return frame.where(_before_end(ending_offsets))


def _before_end(ending_offsets: Mapping[str, int]) -> Column:
    from pyspark.sql import functions as F

    ends = F.create_map(
        *(part for name, end in sorted(ending_offsets.items()) for part in (F.lit(name), F.lit(end)))
    )
    where = F.concat_ws("/", F.col("topic"), F.col("partition").cast("string"))
    return F.coalesce(F.col("offset") < F.element_at(ends, where), F.lit(False))


def check_resume(kafka_config: Mapping[str, Any], query_dir: Path) -> None:
    """Before a query resumes its checkpoint: fail when a partition's next offset in it is outside its log
    (:func:`check_history`), in one line, rather than in the middle of Spark's first micro-batch.

    Raises:
        HistoryGapError: naming the topic, the partition and the offsets.
    """
    newest = newest_batch(query_dir)
    if newest is not None:
        check_history(new_admin(kafka_config), position_at(query_dir, newest).offsets)


def new_admin(kafka_config: Mapping[str, Any]) -> AdminClient:
    """An admin client of ``kafka_config`` (the executors' and the driver's own, not ``Clients``')."""
    return AdminClient(dict(kafka_config), logger=KAFKA_LOGGER)
