"""``fraud up|down`` and ``fraud topics``: the embedded stack and the project's topics."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from contracts.settings import Settings
from fraud.console import console, counts_table, err_console, settings_of
from infra.clients import Clients
from infra.embedded.stack import EmbeddedStack, StackInfo
from infra.kafka.admin import (
    create_project_topics,
    delete_topics,
    existing_topics,
    shorter_retention,
    topic_configs,
)
from infra.kafka.connection import cluster_metadata
from infra.kafka.log import topic_counts
from infra.maven import KAFKA_VERSION

#: The broker's topic configs ``topics describe`` shows besides the settings' (Kafka reports dozens).
_SHOWN = ("retention.", "cleanup.policy", "min.insync.replicas")

topics_app = typer.Typer(help="Create, count and reset the project's Kafka topics.", no_args_is_help=True)


def up(
    ctx: typer.Context,
    broker_port: Annotated[
        int | None, typer.Option(min=1, max=65_535, help="Broker port on 127.0.0.1 (default: a free one).")
    ] = None,
    redis_port: Annotated[
        int | None, typer.Option(min=1, max=65_535, help="Redis port on 127.0.0.1 (default: a free one).")
    ] = None,
) -> None:
    """Start the embedded stack: Apache Kafka broker, Valkey (Redis) server, MLflow store, their data kept
    under FRAUD_HOME; create the topics."""
    settings = settings_of(ctx)
    with console.status("Starting the embedded stack...") as status:
        info = EmbeddedStack(settings.home).start(
            broker_port=broker_port, redis_port=redis_port, progress=status.update
        )
    created = create_topics(settings)
    console.print(stack_table(info, "Embedded stack started"))
    console.print(f"Created topics: {', '.join(created) or 'none (all existed)'}")
    console.print(f"{keeping(settings)} Stop it with [bold]fraud down[/bold].")


def keeping(settings: Settings) -> str:
    """What survives a `fraud down`, in a sentence."""
    return f"Topics, Redis keys and the MLflow store are kept under {settings.home.resolve()}."


def down(ctx: typer.Context) -> None:
    """Stop the embedded stack started by `fraud up` (only the processes it started); it keeps its topics,
    Redis keys and models for the next `fraud up`."""
    settings = settings_of(ctx)
    stack = EmbeddedStack(settings.home)
    with console.status("Stopping the embedded stack..."):
        stopped = stack.stop()
    if not stopped:
        console.print("No embedded stack was running.")
        return
    console.print(f"Stopped: {', '.join(stopped)}")
    console.print(f"{keeping(settings)} `fraud up` starts it again with them.")


@topics_app.command("create")
def topics_create(ctx: typer.Context) -> None:
    """Create the topics named in the settings (idempotent)."""
    created = create_topics(settings_of(ctx))
    console.print(f"Created: {', '.join(created)}" if created else "All topics exist already.")


@topics_app.command("list")
def topics_list(ctx: typer.Context) -> None:
    """Record count of every project topic, counted by reading each in full (`fraud status` shows offsets
    without reading)."""
    settings = settings_of(ctx)
    clients = Clients.from_settings(settings)
    names = existing_topics(clients.admin(), settings.topics.all())
    console.print(counts_table("Topics", topic_counts(clients, names)))


@topics_app.command("describe")
def topics_describe(ctx: typer.Context) -> None:
    """Each project topic's partitions and configs, as the broker reports them, beside what the settings ask."""
    settings = settings_of(ctx)
    admin = Clients.from_settings(settings).admin()
    wanted = settings.topic_configs()
    found = topic_configs(admin, list(wanted))
    partitions = {name: len(meta.partitions) for name, meta in cluster_metadata(admin).topics.items()}
    table = Table(title="Topics", title_justify="left")
    for column in ("topic", "partitions", "config", "broker", "settings"):
        table.add_column(column, justify="right" if column == "partitions" else "left")
    for name, configs in wanted.items():
        if name not in partitions:
            table.add_row(name, "-", "(does not exist)", "", "")
            continue
        shown = sorted(set(configs) | {key for key in found.get(name, {}) if key.startswith(_SHOWN)})
        for i, key in enumerate(shown):
            have = found.get(name, {}).get(key, "(broker default)")
            table.add_row(
                name if i == 0 else "",
                str(partitions[name]) if i == 0 else "",
                key,
                have,
                configs.get(key, ""),
            )
    console.print(table)


@topics_app.command("reset")
def topics_reset(
    ctx: typer.Context,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete and re-create every project topic (all their records are lost)."""
    settings = settings_of(ctx)
    if not yes:
        typer.confirm(f"Delete all records of {', '.join(settings.topics.all())}?", abort=True)
    clients = Clients.from_settings(settings)
    delete_topics(clients.admin(), settings.topics.all())
    create_topics(settings)
    console.print("Topics reset.")


def create_topics(settings: Settings) -> list[str]:
    """Create the topics of ``settings`` that do not exist, with their configs; the names created. Warns
    (one line each) about existing topics that keep their records for less than the settings ask."""
    admin = Clients.from_settings(settings).admin()
    created = create_project_topics(admin, settings)
    wanted = settings.topic_configs()
    for problem in shorter_retention(wanted, topic_configs(admin, list(wanted))):
        err_console.print(
            f"[yellow]warning:[/yellow] {problem}: history may be deleted; "
            "raise it with kafka-configs.sh --alter, or re-create the topic"
        )
    return created


def stack_table(info: StackInfo, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("service")
    table.add_column("address")
    table.add_column("pid", justify="right")
    table.add_row(
        f"Kafka broker (Apache Kafka {KAFKA_VERSION})", info.bootstrap_servers, str(info.broker.pid)
    )
    table.add_row("Redis (Valkey)", info.redis_url, str(info.redis.pid))
    table.add_row("MLflow store", info.mlflow_tracking_uri, "")
    return table
