"""Kafka, Redis and MLflow connections built from the settings, plus topic administration.

Connection settings left unset resolve to the embedded stack recorded under ``settings.home``.
Producers are idempotent with ``acks=all``; consumers never auto-commit and read committed records only:
librdkafka's defaults are the opposite, so every client is made here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource, NewTopic, ResourceType

from contracts.errors import NotFoundError, ServiceUnavailableError, StateError
from contracts.provenance import CopyFilter
from contracts.settings import KEEP_FOREVER, Settings, Topics
from infra.embedded import EmbeddedStack, StackInfo
from infra.kafka_outage import KafkaUnreachableError, is_outage
from infra.redis_store import RedisOptions, redis_client

#: Tansu starves tailing consumers without some producer linger (DESIGN.md).
PRODUCER_LINGER_MS = 20
#: How long the broker keeps a transaction open before aborting it (``transaction.timeout.ms`` of the
#: project's transactional producers); a crashed writer that is not restarted holds back read_committed
#: consumers of its partitions this long, so readers wait at least as long for records they planned.
TRANSACTION_TIMEOUT_MS = 120_000
#: Topic configs that keep the history (the default of every topic the project creates).
KEEP_HISTORY = {"retention.ms": str(KEEP_FOREVER), "retention.bytes": str(KEEP_FOREVER)}
#: How long a metadata request (topics, partitions) may take before Kafka counts as unreachable.
METADATA_TIMEOUT_S = 10.0
#: librdkafka's own log lines (a refused connection, say) go to this logger, not straight to stderr.
KAFKA_LOGGER = logging.getLogger("fraud.kafka")


class HistoryGapError(StateError):
    """Offsets a reader planned, or continues from, are no longer in a topic's log: readers never skip."""


class NotConfiguredError(ServiceUnavailableError):
    """A service is neither configured nor available from a running embedded stack."""


class KafkaAccessError(ServiceUnavailableError):
    """Kafka answers, but refuses the credentials (SASL): a setting to correct, not an outage to wait out."""


#: librdkafka's codes of a refused login (it logs them and tries again, as it would for an outage).
_REFUSED = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})
#: Seconds the first metadata request of an admin client waits (:func:`cluster_metadata`): a refused login
#: is told after it (librdkafka's SASL exchange fails within half a second here).
LOGIN_WAIT_S = 1.5


class LoginFailures:
    """The ``error_cb`` of the project's admin clients: the last refused login, for
    :func:`cluster_metadata` to end its wait with."""

    def __init__(self) -> None:
        self.refused: str | None = None

    def __call__(self, error: KafkaError) -> None:
        if error.code() in _REFUSED:
            self.refused = error.str()


class WatchedAdmin(AdminClient):
    """An admin client that keeps the refused logins librdkafka reports (:class:`LoginFailures`)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.login_failures = LoginFailures()
        watched: dict[str, Any] = {**config, "error_cb": self.login_failures}
        super().__init__(watched, logger=KAFKA_LOGGER)


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


def mlflow_store(settings: Settings) -> tuple[str, str | None]:
    """The MLflow tracking URI (the setting, else the running embedded stack's store), and where the
    embedded store keeps artifacts (None for a configured one: the server decides).

    Raises:
        NotConfiguredError: no URI is set and no embedded stack runs.
    """
    if settings.mlflow_tracking_uri is not None:
        return settings.mlflow_tracking_uri, None
    info = EmbeddedStack(settings.home).running()
    if info is None:
        raise NotConfiguredError(
            f"no embedded stack is running under {settings.home.resolve()}: start one with `fraud up`, "
            "or set FRAUD_MLFLOW_TRACKING_URI"
        )
    return info.mlflow_tracking_uri, info.mlflow_artifacts


class Clients:
    """Factory for correctly configured clients; one per process, passed down from the CLI."""

    def __init__(self, settings: Settings, endpoints: Endpoints) -> None:
        self.settings = settings
        self.endpoints = endpoints

    @classmethod
    def from_settings(cls, settings: Settings) -> Clients:
        return cls(settings, resolve_endpoints(settings))

    @classmethod
    def for_stack(cls, info: StackInfo, home: Path, **updates: Any) -> Clients:
        """Clients (and their settings) for an embedded stack started by the caller."""
        settings = Settings(
            home=home,
            bootstrap_servers=info.bootstrap_servers,
            redis_url=info.redis_url,
            mlflow_tracking_uri=info.mlflow_tracking_uri,
            **updates,
        )
        return cls(settings, Endpoints(info.bootstrap_servers, info.redis_url, info.mlflow_tracking_uri))

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
        if s.ssl_certificate_location is not None:
            config["ssl.certificate.location"] = str(s.ssl_certificate_location)
        if s.ssl_key_location is not None:
            config["ssl.key.location"] = str(s.ssl_key_location)
        if s.ssl_key_password is not None:
            config["ssl.key.password"] = s.ssl_key_password.get_secret_value()
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
        return Producer(config, logger=KAFKA_LOGGER)

    def consumer(self, group_id: str = "fraud-tools", overrides: dict[str, Any] | None = None) -> Consumer:
        """A consumer for ``assign()`` use with offsets we manage: no auto-commit, read_committed."""
        config = {
            **self.kafka_config(),
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            # Offsets come from the caller; one outside the log is an error, never a silent jump.
            "auto.offset.reset": "error",
            **(overrides or {}),
        }
        return Consumer(config, logger=KAFKA_LOGGER)

    def admin(self) -> AdminClient:
        """An admin client; a refused login ends its metadata requests at once (:func:`cluster_metadata`)."""
        return WatchedAdmin(self.kafka_config())

    def redis_options(self) -> RedisOptions:
        """How to log in to Redis beyond its URL: user, password and TLS from the settings."""
        s = self.settings
        return RedisOptions(
            username=s.redis_username,
            password=None if s.redis_password is None else s.redis_password.get_secret_value(),
            tls=s.redis_tls,
            ca_file=_text(s.redis_ca_file),
            cert_file=_text(s.redis_cert_file),
            key_file=_text(s.redis_key_file),
        )

    def redis(self) -> Any:
        """A new Redis client (a process's jobs share theirs: ``RedisTarget.client``)."""
        return redis_client(self.endpoints.redis_url, self.redis_options())


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)


def cluster_metadata(client: AdminClient | Consumer, topic: str | None = None) -> ClusterMetadata:
    """The cluster's metadata (of one topic, if given).

    Raises:
        KafkaUnreachableError: Kafka did not answer within :data:`METADATA_TIMEOUT_S` (the message says what
            to check at start-up; its ``reason``, for an outage's line, only what happened).
        KafkaAccessError: Kafka refused the login of an admin client of :meth:`Clients.admin` (within
            :data:`LOGIN_WAIT_S`): not an outage, never waited out.
    """
    failures = client.login_failures if isinstance(client, WatchedAdmin) else None
    deadline = time.monotonic() + METADATA_TIMEOUT_S
    # An admin client of Clients.admin asks first for a moment, to stop at a refused login (its error_cb),
    # then for the rest of the time: a slow cluster still has all of it.
    first = METADATA_TIMEOUT_S if failures is None else LOGIN_WAIT_S
    while True:
        remaining = max(deadline - time.monotonic(), 0.01)
        try:
            return client.list_topics(topic, timeout=min(first, remaining))
        except KafkaException as exc:
            if failures is not None:  # other clients asked once, for the whole time
                client.poll(0)  # serves the error_cb
                if failures.refused is not None:
                    raise KafkaAccessError(
                        f"Kafka refused the login ({failures.refused}): check FRAUD_SASL_USERNAME, "
                        "FRAUD_SASL_PASSWORD and FRAUD_SASL_MECHANISM"
                    ) from None
                first = remaining
                if time.monotonic() < deadline:
                    continue
            reason = f"no answer within {METADATA_TIMEOUT_S:.0f} s: {exc.args[0].str()}"
            raise KafkaUnreachableError(
                f"Kafka did not answer within {METADATA_TIMEOUT_S:.0f} s ({exc.args[0].str()}); "
                "check FRAUD_BOOTSTRAP_SERVERS and the security settings, or start the embedded stack (`fraud up`)",
                reason,
            ) from None


def existing_topics(admin: AdminClient, names: list[str]) -> list[str]:
    """Those of ``names`` that exist, in their order."""
    present = set(cluster_metadata(admin).topics)
    return [name for name in names if name in present]


def ensure_topics(
    admin: AdminClient,
    names: list[str],
    partitions: int,
    replication_factor: int,
    configs: Mapping[str, Mapping[str, str]] | None = None,
) -> list[str]:
    """Create the topics that do not exist yet, each with its ``configs`` (default: history kept forever,
    ``retention.ms`` and ``retention.bytes`` -1); returns the names created. Idempotent."""
    existing = set(cluster_metadata(admin).topics)
    wanted = [
        NewTopic(name, partitions, replication_factor, config=dict((configs or {}).get(name, KEEP_HISTORY)))
        for name in names
        if name not in existing
    ]
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


def create_project_topics(admin: AdminClient, settings: Settings, topics: Topics | None = None) -> list[str]:
    """Create the topics of ``topics`` (default: the settings') that do not exist, with the partitions,
    replication and retention of the settings; returns the names created."""
    configs = settings.topic_configs(topics)
    return ensure_topics(admin, list(configs), settings.partitions, settings.replication_factor, configs)


def topic_configs(admin: AdminClient, names: list[str]) -> dict[str, dict[str, str]]:
    """The configs the broker reports for each existing topic of ``names`` (a broker may report only the
    ones set on the topic)."""
    present = existing_topics(admin, names)
    if not present:
        return {}
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name) for name in present])
    return {
        resource.name: {key: entry.value for key, entry in future.result(METADATA_TIMEOUT_S).items()}
        for resource, future in futures.items()
    }


def shorter_retention(
    wanted: Mapping[str, Mapping[str, str]], found: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """For each topic that keeps its records for less time or space than ``wanted`` asks, one line saying so."""
    problems = []
    for name, configs in wanted.items():
        for key, value in configs.items():
            have = found.get(name, {}).get(key)
            if have is None or value == have:
                continue
            if int(value) == KEEP_FOREVER or (int(have) != KEEP_FOREVER and int(have) < int(value)):
                problems.append(f"topic {name!r} has {key}={have}, the settings ask for {value}")
    return problems


def delete_topics(admin: AdminClient, names: list[str]) -> None:
    """Delete topics that exist (tests and `fraud topics reset`)."""
    doomed = existing_topics(admin, names)
    if doomed:
        for future in admin.delete_topics(doomed, request_timeout=15).values():
            future.result()


def consumed(
    consumer: Consumer, count: int, timeout: float, gaps: set[str] | None = None
) -> Iterator[tuple[Message, bool]]:
    """The messages of one ``consume`` call as ``(message, at_end)``: a record (False), or the event that the
    consumer reached the end of a partition (True; its offset is that end, with ``enable.partition.eof``).

    An offset outside the log (with ``auto.offset.reset=error``) raises :class:`HistoryGapError`, or is
    added to ``gaps`` as ``topic/partition`` when the caller expects it. A broker that does not answer is
    reported to consumers as an error event too, which the consumer recovers from by itself: such events
    are passed over (the caller's own deadline says when nothing came for too long). Any other error
    raises ``KafkaException``.
    """
    for message in consumer.consume(count, timeout=timeout):
        error = message.error()
        if error is None or error.code() == KafkaError._PARTITION_EOF:
            yield message, error is not None
        elif is_outage(error):
            continue
        elif error.code() == KafkaError._AUTO_OFFSET_RESET and gaps is not None:
            gaps.add(f"{message.topic()}/{message.partition()}")
        elif error.code() == KafkaError._AUTO_OFFSET_RESET:  # auto.offset.reset=error: out of the log
            raise HistoryGapError(
                f"topic {message.topic()!r} partition {message.partition()}: offset {message.offset()} is no "
                f"longer in the log ({error.str()}); the reader stops rather than skip records"
            )
        else:
            raise KafkaException(error)


def partitions_of(consumer: Consumer, topic: str) -> list[int]:
    metadata = cluster_metadata(consumer, topic).topics.get(topic)
    if metadata is None or metadata.error is not None:
        raise NotFoundError(f"topic {topic!r} does not exist; create the topics with `fraud topics create`")
    return sorted(metadata.partitions)


def read_to_end(
    consumer: Consumer, start: list[TopicPartition], timeout_s: float = 60.0, first_only: bool = False
) -> dict[str, tuple[int, int]]:
    """Read each partition from the given offset to its end; (offset, timestamp) of the last record read
    (of the first one, and no further, with ``first_only``).

    The consumer must have ``enable.partition.eof`` set: the end is where the broker says so, which
    also covers partitions whose last offsets hold transaction markers. Keys are ``topic/partition``.
    """
    if not start:
        return {}
    consumer.assign(start)
    last: dict[str, tuple[int, int]] = {}
    pending = {f"{tp.topic}/{tp.partition}" for tp in start}
    gaps: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while pending:
        for message, at_end in consumed(consumer, 100_000, timeout=0.05, gaps=gaps if first_only else None):
            name = f"{message.topic()}/{message.partition()}"
            if at_end:
                pending.discard(name)
                continue
            if first_only and name not in pending:
                continue
            last[name] = (message.offset() or 0, message.timestamp()[1])
            if first_only:
                pending.discard(name)
        pending -= gaps  # first_only: a start below the log (Kafka's, after deletions) has no record to find
        if pending and time.monotonic() > deadline:
            raise ServiceUnavailableError(
                f"no end of partition from Kafka for {sorted(pending)} within {timeout_s:.0f} s"
            )
    consumer.unassign()
    return last


def first_offsets(consumer: Consumer, lows: list[TopicPartition], timeout_s: float = 60.0) -> dict[str, int]:
    """Each partition's first offset, given its low watermark as the offset: the low watermark, or less.

    Tansu answers "earliest" (the low watermark, and ``OFFSET_BEGINNING``) with the base offset of the
    record batch it stored first, above the lowest when producers wrote the partition at once; the records
    below it are there. Reading from offset 0 finds them. On Apache Kafka a low watermark above 0 is the
    log start, and the read from 0 falls outside the log, so the smaller of the two is right on both. The
    consumer must have ``enable.partition.eof`` set. Keys are ``topic/partition``.
    """
    first = {f"{tp.topic}/{tp.partition}": tp.offset for tp in lows}
    probe = [TopicPartition(tp.topic, tp.partition, 0) for tp in lows if tp.offset > 0]
    for name, (offset, _) in read_to_end(consumer, probe, timeout_s, first_only=True).items():
        first[name] = min(first[name], offset)
    return first


def log_bounds(
    consumer: Consumer, partitions: list[tuple[str, int]], timeout_s: float = 60.0
) -> dict[str, tuple[int, int]]:
    """(first, end) offset of each (topic, partition) for a read_committed reader, end = one past the last
    record it can read now. Keys are ``topic/partition``.

    Found by reading, because Tansu's watermarks are wrong three ways: its high watermark is (base offset
    of the last record batch) + 1, short of the log end when that batch holds several records; a
    read_committed consumer gets (0, 0) while a transaction is open on the partition; and its low
    watermark can be above the first record (:func:`first_offsets`). Each partition is read from its
    high watermark - 1 (from its first offset when that is not below) to the end the broker's fetch
    reports, its last stable offset. On Apache Kafka that read returns just the last record, so the
    result is exact on both. The consumer must have ``enable.partition.eof`` set.
    """
    lows, highs = [], {}
    for topic, partition in partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
        lows.append(TopicPartition(topic, partition, low))
        highs[f"{topic}/{partition}"] = high
    firsts = first_offsets(consumer, lows, timeout_s)
    bounds = {}
    probe = []
    for tp in lows:
        name = f"{tp.topic}/{tp.partition}"
        first, high = firsts[name], highs[name]
        bounds[name] = (first, max(first, high))
        probe.append(TopicPartition(tp.topic, tp.partition, max(first, high - 1)))
    for name, (offset, _) in read_to_end(consumer, probe, timeout_s).items():
        first, end = bounds[name]
        bounds[name] = (first, max(end, offset + 1))
    return bounds


def offset_bounds(consumer: Consumer, topic: str, timeout_s: float = 60.0) -> dict[int, tuple[int, int]]:
    """:func:`log_bounds` of every partition of ``topic``, by partition number."""
    partitions = [(topic, partition) for partition in partitions_of(consumer, topic)]
    return {
        int(name.rpartition("/")[2]): bounds
        for name, bounds in log_bounds(consumer, partitions, timeout_s).items()
    }


def holds_records(consumer: Consumer, topic: str) -> bool:
    """Whether anything was ever written to ``topic`` (a high watermark above 0, deleted records included);
    False for a topic that does not exist."""
    try:
        partitions = partitions_of(consumer, topic)
    except NotFoundError:
        return False
    return any(
        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] > 0
        for p in partitions
    )


def time_span(consumer: Consumer, topic: str, timeout_s: float = 60.0) -> tuple[int, int] | None:
    """The Kafka timestamps of the first and the last record of ``topic`` (the earliest first record and
    the latest last record over its partitions); None while it is empty. Reads two records a partition.
    The consumer must have ``enable.partition.eof`` set."""
    bounds = {p: span for p, span in offset_bounds(consumer, topic, timeout_s).items() if span[1] > span[0]}
    if not bounds:
        return None
    firsts = read_to_end(
        consumer,
        [TopicPartition(topic, p, first) for p, (first, _) in bounds.items()],
        timeout_s,
        first_only=True,
    )
    lasts = read_to_end(
        consumer,
        [TopicPartition(topic, p, max(first, end - 1)) for p, (first, end) in bounds.items()],
        timeout_s,
    )
    if not firsts or not lasts:
        return None
    return min(stamp for _, stamp in firsts.values()), max(stamp for _, stamp in lasts.values())


def topic_counts(clients: Clients, topics: list[str]) -> dict[str, int]:
    """Number of records in each topic, as a read_committed consumer sees them.

    Counted by reading: offset spans would also count transaction markers (and, on a broker that shows
    records of aborted transactions, their copies, which :func:`read_topic` skips).
    """
    return {topic: sum(1 for _ in read_topic(clients, topic)) for topic in topics}


def offsets_for_time(consumer: Consumer, topic: str, partitions: list[int], time_ms: int) -> dict[int, int]:
    """Per partition, the offset of the first record with a Kafka timestamp at or after ``time_ms``.

    A partition without such a record maps to -1 (the end, ``OFFSET_END``).
    """
    found = consumer.offsets_for_times([TopicPartition(topic, p, time_ms) for p in partitions], timeout=10)
    return {tp.partition: tp.offset if tp.offset >= 0 else -1 for tp in found}


def read_topic(
    clients: Clients,
    topic: str,
    idle_timeout_s: float = 10.0,
    start_ms: int | None = None,
    skip_copies: bool = True,
) -> Generator[Message]:
    """Every record of ``topic`` present now (read_committed), in offset order within each partition.

    With ``start_ms``, each partition starts at its first record with a Kafka timestamp at or after it.
    Stops at the end offsets measured at the start; fails if neither a record nor the end arrives for
    ``idle_timeout_s``. Copies of the project's sink records that an aborted attempt left in the log are
    skipped (``contracts.provenance``; the embedded broker shows them), unless ``skip_copies`` is False.
    """
    consumer = clients.consumer(overrides={"enable.partition.eof": True, "fetch.wait.max.ms": 10})
    try:
        bounds = offset_bounds(consumer, topic)
        if start_ms is not None:
            starts = offsets_for_time(consumer, topic, sorted(bounds), start_ms)
            bounds = {p: (end if starts[p] < 0 else starts[p], end) for p, (_, end) in bounds.items()}
        pending = {p: end for p, (first, end) in bounds.items() if end > first}
        consumer.assign([TopicPartition(topic, p, bounds[p][0]) for p in pending])
        idle_since = time.monotonic()
        copies = CopyFilter()
        while pending:
            idle = True
            for message, at_end in consumed(consumer, 10_000, timeout=0.1):
                idle = False
                partition = message.partition() or 0
                if partition not in pending:
                    continue
                # Done at or past the end measured at the start. The broker's own end can trail it (an open
                # transaction, a high watermark that lags): only the position says the partition is done.
                if (message.offset() or 0) >= pending[partition]:
                    del pending[partition]
                elif not at_end and not (skip_copies and copies.is_copy(str(partition), message.headers())):
                    yield message
            if not idle:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > idle_timeout_s:
                raise ServiceUnavailableError(
                    f"Kafka delivered nothing of {topic}, partitions {sorted(pending)}, for "
                    f"{idle_timeout_s:.0f} s before their end"
                )
    finally:
        consumer.close()
