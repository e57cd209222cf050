"""The embedded broker itself: how long Apache Kafka takes to start, and the memory and CPU it takes idle and
under the project's kind of load.

1. Starts the embedded stack's broker (``infra.embedded.stack``) in a new home: the first start formats its log
   directory; then stops and starts it ``--restarts`` times on the same log directory (as ``fraud down`` /
   ``fraud up`` do). Each start is timed from launch to the first answered metadata request.
2. With the broker up and idle for ``--idle-s``: its resident memory (RSS) and proportional set size (PSS).
3. Produces ``--records`` records of ``--record-bytes`` to a 4-partition topic in transactions of
   ``--transaction-records`` (as the jobs' sink writes), then reads them back read_committed: the rates,
   and the broker's peak memory and the CPU it used.

Writes the ``broker`` section of docs/benchmarks.md (unless ``--no-report``).

Run: .venv/bin/python bench/bench_broker.py [--restarts 3] [--records 1000000] [--no-report]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import report
from confluent_kafka import Producer
from measure import TreeSampler, process_memory_bytes, resident_bytes

from contracts.settings import Settings
from infra.clients import Clients, Endpoints
from infra.embedded.stack import (
    BROKER_HEAP,
    BROKER_STOP_TIMEOUT_S,
    HOST,
    EmbeddedStack,
    Service,
    free_port,
    terminate,
)
from infra.kafka.admin import ensure_topics
from infra.kafka.log import topic_counts
from infra.maven import KAFKA_VERSION

MIB = 2**20


def timed_start(stack: EmbeddedStack) -> tuple[float, Service]:
    """Start the broker; the seconds to its first answer, and the broker."""
    started = time.monotonic()
    service = stack.start_broker(free_port(), stack.home / "logs")
    return time.monotonic() - started, service


def stop(broker: Service) -> None:
    """Stop the broker as ``fraud down`` does (a controlled shutdown), and wait until it has."""
    if not terminate(broker, BROKER_STOP_TIMEOUT_S):
        raise SystemExit(f"the broker (pid {broker.pid}) was gone before it was stopped")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--restarts", type=int, default=3, help="starts on the formatted log directory")
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle before the memory is read")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--record-bytes", type=int, default=500, help="a feature record's size, about")
    parser.add_argument("--transaction-records", type=int, default=10_000)
    report.add_flag(parser)
    args = parser.parse_args()
    print(f"settings: {report.args_settings(args)}; Apache Kafka {KAFKA_VERSION}, heap {BROKER_HEAP}")

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        (home / "logs").mkdir()
        stack = EmbeddedStack(home)
        first_s, broker = timed_start(stack)
        print(f"first start (formats the log directory): {first_s:.2f} s")
        restarts = []
        for _ in range(args.restarts):
            stop(broker)
            seconds, broker = timed_start(stack)
            restarts.append(seconds)
            print(f"restart: {seconds:.2f} s")
        time.sleep(args.idle_s)
        idle_rss, idle_pss = resident_bytes(broker.pid), process_memory_bytes(broker.pid)
        print(f"idle: RSS {idle_rss / MIB:,.0f} MiB, PSS {idle_pss / MIB:,.0f} MiB")

        bootstrap = f"{HOST}:{broker.port}"
        clients = Clients(Settings(home=home), Endpoints(bootstrap, "redis://unused", "sqlite:///unused"))
        topic = "bench-broker"
        ensure_topics(clients.admin(), [topic], 4, 1)
        sampler = TreeSampler(broker.pid).start()
        sampler.sample()
        cpu_before = sampler.cpu_s()
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "bench-broker"})
        producer.init_transactions(30)
        value = b"x" * args.record_bytes
        started = time.monotonic()
        for first in range(0, args.records, args.transaction_records):
            producer.begin_transaction()
            for i in range(first, min(args.records, first + args.transaction_records)):
                producer.produce(topic, value, key=str(i).encode())
            producer.commit_transaction(60)
        produced_s = time.monotonic() - started
        started = time.monotonic()
        (read,) = topic_counts(clients, [topic]).values()
        read_s = time.monotonic() - started
        sampler.sample()
        cpu_s = sampler.cpu_s() - cpu_before
        sampler.stop()
        loaded_rss = resident_bytes(broker.pid)
        stop(broker)
    if read != args.records:
        raise SystemExit(f"read back {read:,} of the {args.records:,} records produced")
    print(
        f"{args.records:,} records: produced at {args.records / produced_s:,.0f}/s, read at {read / read_s:,.0f}/s; "
        f"broker CPU {cpu_s:.1f} s ({cpu_s / args.records * 1e5:.2f} s per 100k records), peak PSS "
        f"{sampler.peak_memory_bytes / MIB:,.0f} MiB, RSS after {loaded_rss / MIB:,.0f} MiB"
    )
    table = report.Table(
        ["figure", "value"],
        [
            ["first start (formats its log directory), to the first answer", f"{first_s:.2f} s"],
            [
                f"restart on its log directory (median of {len(restarts)})",
                f"{statistics.median(restarts):.2f} s",
            ],
            [
                f"idle after {args.idle_s:.0f} s: RSS / PSS",
                f"{idle_rss / MIB:,.0f} / {idle_pss / MIB:,.0f} MiB",
            ],
            [
                f"{args.records:,} records of {args.record_bytes} bytes produced, in transactions of "
                f"{args.transaction_records:,}",
                f"{args.records / produced_s:,.0f} records/s",
            ],
            ["read back read_committed", f"{read / read_s:,.0f} records/s"],
            [
                "broker CPU while producing and reading",
                f"{cpu_s / args.records * 1e5:.2f} s per 100k records",
            ],
            [
                "broker peak PSS / RSS after",
                f"{sampler.peak_memory_bytes / MIB:,.0f} / {loaded_rss / MIB:,.0f} MiB",
            ],
        ],
        caption=f"The embedded broker: Apache Kafka {KAFKA_VERSION} in KRaft mode, one node, heap {BROKER_HEAP}",
        notes=[
            "Start: from launching the JVM to the first answered metadata request (the stack's health check). "
            "The producer and the reader are this script's own, on the same host."
        ],
    )
    print(report.markdown_table(table))
    report.write_unless_skipped(
        args, "broker", script=__file__, tables=[table], settings=report.args_settings(args), title="Broker"
    )


if __name__ == "__main__":
    main()
