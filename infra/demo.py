"""``fraud demo``: the main job end to end on the embedded stack (or your own services, if configured).

Today's pipeline: simulate transactions, ingest them and their delayed labels into Kafka, ingest a file of
deliberately broken events to show the dead-letter topic, run the streaming feature job over everything
(features to Kafka, latest features per card to Redis), train the first model by replaying the
transactions and labels topics (honest split, metrics, registered in MLflow: the first version of an empty
registry becomes the champion), then print topic counts, the dead-letter summary and one card's features
from Redis. The embedded stack is started for the run and stopped after it; with
a stack already running (or your own services), the demo uses fresh ``demo-…`` topics of its own.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich.table import Table

from features.cli import run_feature_job
from features.definitions import FeatureParams
from infra.clients import Clients, ensure_topics, topic_counts
from infra.console import console, counts_table, dead_letter_table, settings_of
from infra.embedded import EmbeddedStack
from infra.redis_store import card_features_key
from infra.settings import Settings
from ingest.cli import label_delay_ms, print_simulation, produce_batch, table_batch
from ingest.deadletter import summarise_topic
from ingest.files import clean_table
from ingest.pipeline import events_from_jsonl
from ingest.schemas import TxColumns
from ingest.simulator import SimulatorConfig, simulate
from ingest.tokens import card_token

#: Broken events of every kind the validation rejects, next to a few good ones.
BAD_EVENTS_FILE = Path(__file__).resolve().parent.parent / "examples" / "bad_events.jsonl"


@contextlib.contextmanager
def stack_for_run(settings: Settings) -> Iterator[bool]:
    """Use the configured services or the running embedded stack; else start one for this block only.

    Yields whether the stack was started here (and so holds nothing but this run's data).
    """
    if settings.bootstrap_servers is not None:
        yield False
        return
    stack = EmbeddedStack(settings.home)
    if stack.running() is not None:
        console.print(f"Using the embedded stack already running under {stack.home}.")
        yield False
        return
    with console.status("Starting the embedded stack (Kafka broker, Redis, MLflow store)..."):
        stack.start()
    try:
        yield True
    finally:
        stack.stop()
        console.print("Embedded stack stopped.")


def demo_command(
    ctx: typer.Context,
    customers: Annotated[int, typer.Option(min=1, help="Simulated customers (cards).")] = 5000,
    terminals: Annotated[int, typer.Option(min=1, help="Simulated terminals.")] = 10000,
    days: Annotated[int, typer.Option(min=1, help="Simulated days from 2018-04-01.")] = 61,
    seed: Annotated[int, typer.Option(min=0, help="Simulator seed.")] = 0,
) -> None:
    """Run the pipeline end to end on the embedded stack and print what reached each topic."""
    settings = settings_of(ctx)
    config = SimulatorConfig(
        customers=customers, terminals=terminals, days=days, start=dt.date(2018, 4, 1), seed=seed
    )
    with stack_for_run(settings) as started_here:
        if not started_here:
            run = uuid.uuid4().hex[:6]
            settings = settings.model_copy(update={"topics": settings.topics.with_prefix(f"demo-{run}-")})
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

        console.rule("4. Streaming feature job (Spark): per-card and per-terminal features")
        checkpoint = settings.home / "checkpoints" / f"demo-{uuid.uuid4().hex[:6]}"
        run_feature_job(settings, settings.topics, checkpoint.resolve(), FeatureParams(), once=True)

        console.rule("5. Train a model: replay the topics, honest split, MLflow registry")
        train_demo_model(settings)

        console.rule("Summary")
        console.print(counts_table("Topics", topic_counts(clients, settings.topics.all())))
        console.print(dead_letter_table(summarise_topic(clients, settings.topics.dead_letter)))
        show_card(clients, frame, settings)
        console.print(
            f"Labels become known {label_delay_ms(settings, None) / 86_400_000:g} days after their transaction. "
            "Next: `fraud status`, `fraud models list`, `fraud train --help`, `fraud features run`, "
            "`fraud ingest FILE`."
        )


def train_demo_model(settings: Settings) -> None:
    """Gradient boosting on every feature, trained on the latest week the replayed topics allow."""
    from models.cli import (
        Periods,
        TrainOptions,
        print_result,
        run_training,
        topics_training_set,
        tracking_target,
    )
    from models.metrics import DEFAULT_ALERTS_PER_DAY
    from models.pipelines import ModelSpec

    started = time.monotonic()
    params = FeatureParams()
    tracking_uri, artifacts = tracking_target(settings)
    dataset, plans = topics_training_set(settings, params, Periods())
    options = TrainOptions(ModelSpec("hist_gradient_boosting"), "all", params, plans, DEFAULT_ALERTS_PER_DAY)
    result, logged = run_training(dataset, options, tracking_uri, artifacts, register=True)
    print_result(result, logged, tracking_uri)
    console.print(f"Replay, features, training and logging took {time.monotonic() - started:,.0f} s.")


def show_card(clients: Clients, frame: pd.DataFrame, settings: Settings) -> None:
    """The latest features in Redis of the card with the most simulated frauds."""
    frauds = frame[frame[TxColumns.IS_FRAUD] == 1]
    busiest = (
        frauds[TxColumns.CARD_ID].value_counts().index[0] if len(frauds) else frame[TxColumns.CARD_ID].iloc[0]
    )
    token = card_token(str(busiest), settings.token_key.get_secret_value().encode())
    key = card_features_key(token)
    values = {k.decode(): v.decode() for k, v in clients.redis().hgetall(key).items()}
    table = Table(title=f"Redis {key}", title_justify="left")
    table.add_column("field")
    table.add_column("value", justify="right")
    for name, value in values.items():
        table.add_row(name, value)
    console.print(table)
