"""Kafka connections: the timeouts and the logger every client of the project shares, refused logins
told apart from an outage (:class:`KafkaAccessError`), and the cluster's metadata asked within a deadline.

The clients themselves are made from the settings in ``infra.clients``; what only needs to read a log or
administer topics takes anything with their ``admin()`` and ``consumer()`` (:class:`KafkaClients`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata

from contracts.errors import ServiceUnavailableError
from infra.kafka.outage import KafkaUnreachableError

#: How long the broker keeps a transaction open before aborting it (``transaction.timeout.ms`` of the
#: project's transactional producers); a crashed writer that is not restarted holds back read_committed
#: consumers of its partitions this long, so readers wait at least as long for records they planned.
TRANSACTION_TIMEOUT_MS = 120_000
#: How long a metadata request (topics, partitions) may take before Kafka counts as unreachable.
METADATA_TIMEOUT_S = 10.0
#: librdkafka's own log lines (a refused connection, say) go to this logger, not straight to stderr.
KAFKA_LOGGER = logging.getLogger("fraud.kafka")


class KafkaAccessError(ServiceUnavailableError):
    """Kafka answers, but refuses the credentials (SASL): a setting to correct, not an outage to wait out."""


class KafkaClients(Protocol):
    """What makes the project's Kafka clients (``infra.clients.Clients``): an admin client and a consumer
    for ``assign()`` use, read_committed, without auto-commit."""

    def admin(self) -> AdminClient: ...

    def consumer(self, group_id: str = ..., overrides: dict[str, Any] | None = None) -> Consumer: ...


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


def cluster_metadata(client: AdminClient | Consumer, topic: str | None = None) -> ClusterMetadata:
    """The cluster's metadata (of one topic, if given).

    Raises:
        KafkaUnreachableError: Kafka did not answer within :data:`METADATA_TIMEOUT_S` (the message says what
            to check at start-up; its ``reason``, for an outage's line, only what happened).
        KafkaAccessError: Kafka refused the login of a :class:`WatchedAdmin` (``Clients.admin``, within
            :data:`LOGIN_WAIT_S`): not an outage, never waited out.
    """
    failures = client.login_failures if isinstance(client, WatchedAdmin) else None
    deadline = time.monotonic() + METADATA_TIMEOUT_S
    # A watched admin client asks first for a moment, to stop at a refused login (its error_cb), then for
    # the rest of the time: a slow cluster still has all of it.
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
