"""The streaming feature job as a subprocess, for the chaos tests of ``test_feature_job.py``.

Runs ``features.job.start_feature_job`` on its own Spark (local mode) against the topics
``{prefix}transactions`` … ``{prefix}dead-letter``, Redis keys under ``prefix``, and a checkpoint, either
with ``--once`` (availableNow: everything there now, then exit) or continuously until killed.

The sink writes through ``chaos.ChaosWriter``: ``--pause BATCH:PARTITION:EVENT`` (repeatable) makes the
write task of that micro-batch and Spark partition stop at that point of its Kafka transaction (``opened``:
begun, marker sent, no record yet; ``committed``: Kafka commit done, Spark not told) until the test
SIGKILLs the application; transaction events and the tasks that return are logged in ``--control`` (see
``ChaosWriter``). Each micro-batch prints a ``progress {...}`` line (records read, duration)
on stdout. Run it from the project root with ``-m`` (which puts the root on ``sys.path``)::

    python -m tests.support.feature_job_runner --bootstrap=127.0.0.1:9092 \\
        --redis=redis://127.0.0.1:6379/0 --prefix=test-abc- --checkpoint=/tmp/cp --home=/tmp/home \\
        --control=/tmp/control --max-records=3000 [--allowed-lateness-ms=0] [--once] [--pause=1:0:committed]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from contracts.settings import DEFAULT_RETENTION_S, Settings, Topics
from features import job
from features.definitions import FeatureParams
from features.job import FeatureJobConfig, start_feature_job
from features.state_layout import Start, bind
from fraud.jobs import SPARK_PRELOAD
from fraud.metrics import records_read
from infra.redis.connection import RedisTarget
from infra.spark.session import Trigger, spark_session
from tests.support.chaos import chaos_sink, parse_pauses, ship_by_value

#: Spark partitions of every shuffle, hence write tasks per micro-batch (as the integration tests' session).
SHUFFLE_PARTITIONS = 2
MAX_EVENT_BYTES = 16_384


def _log_progress(progress: list[Any], seen: int, started: float) -> int:
    """Print one line per micro-batch not printed yet; returns the last batch id printed."""
    for report in progress:
        if report["batchId"] > seen:
            seen = report["batchId"]
            line = {
                "batch": seen,
                "records": records_read(report),
                "ms": report["durationMs"].get("triggerExecution"),
                "at_s": round(time.monotonic() - started, 1),
            }
            print(f"progress {json.dumps(line)}", flush=True)
    return seen


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers.")
    parser.add_argument("--redis", required=True, help="redis:// URL of the feature store.")
    parser.add_argument("--prefix", required=True, help="Prefix of the topics and of the Redis keys.")
    parser.add_argument("--checkpoint", required=True, type=Path, help="The job's checkpoint directory.")
    parser.add_argument("--home", required=True, type=Path, help="Local state directory of Spark.")
    parser.add_argument("--control", required=True, type=Path, help="Where tasks log and pause reports go.")
    parser.add_argument("--max-records", type=int, default=None, help="Records per micro-batch at most.")
    parser.add_argument(
        "--allowed-lateness-ms", type=int, default=0, help="Disorder within a partition that is on time."
    )
    parser.add_argument("--once", action="store_true", help="availableNow: process what is there, exit.")
    parser.add_argument("--trigger-interval", type=float, default=0.5, help="Seconds between micro-batches.")
    parser.add_argument("--pause", action="append", default=[], help="BATCH:PARTITION:EVENT (repeatable).")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    control: Path = args.control
    control.mkdir(parents=True, exist_ok=True)
    pauses = parse_pauses(args.pause)
    ship_by_value()

    def register_chaos_sink(spark: Any) -> None:
        spark.dataSource.register(chaos_sink(control, pauses))

    assert callable(job.register_sink), "start_feature_job no longer registers its sink as register_sink"
    job.register_sink = register_chaos_sink  # start_feature_job registers the sink it writes to

    spark = spark_session(
        Settings(spark_master=f"local[{SHUFFLE_PARTITIONS}]", home=args.home),
        app_name="feature-job-runner",
        shuffle_partitions=SHUFFLE_PARTITIONS,
        preload=SPARK_PRELOAD,
    )
    config = FeatureJobConfig(
        kafka_config={"bootstrap.servers": args.bootstrap},
        topics=Topics().with_prefix(args.prefix),
        checkpoint=args.checkpoint,
        redis=RedisTarget(args.redis, args.prefix, DEFAULT_RETENTION_S),
        params=FeatureParams(allowed_lateness_ms=args.allowed_lateness_ms),
        max_event_bytes=MAX_EVENT_BYTES,
        max_records_per_trigger=args.max_records,
    )
    bind(config.checkpoint, config.state)  # as `fraud features run` does before Spark's query starts
    started = time.monotonic()
    query = start_feature_job(spark, config, Start(), Trigger(args.once, args.trigger_interval))
    seen = -1
    while not query.awaitTermination(0.2):
        seen = _log_progress(query.recentProgress, seen, started)
    _log_progress(query.recentProgress, seen, started)
    print(f"query stopped at_s {time.monotonic() - started:.1f}", flush=True)
    failure = query.exception()
    spark.stop()
    print(f"spark stopped at_s {time.monotonic() - started:.1f}", flush=True)
    if failure is not None:
        raise SystemExit(f"feature job failed: {failure}")


if __name__ == "__main__":
    main()
