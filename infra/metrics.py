"""Prometheus metrics of the streaming jobs: what each micro-batch read, wrote, dropped and how long it took.

Two feeds. Spark's progress report of each micro-batch (:meth:`JobMetrics.on_progress`): rows in and
rates, the micro-batch's duration, how far each partition's offsets trail the log's end, the event-time
frontier's delay, state rows and bytes per stateful operator. And the counts the stages attach to their
output (:data:`COUNTS`, one column each next to the packed records: feature records, late events, scores,
alerts, dead letters by reason), summed per micro-batch by Spark (``observe``) and handed over with the
model versions that served it (:meth:`JobMetrics.on_batch`).

Counts are per micro-batch run: a micro-batch re-run after a crash counts again (metrics are for watching
a job, the topics are the record).

A job also watches its input log (:class:`InputWatch`, one consumer in the driver): when each record of its
main input topic was appended (to a tail's precision, tens of milliseconds), for the alert latency, and it
commits each micro-batch's end offsets to a consumer group of its own (:func:`observer_group`), so that
Kafka's tools (``kafka-consumer-groups.sh --describe``) and ``fraud status`` show its lag. The group is for
observation only: the job resumes from its checkpoint, never from the group.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from bisect import bisect_right
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaException, TopicPartition
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.parser import text_string_to_metric_families

from contracts.errors import ConfigError
from contracts.events import DLQ_REASON_HEADER, Reason
from contracts.records import ALERT_SOURCE_HEADER, parse_source_position
from contracts.settings import Topics
from infra.clients import KAFKA_LOGGER, log_bounds, partitions_of

_log = logging.getLogger(__name__)

#: The counts the stages attach to their output rows, summed per micro-batch.
FEATURE_COUNT, LATE_COUNT, SCORE_COUNT, ALERT_COUNT = "n_features", "n_late", "n_scores", "n_alerts"
DEAD_COUNTS = {reason.value: f"n_dead_{reason.value}" for reason in Reason}
COUNTS = (FEATURE_COUNT, LATE_COUNT, SCORE_COUNT, ALERT_COUNT, *DEAD_COUNTS.values())
#: Next to the counts: the alerts' source records (``contracts.records.ALERT_SOURCE_HEADER``), collected.
ALERT_SOURCES = "alert_sources"
#: The counts' and sources' columns as Spark DDL (``mapInArrow`` and state outputs) and as Arrow fields.
COUNTS_DDL = ", ".join([*(f"{name} bigint" for name in COUNTS), f"{ALERT_SOURCES} array<string>"])
COUNTS_FIELDS = [*((name, pa.int64()) for name in COUNTS), (ALERT_SOURCES, pa.list_(pa.string()))]
#: Fetches of the input watch kept for the alert latency: an alert's transaction older than this (held by
#: the frontier, or read late) is not timed.
ARRIVALS_KEPT_S = 600.0
#: The name of the observed metrics in Spark's progress reports.
OBSERVATION = "fraud"
#: Micro-batch durations, seconds.
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60, 120)
#: Alert latencies, seconds.
LATENCY_BUCKETS = (0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60)
#: API request durations, seconds.
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
#: The start of the consumer groups the jobs commit their offsets to, for observation.
OBSERVER_GROUP_PREFIX = "fraud-observed."


def observer_group(job: str, namespace: str = "") -> str:
    """The consumer group a job commits its processed offsets to: ``fraud-observed.[<namespace>.]<job>``."""
    return f"{OBSERVER_GROUP_PREFIX}{namespace + '.' if namespace else ''}{job}"


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


def alert_sources(records: pa.Table, topics: Topics) -> list[str]:
    """The source positions of a state call's or a task's alert records, from their headers."""
    alerts = records.filter(pc.equal(records.column("topic"), topics.alerts))
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


def observations() -> list[Any]:
    """The aggregates of a micro-batch's observed metrics (``DataFrame.observe``): the counts summed, the
    alerts' sources collected."""
    from pyspark.sql import functions as F

    return [
        *(F.sum(name).alias(name) for name in COUNTS),
        F.flatten(F.collect_list(ALERT_SOURCES)).alias(ALERT_SOURCES),
    ]


class Arrivals:
    """When the records of some partitions were appended: per partition, the first offset of each fetch and
    when it came. Records from one fetch's first offset to the next's arrived with that fetch."""

    def __init__(self, partitions: Collection[str]) -> None:
        self._firsts: dict[str, tuple[list[int], list[float]]] = {name: ([], []) for name in partitions}
        self._lock = threading.Lock()

    def note(self, firsts: Mapping[str, int], at: float) -> None:
        """A fetch at ``at`` (seconds since the epoch) whose first record of each partition had this offset."""
        with self._lock:
            for name, offset in firsts.items():
                offsets, times = self._firsts[name]
                offsets.append(offset)
                times.append(at)

    def appended_at(self, name: str, offset: int) -> float | None:
        """When the record at ``offset`` of partition ``name`` (``topic/partition``) came; None when not
        known (before the watch began, forgotten, or a partition not watched)."""
        with self._lock:
            offsets, times = self._firsts.get(name, ((), ()))
            i = bisect_right(offsets, offset) - 1
            return times[i] if i >= 0 else None

    def forget(self, before_s: float) -> None:
        """Forget the fetches before ``before_s``."""
        with self._lock:
            for offsets, times in self._firsts.values():
                drop = bisect_right(times, before_s)
                del offsets[:drop], times[:drop]


class InputWatch:
    """The driver's watch on a job's input log: when its main topics' records were appended, and a consumer
    group to show what the job has processed.

    A thread tails the topics from their end as the job starts (read_uncommitted: a record counts as
    appended before its transaction commits) and notes, per partition and fetch, the first offset it got
    and the time (:class:`Arrivals`): records appended while the job runs have an append time to a fetch's
    precision (tens of milliseconds), older ones none. :meth:`commit` commits a micro-batch's end offsets
    to ``group``.
    """

    def __init__(self, kafka_config: Mapping[str, Any], topics: Sequence[str], group: str) -> None:
        """Watch ``topics`` (none: only commit to ``group``)."""
        self.group = group
        self._consumer = Consumer(
            {
                **kafka_config,
                "group.id": group,
                "enable.auto.commit": False,
                "isolation.level": "read_uncommitted",
                "fetch.wait.max.ms": 20,
                "enable.partition.eof": True,  # for log_bounds
                "queued.max.messages.kbytes": 4096,
            },
            logger=KAFKA_LOGGER,
        )
        partitions = [(topic, p) for topic in topics for p in partitions_of(self._consumer, topic)]
        # The log's end as it is (Tansu reports a high watermark short of it: infra.clients.log_bounds).
        ends = log_bounds(self._consumer, partitions) if partitions else {}
        self._consumer.assign(
            [TopicPartition(*_topic_partition(name), end) for name, (_, end) in ends.items()]
        )
        self.arrivals = Arrivals([f"{topic}/{p}" for topic, p in partitions])
        self._client = threading.Lock()  # the consumer, shared by the tail and the commits
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tail, name="input-watch", daemon=True)
        if partitions:
            self._thread.start()

    def _tail(self) -> None:
        while not self._stop.is_set():
            try:
                with self._client:
                    messages = self._consumer.consume(10_000, timeout=0.05)
            except (KafkaException, RuntimeError):  # the broker away, or the consumer closed
                time.sleep(0.5)
                continue
            firsts: dict[str, int] = {}
            for message in messages:
                if message.error() is None:
                    firsts.setdefault(f"{message.topic()}/{message.partition()}", message.offset() or 0)
            self.arrivals.note(firsts, time.time())
            if not messages:
                time.sleep(0.01)

    def commit(self, ends: Mapping[str, int]) -> None:
        """Commit the end offsets of a micro-batch (``topic/partition``: offset) to the group, without
        waiting: a commit that fails (the broker away) is made good by the next micro-batch's."""
        offsets = [TopicPartition(*_topic_partition(name), int(at)) for name, at in ends.items()]
        try:
            with self._client:
                self._consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as error:
            _log.debug("committing offsets to %s failed: %s", self.group, error)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with self._client:
            self._consumer.close()


def _topic_partition(name: str) -> tuple[str, int]:
    topic, _, partition = name.rpartition("/")
    return topic, int(partition)


class JobMetrics:
    """The metrics of one job (``job`` label), in a registry of their own."""

    def __init__(
        self,
        job: str,
        registry: CollectorRegistry | None = None,
        watch: InputWatch | None = None,
        redis_failures: Callable[[], int | None] | None = None,
    ) -> None:
        """``watch``: the job's input watch (alert latency, observed offsets); ``redis_failures``: the
        count of the job's failed Redis write attempts so far
        (``infra.redis_store.RedisTarget.write_failures``)."""
        self.job = job
        self.registry = registry or CollectorRegistry()
        self.watch = watch
        self.redis_failures = redis_failures
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
        for source in progress.get("sources", []):
            frontier = _offsets(source.get("endOffset")).get("frontier")
            if isinstance(frontier, int) and frontier > 0:
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
        """The summed counts of a micro-batch's output (:data:`COUNTS`) and the model versions that served it."""
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
        latest = _offsets(source.get("latestOffset")).get("offsets", {})
        for name, at in _offsets(source.get("endOffset")).get("offsets", {}).items():
            behind[name] = max(0, int(latest.get(name, at)) - int(at))
    return behind


def operator_names(operators: Sequence[Mapping[str, Any]]) -> list[str]:
    """The label of each stateful operator of a progress report: its ``operatorName``, numbered (``#1``,
    ``#2``, in the report's order) where several share it, as a job's stateful stages of one kind do."""
    names = [str(operator.get("operatorName", "state")) for operator in operators]
    return [
        name if names.count(name) == 1 else f"{name}#{names[: i + 1].count(name)}"
        for i, name in enumerate(names)
    ]


class ApiMetrics:
    """The metrics of an HTTP API (``fraud serve``): requests by route template, method and status, and
    their durations by route."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "fraud_api_requests", "Requests answered", ["route", "method", "status"], registry=self.registry
        )
        self.duration = Histogram(
            "fraud_api_request_duration_seconds",
            "Time to answer a request",
            ["route"],
            buckets=REQUEST_BUCKETS,
            registry=self.registry,
        )

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.duration.labels(route).observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        """The metrics in Prometheus' text format, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


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
        start = _offsets(source.get("startOffset")).get("offsets", {})
        for name, end in _offsets(source.get("endOffset")).get("offsets", {}).items():
            ranges[name] = (int(start.get(name, end)), int(end))
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
