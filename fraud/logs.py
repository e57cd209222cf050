"""Logging of the ``fraud`` command: what the client libraries log stays out of the user's terminal.

librdkafka reports each refused connection on its own log line, many a second while a broker is away;
the command says what is wrong in one line instead (``fraud.cli``).
"""

from __future__ import annotations

import logging

from infra.clients import KAFKA_LOGGER
from infra.spark_logs import CardNumberFilter


def quiet_client_libraries() -> None:
    """Drop the Kafka clients' own log lines (they are routed to :data:`infra.clients.KAFKA_LOGGER`)."""
    KAFKA_LOGGER.addHandler(logging.NullHandler())
    KAFKA_LOGGER.propagate = False


def mask_card_numbers_in_logs() -> None:
    """Every log line the command writes goes through :class:`CardNumberFilter` (warnings and errors,
    on stderr, as Python does without a configuration)."""
    root = logging.getLogger()
    if not any(isinstance(f, CardNumberFilter) for h in root.handlers for f in h.filters):
        handler = logging.StreamHandler()
        handler.setLevel(logging.WARNING)
        handler.addFilter(CardNumberFilter())
        root.addHandler(handler)
