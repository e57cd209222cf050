"""The ``fraud`` command: one entry point, a sub-command (group) per stage.

Settings are read once here, from ``FRAUD_*`` environment variables, and passed down.
"""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer
from rich.table import Table

from contracts.settings import Settings, UnknownSettingError, load_settings
from fraud.commands.alerts import app as alerts_app
from fraud.commands.alerts import card_command, serve_command
from fraud.commands.features import app as features_app
from fraud.commands.ingest import ingest_command, simulate_command
from fraud.commands.models import app as models_app
from fraud.commands.models import train_command
from fraud.commands.score import app as score_app
from fraud.commands.score import pipeline_app
from fraud.console import console, counts_table, err_console, settings_of
from fraud.demo import demo_command
from infra.checkpoints import CheckpointLayoutError
from infra.clients import Clients, NotConfiguredError, delete_topics, ensure_topics, topic_counts
from infra.embedded import EmbeddedStack, StackError, StackInfo
from ingest.files import InputFileError
from models.dataset import DatasetError
from models.registry import ModelNotFoundError

app = typer.Typer(
    name="fraud",
    help="Real-time card-fraud detection on the Kappa architecture.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
topics_app = typer.Typer(help="Create, count and reset the project's Kafka topics.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")
app.add_typer(features_app, name="features")
app.add_typer(alerts_app, name="alerts")
app.add_typer(models_app, name="models")
app.add_typer(score_app, name="score")
app.add_typer(pipeline_app, name="pipeline")

#: Errors a user can act on: shown as one line, no traceback.
USER_ERRORS = (
    CheckpointLayoutError,
    StackError,
    NotConfiguredError,
    InputFileError,
    UnknownSettingError,
    DatasetError,
    ModelNotFoundError,
)


@app.callback()
def main(ctx: typer.Context) -> None:
    """Real-time card-fraud detection on the Kappa architecture.

    Unset FRAUD_* connection settings mean the embedded local stack (`fraud up`).
    """
    ctx.obj = load_settings()


@app.command()
def up(
    ctx: typer.Context,
    broker_port: Annotated[
        int | None, typer.Option(help="Broker port on 127.0.0.1 (default: a free one).")
    ] = None,
    redis_port: Annotated[
        int | None, typer.Option(help="Redis port on 127.0.0.1 (default: a free one).")
    ] = None,
) -> None:
    """Start the embedded stack: Tansu broker, Valkey (Redis) server, MLflow store; create the topics."""
    settings = settings_of(ctx)
    info = EmbeddedStack(settings.home).start(broker_port=broker_port, redis_port=redis_port)
    created = _create_topics(settings)
    console.print(_stack_table(info, "Embedded stack started"))
    console.print(f"Created topics: {', '.join(created) or 'none (all existed)'}")
    console.print("Stop it with [bold]fraud down[/bold].")


@app.command()
def down(ctx: typer.Context) -> None:
    """Stop the embedded stack started by `fraud up` (only the processes it started)."""
    stopped = EmbeddedStack(settings_of(ctx).home).stop()
    console.print(f"Stopped: {', '.join(stopped)}" if stopped else "No embedded stack was running.")


@app.command()
def status(ctx: typer.Context) -> None:
    """Show the embedded stack and the record count of every topic."""
    settings = settings_of(ctx)
    info = EmbeddedStack(settings.home).running()
    if info is None:
        console.print(f"No embedded stack is running under {settings.home.resolve()}.")
    else:
        console.print(_stack_table(info, "Embedded stack"))
    with contextlib.suppress(NotConfiguredError):
        clients = Clients.from_settings(settings)
        console.print(
            counts_table("Topics", topic_counts(clients, _existing(clients, settings.topics.all())))
        )


@topics_app.command("create")
def topics_create(ctx: typer.Context) -> None:
    """Create the topics named in the settings (idempotent)."""
    created = _create_topics(settings_of(ctx))
    console.print(f"Created: {', '.join(created)}" if created else "All topics exist already.")


@topics_app.command("list")
def topics_list(ctx: typer.Context) -> None:
    """Record count of every project topic."""
    settings = settings_of(ctx)
    clients = Clients.from_settings(settings)
    console.print(counts_table("Topics", topic_counts(clients, _existing(clients, settings.topics.all()))))


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
    _create_topics(settings)
    console.print("Topics reset.")


app.command("simulate")(simulate_command)
app.command("ingest")(ingest_command)
app.command("demo")(demo_command)
app.command("card")(card_command)
app.command("serve")(serve_command)
app.command("train")(train_command)


def _create_topics(settings: Settings) -> list[str]:
    clients = Clients.from_settings(settings)
    return ensure_topics(
        clients.admin(), settings.topics.all(), settings.partitions, settings.replication_factor
    )


def _existing(clients: Clients, names: list[str]) -> list[str]:
    present = set(clients.admin().list_topics(timeout=10).topics)
    return [name for name in names if name in present]


def _stack_table(info: StackInfo, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("service")
    table.add_column("address")
    table.add_column("pid", justify="right")
    table.add_row("Kafka broker (Tansu)", info.bootstrap_servers, str(info.broker.pid))
    table.add_row("Redis (Valkey)", info.redis_url, str(info.redis.pid))
    table.add_row("MLflow store", info.mlflow_tracking_uri, "")
    return table


def run() -> None:
    """Console entry point: user errors print one line and exit 1."""
    try:
        app()
    except USER_ERRORS as exc:
        err_console.print(f"[bold red]error:[/bold red] {exc}")
        raise SystemExit(1) from None


if __name__ == "__main__":
    run()
