"""The jobs' metrics from Spark's progress reports and the stages' counts."""

import json
import socket
from collections.abc import Mapping
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from prometheus_client import generate_latest

from contracts.errors import ConfigError
from contracts.events import DLQ_REASON_HEADER, Reason
from contracts.records import ALERT_SOURCE_HEADER, parse_source_position, source_position
from contracts.settings import Topics
from features.counts import (
    ALERT_COUNT,
    ALERT_SOURCES,
    DEAD_COUNTS,
    FEATURE_COUNT,
    LATE_COUNT,
    SCORE_COUNT,
    alert_sources,
    batch_counts,
    counts_row,
)
from fraud.metrics import JobMetrics, batch_ranges, ended_at, operator_names
from infra.kafka.input_watch import Arrivals, observer_group
from infra.spark.kafka_sink.records import HEADERS_ARROW_TYPE
from infra.spark.offset_log import Frontier, FrontierPlan
from tests.support.progress import kafka_source

TOPICS = Topics()


def sample(metrics: JobMetrics, name: str, **labels: str) -> float | None:
    value = metrics.registry.get_sample_value(name, {"job": metrics.job, **labels})
    return value


def test_records_are_counted_by_topic_and_dead_letters_by_reason() -> None:
    def letter(reason: Reason) -> list[dict[str, object]]:
        return [
            {"key": DLQ_REASON_HEADER, "value": reason.value.encode()},
            {"key": "dlq.detail", "value": b"x"},
        ]

    records = pa.table(
        {
            "topic": [
                TOPICS.features,
                TOPICS.scores,
                TOPICS.alerts,
                TOPICS.scores,
                TOPICS.dead_letter,
                TOPICS.dead_letter,
            ],
            "value": [b"{}"] * 6,
            "headers": pa.array(
                [None, None, None, None, letter(Reason.MALFORMED_JSON), letter(Reason.DUPLICATE_TX_ID)],
                HEADERS_ARROW_TYPE,
            ),
        }
    )
    counts = batch_counts(records, TOPICS, late=3)
    assert (counts[FEATURE_COUNT], counts[SCORE_COUNT], counts[ALERT_COUNT], counts[LATE_COUNT]) == (
        1,
        2,
        1,
        3,
    )
    assert counts[DEAD_COUNTS["malformed_json"]] == counts[DEAD_COUNTS["duplicate_tx_id"]] == 1
    assert sum(counts[name] for name in DEAD_COUNTS.values()) == 2
    assert counts_row(counts)[SCORE_COUNT] == [2]
    assert set(batch_counts(records.slice(0, 0), TOPICS).values()) == {0}


def test_progress_reports_and_batch_counts_become_metrics() -> None:
    # The frontier after each micro-batch, as the job's checkpoint keeps it (``infra.offset_log``).
    metrics = JobMetrics("pipeline", frontier_ms={7: 1_522_540_800_000}.get)
    progress = {
        "batchId": 7,
        "numInputRows": 136,  # the Kafka records and the frontier's ticks
        "durationMs": {"triggerExecution": 1_500},
        "sources": [
            kafka_source({"0": 0, "1": 0}, {"0": 90, "1": 40}, {"0": 100, "1": 40}),
            {
                "startOffset": json.dumps(FrontierPlan().as_json()),
                "endOffset": json.dumps(FrontierPlan(Frontier(), 7, {"transactions/0": 100}).as_json()),
                "numInputRows": 6,
            },
        ],
        "stateOperators": [
            {"operatorName": "transformWithStateInPandasExec", "numRowsTotal": 6, "memoryUsedBytes": 4096}
        ],
        "observedMetrics": {
            "fraud": {
                FEATURE_COUNT: 128,
                LATE_COUNT: 2,
                SCORE_COUNT: 128,
                ALERT_COUNT: 3,
                DEAD_COUNTS["oversized"]: 2,
            }
        },
    }
    metrics.on_progress(progress)
    metrics.on_batch({SCORE_COUNT: 0}, {"model": 4, "shadow": None})
    assert sample(metrics, "fraud_last_batch_id") == 7
    assert sample(metrics, "fraud_input_records_total") == 130
    assert sample(metrics, "fraud_input_records_per_second") == 130 / 1.5
    assert sample(metrics, "fraud_batch_duration_seconds_count") == 1
    assert sample(metrics, "fraud_batch_duration_seconds_sum") == 1.5
    assert sample(metrics, "fraud_lag_records", topic="transactions", partition="0") == 10
    assert sample(metrics, "fraud_lag_records", topic="transactions", partition="1") == 0
    assert sample(metrics, "fraud_frontier_delay_seconds") > 200 * 86_400  # 2018, seen from now
    assert sample(metrics, "fraud_state_rows", operator="transformWithStateInPandasExec") == 6
    assert (sample(metrics, "fraud_feature_records_total"), sample(metrics, "fraud_late_events_total")) == (
        128,
        2,
    )
    assert (sample(metrics, "fraud_scores_total"), sample(metrics, "fraud_alerts_total")) == (128, 3)
    assert sample(metrics, "fraud_dead_letters_total", reason="oversized") == 2
    assert sample(metrics, "fraud_dead_letters_total", reason="malformed_json") == 0  # every reason shows
    assert sample(metrics, "fraud_model_version", role="model") == 4
    assert sample(metrics, "fraud_model_version", role="shadow") is None
    assert b'fraud_alerts_total{job="pipeline"} 3.0' in generate_latest(metrics.registry)
    assert sample(metrics, "fraud_alert_latency_seconds_count") is None  # no watch: no latency
    assert metrics.totals()["alerts"] == 3 and metrics.totals()["dead:oversized"] == 2


def test_stateful_operators_of_one_kind_are_numbered_and_each_keeps_its_state_figures() -> None:
    stateful = "transformWithStateInPandasExec"
    operators = [
        {"operatorName": stateful, "numRowsTotal": 5_000, "memoryUsedBytes": 1024},
        {"operatorName": "dedupe", "numRowsTotal": 2},
        {"operatorName": stateful, "numRowsTotal": 10_000, "memoryUsedBytes": 2048},
    ]
    assert operator_names(operators) == [f"{stateful}#1", "dedupe", f"{stateful}#2"]
    metrics = JobMetrics("pipeline")
    metrics.on_progress({"batchId": 1, "stateOperators": operators})
    assert sample(metrics, "fraud_state_rows", operator=f"{stateful}#1") == 5_000
    assert sample(metrics, "fraud_state_rows", operator=f"{stateful}#2") == 10_000
    assert sample(metrics, "fraud_state_bytes", operator=f"{stateful}#2") == 2048


def test_a_batch_reads_its_offset_ranges_and_ends_after_its_duration() -> None:
    progress = {
        "timestamp": "2026-11-26T10:00:00.000Z",
        "durationMs": {"triggerExecution": 2_250},
        "sources": [
            {
                "startOffset": json.dumps({"t": {"0": 5, "1": 0}}),
                "endOffset": json.dumps({"t": {"0": 9, "1": 3}, "u": {"0": 2}}),
            }
        ],
    }
    assert batch_ranges(progress) == {"t/0": (5, 9), "t/1": (0, 3), "u/0": (2, 2)}
    assert ended_at(progress) == datetime(2026, 11, 26, 10, 0, 2, 250_000, tzinfo=UTC).timestamp()


def test_append_times_are_known_for_the_records_fetched_after_the_watch_began() -> None:
    arrivals = Arrivals(["t/0", "t/1"])
    arrivals.note({"t/0": 10}, at=100.0)  # offsets 10.. came with this fetch
    arrivals.note({"t/0": 20, "t/1": 0}, at=101.0)
    assert [arrivals.appended_at("t/0", offset) for offset in (9, 10, 19, 20, 99)] == [
        None,
        100,
        100,
        101,
        101,
    ]
    assert arrivals.appended_at("t/1", 3) == 101 and arrivals.appended_at("u/0", 3) is None
    arrivals.forget(before_s=100.5)
    assert arrivals.appended_at("t/0", 15) is None and arrivals.appended_at("t/0", 25) == 101


def test_alert_sources_are_collected_from_the_alerts_headers() -> None:
    headers = [
        [{"key": ALERT_SOURCE_HEADER, "value": source_position("transactions", 2, 41).encode()}],
        None,
        [{"key": "fraud.provenance", "value": b"w/1/a/0"}],
    ]
    records = pa.table(
        {
            "topic": [TOPICS.alerts, TOPICS.alerts, TOPICS.scores],
            "value": [b"{}"] * 3,
            "headers": pa.array(headers, HEADERS_ARROW_TYPE),
        }
    )
    assert alert_sources(records, TOPICS) == ["transactions/2@41"]
    # Past ``kept`` alerts (with a source or not), no more sources.
    many = pa.concat_tables([records] * 3)
    assert alert_sources(many, TOPICS) == ["transactions/2@41"] * 3
    assert alert_sources(many, TOPICS, kept=3) == ["transactions/2@41"] * 2
    assert alert_sources(many, TOPICS, kept=0) == []
    assert parse_source_position("transactions/2@41") == ("transactions/2", 41)
    assert parse_source_position("no position") is None


class _Watch:
    """What JobMetrics asks of an input watch, recorded (the real one tails Kafka)."""

    group = "fraud-observed.pipeline"

    def __init__(self) -> None:
        self.arrivals = Arrivals(["transactions/0"])
        self.committed: list[Mapping[str, int]] = []

    def commit(self, ends: Mapping[str, int]) -> None:
        self.committed.append(dict(ends))

    def close(self) -> None:
        pass


def test_alerts_are_timed_from_their_transactions_append_and_the_batch_offsets_committed() -> None:
    watch = _Watch()
    failures = iter([3, 3, 7])
    metrics = JobMetrics("pipeline", watch=watch, redis_failures=lambda: next(failures))  # type: ignore[arg-type]
    started = datetime(2026, 11, 26, 10, tzinfo=UTC)
    watch.arrivals.note({"transactions/0": 0}, started.timestamp() - 0.5)
    watch.arrivals.note({"transactions/0": 50}, started.timestamp())

    def batch(batch_id: int, start: int, end: int, sources: list[str]) -> dict[str, object]:
        return {
            "batchId": batch_id,
            "timestamp": started.isoformat().replace("+00:00", "Z"),
            "durationMs": {"triggerExecution": 1_000},
            "sources": [
                {
                    "startOffset": json.dumps({"transactions": {"0": start}, "labels": {"0": 0}}),
                    "endOffset": json.dumps({"transactions": {"0": end}, "labels": {"0": 4}}),
                }
            ],
            "observedMetrics": {"fraud": {ALERT_COUNT: len(sources), ALERT_SOURCES: sources}},
        }

    # Alerts of records 7 and 60, appended 1.5 s and 1 s before the batch ended; one of a source without a
    # position, and one of a partition not watched: not timed.
    timed = ["transactions/0@7", "transactions/0@60"]
    metrics.on_progress(batch(0, 0, 100, [*timed, "transactions/0@notanumber", "labels/0@1"]))
    assert sample(metrics, "fraud_alert_latency_seconds_count") == 2
    assert sample(metrics, "fraud_alert_latency_seconds_sum") == 1.5 + 1.0
    assert sample(metrics, "fraud_alerts_total") == 4
    assert watch.committed == [{"transactions/0": 100, "labels/0": 4}]
    metrics.on_progress(batch(1, 100, 100, []))
    metrics.on_progress(batch(2, 100, 100, []))
    assert sample(metrics, "fraud_redis_write_failures_total") == 4  # counted from the job's start: 3 -> 7


def test_each_job_commits_to_a_group_of_its_own() -> None:
    assert observer_group("pipeline") == "fraud-observed.pipeline"
    assert observer_group("scoring", "ab-1") == "fraud-observed.ab-1.scoring"


def test_a_port_in_use_is_a_clear_error_and_port_0_takes_a_free_one() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with pytest.raises(
            ConfigError, match=f"cannot serve the metrics on 127.0.0.1:{taken.getsockname()[1]}"
        ):
            JobMetrics("features").serve(taken.getsockname()[1])
    finally:
        taken.close()
    metrics = JobMetrics("features")
    port = metrics.serve(0)
    try:
        assert port > 0
    finally:
        metrics.close()
