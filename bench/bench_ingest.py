"""Ingest throughput on the embedded stack: simulated transactions validated and produced to Kafka.

Prints the settings, then the rate of each phase (tokenise + build + validate; produce and flush) and the
peak memory, and writes them to the ``ingest`` section of docs/benchmarks.md.
Run: .venv/bin/python bench/bench_ingest.py [--days 183] [--seed 0] [--no-report]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import report

from contracts.events import DAY_MS
from infra.clients import Clients
from infra.embedded.stack import temporary_stack
from infra.kafka.admin import ensure_topics
from infra.kafka.log import topic_counts
from ingest.files import clean_table
from ingest.produce import events_from_table, produce_events
from ingest.simulator import SimulatorConfig, simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--customers", type=int, default=5000)
    parser.add_argument("--terminals", type=int, default=10000)
    parser.add_argument("--days", type=int, default=183)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=4)
    report.add_flag(parser)
    args = parser.parse_args()
    config = SimulatorConfig(
        customers=args.customers, terminals=args.terminals, days=args.days, seed=args.seed
    )
    print(f"settings: {config.model_dump()} partitions={args.partitions} stack={report.EMBEDDED_STACK}")

    frame = simulate(config)
    with tempfile.TemporaryDirectory() as home, temporary_stack(Path(home)) as info:
        clients = Clients.for_stack(info, Path(home), partitions=args.partitions)
        settings = clients.settings
        ensure_topics(clients.admin(), settings.topics.all(), settings.partitions, 1)

        started = time.perf_counter()
        batch = events_from_table(
            clean_table(frame, "bench"), "bench", b"bench-key", 7 * DAY_MS, settings.max_event_bytes
        )
        prepare_s = time.perf_counter() - started
        events = len(batch.tx_values) + len(batch.label_values)
        result = produce_events(clients.producer(), settings.topics, batch)
        counts = topic_counts(clients, [settings.topics.transactions, settings.topics.labels])
    total_s = prepare_s + result.seconds
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    phases: list[tuple[str, float, float]] = [
        ("prepare (clean, tokenise, build JSON, validate)", prepare_s, events / prepare_s),
        ("produce (incl. flush)", result.seconds, result.events_per_second),
        ("ingest end to end", total_s, events / total_s),
    ]
    print(
        f"transactions: {result.transactions:,}  labels: {result.labels:,}  dead letters: {result.dead_letters.total}"
    )
    print(f"on the broker: {counts}")
    for name, seconds, rate in phases:
        print(f"{name + ':':49} {seconds:6.2f} s  {rate:10,.0f} events/s")
    print(f"peak RSS: {peak_mib:,.0f} MiB")
    table = report.Table(
        ["phase", "seconds", "events/s"],
        [[name, f"{seconds:.2f}", f"{rate:,.0f}"] for name, seconds, rate in phases],
        notes=[
            f"{result.transactions:,} transactions and {result.labels:,} labels produced, "
            f"{result.dead_letters.total:,} dead letters; peak RSS {peak_mib:,.0f} MiB."
        ],
    )
    recorded = {
        **config.model_dump(mode="json"),
        "partitions": args.partitions,
        "stack": report.EMBEDDED_STACK,
    }
    report.write_unless_skipped(args, "ingest", script=__file__, tables=[table], settings=recorded)


if __name__ == "__main__":
    main()
