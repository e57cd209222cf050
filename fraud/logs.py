"""Logging of the ``fraud`` command: one configuration, set once by the ``fraud`` callback.

Log lines go to stderr at the level of ``--log-level`` (``FRAUD_LOG_LEVEL``, default warning), as text or
as JSON lines (``--log-format``), card numbers masked whatever logged them. The lines of the project's code
in Spark's Python workers arrive through the same handler (``infra.spark.logs``); Spark's JVM logs to
``FRAUD_HOME/logs/spark.log``. librdkafka reports each refused connection on its own log line, many a
second while a broker is away: those are dropped, and the command says what is wrong in one line instead
(``fraud.cli``).
"""

from __future__ import annotations

import logging
import os

from pythonjsonlogger.json import JsonFormatter

from infra.kafka.connection import KAFKA_LOGGER
from infra.spark.logs import PROJECT_LOGGERS, CardNumberFilter

#: Text lines: what a user reads in a terminal.
TEXT_FORMAT = "%(levelname)s %(name)s: %(message)s"
#: The fields of a JSON line (plus ``timestamp``).
JSON_FIELDS = "%(levelname)s %(name)s %(message)s"


class InterruptedCalls(logging.Filter):
    """Drops Py4J's report of a Ctrl-C that landed in one of its calls to Spark's JVM: it logs the
    interrupt with a traceback (or what closing the interrupted connection then raised), then raises it,
    and the command stops the job as asked."""

    def filter(self, record: logging.LogRecord) -> bool:
        interrupted = record.exc_info is not None and _caused_by_interrupt(record.exc_info[1])
        return not (interrupted and f"{os.sep}py4j{os.sep}" in record.pathname)


def _caused_by_interrupt(exc: BaseException | None) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def configure_logging(level: str, log_format: str) -> None:
    """The project's loggers write lines of ``level`` and above to stderr, other libraries' warnings and
    errors, as ``text`` or ``json``; the Kafka clients' own lines are dropped. Replaces a configuration
    made earlier in the process."""
    KAFKA_LOGGER.handlers = [logging.NullHandler()]
    KAFKA_LOGGER.propagate = False
    handler = logging.StreamHandler()
    handler.addFilter(CardNumberFilter())
    handler.addFilter(InterruptedCalls())
    handler.setFormatter(
        JsonFormatter(JSON_FIELDS, timestamp=True) if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    handler.fraud_configured = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    root.handlers = [h for h in root.handlers if not getattr(h, "fraud_configured", False)] + [handler]
    root.setLevel(logging.WARNING)
    for name in PROJECT_LOGGERS:
        logging.getLogger(name).setLevel(level.upper())
