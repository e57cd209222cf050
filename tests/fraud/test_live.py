"""The running jobs as the live page's status strip shows them (``fraud.live``): from metrics samples and
from progress reports."""

from __future__ import annotations

import json

from fraud.live import metrics_status, progress_status
from infra.spark.offset_log import Frontier
from tests.support.progress import kafka_source


def test_a_job_from_its_metrics() -> None:
    samples = {
        ("fraud_input_records_per_second", (("job", "scoring"),)): 1234.5,
        ("fraud_lag_records", (("job", "scoring"), ("partition", "0"), ("topic", "features"))): 10.0,
        ("fraud_lag_records", (("job", "scoring"), ("partition", "1"), ("topic", "features"))): 5.0,
        ("fraud_last_batch_id", (("job", "scoring"),)): 41.0,
        ("fraud_last_batch_timestamp_seconds", (("job", "scoring"),)): 1_700_000_000.25,
        ("fraud_model_version", (("job", "scoring"), ("role", "model"))): 3.0,
    }
    job = metrics_status("scoring", samples)
    assert job.answering
    assert (job.records_per_s, job.lag_records, job.last_batch_id) == (1234.5, 15, 41)
    assert job.last_batch_at_ms == 1_700_000_000_250
    assert job.model_versions == {"model": 3}


def test_a_job_before_its_first_batch_and_one_that_does_not_answer() -> None:
    fresh = metrics_status("features", {("fraud_lag_records", (("job", "features"),)): 0.0})
    assert fresh.answering and fresh.last_batch_id is None and fresh.last_batch_at_ms is None
    gone = metrics_status("features", None)
    assert not gone.answering and gone.records_per_s is None and gone.lag_records is None


def test_a_job_from_its_query_progress() -> None:
    progress = {
        "batchId": 7,
        "timestamp": "2026-11-27T20:00:00.000Z",
        "durationMs": {"triggerExecution": 500},
        "sources": [
            kafka_source({"0": 40, "1": 10}, {"0": 100, "1": 50}, {"0": 130, "1": 50}),
            {  # the frontier source: its ticks are not records read
                "startOffset": json.dumps(Frontier().as_json()),
                "endOffset": json.dumps(Frontier({}, {}, 5).as_json()),
                "latestOffset": None,
                "numInputRows": 6,
            },
        ],
    }
    job = progress_status("features", progress)
    assert (job.records_per_s, job.lag_records, job.last_batch_id) == (200.0, 30, 7)
    assert job.last_batch_at_ms == 1_795_809_600_500  # 2026-11-27 20:00:00.500 UTC
    waiting = progress_status("features", None)
    assert waiting.answering and waiting.last_batch_id is None
