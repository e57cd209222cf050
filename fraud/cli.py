"""The ``fraud`` command: one entry point, a sub-command (group) per stage.

Settings are read once here, from ``FRAUD_*`` environment variables, and passed down. Every error a user
can act on (a ``contracts.errors.FraudError``, a wrong option, an unreachable Kafka, Redis or MLflow) ends
the command with one line on stderr and the error kind's exit code, never a traceback.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from importlib.metadata import version
from typing import Annotated

import typer
from confluent_kafka import KafkaException
from redis.exceptions import RedisError
from rich.markup import escape

# Typer ships its own copy of click; these two are not re-exported (typer.TyperException is their base).
from typer._click.exceptions import NoArgsIsHelpError, UsageError

from contracts import DISTRIBUTION
from contracts.errors import FraudError, ServiceUnavailableError
from contracts.privacy import mask_card_numbers
from contracts.settings import LOG_FORMATS, LOG_LEVELS, load_settings
from fraud.commands import stack
from fraud.commands.ab import app as ab_app
from fraud.commands.alerts import app as alerts_app
from fraud.commands.alerts import card_command, serve_command
from fraud.commands.features import app as features_app
from fraud.commands.ingest import ingest_command, simulate_command
from fraud.commands.models import app as models_app
from fraud.commands.models import train_command
from fraud.commands.savepoint import app as savepoint_app
from fraud.commands.score import app as score_app
from fraud.commands.score import pipeline_app
from fraud.commands.state import app as state_app
from fraud.commands.status import status
from fraud.console import err_console
from fraud.demo import demo_command
from fraud.logs import configure_logging

app = typer.Typer(
    name="fraud",
    help="Real-time card-fraud detection on the Kappa architecture.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(stack.topics_app, name="topics")
app.add_typer(features_app, name="features")
app.add_typer(alerts_app, name="alerts")
app.add_typer(models_app, name="models")
app.add_typer(score_app, name="score")
app.add_typer(pipeline_app, name="pipeline")
app.add_typer(ab_app, name="ab")
app.add_typer(state_app, name="state")
app.add_typer(savepoint_app, name="savepoint")
app.command("up")(stack.up)
app.command("down")(stack.down)
app.command("status")(status)
app.command("simulate")(simulate_command)
app.command("ingest")(ingest_command)
app.command("demo")(demo_command)
app.command("card")(card_command)
app.command("serve")(serve_command)
app.command("train")(train_command)

LogLevelChoice = StrEnum("LogLevelChoice", {level: level for level in LOG_LEVELS})  # type: ignore[misc]
LogFormatChoice = StrEnum("LogFormatChoice", {form: form for form in LOG_FORMATS})  # type: ignore[misc]

#: Exit code of a wrong command line (click's own).
USAGE_EXIT = 2


def show_version(shown: bool) -> None:
    """``--version``: the installed version, then exit (before the settings are read)."""
    if shown:
        typer.echo(f"fraud ({DISTRIBUTION}) {version(DISTRIBUTION)}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    _version: Annotated[
        bool,
        typer.Option("--version", callback=show_version, is_eager=True, help="Print the version and exit."),
    ] = False,
    log_level: Annotated[
        LogLevelChoice | None,
        typer.Option(help="Least severe log lines shown (default: FRAUD_LOG_LEVEL, else warning)."),
    ] = None,
    log_format: Annotated[
        LogFormatChoice | None,
        typer.Option(help="Log lines as text or JSON lines (default: FRAUD_LOG_FORMAT, else text)."),
    ] = None,
) -> None:
    """Real-time card-fraud detection on the Kappa architecture.

    Unset FRAUD_* connection settings mean the embedded local stack (`fraud up`).
    """
    settings = load_settings()
    overrides = {"log_level": log_level, "log_format": log_format}
    settings = settings.model_copy(update={k: v.value for k, v in overrides.items() if v is not None})
    configure_logging(settings.log_level, settings.log_format)
    ctx.obj = settings


def _one_line(text: object) -> str:
    """The message on one line, card numbers masked (it may quote the input)."""
    return mask_card_numbers(" ".join(str(text).split()))


def fail(message: object, code: int) -> None:
    """End the command: ``error: <message>`` on one line of stderr, exit ``code``."""
    err_console.print(
        f"[bold red]error:[/bold red] {escape(_one_line(message))}", highlight=False, soft_wrap=True
    )
    raise SystemExit(code)


def run(args: list[str] | None = None) -> None:
    """Console entry point: each user error is one line on stderr and a non-zero exit, no traceback."""
    try:
        code = app(args=args, prog_name="fraud", standalone_mode=False)
    except NoArgsIsHelpError as exc:  # `fraud` or a group without a sub-command: its help
        exc.show()
        raise SystemExit(USAGE_EXIT) from None
    except UsageError as exc:
        where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        fail(f"{exc.format_message()}{where}", USAGE_EXIT)
    except typer.TyperException as exc:
        fail(exc.format_message(), exc.exit_code)
    except typer.Abort:
        fail("aborted", 1)
    except FraudError as exc:
        fail(exc, exc.exit_code)
    except KafkaException as exc:
        fail(f"Kafka: {exc.args[0].str() if exc.args else exc}", ServiceUnavailableError.exit_code)
    except RedisError as exc:
        fail(f"Redis: {exc}", ServiceUnavailableError.exit_code)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    raise SystemExit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    run(sys.argv[1:])
