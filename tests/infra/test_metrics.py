"""The jobs' metrics from Spark's progress reports and the stages' counts."""

import json

import pyarrow as pa
from prometheus_client import generate_latest

from contracts.events import DLQ_REASON_HEADER, Reason
from contracts.settings import Topics
from infra.kafka_sink.records import HEADERS_ARROW_TYPE
from infra.metrics import ALERTS, DEAD, FEATURES, LATE, SCORES, JobMetrics, batch_counts, counts_row

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
    assert (counts[FEATURES], counts[SCORES], counts[ALERTS], counts[LATE]) == (1, 2, 1, 3)
    assert counts[DEAD["malformed_json"]] == counts[DEAD["duplicate_tx_id"]] == 1
    assert sum(counts[name] for name in DEAD.values()) == 2
    assert counts_row(counts)[SCORES] == [2]
    assert set(batch_counts(records.slice(0, 0), TOPICS).values()) == {0}


def test_progress_reports_and_batch_counts_become_metrics() -> None:
    metrics = JobMetrics("pipeline")
    end = {"offsets": {"transactions/0": 90, "transactions/1": 40}, "frontier": 1_522_540_800_000}
    latest = {"offsets": {"transactions/0": 100, "transactions/1": 40}}
    progress = {
        "batchId": 7,
        "numInputRows": 12,  # the source's rows: events packed per card bucket
        "durationMs": {"triggerExecution": 1_500},
        "sources": [
            {
                "startOffset": json.dumps({"read": 870}),
                "endOffset": json.dumps({**end, "read": 1_000}),
                "latestOffset": json.dumps(latest),
            }
        ],
        "stateOperators": [
            {"operatorName": "transformWithStateInPandasExec", "numRowsTotal": 6, "memoryUsedBytes": 4096}
        ],
        "observedMetrics": {"fraud": {FEATURES: 128, LATE: 2, SCORES: 128, ALERTS: 3, DEAD["oversized"]: 2}},
    }
    metrics.on_progress(progress)
    metrics.on_batch({SCORES: 0}, {"model": 4, "shadow": None})
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
