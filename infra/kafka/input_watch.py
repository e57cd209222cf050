"""The driver's watch on a job's input log: when each record of its main input topic was appended (to a
tail's precision, tens of milliseconds), for the alert latency, and a consumer group of its own
(:func:`observer_group`) that each micro-batch's end offsets are committed to, so that Kafka's tools
(``kafka-consumer-groups.sh --describe``) and ``fraud status`` show the job's lag. The group is for
observation only: the job resumes from its checkpoint, never from the group.

The watch also asks the cluster for its metadata every few seconds (:data:`PROBE_EVERY_S`), so that a job
says when Kafka is away and when it answers again even while all its calls to Kafka wait inside Spark's
connector, which waits an outage out without a word (``infra.spark.kafka_source.OUTAGE_WAIT_MS``).
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_right
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from contracts.errors import ServiceUnavailableError
from infra.kafka.connection import KAFKA_LOGGER, METADATA_TIMEOUT_S, cluster_metadata
from infra.kafka.log import partitions_of
from infra.kafka.outage import is_outage, wait_for_kafka

_log = logging.getLogger(__name__)

#: Fetches of the input watch kept for the alert latency: an alert's transaction older than this (held by
#: the frontier, or read late) is not timed.
ARRIVALS_KEPT_S = 600.0
#: The start of the consumer groups the jobs commit their offsets to, for observation.
OBSERVER_GROUP_PREFIX = "fraud-observed."
#: Seconds between the watch's metadata requests, each waiting up to ``METADATA_TIMEOUT_S`` for an answer.
PROBE_EVERY_S = 5.0


def observer_group(job: str, namespace: str = "") -> str:
    """The consumer group a job commits its processed offsets to: ``fraud-observed.[<namespace>.]<job>``."""
    return f"{OBSERVER_GROUP_PREFIX}{namespace + '.' if namespace else ''}{job}"


class Arrivals:
    """When the records of some partitions were appended: per partition, the first offset of each fetch and
    when it came. Records from one fetch's first offset to the next's arrived with that fetch."""

    def __init__(self, partitions: Collection[str]) -> None:
        self._firsts: dict[str, tuple[list[int], list[float]]] = {name: ([], []) for name in partitions}
        self._lock = threading.Lock()

    def note(self, firsts: Mapping[str, int], at: float) -> None:
        """A fetch at ``at`` (seconds since the epoch) whose first record of each partition had this offset."""
        with self._lock:
            for name, offset in firsts.items():
                offsets, times = self._firsts[name]
                offsets.append(offset)
                times.append(at)

    def appended_at(self, name: str, offset: int) -> float | None:
        """When the record at ``offset`` of partition ``name`` (``topic/partition``) came; None when not
        known (before the watch began, forgotten, or a partition not watched)."""
        with self._lock:
            offsets, times = self._firsts.get(name, ((), ()))
            i = bisect_right(offsets, offset) - 1
            return times[i] if i >= 0 else None

    def forget(self, before_s: float) -> None:
        """Forget the fetches before ``before_s``."""
        with self._lock:
            for offsets, times in self._firsts.values():
                drop = bisect_right(times, before_s)
                del offsets[:drop], times[:drop]


class InputWatch:
    """The driver's watch on a job's input log: when its main topics' records were appended, and a consumer
    group to show what the job has processed.

    A thread tails the topics from their end as the job starts (read_uncommitted: a record counts as
    appended before its transaction commits) and notes, per partition and fetch, the first offset it got
    and the time (:class:`Arrivals`): records appended while the job runs have an append time to a fetch's
    precision (tens of milliseconds), older ones none. Between fetches it probes the cluster
    (:data:`PROBE_EVERY_S`) and waits an outage out with a line at its start and one at its end
    (``infra.kafka.outage.wait_for_kafka``). :meth:`commit` commits a micro-batch's end offsets to
    ``group``.
    """

    def __init__(self, kafka_config: Mapping[str, Any], topics: Sequence[str], group: str) -> None:
        """Watch ``topics`` (none: only commit to ``group``)."""
        self.group = group
        self._consumer = Consumer(
            {
                **kafka_config,
                "group.id": group,
                "enable.auto.commit": False,
                "isolation.level": "read_uncommitted",
                "fetch.wait.max.ms": 20,  # an append time to a fetch's precision
                "queued.max.messages.kbytes": 4096,
            },
            logger=KAFKA_LOGGER,
        )
        partitions = [(topic, p) for topic in topics for p in partitions_of(self._consumer, topic)]
        self._consumer.assign([TopicPartition(topic, p, OFFSET_END) for topic, p in partitions])
        self.arrivals = Arrivals([f"{topic}/{p}" for topic, p in partitions])
        self._client = threading.Lock()  # the consumer, shared by the tail and the commits
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tail, name="input-watch", daemon=True)
        self._thread.start()

    def _probe(self) -> None:
        """The cluster's metadata, waited for while Kafka is away and the watch not closed."""
        wait_for_kafka(
            lambda: cluster_metadata(self._consumer),
            transient=lambda error: is_outage(error) and not self._stop.is_set(),
            sleep=self._stop.wait,  # close() ends the wait between attempts
        )

    def _tail(self) -> None:
        probed = time.monotonic()
        while not self._stop.is_set():
            try:
                if time.monotonic() - probed >= PROBE_EVERY_S:
                    self._probe()  # list_topics is safe beside a consume: outside the lock, commits go on
                    probed = time.monotonic()
                with self._client:
                    messages = self._consumer.consume(10_000, timeout=0.05)
            except (KafkaException, ServiceUnavailableError, RuntimeError):  # away, or the watch closed
                time.sleep(0.5)
                continue
            firsts: dict[str, int] = {}
            for message in messages:
                if message.error() is None:
                    firsts.setdefault(f"{message.topic()}/{message.partition()}", message.offset() or 0)
            self.arrivals.note(firsts, time.time())
            if not messages:
                time.sleep(0.01)

    def commit(self, ends: Mapping[str, int]) -> None:
        """Commit the end offsets of a micro-batch (``topic/partition``: offset) to the group, without
        waiting: a commit that fails (the broker away) is made good by the next micro-batch's."""
        offsets = [TopicPartition(*_topic_partition(name), int(at)) for name, at in ends.items()]
        try:
            with self._client:
                self._consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as error:
            _log.debug("committing offsets to %s failed: %s", self.group, error)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=METADATA_TIMEOUT_S + 5)  # a probe ends within its timeout
        with self._client:
            self._consumer.close()


def _topic_partition(name: str) -> tuple[str, int]:
    topic, _, partition = name.rpartition("/")
    return topic, int(partition)
