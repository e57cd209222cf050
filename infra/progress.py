"""Progress of a running Spark streaming query, shown while it runs and summed up when it stops."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from pyspark.sql.streaming import StreamingQuery

from infra.console import console


@dataclass
class QueryReport:
    """What a query did while it was watched."""

    batches: int = 0
    records: int = 0
    seconds: float = 0.0


def records_read(progress: dict[str, Any]) -> int:
    """Kafka records a micro-batch read: its end offsets minus its start offsets, over all sources."""
    total = 0
    for source in progress.get("sources", []):
        start, end = (_offsets(source.get(key)) for key in ("startOffset", "endOffset"))
        total += sum(offset - start.get(name, offset) for name, offset in end.items())
    return total


def _offsets(raw: Any) -> dict[str, int]:
    if not raw:
        return {}
    value = json.loads(raw) if isinstance(raw, str) else raw
    offsets = value.get("offsets", {}) if isinstance(value, dict) else {}
    return {str(name): int(offset) for name, offset in offsets.items()}


def watch_query(query: StreamingQuery, poll_s: int = 1) -> QueryReport:
    """Print one line per micro-batch until the query stops (Ctrl-C stops it); re-raise its failure."""
    report = QueryReport()
    started = time.monotonic()
    seen = -1
    try:
        while True:
            active = query.isActive
            for progress in query.recentProgress:
                if progress["batchId"] > seen:
                    seen = progress["batchId"]
                    _report_batch(report, progress)
            if not active:
                break
            query.awaitTermination(poll_s)
    except KeyboardInterrupt:
        console.print("Stopping...")
        query.stop()
    report.seconds = time.monotonic() - started
    if query.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {query.exception()}")
    return report


def _report_batch(report: QueryReport, progress: dict[str, Any]) -> None:
    records = records_read(progress)
    report.batches += 1
    report.records += records
    duration_s = progress["durationMs"].get("triggerExecution", 0) / 1000
    if records:
        rate = f" ({records / duration_s:,.0f}/s)" if duration_s else ""
        console.print(f"  batch {progress['batchId']}: {records:,} records in {duration_s:,.1f} s{rate}")
