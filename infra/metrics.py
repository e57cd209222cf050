"""Prometheus metrics of the streaming jobs: what each micro-batch read, wrote, dropped and how long it took.

Two feeds. Spark's progress report of each micro-batch (:meth:`JobMetrics.on_progress`): rows in and
rates, the micro-batch's duration, how far each partition's offsets trail the log's end, the event-time
frontier's delay, state rows and bytes per stateful operator. And the counts the stages attach to their
output (:data:`COUNTS`, one column each next to the packed records: feature records, late events, scores,
alerts, dead letters by reason), summed per micro-batch by Spark (``observe``) and handed over with the
model versions that served it (:meth:`JobMetrics.on_batch`).

Counts are per micro-batch run: a micro-batch re-run after a crash counts again (metrics are for watching
a job, the topics are the record).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from contracts.events import DLQ_REASON_HEADER, Reason
from contracts.settings import Topics

#: The counts the stages attach to their output rows, summed per micro-batch.
FEATURES, LATE, SCORES, ALERTS = "n_features", "n_late", "n_scores", "n_alerts"
DEAD = {reason.value: f"n_dead_{reason.value}" for reason in Reason}
COUNTS = (FEATURES, LATE, SCORES, ALERTS, *DEAD.values())
#: The same as Spark DDL (``mapInArrow`` and state outputs) and as Arrow fields.
COUNTS_DDL = ", ".join(f"{name} bigint" for name in COUNTS)
COUNTS_FIELDS = [(name, pa.int64()) for name in COUNTS]
#: The name of the observed metrics in Spark's progress reports.
OBSERVATION = "fraud"
#: Micro-batch durations, seconds.
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60, 120)


def records_read(progress: Mapping[str, Any]) -> int:
    """Kafka records a micro-batch read (``fraud-kafka`` offsets count them), over all sources. (Spark's
    own row count is of the source's rows, which a decoder may pack: events per card bucket.)"""
    return sum(
        _read(source.get("endOffset")) - _read(source.get("startOffset"))
        for source in progress.get("sources", [])
    )


def _read(raw: Any) -> int:
    return int(_offsets(raw).get("read", 0))


def batch_counts(records: pa.Table, topics: Topics, late: int = 0) -> dict[str, int]:
    """The counts of a state call's or a task's sink records (``infra.kafka_sink.records.COLUMNS``):
    records per output topic, dead letters by reason (from their ``dlq.reason`` header)."""
    counts = dict.fromkeys(COUNTS, 0)
    counts[LATE] = late
    if not records.num_rows:
        return counts
    topic = records.column("topic")
    for name, where in ((FEATURES, topics.features), (SCORES, topics.scores), (ALERTS, topics.alerts)):
        counts[name] = int(pc.sum(pc.equal(topic, where)).as_py() or 0)
    dead = records.filter(pc.equal(topic, topics.dead_letter))
    for headers in dead.column("headers").to_pylist() if dead.num_rows else ():
        reason = next((h["value"] for h in headers or () if h["key"] == DLQ_REASON_HEADER), b"")
        column = DEAD.get(bytes(reason or b"").decode(errors="replace"))
        if column is not None:
            counts[column] += 1
    return counts


def counts_row(counts: Mapping[str, int]) -> dict[str, list[int]]:
    """Columns of one output row carrying ``counts`` (next to its packed records)."""
    return {name: [int(counts.get(name, 0))] for name in COUNTS}


class JobMetrics:
    """The metrics of one job (``job`` label), in a registry of their own."""

    def __init__(self, job: str, registry: CollectorRegistry | None = None) -> None:
        self.job = job
        self.registry = registry or CollectorRegistry()
        labels = ["job"]

        def counter(name: str, text: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, text, [*labels, *extra], registry=self.registry)

        def gauge(name: str, text: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, text, [*labels, *extra], registry=self.registry)

        self.batches = counter("fraud_batches", "Micro-batches run")
        self.input_rows = counter("fraud_input_records", "Kafka records read")
        self.input_rate = gauge(
            "fraud_input_records_per_second", "Records read per second of the last micro-batch's duration"
        )
        self.duration = Histogram(
            "fraud_batch_duration_seconds",
            "Micro-batch duration",
            labels,
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.last_batch = gauge("fraud_last_batch_id", "Id of the last micro-batch run")
        self.last_batch_at = gauge("fraud_last_batch_timestamp_seconds", "When the last micro-batch ended")
        self.lag = gauge("fraud_lag_records", "Records behind the log's end", ("topic", "partition"))
        self.frontier_delay = gauge(
            "fraud_frontier_delay_seconds", "Wall clock minus the event-time frontier"
        )
        self.state_rows = gauge("fraud_state_rows", "Rows in a stateful operator's state", ("operator",))
        self.state_bytes = gauge("fraud_state_bytes", "Memory of a stateful operator's state", ("operator",))
        self.feature_records = counter("fraud_feature_records", "Feature records written")
        self.late_events = counter("fraud_late_events", "Transactions processed behind the frontier (late)")
        self.scores = counter("fraud_scores", "Score records written")
        self.alerts = counter("fraud_alerts", "Alerts written")
        self.dead_letters = counter("fraud_dead_letters", "Dead letters written", ("reason",))
        self.model_version = gauge("fraud_model_version", "Model version serving", ("role",))
        for reason in DEAD:  # every reason shows, at 0 until one comes
            self.dead_letters.labels(job, reason)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve the metrics at ``http://host:port/metrics`` (a thread of this process)."""
        start_http_server(port, host, registry=self.registry)

    def on_progress(self, progress: Mapping[str, Any]) -> None:
        """One micro-batch's progress report (``StreamingQuery.recentProgress`` items)."""
        job = self.job
        self.batches.labels(job).inc()
        self.last_batch.labels(job).set(progress["batchId"])
        self.last_batch_at.labels(job).set(time.time())
        records = records_read(progress)
        duration_s = progress.get("durationMs", {}).get("triggerExecution", 0) / 1000
        self.input_rows.labels(job).inc(records)
        self.input_rate.labels(job).set(records / duration_s if duration_s else 0)
        self.duration.labels(job).observe(duration_s)
        for source in progress.get("sources", []):
            end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
            for name, at in end.get("offsets", {}).items():
                topic, _, partition = name.rpartition("/")
                behind = max(0, int(latest.get("offsets", {}).get(name, at)) - int(at))
                self.lag.labels(job, topic, partition).set(behind)
            frontier = end.get("frontier")
            if isinstance(frontier, int) and frontier > 0:
                self.frontier_delay.labels(job).set(max(0.0, time.time() - frontier / 1000))
        for operator in progress.get("stateOperators", []):
            name = str(operator.get("operatorName", "state"))
            self.state_rows.labels(job, name).set(operator.get("numRowsTotal") or 0)
            self.state_bytes.labels(job, name).set(operator.get("memoryUsedBytes") or 0)
        observed = (progress.get("observedMetrics") or {}).get(OBSERVATION)
        if observed:
            self.on_batch(observed.asDict() if hasattr(observed, "asDict") else observed)  # a Row, from Spark

    def on_batch(self, counts: Mapping[str, Any], versions: Mapping[str, int | None] | None = None) -> None:
        """The summed counts of a micro-batch's output (:data:`COUNTS`) and the model versions that served it."""
        job = self.job
        for name, counter in (
            (FEATURES, self.feature_records),
            (LATE, self.late_events),
            (SCORES, self.scores),
            (ALERTS, self.alerts),
        ):
            counter.labels(job).inc(int(counts.get(name) or 0))
        for reason, name in DEAD.items():
            self.dead_letters.labels(job, reason).inc(int(counts.get(name) or 0))
        for role, version in (versions or {}).items():
            if version is not None:
                self.model_version.labels(job, role).set(version)


def _offsets(raw: Any) -> dict[str, Any]:
    """A source offset of a progress report (a JSON string, or already parsed)."""
    if not raw:
        return {}
    value = json.loads(raw) if isinstance(raw, str) else raw
    return value if isinstance(value, dict) else {}
