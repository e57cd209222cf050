"""The ``fraud`` command: one entry point, a sub-command (group) per stage.

Settings are read once here, from ``FRAUD_*`` environment variables, and passed down. Every error a user
can act on (a ``contracts.errors.FraudError``, a wrong option, an unreachable Kafka, Redis or MLflow) ends
the command with one line on stderr and the error kind's exit code, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, MutableMapping
from enum import StrEnum
from importlib.metadata import version
from typing import Annotated, Any

import typer
from confluent_kafka import KafkaException
from redis.exceptions import RedisError
from rich.markup import escape

# Typer ships its own copy of click; these two are not re-exported (typer.TyperException is their base).
from typer._click.core import Command
from typer._click.exceptions import NoArgsIsHelpError, UsageError
from typer.core import DEFAULT_MARKUP_MODE, TyperGroup
from typer.models import CommandInfo

from contracts import DISTRIBUTION
from contracts.errors import FraudError, ServiceUnavailableError
from contracts.privacy import mask_card_numbers
from contracts.settings import LOG_FORMATS, LOG_LEVELS, load_settings
from fraud.console import err_console
from fraud.logs import configure_logging

#: Each command and group: the module that defines it and its name there. A command's module is imported
#: when it runs (or when the help lists it), so that `fraud status` does not load Spark, MLflow and FastAPI.
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("fraud.commands.stack", "up"),
    "down": ("fraud.commands.stack", "down"),
    "status": ("fraud.commands.status", "status"),
    "simulate": ("fraud.commands.ingest", "simulate_command"),
    "ingest": ("fraud.commands.ingest", "ingest_command"),
    "demo": ("fraud.demo", "demo_command"),
    "card": ("fraud.commands.alerts", "card_command"),
    "serve": ("fraud.commands.alerts", "serve_command"),
    "train": ("fraud.commands.models", "train_command"),
    "topics": ("fraud.commands.stack", "topics_app"),
    "features": ("fraud.commands.features", "app"),
    "alerts": ("fraud.commands.alerts", "app"),
    "models": ("fraud.commands.models", "app"),
    "score": ("fraud.commands.score", "app"),
    "pipeline": ("fraud.commands.score", "pipeline_app"),
    "ab": ("fraud.commands.ab", "app"),
    "state": ("fraud.commands.state", "app"),
    "savepoint": ("fraud.commands.savepoint", "app"),
}


class LazyCommands(MutableMapping[str, Command]):
    """The sub-commands of ``fraud``, each built from its module on first use."""

    def __init__(self) -> None:
        self.built: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self.built:
            module, attribute = COMMANDS[name]
            target = getattr(importlib.import_module(module), attribute)
            if isinstance(target, typer.Typer):
                command: Command = typer.main.get_group(target)
                command.name = name
            else:
                command = typer.main.get_command_from_info(
                    CommandInfo(name=name, callback=target),
                    pretty_exceptions_short=True,
                    rich_markup_mode=DEFAULT_MARKUP_MODE,
                )
            self.built[name] = command
        return self.built[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self.built[name] = command

    def __delitem__(self, name: str) -> None:
        del self.built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)


class LazyGroup(TyperGroup):
    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = LazyCommands()


app = typer.Typer(
    name="fraud",
    help="Real-time card-fraud detection on the Kappa architecture.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=LazyGroup,
)

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
