"""Kafka, Redis and MLflow connections built from the settings: where the services are, and the clients.

Connection settings left unset resolve to the embedded stack recorded under ``settings.home``.
Producers are idempotent with ``acks=all``; consumers never auto-commit and read committed records only:
librdkafka's defaults are the opposite, so every client is made here. Kafka's shared timeouts, logger and
metadata requests are in ``infra.kafka.connection``, topics administered in ``infra.kafka.admin``, logs
probed and read in ``infra.kafka.log``; Redis connections in ``infra.redis.connection``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from contracts.errors import ServiceUnavailableError
from contracts.settings import Settings
from infra.embedded.stack import EmbeddedStack, StackInfo
from infra.kafka.connection import KAFKA_LOGGER, WatchedAdmin
from infra.redis.connection import redis_client


class NotConfiguredError(ServiceUnavailableError):
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
        """An admin client; a refused login ends its metadata requests at once
        (``infra.kafka.connection.cluster_metadata``)."""
        return WatchedAdmin(self.kafka_config())

    def redis(self) -> Any:
        """A new Redis client (a process's jobs share theirs: ``RedisTarget.client``)."""
        return redis_client(self.endpoints.redis_url, self.settings.redis)
