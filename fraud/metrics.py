"""Prometheus metrics of the streaming jobs: what each micro-batch read, wrote, dropped and how long it took.

Two feeds. Spark's progress report of each micro-batch (:meth:`JobMetrics.on_progress`): rows in and
rates, the micro-batch's duration, how far each partition's offsets trail the log's end, the event-time
frontier's delay, state rows and bytes per stateful operator. And the counts the stages attach to their
output (``features.counts``: feature records, late events, scores, alerts, dead letters by reason),
summed per micro-batch by Spark (``observe``) and handed over with the model versions that served it
(:meth:`JobMetrics.on_batch`). With the job's input watch (``infra.kafka.input_watch``), the alert latency too.

Counts are per micro-batch run: a micro-batch re-run after a crash counts again (metrics are for watching
a job, the topics are the record).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from contracts.errors import ConfigError
from contracts.records import parse_source_position
from features.counts import (
    ALERT_COUNT,
    ALERT_SOURCES,
    DEAD_COUNTS,
    FEATURE_COUNT,
    LATE_COUNT,
    OBSERVATION,
    SCORE_COUNT,
)
from infra.kafka.input_watch import ARRIVALS_KEPT_S, InputWatch
from infra.spark.offset_log import connector_offsets

#: Micro-batch durations, seconds.
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60, 120)
#: Alert latencies, seconds.
LATENCY_BUCKETS = (0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60)


def records_read(progress: Mapping[str, Any]) -> int:
    """Kafka records a micro-batch read: the rows of its Kafka sources (not the frontier's ticks)."""
    return sum(
        int(source.get("numInputRows") or 0)
        for source in progress.get("sources", [])
        if connector_offsets(_offsets(source.get("endOffset")))
    )


class JobMetrics:
    """The metrics of one job (``job`` label), in a registry of their own."""

    def __init__(
        self,
        job: str,
        registry: CollectorRegistry | None = None,
        watch: InputWatch | None = None,
        redis_failures: Callable[[], int | None] | None = None,
        frontier_ms: Callable[[int], int | None] | None = None,
    ) -> None:
        """``watch``: the job's input watch (alert latency, observed offsets); ``redis_failures``: the
        count of the job's failed Redis write attempts so far
        (``infra.redis.connection.RedisTarget.write_failures``); ``frontier_ms``: the event-time frontier
        after a micro-batch, by its id (``infra.spark.offset_log.frontier_ms_at``; None: a job without one)."""
        self.job = job
        self.registry = registry or CollectorRegistry()
        self.watch = watch
        self.redis_failures = redis_failures
        self.frontier_ms = frontier_ms
        self._redis_failures_seen: int | None = None
        self._alert_sources: list[str] = []  # of micro-batches whose progress has not come yet
        self._lock = threading.Lock()
        self._server: Any = None
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
        self.alert_latency = Histogram(
            "fraud_alert_latency_seconds",
            "From the append of an alert's source record (a transaction; a feature record for the scoring "
            "job) to the end of the micro-batch that wrote the alert; records appended while the job runs",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.redis_write_failures = counter(
            "fraud_redis_write_failures", "Redis write attempts that failed and were retried (Redis away)"
        )
        for reason in DEAD_COUNTS:  # every reason shows, at 0 until one comes
            self.dead_letters.labels(job, reason)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve the metrics at ``http://host:port/metrics`` (a thread of this process); port 0 takes a
        free one. Returns the port."""
        try:
            self._server, _ = start_http_server(port, host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve the metrics on {host}:{port}: {exc.strerror or exc}") from None
        return int(self._server.server_port)

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
        for name, behind in records_behind(progress).items():
            topic, _, partition = name.rpartition("/")
            self.lag.labels(job, topic, partition).set(behind)
        frontier = self.frontier_ms(progress["batchId"]) if self.frontier_ms is not None else None
        if frontier is not None and frontier > 0:
            self.frontier_delay.labels(job).set(max(0.0, time.time() - frontier / 1000))
        operators = progress.get("stateOperators", [])
        for name, operator in zip(operator_names(operators), operators, strict=True):
            self.state_rows.labels(job, name).set(operator.get("numRowsTotal") or 0)
            self.state_bytes.labels(job, name).set(operator.get("memoryUsedBytes") or 0)
        observed = (progress.get("observedMetrics") or {}).get(OBSERVATION)
        if observed:
            self.on_batch(observed.asDict() if hasattr(observed, "asDict") else observed)  # a Row, from Spark
        with self._lock:
            sources, self._alert_sources = self._alert_sources, []
        if self.watch is not None:
            ended_s = ended_at(progress)
            for source in sources:
                position = parse_source_position(source)
                appended = self.watch.arrivals.appended_at(*position) if position else None
                if appended is not None:
                    self.alert_latency.labels(job).observe(max(0.0, ended_s - appended))
            self.watch.arrivals.forget(ended_s - ARRIVALS_KEPT_S)
            self.watch.commit({name: end for name, (_, end) in batch_ranges(progress).items()})
        self._count_redis_failures()

    def _count_redis_failures(self) -> None:
        total = self.redis_failures() if self.redis_failures is not None else None
        if total is None:
            return
        if self._redis_failures_seen is not None and total > self._redis_failures_seen:
            self.redis_write_failures.labels(self.job).inc(total - self._redis_failures_seen)
        self._redis_failures_seen = total

    def on_batch(self, counts: Mapping[str, Any], versions: Mapping[str, int | None] | None = None) -> None:
        """The summed counts of a micro-batch's output (``features.counts.COUNTS``) and the model versions
        that served it."""
        job = self.job
        for name, counter in (
            (FEATURE_COUNT, self.feature_records),
            (LATE_COUNT, self.late_events),
            (SCORE_COUNT, self.scores),
            (ALERT_COUNT, self.alerts),
        ):
            counter.labels(job).inc(int(counts.get(name) or 0))
        with self._lock:
            self._alert_sources.extend(counts.get(ALERT_SOURCES) or ())
        for reason, name in DEAD_COUNTS.items():
            self.dead_letters.labels(job, reason).inc(int(counts.get(name) or 0))
        for role, version in (versions or {}).items():
            if version is not None:
                self.model_version.labels(job, role).set(version)

    def totals(self) -> dict[str, int]:
        """What the job has counted since it started: records read, feature records, late events, scores,
        alerts, and dead letters by reason (``dead:<reason>``)."""

        def value(name: str, **labels: str) -> int:
            return int(self.registry.get_sample_value(name, {"job": self.job, **labels}) or 0)

        counts = {
            "records": value("fraud_input_records_total"),
            "feature records": value("fraud_feature_records_total"),
            "late events": value("fraud_late_events_total"),
            "scores": value("fraud_scores_total"),
            "alerts": value("fraud_alerts_total"),
        }
        for reason in DEAD_COUNTS:
            counts[f"dead:{reason}"] = value("fraud_dead_letters_total", reason=reason)
        return counts

    def close(self) -> None:
        """Stop serving and watching."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self.watch is not None:
            self.watch.close()


def records_behind(progress: Mapping[str, Any]) -> dict[str, int]:
    """How far each ``topic/partition``'s end offset trails the latest offset the source saw, after a
    micro-batch."""
    behind = {}
    for source in progress.get("sources", []):
        latest = connector_offsets(_offsets(source.get("latestOffset")))
        for name, at in connector_offsets(_offsets(source.get("endOffset"))).items():
            behind[name] = max(0, latest.get(name, at) - at)
    return behind


def operator_names(operators: Sequence[Mapping[str, Any]]) -> list[str]:
    """The label of each stateful operator of a progress report: its ``operatorName``, numbered (``#1``,
    ``#2``, in the report's order) where several share it, as a job's stateful stages of one kind do."""
    names = [str(operator.get("operatorName", "state")) for operator in operators]
    return [
        name if names.count(name) == 1 else f"{name}#{names[: i + 1].count(name)}"
        for i, name in enumerate(names)
    ]


#: Seconds a metrics endpoint may take to answer.
SCRAPE_TIMEOUT_S = 3.0

#: A metrics endpoint's samples: value by (name, sorted labels).
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples | None:
    """Every sample a metrics endpoint serves, by name and labels; None when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as answer:  # noqa: S310 - http(s) URLs
            text = answer.read().decode()
    except OSError:
        return None
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def batch_ranges(progress: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """The offsets a micro-batch read, per ``topic/partition``: [start, end)."""
    ranges = {}
    for source in progress.get("sources", []):
        start = connector_offsets(_offsets(source.get("startOffset")))
        for name, end in connector_offsets(_offsets(source.get("endOffset"))).items():
            ranges[name] = (start.get(name, end), end)
    return ranges


def ended_at(progress: Mapping[str, Any]) -> float:
    """When a micro-batch ended (its commit), in seconds since the epoch: its start plus its duration."""
    started = datetime.fromisoformat(str(progress["timestamp"]).replace("Z", "+00:00")).timestamp()
    return started + progress.get("durationMs", {}).get("triggerExecution", 0) / 1000


def _offsets(raw: Any) -> dict[str, Any]:
    """A source offset of a progress report (a JSON string, or already parsed)."""
    if not raw:
        return {}
    value = json.loads(raw) if isinstance(raw, str) else raw
    return value if isinstance(value, dict) else {}
