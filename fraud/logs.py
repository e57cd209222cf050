"""Logging of the ``fraud`` command: what the client libraries log stays out of the user's terminal.

librdkafka reports each refused connection on its own log line, many a second while a broker is away;
the command says what is wrong in one line instead (``fraud.cli``).
"""

from __future__ import annotations

import logging

from infra.clients import KAFKA_LOGGER


def quiet_client_libraries() -> None:
    """Drop the Kafka clients' own log lines (they are routed to :data:`infra.clients.KAFKA_LOGGER`)."""
    KAFKA_LOGGER.addHandler(logging.NullHandler())
    KAFKA_LOGGER.propagate = False
