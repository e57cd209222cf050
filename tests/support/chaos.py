"""Chaos-test harness of the Spark jobs: a sink writer that reports and pauses, and SIGKILL of a whole job.

The jobs under test run as subprocesses (``python -m tests.support.<module>`` from the project root)
that write through :class:`ChaosWriter`. Spark pickles the writer to its Python workers; the subprocess
calls :func:`ship_by_value` first, so the workers get this module's code with it and never import the
tests package.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyspark import cloudpickle

from infra.embedded.stack import HOST, EmbeddedStack, Service, valkey_binary
from infra.kafka.log import list_offsets, partitions_of
from infra.spark.kafka_sink.config import KafkaSinkConfig
from infra.spark.kafka_sink.datasource import (
    FraudKafkaSink,
    FraudKafkaStreamWriter,
    KafkaSinkCommit,
    TransactionEvent,
)

Pause = tuple[int, int, str]  # (micro-batch, Spark partition, TransactionEvent)

TASKS_LOG = "tasks.log"
EVENTS_LOG = "events.log"


class ChaosWriter(FraudKafkaStreamWriter):
    """The sink's stream writer, reporting to the ``control`` directory and pausing where asked.

    Appends ``[batch, partition, event]`` to ``events.log`` at each transaction event (``opened``: begun,
    marker sent, no row yet; ``produced``: its rows handed to the producer, not committed; ``committed``:
    Kafka commit done, Spark not told) and ``[batch, partition, status, rows]`` to ``tasks.log`` when a task
    returns. At a pause point (batch, partition, event) the
    task writes ``paused-BATCH-PARTITION-EVENT`` (its pid and process group) and sleeps until the test
    SIGKILLs the application, so kills can land at exact points of the sink's protocol.
    """

    def __init__(self, config: KafkaSinkConfig, control: Path, pauses: set[Pause]) -> None:
        super().__init__(config)
        self.control = control
        self.pauses = pauses

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KafkaSinkCommit:
        result = super().write(iterator)
        _append(self.control / TASKS_LOG, [result.batch_id, result.partition_id, result.status, result.rows])
        return result

    def on_transaction_event(self, event: TransactionEvent, batch_id: int | None, partition_id: int) -> None:
        _append(self.control / EVENTS_LOG, [batch_id, partition_id, event])
        if (batch_id, partition_id, event) not in self.pauses:
            return
        report = self.control / f"paused-{batch_id}-{partition_id}-{event}"
        report.with_suffix(".tmp").write_text(json.dumps({"pid": os.getpid(), "pgid": os.getpgid(0)}))
        report.with_suffix(".tmp").rename(report)
        time.sleep(3600)  # until SIGKILL


def chaos_sink(control: Path, pauses: set[Pause], name: str | None = None) -> type[FraudKafkaSink]:
    """The sink writing through a :class:`ChaosWriter`, under ``name`` (default: ``fraud-kafka-sink``, the
    name the jobs ask for)."""

    class ChaosSink(FraudKafkaSink):
        @classmethod
        def name(cls) -> str:
            return name or super().name()

        def streamWriter(self, schema: Any, overwrite: bool) -> ChaosWriter:
            return ChaosWriter(self._checked(schema), control, pauses)

    return ChaosSink


def _append(path: Path, entry: list[Any]) -> None:
    with path.open("a") as log:
        log.write(json.dumps(entry) + "\n")


def ship_by_value() -> None:
    """Pickle this module's classes by value, so Spark's workers need not import the tests package."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def parse_pauses(specs: list[str]) -> set[Pause]:
    """``BATCH:PARTITION:EVENT`` strings as pause points."""
    return {(int(batch), int(partition), event) for batch, partition, event in (s.split(":") for s in specs)}


def pause_args(pauses: list[Pause]) -> list[str]:
    """The job's ``--pause`` arguments for these pause points."""
    return [f"--pause={batch}:{partition}:{event}" for batch, partition, event in pauses]


def pause_reports(control: Path, pauses: list[Pause]) -> list[Path]:
    """The files the tasks write when they reach these pause points."""
    return [control / f"paused-{batch}-{partition}-{event}" for batch, partition, event in pauses]


def logged_tasks(control: Path) -> list[tuple[int, int, str]]:
    """(batch, partition, status) of every write task that returned, in order."""
    return [(batch, partition, status) for batch, partition, status, _ in entries(control / TASKS_LOG)]


def open_transactions(control: Path) -> set[tuple[int, int]]:
    """(batch, partition) of the transactions opened and not committed (by the time the log was read)."""
    still_open: set[tuple[int, int]] = set()
    for batch, partition, event in entries(control / EVENTS_LOG):
        if event == "opened":
            still_open.add((batch, partition))
        elif event == "committed":
            still_open.discard((batch, partition))
    return still_open


def entries(path: Path) -> list[list[Any]]:
    """The JSON lines of a log (none when there is no log yet)."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --- SIGKILL a job: the driver, its JVM, the JVM's Python daemon and workers ---------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            children[int(fields[1])].append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(job: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``job`` (started in a session of its own) and every process below it, by process group
    (the PySpark daemon and its workers have their own), and wait until all of them are gone."""
    tree = [job.pid, *_descendants(job.pid)]
    groups = set()
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(pid))
    assert os.getpgid(0) not in groups, "the job shares the test's process group"
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    job.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in tree):
        assert time.monotonic() < deadline, "killed processes did not exit"
        time.sleep(0.1)


# --- outages of the services: pause the broker, restart Redis -------------------------------------------


def pause(pid: int, seconds: float) -> None:
    """SIGSTOP the process (a broker: it stops answering, its connections stay open) for ``seconds``."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def stop_redis(redis_service: Service) -> None:
    """Shut the embedded Valkey down, saving its data first (as a persistent Redis keeps it)."""
    import redis

    redis.Redis(host=HOST, port=redis_service.port).shutdown(save=True)
    deadline = time.monotonic() + 30
    while _alive(redis_service.pid):
        assert time.monotonic() < deadline, "Valkey did not shut down"
        time.sleep(0.05)


def start_redis(redis_service: Service, data_dir: Path) -> subprocess.Popen[bytes]:
    """Start Valkey again on the port and data of ``redis_service``; the caller stops the new process."""
    import redis

    args = ["--port", str(redis_service.port), "--bind", HOST, "--dir", str(data_dir), "--appendonly", "yes"]
    process = subprocess.Popen(
        [str(valkey_binary()), *args], stdout=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            if redis.Redis(host=HOST, port=redis_service.port, socket_timeout=1).ping():
                return process
        except redis.RedisError:
            assert time.monotonic() < deadline, "Valkey did not start again"
            time.sleep(0.05)


# --- the broker: open transactions seen from outside, a SIGKILL and a restart -------------------------


def held_back(admin: AdminClient, topics: list[str]) -> dict[str, int]:
    """The partitions of ``topics`` whose read_committed readers are held back by an open transaction: records
    past the last stable offset. ``topic/partition`` -> records held."""
    partitions = [(topic, p) for topic in topics for p in partitions_of(admin, topic)]
    stable = list_offsets(admin, partitions, OffsetSpec.latest())
    futures = admin.list_offsets(
        {TopicPartition(topic, p): OffsetSpec.latest() for topic, p in partitions},
        isolation_level=IsolationLevel.READ_UNCOMMITTED,
        request_timeout=10,
    )
    written = {f"{tp.topic}/{tp.partition}": future.result().offset for tp, future in futures.items()}
    return {name: written[name] - stable[name] for name in stable if written[name] > stable[name]}


def wait_held_back(admin: AdminClient, topics: list[str], timeout_s: float) -> bool:
    """Wait until a transaction holds records on ``topics`` open (True), or ``timeout_s`` (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if held_back(admin, topics):
            return True
        time.sleep(0.005)
    return False


def kill_broker(broker: Service) -> None:
    """SIGKILL the broker (no controlled shutdown: its logs are recovered at the next start)."""
    os.kill(broker.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _alive(broker.pid):
        assert time.monotonic() < deadline, "the broker did not die"
        time.sleep(0.05)


def restart_broker(home: Path, broker: Service) -> Service:
    """The embedded broker of the stack at ``home`` started again on its port, with its log directory."""
    return EmbeddedStack(home).start_broker(broker.port, home / "logs")
