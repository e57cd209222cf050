"""Ingest throughput on the embedded stack: simulated transactions validated and produced to Kafka.

Prints the settings, then the rate of each phase (tokenise + build + validate; produce and flush) and the
peak memory. Run: .venv/bin/python bench/bench_ingest.py [--days 183] [--seed 0]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from infra.clients import Clients, ensure_topics, topic_counts
from infra.embedded import temporary_stack
from ingest.files import clean_table
from ingest.produce import events_from_table, produce_events
from ingest.simulator import SimulatorConfig, simulate

DAY_MS = 86_400_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--customers", type=int, default=5000)
    parser.add_argument("--terminals", type=int, default=10000)
    parser.add_argument("--days", type=int, default=183)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    config = SimulatorConfig(
        customers=args.customers, terminals=args.terminals, days=args.days, seed=args.seed
    )
    print(f"settings: {config.model_dump()} partitions={args.partitions} broker=embedded Tansu (memory)")

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
    print(
        f"transactions: {result.transactions:,}  labels: {result.labels:,}  dead letters: {result.dead_letters.total}"
    )
    print(f"on the broker: {counts}")
    print(
        f"prepare (clean, tokenise, build JSON, validate): {prepare_s:6.2f} s  {events / prepare_s:10,.0f} events/s"
    )
    print(
        f"produce (incl. flush):                           {result.seconds:6.2f} s  {result.events_per_second:10,.0f} events/s"
    )
    print(
        f"ingest end to end:                               {total_s:6.2f} s  {events / total_s:10,.0f} events/s"
    )
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")


if __name__ == "__main__":
    main()
