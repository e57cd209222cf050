"""Scoring throughput and end-to-end alert latency: both Spark jobs live on the embedded stack.

1. Trains a model (gradient boosting on every feature, batch path) into the stack's MLflow store as the
   champion.
2. Unpaced: produces the first days of a fixed simulation (seed 0), runs the feature job over them, then
   the scoring job over the features (each ``--once``), and prints each job's steady rate (first
   micro-batch, with the Python workers' start-up, left out) and the two together.
3. Paced: starts both jobs continuously, streams the following days at 1,000 and then 2,000
   transactions/s and prints the latency from producing a transaction to its alert being readable in
   Redis (p50/p95/p99/max).

Run: .venv/bin/python bench/bench_scoring.py [--customers 5000] [--unpaced-days 52] [--paced-s 60]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from features.definitions import DAY_MS, FeatureParams
from features.job import FeatureJobConfig, start_feature_job
from infra.clients import Clients, ensure_topics
from infra.embedded import temporary_stack
from infra.progress import records_read
from infra.redis_store import recent_alerts_key
from infra.spark import spark_session
from ingest.files import clean_table
from ingest.pipeline import EventBatch, events_from_table, produce_events
from ingest.schemas import TxColumns
from ingest.simulator import SimulatorConfig, simulate
from models.cli import Periods, TrainOptions, run_training
from models.dataset import file_dataset
from models.metrics import DEFAULT_ALERTS_PER_DAY
from models.pipelines import ModelSpec
from models.tracking import default_artifact_location
from scoring.job import ScoringJobConfig, start_scoring_job

LABEL_DELAY_MS = 7 * DAY_MS
MAX_EVENT_BYTES = 16_384


def events_of(frame: pd.DataFrame) -> EventBatch:
    return events_from_table(clean_table(frame, "bench"), "bench", b"bench", LABEL_DELAY_MS, MAX_EVENT_BYTES)


def paced(clients: Clients, batch: EventBatch, rate: float, seconds: float) -> dict[int, float]:
    """Produce the batch's records in time order at ``rate`` transactions/s for at most ``seconds``;
    returns each transaction's produce time (monotonic clock) by tx id."""
    producer = clients.producer()
    topics = clients.settings.topics
    records = sorted(
        [
            (t, topics.transactions, k, v)
            for t, k, v in zip(batch.tx_times, batch.tx_keys, batch.tx_values, strict=True)
        ]
        + [
            (t, topics.labels, k, v)
            for t, k, v in zip(batch.label_times, batch.label_keys, batch.label_values, strict=True)
        ],
        key=lambda record: record[0],
    )
    produced: dict[int, float] = {}
    started = time.monotonic()
    for timestamp, topic, key, value in records:
        if topic == topics.transactions:
            due = started + len(produced) / rate
            if due - started > seconds:
                break
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            produced[orjson.loads(value)[TxColumns.TX_ID]] = time.monotonic()
        producer.produce(topic, value, key, timestamp=timestamp)
        producer.poll(0)
    producer.flush()
    return produced


def watch_alerts(clients: Clients, seen: dict[int, float], stop: threading.Event) -> None:
    """Record when each alert first becomes readable in Redis (the recent-alerts set)."""
    redis = clients.redis()
    key = recent_alerts_key()
    while not stop.is_set():
        for member in redis.zrange(key, 0, -1):
            seen.setdefault(int(member), time.monotonic())
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--customers", type=int, default=5000)
    parser.add_argument("--terminals", type=int, default=10000)
    parser.add_argument(
        "--unpaced-days", type=int, default=52, help="52 days of 5,000 customers: about 500k transactions"
    )
    parser.add_argument("--paced-s", type=float, default=60.0, help="seconds of each paced load")
    parser.add_argument("--rates", default="1000,2000")
    parser.add_argument("--max-records", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"settings: {vars(args)}; Spark local[2], embedded Tansu broker (memory), Valkey, SQLite MLflow")

    rates = [float(r) for r in args.rates.split(",")]
    days = args.unpaced_days + 14
    frame = simulate(
        SimulatorConfig(customers=args.customers, terminals=args.terminals, days=days, seed=args.seed)
    )
    start = frame[TxColumns.EVENT_TIME].min().normalize()
    cut = start + pd.Timedelta(days=args.unpaced_days)
    first, later = frame[frame[TxColumns.EVENT_TIME] < cut], frame[frame[TxColumns.EVENT_TIME] >= cut]

    with tempfile.TemporaryDirectory() as home, temporary_stack(Path(home)) as info:
        clients = Clients.for_stack(info, Path(home))
        settings, topics = clients.settings, clients.settings.topics
        ensure_topics(clients.admin(), topics.all(), settings.partitions, 1)
        params = FeatureParams()

        dataset = file_dataset(first, "bench", params, LABEL_DELAY_MS, MAX_EVENT_BYTES)
        options = TrainOptions(
            ModelSpec("hist_gradient_boosting"),
            "all",
            params,
            Periods(train_days=7, delay_days=3, test_days=3).plans(dataset.last_ms),
            DEFAULT_ALERTS_PER_DAY,
        )
        run_training(
            dataset,
            options,
            info.mlflow_tracking_uri,
            default_artifact_location(info.mlflow_tracking_uri, info.mlflow_artifacts),
            register=True,
        )

        produced = produce_events(clients.producer(), topics, events_of(first))
        print(f"unpaced input: {produced.transactions:,} transactions, {produced.labels:,} labels")

        spark = spark_session(settings, app_name="bench-scoring")
        feature_config = FeatureJobConfig(
            kafka_config=clients.kafka_config(),
            topics=topics,
            checkpoint=Path(home) / "features",
            redis_url=info.redis_url,
            params=params,
            max_event_bytes=MAX_EVENT_BYTES,
            max_records_per_trigger=args.max_records,
        )
        scoring_config = ScoringJobConfig(
            kafka_config=clients.kafka_config(),
            topics=topics,
            checkpoint=Path(home) / "scoring",
            redis_url=info.redis_url,
            tracking_uri=info.mlflow_tracking_uri,
            max_event_bytes=MAX_EVENT_BYTES,
            max_records_per_trigger=args.max_records,
        )
        rates_of = {}
        for name, start in (
            ("feature job", lambda: start_feature_job(spark, feature_config, once=True)),
            ("scoring job", lambda: start_scoring_job(spark, scoring_config, once=True)),
        ):
            query = start()
            query.awaitTermination()
            batches = [p for p in query.recentProgress if records_read(p)][1:]
            records = sum(records_read(p) for p in batches)
            seconds = sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000
            rates_of[name] = records / seconds
            print(
                f"{name}, unpaced steady: {rates_of[name]:10,.0f} records/s "
                f"({records:,} records in {len(batches)} micro-batches after the first)"
            )
        both = 1 / sum(1 / rate for rate in rates_of.values())
        print(f"features + scoring, unpaced:  {both:10,.0f} transactions/s (the two steady rates in series)")

        features = start_feature_job(spark, feature_config, once=False, trigger_interval_s=0.5)
        scoring = start_scoring_job(spark, scoring_config, once=False, trigger_interval_s=0.5)
        later_batch = events_of(later)
        offset = 0
        for rate in rates:
            n = int(rate * args.paced_s)
            part = EventBatch(
                tx_keys=later_batch.tx_keys[offset : offset + n],
                tx_values=later_batch.tx_values[offset : offset + n],
                tx_times=later_batch.tx_times[offset : offset + n],
            )
            offset += n
            seen: dict[int, float] = {}
            stop = threading.Event()
            watcher = threading.Thread(target=watch_alerts, args=(clients, seen, stop), daemon=True)
            watcher.start()
            sent = paced(clients, part, rate, args.paced_s)
            time.sleep(30)  # let the last micro-batches finish
            stop.set()
            watcher.join()
            latencies = np.array([seen[tx] - at for tx, at in sent.items() if tx in seen])
            if not len(latencies):
                print(f"paced {rate:,.0f}/s: no alerts seen in Redis")
                continue
            p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
            print(
                f"paced {rate:,.0f}/s for {args.paced_s:.0f} s: {len(sent):,} transactions, {len(latencies):,} alerts; "
                f"produce -> alert in Redis p50 {p50:.2f} s, p95 {p95:.2f} s, p99 {p99:.2f} s, "
                f"max {latencies.max():.2f} s"
            )
        for query in (features, scoring):
            query.stop()
        spark.stop()
    print(f"driver peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")


if __name__ == "__main__":
    main()
