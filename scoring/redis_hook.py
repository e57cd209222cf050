"""The scoring sink's after-commit hook: what a committed micro-batch wrote to Kafka, into Redis."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from contracts.records import AlertRecord
from infra.redis.connection import RedisTarget
from infra.redis.store import write_alerts, write_score_values
from infra.spark.kafka_sink.records import newest_per_key
from scoring.score_stats import score_stats, write_score_stats


@dataclass(frozen=True)
class ScoresToRedis:
    """The sink's after-commit hook: alerts, then the newest score of each card, into Redis.

    Alerts go first: they are few and what alert consumers wait for; the scores are one per card.
    """

    redis: RedisTarget
    alerts_topic: str
    scores_topic: str

    def __call__(self, batches: list[pa.RecordBatch]) -> None:
        alerts = [
            AlertRecord.model_validate_json(value) for value in topic_values(batches, self.alerts_topic)
        ]
        prefix, retention_s = self.redis.prefix, self.redis.retention_s
        if alerts:
            self.redis.write(lambda client: write_alerts(client, alerts, prefix, retention_s))
        # Only the newest score per card is stored: read just those (ties are broken by tx id).
        scores = newest_per_key(batches, self.scores_topic)
        self.redis.write(lambda client: write_score_values(client, scores, prefix, retention_s))
        # Every score counts in the live page's figures (scoring.score_stats: once per task and micro-batch).
        stats = score_stats(topic_values(batches, self.scores_topic))
        self.redis.write(lambda client: write_score_stats(client, stats, prefix, retention_s))


def topic_values(batches: list[pa.RecordBatch], topic: str) -> list[bytes]:
    """The values of the sink rows for ``topic``."""
    return [
        value
        for batch in batches
        for value in batch.column("value").filter(pc.equal(batch.column("topic"), topic)).to_pylist()
    ]
