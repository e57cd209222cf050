"""Scoring throughput and end-to-end alert latency on the embedded stack: the separate feature and scoring
jobs, and the one-query pipeline (``fraud pipeline run``).

1. Trains a model (gradient boosting on every feature, batch path) into the stack's MLflow store as the
   champion.
2. Unpaced: produces the first days of a fixed simulation (seed 0); runs the feature job over them, then
   the scoring job over the features (each ``--once``), and prints each job's steady rate (first
   micro-batch, with the Python workers' start-up, left out) and the two in series; then the pipeline
   over the same transactions into topics of its own, and its steady rate (``--pipeline-only``: just the
   pipeline).
3. Paced, with ``--rates`` (say ``1000,2000``; ``make bench`` leaves it out: bench_peers.py and
   bench_microbatch.py measure the pipeline's latency): in a new Spark application (as ``fraud pipeline
   run`` has), keeps the pipeline running (``--paced-jobs separate``: both separate jobs instead), streams
   the following days at each rate in turn and prints the latency from producing a transaction to its alert being readable
   in Redis (p50/p95/p99/max), the micro-batch durations, and the CPU each process group used meanwhile
   (of one core; the machine has 2). Each load starts with ``--warmup-s`` of the same pace, reported
   apart: a query's first micro-batches load its state.
4. Writes the figures to the ``scoring`` section of docs/benchmarks.md (unless ``--no-report``).

Run: .venv/bin/python bench/bench_scoring.py [--customers 5000] [--unpaced-days 21] [--rates 1000,2000 --paced-s 60]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import resource
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import project_jobs
import report
from project_jobs import TX_PER_CUSTOMER_DAY, events_of
from pyspark.sql.streaming import StreamingQuery

from contracts.events import TxColumns
from contracts.redis_keys import recent_alerts_key
from contracts.settings import Settings, Topics
from features.definitions import FeatureParams
from features.job import FeatureJobConfig, start_feature_job
from fraud.jobs import job_spark_session, redis_target
from fraud.progress import records_read
from infra.clients import Clients
from infra.embedded.stack import temporary_stack
from infra.kafka.admin import ensure_topics
from infra.spark.session import ONCE, Trigger
from ingest.produce import EventBatch, produce_events
from ingest.simulator import SimulatorConfig, simulate
from scoring.job import ScoringJobConfig, start_scoring_job
from scoring.pipeline import PipelineConfig, start_pipeline


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


def watch_alerts(clients: Clients, key: str, seen: dict[int, float], stop: threading.Event) -> None:
    """Record when each alert first becomes readable in Redis (the recent-alerts set ``key``)."""
    redis = clients.redis()
    while not stop.is_set():
        for member in redis.zrange(key, 0, -1):
            seen.setdefault(int(member), time.monotonic())
        time.sleep(0.05)


def process_cpu_s() -> dict[int, tuple[float, str]]:
    """CPU seconds used so far by each process of this machine, with its command line."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found[int(pid)] = ((int(fields[11]) + int(fields[12])) / tick, command)
    return found


#: Process groups of the CPU report, by a part of the command line.
CPU_GROUPS = (
    ("Spark JVM", "org.apache.spark"),
    ("Python workers", "infra.spark.daemon"),
    ("Kafka broker", "kafka.Kafka"),
    ("Valkey", "valkey"),
    ("bench (producer, Spark driver)", "bench_scoring"),
)


def cpu_report(before: dict[int, tuple[float, str]], seconds: float) -> str:
    """Share of one core each process group used since ``before``."""
    used: dict[str, float] = {}
    for pid, (cpu_s, command) in process_cpu_s().items():
        group = next((name for name, part in CPU_GROUPS if part in command), "other")
        used[group] = used.get(group, 0.0) + cpu_s - before.get(pid, (0.0, ""))[0]
    return ", ".join(
        f"{name} {share / seconds:.0%}" for name, share in sorted(used.items(), key=lambda kv: -kv[1])
    )


def steady_rate(query: StreamingQuery, name: str) -> tuple[float, int, int]:
    """Records/s of a finished ``--once`` query over its micro-batches after the first (printed), with the
    records and micro-batches it counts."""
    batches = [p for p in query.recentProgress if records_read(p)][1:]
    records = sum(records_read(p) for p in batches)
    seconds = sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000
    print(
        f"{name}, unpaced steady: {records / seconds:10,.0f} records/s "
        f"({records:,} records in {len(batches)} micro-batches after the first)"
    )
    return records / seconds, records, len(batches)


def run_paced(
    clients: Clients,
    alerts_key: str,
    queries: list[StreamingQuery],
    later: EventBatch,
    rates: list[float],
    seconds: float,
    warmup: float,
) -> tuple[list[list[str]], list[str]]:
    """Stream ``later`` at each rate while ``queries`` run: ``warmup`` seconds first (reported apart: the
    first micro-batches of a query load its state and workers), then ``seconds`` measured; print alert
    latency, micro-batch durations and CPU of the measured part. Returns them as table rows (one per
    rate), and notes on what went short."""
    offset = 0

    def take(n: int) -> EventBatch:
        nonlocal offset
        part = EventBatch(
            tx_keys=later.tx_keys[offset : offset + n],
            tx_values=later.tx_values[offset : offset + n],
            tx_times=later.tx_times[offset : offset + n],
        )
        offset += n
        return part

    rows: list[list[str]] = []
    notes: list[str] = []
    for rate in rates:
        seen: dict[int, float] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=watch_alerts, args=(clients, alerts_key, seen, stop), daemon=True)
        watcher.start()
        warm = paced(clients, take(int(rate * warmup)), rate, warmup)
        last_warm = {id(q): q.lastProgress["batchId"] if q.lastProgress else -1 for q in queries}
        cpu_before, started = process_cpu_s(), time.monotonic()
        sent = paced(clients, take(int(rate * seconds)), rate, seconds)
        cpu = cpu_report(cpu_before, time.monotonic() - started)
        time.sleep(30)  # let the last micro-batches finish
        stop.set()
        watcher.join()
        if len(sent) < int(rate * seconds):
            notes.append(
                f"paced {rate:,.0f}/s: only {len(sent):,} transactions left to send (simulate more days)"
            )
            print(notes[-1])
        latencies = np.array([seen[tx] - at for tx, at in sent.items() if tx in seen])
        if not len(latencies):
            notes.append(f"paced {rate:,.0f}/s: no alerts seen in Redis")
            print(notes[-1])
            continue
        warm_latencies = [seen[tx] - at for tx, at in warm.items() if tx in seen]
        p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
        print(
            f"paced {rate:,.0f}/s for {seconds:.0f} s after {warmup:.0f} s of warm-up: {len(sent):,} "
            f"transactions, {len(latencies):,} alerts; produce -> alert in Redis p50 {p50:.2f} s, "
            f"p95 {p95:.2f} s, p99 {p99:.2f} s, max {latencies.max():.2f} s "
            f"(warm-up: {len(warm_latencies)} alerts, max {max(warm_latencies, default=0.0):.2f} s)"
        )
        batches = []
        for query in queries:
            durations = [
                p["durationMs"]["triggerExecution"] / 1000
                for p in query.recentProgress
                if p["batchId"] > last_warm[id(query)] and records_read(p)
            ]
            if durations:
                summary = f"duration p50 {np.percentile(durations, 50):.2f} s, max {max(durations):.2f} s"
                print(f"  {query.name}: {len(durations)} micro-batches, {summary}")
                batches.append(f"{query.name}: {len(durations)}, {summary}")
        print(f"  CPU while producing (of one core): {cpu}")
        rows.append(
            [
                f"{rate:,.0f}/s",
                f"{len(sent):,}",
                f"{len(latencies):,}",
                f"{p50:.2f} / {p95:.2f} / {p99:.2f} / {latencies.max():.2f} s",
                f"{len(warm_latencies)} alerts, max {max(warm_latencies, default=0.0):.2f} s",
                "; ".join(batches),
                cpu,
            ]
        )
    return rows, notes


def paced_loads(
    args: argparse.Namespace,
    settings: Settings,
    clients: Clients,
    pipeline_config: PipelineConfig,
    feature_config: FeatureJobConfig,
    scoring_config: ScoringJobConfig,
    later: EventBatch,
    rates: list[float],
) -> tuple[list[list[str]], list[str]]:
    """The paced part: the table's rows and notes."""
    # The paced jobs run in an application of their own, as `fraud pipeline run` does: in the session of
    # the unpaced runs, PySpark would hand their tasks to that session's idle Python workers in turn,
    # each with cold Kafka clients and no model loaded.
    spark = job_spark_session(settings, "bench-scoring-paced")
    # Keep every micro-batch's progress of a paced load (Spark keeps the last 100 by default).
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "2000")
    interval = args.trigger_interval_s
    if args.paced_jobs == "pipeline":
        start = project_jobs.bound(pipeline_config)
        queries = [start_pipeline(spark, pipeline_config, start, Trigger(interval_s=interval))]
        alerts_key = recent_alerts_key("pipeline-")
    else:
        queries = [
            start_feature_job(
                spark,
                feature_config,
                project_jobs.bound(feature_config),
                Trigger(interval_s=interval),
            ),
            start_scoring_job(spark, scoring_config, Trigger(interval_s=interval)),
        ]
        alerts_key = recent_alerts_key()
    print(f"paced: {args.paced_jobs} running, trigger interval {interval} s")
    paced_rows, notes = run_paced(clients, alerts_key, queries, later, rates, args.paced_s, args.warmup_s)
    for query in queries:
        if not query.isActive:
            notes.append(f"{query.name} stopped during the paced loads: {query.exception()}")
            print(notes[-1])
        query.stop()
    spark.stop()
    return paced_rows, notes


def main() -> None:
    parser = report.world_parser(__doc__)
    parser.add_argument(
        "--unpaced-days", type=int, default=21, help="21 days of 5,000 customers: about 200k transactions"
    )
    parser.add_argument("--paced-s", type=float, default=60.0, help="seconds of each paced load")
    parser.add_argument(
        "--warmup-s", type=float, default=10.0, help="paced seconds before each measured load, reported apart"
    )
    parser.add_argument("--rates", default="", help="paced loads, transactions/s (none: no paced part)")
    parser.add_argument(
        "--paced-jobs",
        choices=("pipeline", "separate"),
        default="pipeline",
        help="what runs under the paced load: the one-query pipeline or the two separate jobs",
    )
    parser.add_argument(
        "--pipeline-only",
        action="store_true",
        help="skip the separate jobs' unpaced runs (the paced load then runs the pipeline)",
    )
    parser.add_argument("--max-records", type=int, default=100_000)
    parser.add_argument("--card-buckets", type=int, default=FeatureJobConfig.card_buckets)
    parser.add_argument("--terminal-buckets", type=int, default=FeatureJobConfig.terminal_buckets)
    parser.add_argument("--trigger-interval-s", type=float, default=0.2, help="of the paced jobs")
    parser.add_argument("--seed", type=int, default=0)
    report.add_flag(parser)
    args = parser.parse_args()
    if args.pipeline_only and args.paced_jobs == "separate":
        parser.error("--pipeline-only runs no separate jobs: it cannot pace them")
    print(f"settings: {vars(args)}; Spark local[2], {report.EMBEDDED_STACK}")

    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    paced_tx = sum(rate * (args.paced_s + args.warmup_s) for rate in rates)
    days = args.unpaced_days + math.ceil(paced_tx / (args.customers * TX_PER_CUSTOMER_DAY)) + 1
    frame = simulate(
        SimulatorConfig(customers=args.customers, terminals=args.terminals, days=days, seed=args.seed)
    )
    start = frame[TxColumns.EVENT_TIME].min().normalize()
    cut = start + pd.Timedelta(days=args.unpaced_days)
    first, later = frame[frame[TxColumns.EVENT_TIME] < cut], frame[frame[TxColumns.EVENT_TIME] >= cut]

    with tempfile.TemporaryDirectory() as home, temporary_stack(Path(home)) as info:
        clients = Clients.for_stack(info, Path(home))
        settings, topics = clients.settings, clients.settings.topics
        # The pipeline reads the same transactions and labels and writes topics and Redis keys of its own.
        piped = Topics().with_prefix("pipeline-")
        ensure_topics(clients.admin(), [*topics.all(), *piped.all()], settings.partitions, 1)
        piped = piped.model_copy(update={"transactions": topics.transactions, "labels": topics.labels})
        params = FeatureParams()

        project_jobs.train_champion(first, info, params)

        produced = produce_events(clients.producer(), topics, events_of(first))
        print(f"unpaced input: {produced.transactions:,} transactions, {produced.labels:,} labels")

        spark = job_spark_session(settings, "bench-scoring")
        feature_config = project_jobs.feature_config(
            clients,
            topics,
            Path(home) / "features",
            params,
            args.max_records,
            args.card_buckets,
            args.terminal_buckets,
        )
        scoring_config = ScoringJobConfig(
            kafka_config=clients.kafka_config(),
            topics=topics,
            checkpoint=Path(home) / "scoring",
            redis=redis_target(settings, clients),
            tracking_uri=info.mlflow_tracking_uri,
            max_event_bytes=project_jobs.MAX_EVENT_BYTES,
            model_check_interval_s=settings.model_check_interval_s,
            max_records_per_trigger=args.max_records,
        )
        pipeline_config = project_jobs.pipeline_config(
            clients, info, feature_config, piped, Path(home) / "pipeline", "pipeline-"
        )
        runs = [
            (
                "pipeline",
                lambda: start_pipeline(spark, pipeline_config, project_jobs.bound(pipeline_config), ONCE),
            )
        ]
        if not args.pipeline_only:
            runs = [
                (
                    "feature job",
                    lambda: start_feature_job(
                        spark, feature_config, project_jobs.bound(feature_config), ONCE
                    ),
                ),
                ("scoring job", lambda: start_scoring_job(spark, scoring_config, ONCE)),
                *runs,
            ]
        rates_of = {}
        unpaced: list[list[str]] = []
        for name, start_once in runs:
            query = start_once()
            query.awaitTermination()
            rate, records, batches = steady_rate(query, name)
            rates_of[name] = rate
            unpaced.append([name, f"{rate:,.0f}", f"{records:,} in {batches} micro-batches after the first"])
        if not args.pipeline_only:
            both = 1 / (1 / rates_of["feature job"] + 1 / rates_of["scoring job"])
            print(
                f"feature job + scoring job:    {both:10,.0f} transactions/s (the two steady rates in series)"
            )
            unpaced.append(["feature job + scoring job", f"{both:,.0f}", "the two steady rates in series"])

        spark.stop()
        paced_rows: list[list[str]] = []
        notes: list[str] = []
        if rates:
            paced_rows, notes = paced_loads(
                args,
                settings,
                clients,
                pipeline_config,
                feature_config,
                scoring_config,
                events_of(later),
                rates,
            )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"driver peak RSS: {peak_mib:,.0f} MiB")
    if args.no_report:
        return
    tables = [
        report.Table(
            ["unpaced `--once` run", "steady records/s", "measured over"],
            unpaced,
            caption=f"Unpaced: {produced.transactions:,} transactions, {produced.labels:,} labels",
            notes=[f"Driver peak RSS {peak_mib:,.0f} MiB."],
        )
    ]
    if rates:
        tables.append(
            report.Table(
                [
                    "paced",
                    "transactions",
                    "alerts",
                    "produce -> alert in Redis p50 / p95 / p99 / max",
                    "warm-up",
                    "micro-batches (count, duration)",
                    "CPU while producing (of one core)",
                ],
                paced_rows,
                caption=(
                    f"Paced ({args.paced_jobs}, {args.paced_s:.0f} s per rate after {args.warmup_s:.0f} s "
                    f"of warm-up, trigger interval {args.trigger_interval_s} s)"
                ),
                notes=notes,
            )
        )
    report.write_section(
        "scoring",
        script=__file__,
        tables=tables,
        settings={
            **report.args_settings(args),
            "spark_master": settings.spark_master,
            "stack": report.EMBEDDED_STACK,
        },
    )


if __name__ == "__main__":
    main()
