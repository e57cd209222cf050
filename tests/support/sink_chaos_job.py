"""The streaming job of the sink's chaos test (``tests/integration/test_spark_sink.py``), as a program.

The standard test stream (``sink_stream.sink_frame``) into a sink that can pause (``chaos.ChaosWriter``):
``--pause BATCH:PARTITION:EVENT`` (repeatable) stops that write task at that point of its Kafka
transaction until the test SIGKILLs the application; tasks log to ``--control``. Run it from the project
root with ``-m``, killed and restarted by the test in a subprocess::

    python -m tests.support.sink_chaos_job --bootstrap=127.0.0.1:9092 --inputs=/tmp/in --checkpoint=/tmp/cp \\
        --topic=alerts --sink-id=chaos-abc --control=/tmp/control --home=/tmp/home [--pause=1:0:committed] \\
        [--transaction-timeout-ms=20000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from contracts.settings import Settings
from infra.spark.kafka_sink.config import KafkaSinkConfig
from infra.spark.kafka_sink.datasource import sink_options
from tests.support.chaos import chaos_sink, parse_pauses, ship_by_value
from tests.support.sink_stream import PARTITIONS, sink_frame

CHAOS_SINK_NAME = "fraud-kafka-sink-chaos"


def chaos_job(argv: list[str]) -> None:
    """The chaos test's streaming job: the standard test stream into a sink that can pause (ChaosWriter)."""
    parser = argparse.ArgumentParser()
    for name in ("--bootstrap", "--inputs", "--checkpoint", "--topic", "--sink-id", "--control", "--home"):
        parser.add_argument(name, required=True)
    parser.add_argument("--pause", action="append", default=[], help="BATCH:PARTITION:EVENT")
    parser.add_argument("--transaction-timeout-ms", type=int, help="the sink's, set through kafka_config")
    args = parser.parse_args(argv)
    pauses = parse_pauses(args.pause)
    control = Path(args.control)
    ship_by_value()

    from infra.spark.session import spark_session

    spark = spark_session(
        Settings(spark_master=f"local[{PARTITIONS}]", home=Path(args.home)), "chaos-sink-job"
    )
    spark.dataSource.register(chaos_sink(control, pauses, CHAOS_SINK_NAME))
    kafka_config: dict[str, str | int] = {"bootstrap.servers": args.bootstrap}
    if args.transaction_timeout_ms is not None:
        kafka_config["transaction.timeout.ms"] = args.transaction_timeout_ms
    options = sink_options(KafkaSinkConfig(kafka_config, args.sink_id, topic=args.topic))
    query = (
        sink_frame(spark, Path(args.inputs))
        .writeStream.format(CHAOS_SINK_NAME)
        .options(**options)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    chaos_job(sys.argv[1:])
