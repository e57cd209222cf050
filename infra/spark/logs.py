"""Spark's own output goes to a log file; the project's lines from Spark's Python processes still reach the
terminal.

Spark's JVM writes log4j notices to its stderr, and the Python processes it starts write there too: the
workers that run the stages, the driver-side runners of the Python data sources, and PySpark's driver
worker of ``transformWithStateInPandas``, which prints several notices per query start. A command that
shows them floods its user. So the session's JVM starts with its stdout and stderr in a log file
(:func:`launch_logged_gateway`); the Python processes it starts find :data:`WORKER_LOGS_ENV` (the
command's log level) in their environment and log the project's lines of that level with :data:`MARK`, their
level and logger in front (:func:`mark_worker_logs`, called where the project's code is imported in them); a
thread of the driver logs the marked lines again, through the command's logging configuration
(:class:`MarkedLines`). Everything stays in the log file.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from contracts.errors import ServiceUnavailableError
from contracts.privacy import mask_card_numbers
from infra.spark.internals import launch_gateway

#: Set in the environment of the JVM, hence of every Python process it starts (and of the executors').
WORKER_LOGS_ENV = "FRAUD_SPARK_WORKER_LOGS"
#: The start of a log line of the project's code in one of Spark's Python processes.
MARK = "[fraud] "
POLL_S = 0.2
#: The loggers a log level applies to: the project's packages (and the lines of Spark's Python workers
#: without a logger of their own, :func:`relog`). Other libraries log warnings and errors only, whatever the
#: level: at debug, some would log their calls' arguments, credentials included.
PROJECT_LOGGERS = (
    "contracts",
    "validation",
    "infra",
    "ingest",
    "features",
    "models",
    "scoring",
    "api",
    "fraud",
    "spark.worker",
)


class CardNumberFilter(logging.Filter):
    """Masks card numbers in a log record's message (``contracts.privacy``), whatever logged it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_card_numbers(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def mark_worker_logs() -> None:
    """In a Python process Spark started (``WORKER_LOGS_ENV`` set, to a level): the project's log lines of
    that level and above go to stderr, marked, with their level and logger, card numbers masked. Anywhere
    else (a command, a test) it does nothing. Called once per process."""
    root = logging.getLogger()
    level = os.environ.get(WORKER_LOGS_ENV)
    if not level or any(getattr(h, "fraud_marked", False) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(level.upper() if level.upper() in logging.getLevelNamesMapping() else logging.WARNING)
    handler.setFormatter(logging.Formatter(MARK + "%(levelname)s %(name)s %(message)s"))
    handler.addFilter(CardNumberFilter())
    handler.fraud_marked = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    for name in PROJECT_LOGGERS:
        logging.getLogger(name).setLevel(handler.level)


def marked(lines: Iterable[str]) -> Iterator[str]:
    """The project's lines among a Spark log's lines, without their mark."""
    for line in lines:
        at = line.find(MARK)
        if at >= 0:
            yield line[at + len(MARK) :].rstrip("\n")


def relog(line: str) -> None:
    """A marked line (``LEVEL logger message``) logged again in this process, by the same logger at the same
    level: the command's logging configuration formats it."""
    level, _, rest = line.partition(" ")
    name, _, message = rest.partition(" ")
    number = logging.getLevelNamesMapping().get(level)
    if number is None or not name:
        number, name, message = logging.WARNING, "spark.worker", line
    logging.getLogger(name).log(number, "%s", message)


class MarkedLines(threading.Thread):
    """Logs again the marked lines that reach ``path`` (a daemon thread: it ends with the process)."""

    def __init__(self, path: Path, emit: Callable[[str], None] = relog) -> None:
        super().__init__(name="spark-log-lines", daemon=True)
        self.path = path
        self.emit = emit
        self.start_at = path.stat().st_size if path.exists() else 0

    def run(self) -> None:
        with self.path.open(errors="replace") as log:
            log.seek(self.start_at)
            pending = ""
            while True:
                chunk = log.read()
                if not chunk:
                    time.sleep(POLL_S)
                    continue
                *lines, pending = (pending + chunk).split("\n")
                for line in marked(lines):
                    self.emit(line)


def launch_logged_gateway(conf: Any, log_file: Path, level: str = "warning") -> Any:
    """Start Spark's JVM (PySpark's gateway) with ``conf``, its output appended to ``log_file``, and log the
    project's lines of ``level`` and above from its Python processes again here. Returns the gateway, for
    ``infra.spark.internals.use_gateway``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    copier = MarkedLines(log_file)
    with log_file.open("ab") as log:
        previous = os.environ.get(WORKER_LOGS_ENV)
        os.environ[WORKER_LOGS_ENV] = level  # the JVM's environment only: restored below
        start = log.tell()
        try:
            gateway = launch_gateway(conf, log)
        except Exception as exc:  # the JVM's reasons are in the log, not in PySpark's error
            said = log_file.read_bytes()[start:].decode(errors="replace").strip().splitlines()
            last = said[-1] if said else str(exc)
            raise ServiceUnavailableError(
                f"Spark's JVM did not start: {last} (its output: {log_file})"
            ) from exc
        finally:
            if previous is None:
                del os.environ[WORKER_LOGS_ENV]
            else:
                os.environ[WORKER_LOGS_ENV] = previous
    copier.start()
    return gateway
