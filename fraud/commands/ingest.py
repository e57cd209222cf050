"""``fraud simulate`` and ``fraud ingest``: transactions and labels into Kafka, bad records to dead letters."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich.markup import escape

from contracts.errors import RecordsRejectedError
from contracts.settings import Settings
from fraud.console import console, dead_letter_table, progress_bar, settings_of
from fraud.options import LabelDelayOption, check_output_file
from infra.clients import Clients
from infra.kafka.admin import create_project_topics
from infra.kafka.log import holds_records
from ingest.files import CleanTable, clean_table, parse_mapping
from ingest.produce import EventBatch, IngestResult, events_from_file, events_from_table, produce_events
from ingest.simulator import SimulatorConfig, simulate, write_parquet
from ingest.validation import Clock

SpeedupOption = Annotated[
    float | None,
    typer.Option(
        min=0.001,
        help="Replay event time this many times faster than real time (86400 = a day per second). "
        "Default: as fast as possible.",
    ),
]


def produce_batch(
    settings: Settings, batch: EventBatch, speedup: float | None, paced_from_ms: int | None = None
) -> IngestResult:
    """Produce a validated batch with a progress bar, then print the summary."""
    clients = Clients.from_settings(settings)
    create_project_topics(clients.admin(), settings)
    producer = clients.producer()
    total = len(batch.tx_values) + len(batch.label_values)
    with progress_bar("Producing", total) as advance:
        result = produce_events(
            producer, settings.topics, batch, speedup, advance, paced_from_ms=paced_from_ms
        )
    print_summary(settings, result)
    if result.delivery_errors:
        console.print(
            f"[bold red]{len(result.delivery_errors)} delivery errors[/bold red], first: "
            f"{escape(str(result.delivery_errors[0]))}"
        )
        raise typer.Exit(1)
    return result


def print_summary(settings: Settings, result: IngestResult) -> None:
    topics = settings.topics
    console.print(
        f"Produced [bold]{result.transactions:,}[/bold] transactions to '{topics.transactions}' and "
        f"[bold]{result.labels:,}[/bold] labels to '{topics.labels}' in {result.seconds:,.1f} s "
        f"({result.events_per_second:,.0f} events/s); "
        f"[bold]{result.dead_letters.total:,}[/bold] dead letters to '{topics.dead_letter}'."
    )
    if result.dead_letters.total:
        console.print(dead_letter_table(result.dead_letters))


def table_batch(settings: Settings, clean: CleanTable, source: str) -> EventBatch:
    return events_from_table(
        clean, source, settings.card_token_key(), settings.label_delay_ms, settings.max_event_bytes
    )


def simulate_command(
    ctx: typer.Context,
    customers: Annotated[int, typer.Option(min=1, help="Number of customers (cards).")] = 5000,
    terminals: Annotated[
        int,
        typer.Option(
            min=1,
            help="Number of terminals. Beyond 10,000 the map grows with them, so that a customer reaches "
            "about as many as in the handbook's run.",
        ),
    ] = 10000,
    days: Annotated[int, typer.Option(min=1, help="Number of simulated days.")] = 183,
    start: Annotated[str, typer.Option(help="First simulated day (UTC), YYYY-MM-DD.")] = "2018-04-01",
    seed: Annotated[int, typer.Option(min=0, help="Random seed; the same seed gives the same output.")] = 0,
    radius: Annotated[
        float, typer.Option(min=0.0, help="Terminals within this distance serve a customer.")
    ] = 5.0,
    out: Annotated[
        Path | None,
        typer.Option(callback=check_output_file, help="Write the transactions to this Parquet file."),
    ] = None,
    produce: Annotated[
        bool, typer.Option("--produce", help="Produce the transactions and labels to Kafka.")
    ] = False,
    label_delay_days: LabelDelayOption = None,
    speedup: SpeedupOption = None,
    backfill_days: Annotated[
        int,
        typer.Option(
            min=0,
            help="With --speedup: produce the first days as fast as possible (history), then pace the rest.",
        ),
    ] = 0,
    if_empty: Annotated[
        bool,
        typer.Option(
            "--if-empty",
            help="With --produce: produce only if nothing was ever written to the transactions topic (a "
            "one-shot service started again adds nothing).",
        ),
    ] = False,
) -> None:
    """Simulate card transactions with the fraud-detection handbook's generative process."""
    if out is None and not produce:
        raise typer.BadParameter("give --out FILE.parquet, --produce, or both")
    if backfill_days and speedup is None:
        raise typer.BadParameter("--backfill-days paces what follows the backfill: give --speedup too")
    settings = settings_of(ctx)
    if (
        produce
        and if_empty
        and holds_records(Clients.from_settings(settings).admin(), settings.topics.transactions)
    ):
        console.print(
            f"{escape(settings.topics.transactions)!r} holds records already: nothing produced (--if-empty).",
            highlight=False,
        )
        if out is None:
            return
        produce = False
    try:
        first_day = dt.date.fromisoformat(start)
    except ValueError as exc:
        raise typer.BadParameter(f"--start {start!r} is not a YYYY-MM-DD date") from exc
    config = SimulatorConfig(
        customers=customers, terminals=terminals, days=days, start=first_day, seed=seed, radius=radius
    )
    with console.status("Simulating..."):
        frame = simulate(config)
    print_simulation(frame, config)
    if out is not None:
        write_parquet(frame, out)
        console.print(f"Wrote {escape(str(out))}", highlight=False)
    if produce:
        source = f"simulator:seed={seed}"
        batch = table_batch(settings, clean_table(frame, source), source)
        paced_from = dt.datetime.combine(first_day + dt.timedelta(days=backfill_days), dt.time(), dt.UTC)
        produce_batch(settings, batch, speedup, int(paced_from.timestamp() * 1000) if backfill_days else None)


def print_simulation(frame: pd.DataFrame, config: SimulatorConfig) -> None:
    n = len(frame)
    frauds = int(frame["is_fraud"].sum())
    by_scenario = frame.loc[frame["is_fraud"] == 1, "fraud_scenario"].value_counts().sort_index()
    scenarios = ", ".join(f"scenario {int(k)}: {int(v):,}" for k, v in by_scenario.items())
    console.print(
        f"Simulated [bold]{n:,}[/bold] transactions over {config.days} days from {config.start} "
        f"({n / config.days:,.0f} a day), [bold]{frauds:,}[/bold] fraudulent ({frauds / max(n, 1):.2%}; {scenarios})."
    )


def ingest_command(
    ctx: typer.Context,
    file: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="CSV, Parquet or JSON-lines file.")
    ],
    mapping: Annotated[
        str,
        typer.Option(
            help="Column mapping: 'canonical' (tx_id, card_id, terminal_id, amount, event_time, is_fraud), "
            "'handbook' (TRANSACTION_ID, TX_DATETIME, CUSTOMER_ID, TERMINAL_ID, TX_AMOUNT, TX_FRAUD), "
            "or SRC=DST pairs separated by commas."
        ),
    ] = "canonical",
    label_delay_days: LabelDelayOption = None,
    speedup: SpeedupOption = None,
) -> None:
    """Import a file of transactions (with an optional fraud column) into the transactions and labels topics.

    Card numbers are tokenised with a keyed hash, and so are terminal ids a card number could be read in;
    records are keyed by card token with the event time as the Kafka timestamp; each fraud becomes a label
    known one label delay later. Invalid rows go to the dead-letter topic with the reason, as do events
    dated further ahead of now than FRAUD_MAX_CLOCK_SKEW_S: the others are produced, and the command then
    exits 6. An empty, binary or non-UTF-8 file is refused whole (exit 2).
    """
    settings = settings_of(ctx)
    with console.status(f"Reading and validating {escape(str(file))}..."):
        batch = events_from_file(
            file,
            parse_mapping(mapping),
            settings.card_token_key(),
            settings.label_delay_ms,
            settings.max_event_bytes,
            Clock.wall(round(settings.max_clock_skew_s * 1000)),
        )
    result = produce_batch(settings, batch, speedup)
    if result.dead_letters.total:
        raise RecordsRejectedError(
            f"{result.dead_letters.total:,} of the file's records went to the dead-letter topic "
            f"'{settings.topics.dead_letter}' (reasons above); the other {result.transactions:,} were produced"
        )
