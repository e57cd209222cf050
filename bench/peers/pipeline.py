"""The project among the peers: ``fraud pipeline run`` (features and scoring in one Spark query, exactly-once
Kafka transactions, Redis) or, with ``--job features``, ``fraud features run`` (the feature job alone), on an
embedded stack that bench/bench_peers.py started, with the configuration bench/bench_scoring.py gives it
(``project_jobs``), running until it is terminated.

Runs in the project's virtualenv. Its feature records go to ``<prefix>features``; the pipeline writes them in
the same Kafka transactions as its scores and alerts.

Run: python bench/peers/pipeline.py --stack STACK.json --home DIR --prefix pipeline- [--job features]
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: project_jobs

import project_jobs

from contracts.settings import Topics
from features.definitions import FeatureParams
from features.job import FeatureJobConfig, start_feature_job
from fraud.jobs import SPARK_PRELOAD, job_spark_session
from fraud.options import DEFAULT_MAX_RECORDS
from infra.clients import Clients
from infra.embedded.stack import StackInfo
from infra.spark.session import Trigger
from scoring.pipeline import start_pipeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stack", type=Path, required=True, help="the stack's StackInfo as JSON")
    parser.add_argument("--home", type=Path, required=True, help="the stack's home (FRAUD_HOME)")
    parser.add_argument("--prefix", default="pipeline-", help="of its topics, Redis keys and checkpoint")
    parser.add_argument("--job", choices=("pipeline", "features"), default="pipeline")
    parser.add_argument("--max-records", type=int, default=DEFAULT_MAX_RECORDS)
    parser.add_argument("--card-buckets", type=int, default=FeatureJobConfig.card_buckets)
    parser.add_argument("--terminal-buckets", type=int, default=FeatureJobConfig.terminal_buckets)
    parser.add_argument("--trigger-interval-s", type=float, default=0.2)
    args = parser.parse_args()

    info = StackInfo.from_json(args.stack.read_text())
    clients = Clients.for_stack(info, args.home)
    topics = Topics().with_prefix(args.prefix)
    checkpoint = args.home / f"{args.prefix}checkpoint"
    features = project_jobs.feature_config(
        clients,
        topics,
        checkpoint,
        FeatureParams(),
        args.max_records,
        args.card_buckets,
        args.terminal_buckets,
    )
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())

    interval = args.trigger_interval_s
    if args.job == "features":
        spark = job_spark_session(clients.settings, "bench-peers-features", SPARK_PRELOAD)
        query = start_feature_job(spark, features, project_jobs.bound(features), Trigger(interval_s=interval))
        print(f"feature job: {topics.transactions} -> {topics.features}", flush=True)
    else:
        config = project_jobs.pipeline_config(clients, info, features, topics, checkpoint, args.prefix)
        spark = job_spark_session(clients.settings, "bench-peers-pipeline")
        query = start_pipeline(spark, config, project_jobs.bound(config), Trigger(interval_s=interval))
        print(f"pipeline: {topics.transactions} -> {topics.features}, {topics.scores}", flush=True)
    while not stopping.wait(0.5):
        if not query.isActive:
            print(f"{args.job} stopped: {query.exception()}", flush=True)
            sys.exit(1)
    query.stop()
    spark.stop()


if __name__ == "__main__":
    main()
