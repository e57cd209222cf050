"""One transaction at a time per topic, for brokers that mishandle overlapping transactions (Tansu 0.6).

Tansu 0.6 (the embedded broker) keeps every open transaction's offset range per partition and completes a
commit only once each transaction whose range overlaps it is prepared too. When two producers' transactions
write the same partition at the same time, a commit can be left half done: the broker answers the producer
with success, but its last stable offset stays at that transaction's first offset for good, and a
``read_committed`` consumer never sees another record of the partition (its ``ListOffsets`` even answers
(0, 0) while any transaction is open there). It also has no transaction timeout. Measured here: four
transactional producers writing one partition at once left it unreadable in about 1 run of 40; holding a
lock from the first record to the commit, 0 of 80.

So on Tansu the sink's write tasks hold an exclusive file lock per topic they write, from their first
record to their commit. That covers every writer on one host (Spark's local mode, which is how the
embedded stack runs); Spark executors on several hosts writing to one Tansu would need a broker without
this defect. Apache Kafka does not need it and does not get it: the sink asks the broker for its cluster
id, and Tansu's default id names it.
"""

from __future__ import annotations

import fcntl
import hashlib
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer

from infra.kafka_outage import wait_for_kafka

#: The cluster id a Tansu broker reports unless started with ``--cluster-id``.
TANSU_CLUSTER_ID = "tansu_cluster"
#: Where the locks live: every Python worker of the host sees the same files.
LOCK_DIR = Path(tempfile.gettempdir()) / "fraud-kafka-transaction-locks"
METADATA_TIMEOUT_S = 10.0

#: Whether the broker behind each bootstrap address needs the locks (asked once per process).
_NEEDS_LOCKS: dict[str, bool] = {}


def needs_locks(consumer: Consumer, bootstrap_servers: str) -> bool:
    """Whether transactions against this cluster must not overlap (the broker is Tansu)."""
    if bootstrap_servers not in _NEEDS_LOCKS:
        metadata = wait_for_kafka(lambda: consumer.list_topics(timeout=METADATA_TIMEOUT_S))
        cluster_id = metadata.cluster_id
        _NEEDS_LOCKS[bootstrap_servers] = cluster_id == TANSU_CLUSTER_ID
    return _NEEDS_LOCKS[bootstrap_servers]


def topics_of(batches: Iterable[pa.RecordBatch], default_topic: str | None) -> set[str]:
    """The topics rows with an optional ``topic`` column go to (``default_topic`` where it is null)."""
    topics: set[str | None] = set()
    for batch in batches:
        if "topic" not in batch.schema.names:
            topics.add(default_topic)
            continue
        column = batch.column("topic")
        topics.update(pc.unique(column).to_pylist())
        if column.null_count:
            topics.add(default_topic)
    return {topic for topic in topics if topic is not None}


@contextmanager
def topic_locks(bootstrap_servers: str, topics: Iterable[str]) -> Iterator[None]:
    """Hold this host's exclusive lock of each topic of the cluster (taken in name order: no deadlock)."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    with ExitStack() as held:
        for topic in sorted(set(topics)):
            handle = held.enter_context(lock_path(bootstrap_servers, topic).open("ab"))
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # released when the file is closed
        yield


def lock_path(bootstrap_servers: str, topic: str) -> Path:
    """The file whose lock a write task of ``topic`` holds from its first record to its commit."""
    cluster = hashlib.sha256(bootstrap_servers.encode()).hexdigest()[:12]
    return LOCK_DIR / f"{cluster}-{topic}.lock"
