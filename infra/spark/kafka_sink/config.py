"""What a Kafka sink writes where, as one typed object: :class:`KafkaSinkConfig`, and the sink's errors.

A job builds the config once and hands it to the sink whole (``infra.spark.kafka_sink.datasource.sink_options``);
the sink's writers in the executors get the same object, hook included.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from contracts.errors import ConfigError, FraudError, StateError
from infra.kafka.connection import TRANSACTION_TIMEOUT_MS
from infra.spark.timing import Timings

#: The commit markers live on this partition of the marker topic (it exists in every topic).
MARKER_PARTITION = 0
#: Writer processes take transactional ids over from each other often (Spark gives a partition's task to
#: whichever Python worker is idle), and each takeover is a new producer and consumer. librdkafka's sparse
#: connections hold the connection to a broker it has just learned of for about 50 ms; connecting to the
#: cluster's brokers at once brings init_transactions from 53 ms to 2 ms here. Override in ``kafka_config``.
EAGER_CONNECTIONS = {"enable.sparse.connections": False}
#: Upper bound on each blocking Kafka call (init, marker read, commit) before the task fails.
KAFKA_CALL_TIMEOUT_S = 60.0

#: Settings the sink owns: exactly-once needs them, so ``kafka_config`` may not change them.
_OWNED_PRODUCER_SETTINGS = ("transactional.id", "enable.idempotence", "acks", "isolation.level")

#: Called with a write task's record batches once they are in Kafka (committed now, or found committed by
#: an earlier attempt): for idempotent side stores such as Redis. It must be importable by the executors
#: (a module-level function or an instance of a module-level class).
AfterCommit = Callable[[list[pa.RecordBatch]], None]


@dataclass(frozen=True)
class AfterCommitAll:
    """Several after-commit hooks, called in order."""

    hooks: tuple[AfterCommit, ...]

    def __call__(self, batches: list[pa.RecordBatch]) -> None:
        timings = Timings("after-commit")
        for hook in self.hooks:
            with timings.phase(type(hook).__name__):
                hook(batches)
        timings.log()


class SinkConfigError(ConfigError, ValueError):
    """The sink's configuration or the input schema is unusable."""


class SinkIdReusedError(StateError):
    """The commit marker is ahead of the batch being written: ``sink.id`` belongs to another checkpoint."""


class SinkWriteError(FraudError):
    """A Kafka transaction could not be committed; its rows were not written (the task fails)."""


@dataclass(frozen=True)
class KafkaSinkConfig:
    """Where and how the sink writes.

    Args:
        kafka_config: librdkafka client settings (connection and security, e.g. ``Clients.kafka_config()``);
            the sink owns the transactional ones.
        sink_id: a stable identifier of this sink within its query, unique per checkpoint
            (:func:`checkpoint_sink_id`).
        topic: the default topic of rows without one.
        marker_topic: the topic whose partition 0 carries the commit markers (default: ``topic``).
        after_commit: called with each write task's rows once they are in Kafka.
        batch_id: batch writes only (``foreachBatch``): the micro-batch id, which makes a batch write
            exactly-once like a streaming one (commit markers per task), so a re-run of that micro-batch
            writes nothing twice.

    Raises:
        SinkConfigError: a setting is missing or not allowed.
    """

    kafka_config: Mapping[str, Any] = field(repr=False)  # credentials: never in a repr
    sink_id: str
    topic: str | None = None
    marker_topic: str | None = None
    after_commit: AfterCommit | None = field(default=None, compare=False)
    batch_id: int | None = None

    def __post_init__(self) -> None:
        if "bootstrap.servers" not in self.kafka_config:
            raise SinkConfigError("kafka_config must hold bootstrap.servers")
        owned = sorted(key for key in self.kafka_config if key in _OWNED_PRODUCER_SETTINGS)
        if owned:
            raise SinkConfigError(f"kafka_config may not set {', '.join(owned)}: the sink owns them")
        if not self.sink_id.strip():
            raise SinkConfigError("sink_id (a stable id of this sink in its query) is required")
        if self.marker_topic is None and self.topic is None:
            raise SinkConfigError(
                f"set marker_topic or topic: partition {MARKER_PARTITION} of that existing topic carries the "
                "sink's commit markers"
            )
        if self.batch_id is not None and self.batch_id < 0:
            raise SinkConfigError("batch_id must be a micro-batch id (an integer >= 0)")

    @property
    def markers(self) -> str:
        """The topic of the commit markers."""
        return self.marker_topic or str(self.topic)

    def run_after_commit(self, batches: list[pa.RecordBatch]) -> None:
        """Call the ``after_commit`` hook, if any, with rows that are in Kafka."""
        if self.after_commit is not None and batches:
            self.after_commit(batches)

    def transactional_id(self, partition_id: int) -> str:
        """Transactional id (and marker consumer group) of Spark partition ``partition_id``."""
        return f"{self.sink_id}-{partition_id}"

    def producer_config(self, transactional_id: str) -> dict[str, Any]:
        """Transactional, idempotent producer settings: defaults, then ``kafka_config``, then owned ones."""
        return {
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,  # kafka_config may override it
            **EAGER_CONNECTIONS,
            **self.kafka_config,
            # Only failures need a report; commit_transaction fails if any record of the transaction did.
            "delivery.report.only.error": True,
            "enable.idempotence": True,
            "acks": "all",
            "transactional.id": transactional_id,
        }

    def marker_consumer_config(self, group_id: str) -> dict[str, Any]:
        """Settings of the consumer that only reads the group's committed marker."""
        return {
            **EAGER_CONNECTIONS,
            **self.kafka_config,
            "group.id": group_id,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }


#: The files of a checkpoint that hold its sinks' ids (``checkpoint_sink_id``), as a glob pattern.
SINK_ID_FILES = "fraud-sink-*.id"


def checkpoint_sink_id(checkpoint: Path, name: str) -> str:
    """A sink id that lives and dies with a local checkpoint directory.

    The id (``name`` plus a random suffix) is kept in a file inside the checkpoint: restarts from the
    checkpoint reuse it, while a deleted and recreated checkpoint gets a new one, so its batch ids (which
    start again at 0) never meet the old query's commit markers. A checkpoint started from a savepoint
    gets a new one as well (``infra.spark.checkpoint`` leaves the file out of its copies): the job it was taken
    from may have written later batches under its id.
    """
    path = checkpoint / SINK_ID_FILES.replace("*", name)
    if path.is_file():
        return path.read_text().strip()
    checkpoint.mkdir(parents=True, exist_ok=True)
    sink_id = f"{name}-{uuid.uuid4().hex[:12]}"
    partial = path.with_suffix(".tmp")
    partial.write_text(sink_id)
    partial.replace(path)
    return sink_id
