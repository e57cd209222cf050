"""``fraud demo``: the main job end to end on the embedded stack (or your own services, if configured).

Today's pipeline: simulate transactions, ingest them and their delayed labels into Kafka, ingest a file of
deliberately broken events to show the dead-letter topic, then print topic counts and the dead-letter
summary. The embedded stack is started for the run and stopped after it, unless one was already up.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from infra.clients import Clients, ensure_topics, topic_counts
from infra.console import console, counts_table, dead_letter_table, settings_of
from infra.embedded import EmbeddedStack
from infra.settings import Settings
from ingest.cli import label_delay_ms, print_simulation, produce_batch, table_batch
from ingest.deadletter import summarise_topic
from ingest.files import clean_table
from ingest.pipeline import events_from_jsonl
from ingest.simulator import SimulatorConfig, simulate

#: Broken events of every kind the validation rejects, next to a few good ones.
BAD_EVENTS_FILE = Path(__file__).resolve().parent.parent / "examples" / "bad_events.jsonl"


@contextlib.contextmanager
def stack_for_run(settings: Settings) -> Iterator[None]:
    """Use the configured services or the running embedded stack; else start one for this block only."""
    if settings.bootstrap_servers is not None:
        yield
        return
    stack = EmbeddedStack(settings.home)
    if stack.running() is not None:
        console.print(f"Using the embedded stack already running under {stack.home}.")
        yield
        return
    with console.status("Starting the embedded stack (Kafka broker, Redis, MLflow store)..."):
        stack.start()
    try:
        yield
    finally:
        stack.stop()
        console.print("Embedded stack stopped.")


def demo_command(
    ctx: typer.Context,
    customers: Annotated[int, typer.Option(min=1, help="Simulated customers (cards).")] = 5000,
    terminals: Annotated[int, typer.Option(min=1, help="Simulated terminals.")] = 10000,
    days: Annotated[int, typer.Option(min=1, help="Simulated days from 2018-04-01.")] = 91,
    seed: Annotated[int, typer.Option(min=0, help="Simulator seed.")] = 0,
) -> None:
    """Run the pipeline end to end on the embedded stack and print what reached each topic."""
    settings = settings_of(ctx)
    config = SimulatorConfig(
        customers=customers, terminals=terminals, days=days, start=dt.date(2018, 4, 1), seed=seed
    )
    with stack_for_run(settings):
        clients = Clients.from_settings(settings)
        ensure_topics(
            clients.admin(), settings.topics.all(), settings.partitions, settings.replication_factor
        )

        console.rule("1. Simulate")
        with console.status("Simulating..."):
            frame = simulate(config)
        print_simulation(frame, config)

        console.rule("2. Ingest transactions and delayed labels")
        source = f"simulator:seed={seed}"
        produce_batch(settings, table_batch(settings, clean_table(frame, source), source, None), speedup=None)

        console.rule(f"3. Ingest {BAD_EVENTS_FILE.name}: broken events go to the dead-letter topic")
        produce_batch(settings, events_from_jsonl(BAD_EVENTS_FILE, settings.max_event_bytes), speedup=None)

        console.rule("Summary")
        console.print(counts_table("Topics", topic_counts(clients, settings.topics.all())))
        console.print(dead_letter_table(summarise_topic(clients, settings.topics.dead_letter)))
        console.print(
            f"Labels become known {label_delay_ms(settings, None) / 86_400_000:g} days after their transaction. "
            "Next: `fraud status`, `fraud ingest FILE`, `fraud simulate --help`."
        )
