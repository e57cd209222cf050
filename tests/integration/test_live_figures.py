"""The live page's figures against a real Valkey server: the scoring job's after-commit hook counts every
score once per minute of scoring (a re-run of the same micro-batch counts nothing again), the routes serve
the counts under the API's token, and the jobs registered under FRAUD_HOME are read from their real
metrics endpoints."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import redis
from fastapi.testclient import TestClient

from api.app import create_app
from fraud.live import RegisteredJobs
from fraud.metrics import JobMetrics
from fraud.running import RunningJob, jobs_dir, registered, this_job
from infra.embedded.stack import StackInfo
from infra.redis.connection import RedisTarget
from scoring.redis_hook import ScoresToRedis
from scoring.score_stats import MINUTE_MS, SCORE_BINS
from tests.support.factories import EXPLANATION, make_progress, make_score

RETENTION_S = 7 * 86_400
TOKEN = "live-token"  # noqa: S105 - a test token


@pytest.fixture
def target(stack: StackInfo) -> Iterator[tuple[Any, RedisTarget]]:
    client = redis.Redis.from_url(stack.redis_url)
    yield client, RedisTarget(stack.redis_url, f"test-{uuid.uuid4().hex[:10]}:", RETENTION_S)
    client.close()


def sink_rows(scores: list[tuple[int, float]], at_ms: int, version: int = 3) -> pa.RecordBatch:
    """The rows a scoring job's write task hands its after-commit hook: a score record per (tx, score)
    and an alert record for each score at or above 0.5."""
    records = [
        make_score(tx, score=s, scored_at_ms=at_ms, model_version=version, alert=s >= 0.5) for tx, s in scores
    ]
    rows = [("scores", r) for r in records] + [
        ("alerts", r.to_alert({"card_nb_tx_1d": 1.0}, EXPLANATION)) for r in records if r.alert
    ]
    return pa.record_batch(
        {
            "topic": [topic for topic, _ in rows],
            "key": [r.card_id.encode() for _, r in rows],
            "value": [r.model_dump_json().encode() for _, r in rows],
            "timestamp_ms": [r.event_time_ms for _, r in rows],
        }
    )


def test_scores_count_once_per_minute_and_the_routes_serve_them(target: tuple[Any, RedisTarget]) -> None:
    client, redis_target = target
    hook = ScoresToRedis(redis_target, "alerts", "scores")
    now_ms = int(time.time() * 1000)
    earlier_ms = now_ms - 2 * MINUTE_MS
    older = sink_rows([(1, 0.01), (2, 0.03), (3, 0.7)], earlier_ms, version=2)
    newer = sink_rows([(10, 0.01), (11, 0.015), (12, 0.55), (13, 0.999)], now_ms)
    hook([older])
    hook([newer])
    hook([newer])  # the micro-batch run again after a crash: counted once

    api = TestClient(create_app(client, redis_target.prefix, token=TOKEN))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    minutes = api.get("/live/alerts?minutes=5", headers=auth).json()["minutes"]
    assert [m["start_ms"] for m in minutes][-1] == now_ms // MINUTE_MS * MINUTE_MS
    assert [(m["scores"], m["alerts"]) for m in minutes[-3:]] == [(3, 1), (0, 0), (4, 2)]

    distribution = api.get("/live/scores?minutes=5", headers=auth).json()
    assert distribution["model"]["model_version"] == 3
    assert distribution["model"]["threshold"] == 0.5
    assert (distribution["scores"], distribution["alerts"], distribution["other_versions"]) == (4, 2, 3)
    assert len(distribution["counts"]) == SCORE_BINS
    assert (
        distribution["counts"][0] == 2 and distribution["counts"][27] == 1 and distribution["counts"][-1] == 1
    )

    status = api.get("/live/status", headers=auth).json()
    assert status["jobs"] is None  # this server was given no view of the jobs
    assert status["model"]["model_version"] == 3
    assert status["model"]["since_ms"] == now_ms  # its first score, after version 2's last
    assert status["model"]["last_scored_ms"] == now_ms


def test_the_live_routes_need_the_token_and_are_documented(target: tuple[Any, RedisTarget]) -> None:
    client, redis_target = target
    api = TestClient(create_app(client, redis_target.prefix, token=TOKEN))
    paths = api.get("/openapi.json").json()["paths"]
    for path in ("/live/status", "/live/alerts", "/live/scores"):
        assert api.get(path).status_code == 401
        assert api.get(path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert paths[path]["get"]["summary"]
    assert api.get("/live/alerts?minutes=0", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 422


def test_jobs_registered_under_the_home_are_read_from_their_metrics(tmp_path: Path) -> None:
    metrics = JobMetrics("scoring")
    port = metrics.serve(0)
    metrics.on_progress(make_progress(12, read=300, behind=40, duration_ms=1000))
    metrics.on_batch({}, {"model": 3})
    try:
        job = this_job("scoring", "", f"http://127.0.0.1:{port}/metrics", "")
        # A job whose process is gone is not shown, and its file stays (the API only reads; in compose,
        # it sees the pipeline's FRAUD_HOME read-only, and not its processes).
        gone = RunningJob("features", "", 2**31 - 2, "http://127.0.0.1:9/metrics", "", 0.0)
        stale = jobs_dir(tmp_path) / "features-gone.json"
        stale.parent.mkdir(parents=True)
        stale.write_text(json.dumps(asdict(gone)))
        assert RegisteredJobs(tmp_path).jobs() == []
        assert stale.exists()
        with registered(tmp_path, job):
            (shown,) = RegisteredJobs(tmp_path).jobs()
    finally:
        metrics.close()
    assert shown.name == "scoring" and shown.answering
    assert (shown.records_per_s, shown.lag_records, shown.last_batch_id) == (300.0, 40, 12)
    assert shown.model_versions == {"model": 3}
    assert shown.last_batch_at_ms is not None and abs(shown.last_batch_at_ms / 1000 - time.time()) < 60
