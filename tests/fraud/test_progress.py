"""Watching a streaming query: a query that fails while it is waited on ends in one line, not a traceback;
Ctrl-C stops it, even when the interrupt broke the driver's connection to Spark's JVM (fake queries: pure
logic, no Spark)."""

from __future__ import annotations

import os
import signal
from typing import Any, cast

import pytest
from py4j.protocol import Py4JNetworkError
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming import StreamingQuery

from fraud.progress import JobFailedError, watch_query


class FailingQuery:
    """A query that fails while ``awaitTermination`` waits, as Spark's does (it raises there)."""

    def __init__(self) -> None:
        self.isActive = True
        self.recentProgress: list[dict[str, Any]] = []

    def awaitTermination(self, timeout: float) -> None:
        self.isActive = False
        raise StreamingQueryException(message="Python worker failed to connect back.")

    def exception(self) -> Exception:
        return RuntimeError("org.apache.spark.SparkException: Python worker failed to connect back.")


def test_a_query_that_fails_while_waited_on_raises_the_one_line_error() -> None:
    with pytest.raises(
        JobFailedError, match=r"the streaming query failed: .*Python worker failed to connect"
    ) as raised:
        watch_query(cast(StreamingQuery, FailingQuery()), poll_s=0)
    assert "\n" not in str(raised.value)


class OrphanedQuery:
    """A query whose JVM died under it (out of memory, killed): the driver's next call finds no answer."""

    @property
    def isActive(self) -> bool:
        raise Py4JNetworkError("Answer from Java side is empty")


def test_a_query_whose_jvm_died_raises_the_one_line_error_naming_spark_s_log() -> None:
    with pytest.raises(JobFailedError, match=r"the streaming query failed: Spark's JVM stopped") as raised:
        watch_query(cast(StreamingQuery, OrphanedQuery()), poll_s=0)
    assert "\n" not in str(raised.value) and "spark.log" in str(raised.value)


class QueryCutOffAfterCtrlC:
    """Ctrl-C comes while the driver waits on the JVM, and the call comes back broken: a stop was asked for,
    so the JVM being out of reach is the stop's doing, not a failure."""

    isActive = True
    recentProgress: tuple[dict[str, Any], ...] = ()

    def awaitTermination(self, timeout: float) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        raise Py4JNetworkError("Error while receiving")


def test_a_connection_broken_after_ctrl_c_ends_with_a_report_not_an_error() -> None:
    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        report = watch_query(cast(StreamingQuery, QueryCutOffAfterCtrlC()), poll_s=0)
        assert report.batches == 0 and report.seconds >= 0
    finally:
        signal.signal(signal.SIGINT, started_with)


class InterruptedQuery:
    """A query watched when Ctrl-C comes: the interrupt lands in a call to the JVM, whose connection it
    breaks, so stopping the query cannot reach the JVM either."""

    isActive = True

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        raise KeyboardInterrupt

    def stop(self) -> None:
        raise Py4JNetworkError("Answer from Java side is empty")


def test_ctrl_c_that_broke_the_connection_to_the_jvm_still_stops_with_a_report() -> None:
    report = watch_query(cast(StreamingQuery, InterruptedQuery()), poll_s=0)
    assert report.batches == 0 and report.seconds >= 0


class QueryOfManyBatches:
    """A query that runs until stopped; counts the calls made to it."""

    def __init__(self) -> None:
        self.isActive = True
        self.recentProgress: list[dict[str, Any]] = []
        self.waits = 0
        self.completed = 0
        self.stopped = False

    def awaitTermination(self, timeout: float) -> None:
        self.waits += 1
        if self.waits == 2:  # Ctrl-C while the driver waits on the JVM
            os.kill(os.getpid(), signal.SIGINT)
        self.completed += 1

    def stop(self) -> None:
        self.stopped = True
        self.isActive = False

    def exception(self) -> None:
        return None


def test_ctrl_c_during_a_call_to_the_jvm_stops_the_query_after_the_call() -> None:
    # Python's own handler, as in a command started from a terminal (a shell's background job ignores SIGINT).
    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        query = QueryOfManyBatches()
        watch_query(cast(StreamingQuery, query), poll_s=0)
        assert query.stopped and query.waits == query.completed == 2  # the call it came in finished only
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the command's own again
    finally:
        signal.signal(signal.SIGINT, started_with)


class QueryWithAnIdleTrigger:
    """A query whose input paused: between two batches Spark reported a trigger that found no data, under
    the id of the batch that had not run yet, and that batch's report came after it."""

    def __init__(self) -> None:
        self.isActive = True
        ran = {"addBatch": 40, "triggerExecution": 50}
        self.reports = [
            [{"batchId": 0, "durationMs": ran}],
            [{"batchId": 0, "durationMs": ran}, {"batchId": 1, "durationMs": {"triggerExecution": 1}}],
            [{"batchId": 0, "durationMs": ran}, {"batchId": 1, "durationMs": ran}],
        ]
        self.recentProgress = self.reports[0]

    def awaitTermination(self, timeout: float) -> None:
        self.reports.pop(0)
        self.recentProgress = self.reports[0]
        self.isActive = len(self.reports) > 1

    def exception(self) -> None:
        return None


def test_every_batch_is_reported_once_and_a_trigger_without_data_is_not_one() -> None:
    seen: list[dict[str, Any]] = []
    report = watch_query(cast(StreamingQuery, QueryWithAnIdleTrigger()), poll_s=0, on_progress=seen.append)
    assert [(p["batchId"], p["durationMs"].get("addBatch")) for p in seen] == [(0, 40), (1, 40)]
    assert report.batches == 2
