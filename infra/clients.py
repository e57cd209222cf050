"""Kafka, Redis and MLflow connections built from the settings, plus topic administration.

Connection settings left unset resolve to the embedded stack recorded under ``settings.home``.
Producers are idempotent with ``acks=all``; consumers never auto-commit and read committed records only:
librdkafka's defaults are the opposite, so every client is made here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from infra.embedded import EmbeddedStack
from infra.settings import Settings

#: Tansu starves tailing consumers without some producer linger (DESIGN.md).
PRODUCER_LINGER_MS = 20


class NotConfiguredError(RuntimeError):
    """A service is neither configured nor available from a running embedded stack."""


@dataclass(frozen=True)
class Endpoints:
    """Where the services are, after resolving unset settings to the embedded stack."""

    bootstrap_servers: str
    redis_url: str
    mlflow_tracking_uri: str
    mlflow_artifacts: str | None = None


def resolve_endpoints(settings: Settings) -> Endpoints:
    """Explicit settings win; anything unset comes from the running embedded stack."""
    explicit = (settings.bootstrap_servers, settings.redis_url, settings.mlflow_tracking_uri)
    if all(value is not None for value in explicit):
        return Endpoints(*explicit)  # type: ignore[arg-type]
    info = EmbeddedStack(settings.home).running()
    if info is None:
        missing = [
            env
            for env, value in zip(
                ("FRAUD_BOOTSTRAP_SERVERS", "FRAUD_REDIS_URL", "FRAUD_MLFLOW_TRACKING_URI"),
                explicit,
                strict=True,
            )
            if value is None
        ]
        raise NotConfiguredError(
            f"no embedded stack is running under {settings.home.resolve()}: start one with `fraud up`, "
            f"or set {', '.join(missing)}"
        )
    return Endpoints(
        bootstrap_servers=settings.bootstrap_servers or info.bootstrap_servers,
        redis_url=settings.redis_url or info.redis_url,
        mlflow_tracking_uri=settings.mlflow_tracking_uri or info.mlflow_tracking_uri,
        mlflow_artifacts=None if settings.mlflow_tracking_uri else info.mlflow_artifacts,
    )


class Clients:
    """Factory for correctly configured clients; one per process, passed down from the CLI."""

    def __init__(self, settings: Settings, endpoints: Endpoints) -> None:
        self.settings = settings
        self.endpoints = endpoints

    @classmethod
    def from_settings(cls, settings: Settings) -> Clients:
        return cls(settings, resolve_endpoints(settings))

    def kafka_config(self) -> dict[str, Any]:
        """Connection and security options shared by every Kafka client."""
        s = self.settings
        config: dict[str, Any] = {
            "bootstrap.servers": self.endpoints.bootstrap_servers,
            "security.protocol": s.security_protocol,
        }
        if s.sasl_mechanism is not None:
            config["sasl.mechanism"] = s.sasl_mechanism
        if s.sasl_username is not None:
            config["sasl.username"] = s.sasl_username
        if s.sasl_password is not None:
            config["sasl.password"] = s.sasl_password.get_secret_value()
        if s.ssl_ca_location is not None:
            config["ssl.ca.location"] = str(s.ssl_ca_location)
        return config

    def producer(self, **overrides: Any) -> Producer:
        """An idempotent producer (no duplicates or reordering from retries)."""
        config = {
            **self.kafka_config(),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": PRODUCER_LINGER_MS,
            "message.max.bytes": max(1_000_000, self.settings.max_event_bytes * 2),
            **overrides,
        }
        return Producer(config)

    def consumer(self, group_id: str = "fraud-tools", **overrides: Any) -> Consumer:
        """A consumer for ``assign()`` use with offsets we manage: no auto-commit, read_committed."""
        config = {
            **self.kafka_config(),
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            **overrides,
        }
        return Consumer(config)

    def admin(self) -> AdminClient:
        return AdminClient(self.kafka_config())

    def redis(self) -> Any:
        import redis

        return redis.Redis.from_url(self.endpoints.redis_url)


def ensure_topics(
    admin: AdminClient, names: list[str], partitions: int, replication_factor: int
) -> list[str]:
    """Create the topics that do not exist yet; returns the names created. Idempotent."""
    existing = set(admin.list_topics(timeout=10).topics)
    wanted = [NewTopic(name, partitions, replication_factor) for name in names if name not in existing]
    if not wanted:
        return []
    futures = admin.create_topics(wanted, request_timeout=15)  # keep `admin` alive until .result()
    created = []
    for name, future in futures.items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return created


def delete_topics(admin: AdminClient, names: list[str]) -> None:
    """Delete topics that exist (tests and `fraud topics reset`)."""
    existing = set(admin.list_topics(timeout=10).topics)
    doomed = [name for name in names if name in existing]
    if doomed:
        for future in admin.delete_topics(doomed, request_timeout=15).values():
            future.result()


def partitions_of(consumer: Consumer, topic: str) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if metadata is None or metadata.error is not None:
        raise NotConfiguredError(
            f"topic {topic!r} does not exist; create the topics with `fraud topics create`"
        )
    return sorted(metadata.partitions)


def offset_bounds(consumer: Consumer, topic: str, timeout_s: float = 10.0) -> dict[int, tuple[int, int]]:
    """(first, end) offset of every partition, with end = one past the last record.

    Tansu reports a high watermark of (base offset of the last record batch) + 1, short of the log end
    when the last batch holds several records. Reading from there to the end finds the true end; on
    Apache Kafka the same read returns just the last record, so the result is exact on both.
    """
    bounds = {}
    for partition in partitions_of(consumer, topic):
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=timeout_s, cached=False
        )
        bounds[partition] = (low, high)
    probe = [TopicPartition(topic, p, high - 1) for p, (low, high) in bounds.items() if high > low]
    if probe:
        consumer.assign(probe)
        wait_s = timeout_s  # the first fetch includes connecting; later ones only drain
        while messages := consumer.consume(10_000, timeout=wait_s):
            wait_s = 0.3
            for message in messages:
                where, offset = message.partition(), message.offset()
                if message.error() is None and where is not None and offset is not None:
                    first, end = bounds[where]
                    bounds[where] = (first, max(end, offset + 1))
        consumer.unassign()
    return bounds


def topic_counts(clients: Clients, topics: list[str]) -> dict[str, int]:
    """Number of records in each topic (offset span; exact for topics written without transactions)."""
    consumer = clients.consumer()
    try:
        return {
            topic: sum(end - first for first, end in offset_bounds(consumer, topic).values())
            for topic in topics
        }
    finally:
        consumer.close()


def read_topic(clients: Clients, topic: str, idle_timeout_s: float = 10.0) -> Iterator[Message]:
    """Every record of ``topic`` present now, partition by partition in offset order (read_committed).

    Stops at the end offsets measured at the start; fails if no record arrives for ``idle_timeout_s``
    before the end is reached.
    """
    consumer = clients.consumer()
    try:
        bounds = offset_bounds(consumer, topic)
        for partition, (first, end) in sorted(bounds.items()):
            if end <= first:
                continue
            consumer.assign([TopicPartition(topic, partition, first)])
            position = first
            idle_since = time.monotonic()
            while position < end:
                message = consumer.poll(0.2)
                if message is None:
                    # Transaction markers take offsets too: the position may be at the end already.
                    position = max(position, consumer.position([TopicPartition(topic, partition)])[0].offset)
                    if position < end and time.monotonic() - idle_since > idle_timeout_s:
                        raise TimeoutError(
                            f"{topic}[{partition}]: nothing after offset {position}, expected up to {end}"
                        )
                    continue
                if message.error() is not None:
                    raise KafkaException(message.error())
                idle_since = time.monotonic()
                position = (message.offset() or 0) + 1
                yield message
            consumer.unassign()
    finally:
        consumer.close()
