"""Feature-job throughput: simulated transactions through the streaming job on the embedded stack.

Produces a fixed simulation (seed 0) to an embedded Tansu broker, then runs ``fraud features run --once``
(as a function call) with the real exactly-once sink and Redis, and prints: Spark start-up, the first
micro-batch (Python workers warming up) separately, steady-state events/s over the other batches,
micro-batch latency percentiles, and the features written; writes them to the ``features`` section of
docs/benchmarks.md.

Run: .venv/bin/python bench/bench_features.py [--customers 5000 --days 52] [--max-records 100000] [--no-report]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import report

from features.definitions import FeatureParams
from features.job import FeatureJobConfig, start_feature_job
from fraud.jobs import SPARK_PRELOAD, job_spark_session, redis_target
from fraud.progress import records_read
from infra.clients import Clients, ensure_topics, topic_counts
from infra.embedded import temporary_stack
from ingest.files import clean_table
from ingest.produce import events_from_table, produce_events
from ingest.simulator import SimulatorConfig, simulate

DAY_MS = 86_400_000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--customers", type=int, default=5000)
    parser.add_argument("--terminals", type=int, default=10000)
    parser.add_argument(
        "--days", type=int, default=52, help="52 days of 5,000 customers: about 500k transactions"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--max-records", type=int, default=100_000)
    parser.add_argument("--card-buckets", type=int, default=FeatureJobConfig.card_buckets)
    parser.add_argument("--terminal-buckets", type=int, default=FeatureJobConfig.terminal_buckets)
    report.add_flag(parser)
    args = parser.parse_args()
    print(f"settings: {vars(args)}; Spark local[2], embedded Tansu broker (memory), Valkey")

    frame = simulate(
        SimulatorConfig(customers=args.customers, terminals=args.terminals, days=args.days, seed=args.seed)
    )
    with tempfile.TemporaryDirectory() as home, temporary_stack(Path(home)) as info:
        clients = Clients.for_stack(info, Path(home), partitions=args.partitions)
        settings = clients.settings
        ensure_topics(clients.admin(), settings.topics.all(), settings.partitions, 1)
        batch = events_from_table(clean_table(frame, "bench"), "bench", b"bench", 7 * DAY_MS, 16_384)
        produced = produce_events(clients.producer(), settings.topics, batch)
        print(f"input: {produced.transactions:,} transactions, {produced.labels:,} labels")

        started = time.perf_counter()
        spark = job_spark_session(settings, "bench-features", SPARK_PRELOAD)
        startup_s = time.perf_counter() - started
        config = FeatureJobConfig(
            kafka_config=clients.kafka_config(),
            topics=settings.topics,
            checkpoint=Path(home) / "checkpoint",
            redis=redis_target(settings, clients),
            params=FeatureParams(),
            max_event_bytes=settings.max_event_bytes,
            max_records_per_trigger=args.max_records,
            card_buckets=args.card_buckets,
            terminal_buckets=args.terminal_buckets,
        )
        started = time.perf_counter()
        query = start_feature_job(spark, config, once=True)
        query.awaitTermination()
        run_s = time.perf_counter() - started
        progress = [p for p in query.recentProgress if records_read(p)]
        written = topic_counts(clients, [settings.topics.features])[settings.topics.features]
        spark.stop()

    records = [records_read(p) for p in progress]
    batch_s = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    steady_records, steady_s = sum(records[1:]), sum(batch_s[1:])
    figures = [
        ["Spark session start-up", f"{startup_s:.1f} s"],
        ["first micro-batch", f"{batch_s[0]:.1f} s for {records[0]:,} records (worker start-up included)"],
    ]
    if steady_s:
        figures += [
            [
                "steady state",
                f"{steady_records / steady_s:,.0f} events/s ({steady_records:,} records in "
                f"{len(records) - 1} micro-batches, {steady_s:,.1f} s)",
            ],
            [
                "micro-batch latency",
                f"p50 {np.percentile(batch_s[1:], 50):.1f} s, p95 {np.percentile(batch_s[1:], 95):.1f} s, "
                f"max {max(batch_s[1:]):.1f} s",
            ],
        ]
    figures += [
        ["whole run", f"{sum(records) / run_s:,.0f} events/s ({sum(records):,} in {run_s:,.1f} s)"],
        ["feature records written", f"{written:,}"],
        ["driver peak RSS", f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB"],
    ]
    for name, value in figures:
        print(f"{name + ':':24} {value}")
    if not args.no_report:
        report.write_section(
            "features",
            script=__file__,
            tables=[
                report.Table(
                    ["figure", "value"],
                    figures,
                    notes=[f"Input: {produced.transactions:,} transactions, {produced.labels:,} labels."],
                )
            ],
            settings={
                **report.args_settings(args),
                "spark_master": settings.spark_master,
                "stack": "embedded Tansu (memory), Valkey",
            },
        )


if __name__ == "__main__":
    main()
