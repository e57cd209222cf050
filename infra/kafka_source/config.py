"""What a Kafka source reads, as one typed object: :class:`KafkaSourceConfig`, and its :class:`Decoder`.

A job builds the config once and hands it to the source whole (``infra.kafka_source.datasource``); the
planner in the driver and the readers in the executors get the same object, decoder included.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from contracts.errors import ConfigError
from infra.kafka_source.splits import Split
from infra.schemas import spark_ddl

#: Raw records, as the source yields them without a decoder.
RAW_FIELDS = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)
RAW_DDL = spark_ddl(RAW_FIELDS)


class Decoder(Protocol):
    """Turns raw Kafka records into a job's input rows (see ``infra.kafka_source.datasource``).

    It must be importable by the executors: an instance of a module-level class, holding its own options.
    """

    @property
    def schema(self) -> str:
        """The Spark DDL of the rows it yields."""
        ...

    def decode(self, records: pa.RecordBatch, split: Split) -> Iterator[pa.RecordBatch]:
        """Rows of the raw records (``RAW_FIELDS``) one split read."""
        ...

    def heartbeat(self, split: Split) -> Iterator[pa.RecordBatch]:
        """Rows that carry the micro-batch's frontier (and final mark) to every state key; once per
        micro-batch, on the split marked ``heartbeat``."""
        ...


#: Where a read starts: the first record, the end, or the first record at or after a time (epoch ms).
EARLIEST, LATEST = "earliest", "latest"
TIME_PREFIX = "time:"


def at_time(epoch_ms: int) -> str:
    """The offset spec of the first record with a timestamp at or after ``epoch_ms``."""
    return f"{TIME_PREFIX}{epoch_ms}"


@dataclass(frozen=True)
class KafkaSourceConfig:
    """What the source reads and how.

    Args:
        kafka_config: librdkafka client settings (connection and security, e.g. ``Clients.kafka_config()``).
        topics: the topics read, together.
        starting_offsets: ``earliest``, ``latest`` or ``time:<epoch ms>`` (:func:`at_time`), for a new query.
        ending_offsets: where a bounded read (``spark.read``) or an ``availableNow`` run stops: ``latest``
            (the log's end when it starts) or ``time:<epoch ms>`` (exclusive).
        max_records_per_trigger: admission control, records per micro-batch (None: all available).
        allowed_lateness_ms: disorder within a partition that still counts as on time.
        read_tasks: Spark tasks per micro-batch, each reading its topic-partitions one after another
            (None: one per topic-partition). Every task has a fixed cost; the job's cores are enough.
        decoder: turns raw records into the output rows (None: raw records, ``RAW_FIELDS``).
        max_clock_skew_ms: records stamped further ahead of the planner's clock than this move no
            partition's progress, hence no frontier (None: no limit). The clock of each micro-batch is
            kept in its end offset and reaches the decoder (``Split.clock_ms``), which can reject them.
        initial_position: where a new query starts instead of ``starting_offsets``: an end offset of this
            source, as another query's checkpoint keeps it (``planner.end_offset``: offsets, progress,
            frontier, final mark, copy marks, clock), so the new query goes on exactly where that one's
            micro-batch left it. Partitions it does not name are read from their first record.

    Raises:
        ConfigError: a setting is out of range.
    """

    kafka_config: Mapping[str, Any] = field(repr=False)  # credentials: never in a repr
    topics: tuple[str, ...]
    starting_offsets: str = EARLIEST
    ending_offsets: str = LATEST
    max_records_per_trigger: int | None = None
    allowed_lateness_ms: int = 0
    read_tasks: int | None = None
    decoder: Decoder | None = field(default=None, compare=False)
    max_clock_skew_ms: int | None = None
    initial_position: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if "bootstrap.servers" not in self.kafka_config:
            raise ConfigError("kafka_config must hold bootstrap.servers")
        if not self.topics or not all(self.topics):
            raise ConfigError("the source needs at least one topic, and no empty name")
        _check_spec("starting_offsets", self.starting_offsets, (EARLIEST, LATEST))
        _check_spec("ending_offsets", self.ending_offsets, (LATEST,))
        for name in ("max_records_per_trigger", "read_tasks"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be at least 1, not {value}")
        if self.allowed_lateness_ms < 0:
            raise ConfigError("allowed_lateness_ms must not be negative")
        if self.max_clock_skew_ms is not None and self.max_clock_skew_ms < 0:
            raise ConfigError("max_clock_skew_ms must not be negative")
        if self.initial_position is not None and not {"offsets", "frontier"} <= set(self.initial_position):
            raise ConfigError("initial_position must be an end offset of the source: offsets, frontier, ...")

    @property
    def schema(self) -> str:
        """The Spark DDL of the rows the source yields."""
        return self.decoder.schema if self.decoder is not None else RAW_DDL


def time_of(spec: str) -> int | None:
    """The epoch ms of a ``time:<ms>`` spec; None for ``earliest`` / ``latest``."""
    return int(spec.removeprefix(TIME_PREFIX)) if spec.startswith(TIME_PREFIX) else None


def _check_spec(name: str, spec: str, words: tuple[str, ...]) -> None:
    if spec in words:
        return
    if spec.startswith(TIME_PREFIX) and spec.removeprefix(TIME_PREFIX).lstrip("-").isdigit():
        return
    raise ConfigError(f"{name} {spec!r}: use {', '.join(words)} or {TIME_PREFIX}<epoch ms>")
