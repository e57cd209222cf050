"""``fraud state card|terminal``: what the feature job (or the pipeline) holds for a card or a terminal.

Reads the job's checkpoint, or a savepoint (a copy of one), read-only and beside the running job: the last
committed micro-batch's state (``features.inspect``). Spark's state data source reads it, in a local
Spark session of this command (whatever ``FRAUD_SPARK_MASTER`` says: the read is small, and a cluster's
cores belong to the job).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich.table import Table

from contracts.errors import ConfigError
from contracts.events import CARD_TOKEN_PATTERN
from fraud.console import console, err_console, format_ms, settings_of
from fraud.options import CheckpointOption, StateNamespaceOption, checkpoint_dir, feature_params
from fraud.state import state_session

if TYPE_CHECKING:
    from features.inspect import CardView, JobState, TerminalView

app = typer.Typer(
    help="Look inside a job's state: what the feature job holds for a card or a terminal, from its "
    "checkpoint or a savepoint, without stopping it.",
    no_args_is_help=True,
)


class StatefulJob(StrEnum):
    """The jobs that keep feature state."""

    FEATURES = "features"
    PIPELINE = "pipeline"


JobOption = Annotated[
    StatefulJob, typer.Option("--job", help="Whose state: the feature job's or the pipeline's checkpoint.")
]
SavepointOption = Annotated[
    Path | None, typer.Option(help="Read a savepoint (a copy of a checkpoint) instead of the checkpoint.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables (every event).")]
LimitOption = Annotated[int, typer.Option(min=1, help="Show at most this many events, the newest.")]


@dataclass(frozen=True)
class Where:
    """Which state a command reads (its options)."""

    job: StatefulJob
    namespace: str
    checkpoint: Path | None
    savepoint: Path | None


def _view(ctx: typer.Context, where: Where, name: str, read: Callable[..., Any]) -> Any:
    """``read(spark, job_state, name, params)`` of the state ``where`` names, in a local Spark session of
    this command (stopped after it). The checkpoint is found before Spark starts."""
    from features.inspect import open_job_state  # heavy: PySpark, imported only when the state is read

    if where.checkpoint is not None and where.savepoint is not None:
        raise typer.BadParameter("give --checkpoint or --savepoint, not both", param_hint="--savepoint")
    settings = settings_of(ctx)
    directory = (
        where.savepoint.resolve()
        if where.savepoint
        else checkpoint_dir(settings, where.checkpoint, where.job, where.namespace)
    )
    state = open_job_state(directory)
    params = state.params_or(feature_params(settings))
    with err_console.status("Reading the state (starting Spark)..."):
        spark = state_session(settings, "fraud-state")
        try:
            return read(spark, state, name, params)
        finally:
            spark.stop()


def _missing(value: object) -> bool:
    return value is None or value != value  # NaN: a missing number


def _at(ms: int | None) -> str:
    return "none yet" if ms is None else f"{format_ms(ms)} UTC ({ms})"


def _header(kind: str, name: str, bucket: int, buckets: int | None, job: JobState) -> None:
    console.print(f"[bold]{kind} {name}[/bold] in the state of {job.checkpoint}", highlight=False)
    final = " (final: an --once run released everything it held)" if job.final else ""
    console.print(
        f"Micro-batch {job.batch.batch_id} (the last committed); frontier {_at(job.frontier_ms)}{final}; "
        f"{kind.lower()} bucket {bucket} of {buckets}",
        highlight=False,
    )


def _show_card(view: CardView, limit: int) -> None:
    _header("Card", view.card_id, view.bucket, view.job.layout.get("card_buckets"), view.job)
    if view.bucket_frontier_ms != view.job.frontier_ms:
        console.print(f"The card bucket's frontier: {_at(view.bucket_frontier_ms)}", highlight=False)
    console.print(
        f"Card windows ending at {_at(view.at_ms)}: its transactions in (end - window, end]", highlight=False
    )
    windows = Table()
    for name in ("window", "feature", "transactions", "amount sum", "mean amount"):
        windows.add_column(name, justify="left" if name in ("window", "feature") else "right")
    for row in view.windows.to_dict("records"):
        mean = row["avg_amount"]
        windows.add_row(
            str(row["window"]),
            str(row["count_column"]),
            f"{int(row['nb_tx']):,}",
            f"{int(row['amount_cents']) / 100:,.2f}",
            "-" if _missing(mean) else f"{mean:,.2f}",  # an empty window
        )
    console.print(windows)
    events = view.events
    held = int((~events["waiting"]).sum())
    shown = f"; the newest {limit} shown" if len(events) > limit else ""
    console.print(
        f"Events held: {held:,} released (the card state keeps no terminal of those), "
        f"{len(events) - held:,} waiting for the frontier{shown}",
        highlight=False,
    )
    table = Table()
    for name in ("event time (UTC)", "tx", "kind", "amount", "terminal", "state"):
        table.add_column(name, justify="right" if name in ("tx", "amount") else "left")
    for row in events.tail(limit).to_dict("records"):
        amount, terminal = row["amount"], row["terminal_id"]
        table.add_row(
            format_ms(int(row["event_time_ms"])),
            str(row["tx_id"]),
            str(row["kind"]),
            "-" if _missing(amount) else f"{amount:,.2f}",
            "-" if _missing(terminal) else str(terminal),
            "waiting" if row["waiting"] else "released",
        )
    console.print(table)


def _show_terminal(view: TerminalView) -> None:
    _header("Terminal", view.terminal_id, view.bucket, view.job.layout.get("terminal_buckets"), view.job)
    times = view.transaction_times_ms
    if len(times):
        console.print(
            f"Transactions held: {len(times):,}, from {format_ms(int(times[0]))} to {format_ms(int(times[-1]))} UTC",
            highlight=False,
        )
    else:
        console.print("Transactions held: none")
    console.print(
        "Terminal features of a transaction at the frontier (its windows end a label delay before it)"
    )
    windows = Table()
    for name in ("window", "transactions", "risk"):
        windows.add_column(name, justify="left" if name == "window" else "right")
    for row in view.windows.to_dict("records"):
        windows.add_row(str(row["window"]), f"{int(row['nb_tx']):,}", f"{float(row['risk']):.4f}")
    console.print(windows)
    if not len(view.labels):
        console.print("Labels held: none")
        return
    console.print(f"Labels held: {len(view.labels):,} (the first known of each transaction)", highlight=False)
    labels = Table()
    for name in ("tx", "transaction time (UTC)", "known at (UTC)", "fraud"):
        labels.add_column(name)
    for row in view.labels.to_dict("records"):
        labels.add_row(
            str(row["tx_id"]),
            format_ms(int(row["tx_time_ms"])),
            format_ms(int(row["known_at_ms"])),
            "yes" if row["is_fraud"] else "no",
        )
    console.print(labels)


def _print_json(value: dict[str, Any]) -> None:
    console.out(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode(), highlight=False)


@app.command("card")
def card_command(
    ctx: typer.Context,
    card_id: Annotated[str, typer.Argument(help="Card token (32 hex digits).")],
    job: JobOption = StatefulJob.FEATURES,
    namespace: StateNamespaceOption = "",
    checkpoint: CheckpointOption = None,
    savepoint: SavepointOption = None,
    limit: LimitOption = 20,
    as_json: JsonOption = False,
) -> None:
    """What the job holds for a card: its transactions and waiting events, and the card windows' counts,
    sums and means at the event-time frontier, as of the last committed micro-batch."""
    if not re.match(CARD_TOKEN_PATTERN, card_id):
        raise typer.BadParameter("a card token is 32 lower-case hex digits", param_hint="CARD_ID")
    from features.inspect import read_card

    view: CardView = _view(ctx, Where(job, namespace, checkpoint, savepoint), card_id, read_card)
    if as_json:
        _print_json(view.as_json())
    else:
        _show_card(view, limit)


@app.command("terminal")
def terminal_command(
    ctx: typer.Context,
    terminal_id: Annotated[str, typer.Argument(help="Terminal id.")],
    job: JobOption = StatefulJob.FEATURES,
    namespace: StateNamespaceOption = "",
    checkpoint: CheckpointOption = None,
    savepoint: SavepointOption = None,
    as_json: JsonOption = False,
) -> None:
    """What the job holds for a terminal: its transaction times and fraud labels, and the terminal features
    a transaction at the event-time frontier would get, as of the last committed micro-batch."""
    if not terminal_id.strip():
        raise ConfigError("a terminal id is not empty")
    from features.inspect import read_terminal

    view: TerminalView = _view(ctx, Where(job, namespace, checkpoint, savepoint), terminal_id, read_terminal)
    if as_json:
        _print_json(view.as_json())
    else:
        _show_terminal(view)
