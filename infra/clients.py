"""Kafka, Redis and MLflow connections built from the settings: where the services are, and the clients.

Connection settings left unset resolve to the embedded stack recorded under ``settings.home``.
Producers are idempotent with ``acks=all``; consumers never auto-commit and read committed records only:
librdkafka's defaults are the opposite, so every client is made here. Topics are administered in
``infra.topic_admin``, logs probed and read in ``infra.kafka_log``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ClusterMetadata

from contracts.errors import ServiceUnavailableError
from contracts.settings import Settings
from infra.embedded import EmbeddedStack, StackInfo
from infra.kafka_outage import KafkaUnreachableError
from infra.redis.connection import redis_client

#: How long the broker keeps a transaction open before aborting it (``transaction.timeout.ms`` of the
#: project's transactional producers); a crashed writer that is not restarted holds back read_committed
#: consumers of its partitions this long, so readers wait at least as long for records they planned.
TRANSACTION_TIMEOUT_MS = 120_000
#: How long a metadata request (topics, partitions) may take before Kafka counts as unreachable.
METADATA_TIMEOUT_S = 10.0
#: librdkafka's own log lines (a refused connection, say) go to this logger, not straight to stderr.
KAFKA_LOGGER = logging.getLogger("fraud.kafka")


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
        """Connection and security options shared by every Kafka client (``Settings.kafka``)."""
        return self.settings.kafka.client_config(self.endpoints.bootstrap_servers)

    def producer(self, **overrides: Any) -> Producer:
        """An idempotent producer (no duplicates or reordering from retries)."""
        config = {
            **self.kafka_config(),
            "enable.idempotence": True,
            "acks": "all",
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

    def redis(self) -> Any:
        """A new Redis client (a process's jobs share theirs: ``RedisTarget.client``)."""
        return redis_client(self.endpoints.redis_url, self.settings.redis)


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
