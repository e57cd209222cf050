"""The counts the stages attach to their output: one column each next to the packed records (feature
records, late events, scores, alerts, dead letters by reason, the alerts' source records), summed per
micro-batch by Spark (``observe``) for the jobs' metrics (``fraud.metrics``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from contracts.events import DLQ_REASON_HEADER, Reason
from contracts.records import ALERT_SOURCE_HEADER
from contracts.settings import Topics

#: The counts the stages attach to their output rows, summed per micro-batch.
FEATURE_COUNT, LATE_COUNT, SCORE_COUNT, ALERT_COUNT = "n_features", "n_late", "n_scores", "n_alerts"
DEAD_COUNTS = {reason.value: f"n_dead_{reason.value}" for reason in Reason}
COUNTS = (FEATURE_COUNT, LATE_COUNT, SCORE_COUNT, ALERT_COUNT, *DEAD_COUNTS.values())
#: Next to the counts: the alerts' source records (``contracts.records.ALERT_SOURCE_HEADER``), collected.
ALERT_SOURCES = "alert_sources"
#: The most alerts' sources a state call or a task passes on. They are gathered on the driver in one row of
#: Spark's observed metrics, and a backlog or a burst of alerts (a micro-batch of 100,000 alerts: 75 MB)
#: filled the driver's heap: past this, a call's further alerts are not timed.
ALERT_SOURCES_KEPT = 1_000
#: The counts' and sources' columns as Spark DDL (``mapInArrow`` and state outputs) and as Arrow fields.
COUNTS_DDL = ", ".join([*(f"{name} bigint" for name in COUNTS), f"{ALERT_SOURCES} array<string>"])
COUNTS_FIELDS = [*((name, pa.int64()) for name in COUNTS), (ALERT_SOURCES, pa.list_(pa.string()))]
#: The name of the observed metrics in Spark's progress reports.
OBSERVATION = "fraud"
#: Gets each micro-batch's summed counts (``COUNTS``) and the model versions that served it.
BatchObserver = Callable[[Mapping[str, Any], Mapping[str, int | None]], None]


def batch_counts(records: pa.Table, topics: Topics, late: int = 0) -> dict[str, int]:
    """The counts of a state call's or a task's sink records (``infra.spark.kafka_sink.records.COLUMNS``):
    records per output topic, dead letters by reason (from their ``dlq.reason`` header)."""
    counts = dict.fromkeys(COUNTS, 0)
    counts[LATE_COUNT] = late
    if not records.num_rows:
        return counts
    topic = records.column("topic")
    for name, where in (
        (FEATURE_COUNT, topics.features),
        (SCORE_COUNT, topics.scores),
        (ALERT_COUNT, topics.alerts),
    ):
        counts[name] = int(pc.sum(pc.equal(topic, where)).as_py() or 0)
    dead = records.filter(pc.equal(topic, topics.dead_letter))
    for headers in dead.column("headers").to_pylist() if dead.num_rows else ():
        reason = next((h["value"] for h in headers or () if h["key"] == DLQ_REASON_HEADER), b"")
        column = DEAD_COUNTS.get(bytes(reason or b"").decode(errors="replace"))
        if column is not None:
            counts[column] += 1
    return counts


def alert_sources(records: pa.Table, topics: Topics, kept: int = ALERT_SOURCES_KEPT) -> list[str]:
    """The source positions of a state call's or a task's first ``kept`` alert records, from their
    headers."""
    alerts = records.filter(pc.equal(records.column("topic"), topics.alerts)).slice(0, kept)
    found = []
    for headers in alerts.column("headers").to_pylist() if alerts.num_rows else ():
        value = next((h["value"] for h in headers or () if h["key"] == ALERT_SOURCE_HEADER), None)
        if value:
            found.append(bytes(value).decode(errors="replace"))
    return found


def counts_row(counts: Mapping[str, int], sources: Sequence[str] = ()) -> dict[str, list[Any]]:
    """Columns of one output row carrying ``counts`` and the alerts' ``sources`` (next to its packed
    records)."""
    return {**{name: [int(counts.get(name, 0))] for name in COUNTS}, ALERT_SOURCES: [list(sources)]}
