"""``fraud up|down|status`` and ``fraud topics``: the embedded stack and the project's topics."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from contracts.settings import Settings
from fraud.console import console, counts_table, settings_of
from infra.clients import (
    Clients,
    NotConfiguredError,
    delete_topics,
    ensure_topics,
    existing_topics,
    topic_counts,
)
from infra.embedded import EmbeddedStack, StackInfo

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
    """Start the embedded stack: Tansu broker, Valkey (Redis) server, MLflow store; create the topics."""
    settings = settings_of(ctx)
    info = EmbeddedStack(settings.home).start(broker_port=broker_port, redis_port=redis_port)
    created = create_topics(settings)
    console.print(_stack_table(info, "Embedded stack started"))
    console.print(f"Created topics: {', '.join(created) or 'none (all existed)'}")
    console.print("Stop it with [bold]fraud down[/bold].")


def down(ctx: typer.Context) -> None:
    """Stop the embedded stack started by `fraud up` (only the processes it started)."""
    stopped = EmbeddedStack(settings_of(ctx).home).stop()
    console.print(f"Stopped: {', '.join(stopped)}" if stopped else "No embedded stack was running.")


def status(ctx: typer.Context) -> None:
    """Show the embedded stack and the record count of every topic."""
    settings = settings_of(ctx)
    info = EmbeddedStack(settings.home).running()
    if info is None:
        console.print(f"No embedded stack is running under {settings.home.resolve()}.")
    else:
        console.print(_stack_table(info, "Embedded stack"))
    try:
        clients = Clients.from_settings(settings)
    except NotConfiguredError:
        return
    names = existing_topics(clients.admin(), settings.topics.all())
    console.print(counts_table("Topics", topic_counts(clients, names)))


@topics_app.command("create")
def topics_create(ctx: typer.Context) -> None:
    """Create the topics named in the settings (idempotent)."""
    created = create_topics(settings_of(ctx))
    console.print(f"Created: {', '.join(created)}" if created else "All topics exist already.")


@topics_app.command("list")
def topics_list(ctx: typer.Context) -> None:
    """Record count of every project topic."""
    settings = settings_of(ctx)
    clients = Clients.from_settings(settings)
    names = existing_topics(clients.admin(), settings.topics.all())
    console.print(counts_table("Topics", topic_counts(clients, names)))


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
    """Create the topics of ``settings`` that do not exist; the names created."""
    clients = Clients.from_settings(settings)
    return ensure_topics(
        clients.admin(), settings.topics.all(), settings.partitions, settings.replication_factor
    )


def _stack_table(info: StackInfo, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("service")
    table.add_column("address")
    table.add_column("pid", justify="right")
    table.add_row("Kafka broker (Tansu)", info.bootstrap_servers, str(info.broker.pid))
    table.add_row("Redis (Valkey)", info.redis_url, str(info.redis.pid))
    table.add_row("MLflow store", info.mlflow_tracking_uri, "")
    return table
