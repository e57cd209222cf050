"""Watching a streaming query: a query that fails while it is waited on ends in one line, not a traceback
(a fake query: pure logic, no Spark)."""

from __future__ import annotations

from typing import Any, cast

import pytest
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
