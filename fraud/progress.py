"""Progress of a running Spark streaming query, shown while it runs and summed up when it stops."""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JError, Py4JNetworkError
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming import StreamingQuery

from contracts.errors import FraudError
from fraud.console import GrowingBar, console
from fraud.metrics import records_behind, records_read

#: The last line of a Python traceback inside Spark's report: ``package.module.SomeError: what happened``.
_PYTHON_ERROR = re.compile(
    r"^\s*(?P<name>(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)): (?P<message>.+)$"
)


def _project_errors(kind: type[FraudError] = FraudError) -> dict[str, type[FraudError]]:
    """The project's error classes by their qualified name (``infra.redis.connection.RedisAccessError``)."""
    found = {f"{kind.__module__}.{kind.__qualname__}": kind}
    for sub in kind.__subclasses__():
        found |= _project_errors(sub)
    return found


#: Why a query stopped when the driver lost Spark's JVM under it, without a Ctrl-C.
JVM_GONE = (
    "Spark's JVM stopped under it (out of memory, or killed): Spark's log says which (logs/spark.log under "
    "FRAUD_HOME); started again, the job resumes from its checkpoint"
)


class JobFailedError(FraudError):
    """A streaming query stopped with an error. Spark wraps a Python error in pages of its own report; the
    message is the Python error's own line when there is one, else the report's first line. A project
    error raised in a task (Redis refusing the credentials, say) keeps its exit code."""

    def __init__(self, failure: object) -> None:
        lines = [line.strip() for line in str(failure).splitlines() if line.strip()]
        python = [match for line in lines if (match := _PYTHON_ERROR.match(line))]
        reason = python[-1]["message"] if python else lines[0] if lines else str(failure)
        super().__init__(f"the streaming query failed: {reason}")
        if python and (kind := _project_errors().get(python[-1]["name"])) is not None:
            self.exit_code = kind.exit_code


@dataclass
class QueryReport:
    """What a query did while it was watched."""

    batches: int = 0
    records: int = 0
    seconds: float = 0.0


def watch_query(
    query: StreamingQuery,
    poll_s: int = 1,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    bar: bool = False,
    ended: Callable[[dict[str, Any]], bool] | None = None,
) -> QueryReport:
    """Print one line per micro-batch until the query stops (Ctrl-C stops it); re-raise its failure.
    ``on_progress`` gets each micro-batch's progress report (the metrics, ``fraud.metrics``). ``bar``: also
    show how far the query is toward the end of its input as it was when it started (a bounded run).
    ``ended``: the query is stopped after the micro-batch whose progress report it says is the last (a run
    of a time range)."""
    report = QueryReport()
    started = time.monotonic()
    seen = -1
    with GrowingBar(bar) as progress_bar, ctrl_c_requests_a_stop() as stop_requested:
        try:
            while True:
                if stop_requested.is_set():
                    raise KeyboardInterrupt
                active = query.isActive
                done = False
                for progress in query.recentProgress:
                    if ran_a_batch(progress) and progress["batchId"] > seen:
                        seen = progress["batchId"]
                        _report_batch(report, progress)
                        progress_bar.update(report.records, sum(records_behind(progress).values()))
                        if on_progress is not None:
                            on_progress(progress)
                        done = done or (ended is not None and ended(progress))
                if done:
                    with quiet_py4j():
                        query.stop()
                    break
                if not active:
                    break
                with contextlib.suppress(StreamingQueryException):  # it failed: said below, in one line
                    query.awaitTermination(poll_s)
        except (Py4JNetworkError, ConnectionError) as gone:
            if not stop_requested.is_set():  # not a second Ctrl-C that broke a call to the JVM
                raise JobFailedError(JVM_GONE) from gone
            report.seconds = time.monotonic() - started
            return report
        except KeyboardInterrupt:
            console.print("Stopping...")
            try:
                with quiet_py4j():
                    query.stop()
            except Py4JError:
                # The interrupt cut a call to Spark's JVM short and the driver cannot reach it any more: the
                # JVM ends with this process, and the micro-batch in flight runs again at the next start.
                report.seconds = time.monotonic() - started
                return report
    report.seconds = time.monotonic() - started
    failure = query.exception()
    if failure is not None:
        raise JobFailedError(failure)
    return report


def ran_a_batch(progress: dict[str, Any]) -> bool:
    """Whether a progress report is a micro-batch's. Spark also reports a trigger that found no data (every
    ``spark.sql.streaming.noDataProgressEventInterval``) under the id of the batch that has not run yet:
    taking it for that batch would hide the batch's own report when it comes."""
    return "addBatch" in progress.get("durationMs", {})


@contextlib.contextmanager
def quiet_py4j() -> Iterator[None]:
    """Py4J's own lines dropped for the block: stopping a query in the middle of a micro-batch interrupts
    its ``foreachBatch`` call, which Py4J logs with a traceback (the batch is re-run by the next start)."""
    logger = logging.getLogger("py4j")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def ctrl_c_requests_a_stop() -> Iterator[threading.Event]:
    """While the block runs, a first Ctrl-C sets the event the block polls instead of interrupting a call
    to Spark's JVM half-way (which breaks the driver's connection to it); a second one interrupts at once.
    In the main thread only (elsewhere the event is never set)."""
    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return

    def request(_signal: int, _frame: object) -> None:
        requested.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.signal(signal.SIGINT, request)
    try:
        yield requested
    finally:
        signal.signal(signal.SIGINT, previous)


def ctrl_c_interrupts_the_command_only() -> None:
    """Ctrl-C interrupts the command's main thread only (Python's own handler), which then stops the query.

    PySpark's handler, installed with its context, cancels every running Spark job first: a micro-batch is
    cut off mid-write and every layer of the job reports it, with tracebacks. Called from the main thread
    once the session runs; elsewhere (a job run from another thread) it does nothing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _report_batch(report: QueryReport, progress: dict[str, Any]) -> None:
    records = records_read(progress)
    report.batches += 1
    report.records += records
    duration_s = progress["durationMs"].get("triggerExecution", 0) / 1000
    if records:
        rate = f" ({records / duration_s:,.0f}/s)" if duration_s else ""
        console.print(f"  batch {progress['batchId']}: {records:,} records in {duration_s:,.1f} s{rate}")
