"""Terminal output shared by the CLI commands: progress bars with rates, summary tables."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from contracts.settings import Settings

if TYPE_CHECKING:
    from ingest.deadletter import DeadLetterSummary

console = Console()
err_console = Console(stderr=True)


def settings_of(ctx: typer.Context) -> Settings:
    """The settings the ``fraud`` callback loaded for this invocation."""
    settings = ctx.find_root().obj
    if not isinstance(settings, Settings):
        raise RuntimeError("settings were not loaded; commands run under the `fraud` app")
    return settings


@contextmanager
def progress_bar(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar with count, rate and time left; yields ``advance(n)`` to report n more done."""
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )
    task = progress.add_task(description, total=total, rate="")

    def advance(amount: int) -> None:
        progress.advance(task, amount)
        speed = progress.tasks[0].speed
        progress.update(task, rate=f"{speed:,.0f}/s" if speed else "")

    with progress:
        yield advance


class GrowingBar:
    """A progress bar of records read toward records read + records behind (shown when ``shown``)."""

    def __init__(self, shown: bool) -> None:
        self.progress = (
            Progress(
                TextColumn("[bold]Records"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            if shown
            else None
        )
        self.task = self.progress.add_task("records", total=None) if self.progress else None

    def __enter__(self) -> GrowingBar:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(self, done: int, behind: int) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, completed=done, total=done + behind)


def counts_table(title: str, counts: Mapping[str, int]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("topic")
    table.add_column("records", justify="right")
    for name, count in counts.items():
        table.add_row(name, f"{count:,}")
    return table


def summary_table(totals: Mapping[str, int]) -> Table:
    """A job's counts at its end (``fraud.metrics.JobMetrics.totals``): what it read and wrote, and the dead
    letters by reason (those it wrote)."""
    table = Table(title="Summary", title_justify="left")
    table.add_column("")
    table.add_column("count", justify="right")
    dead = {name.removeprefix("dead:"): n for name, n in totals.items() if name.startswith("dead:")}
    for name, count in totals.items():
        if not name.startswith("dead:"):
            table.add_row(name, f"{count:,}")
    table.add_row("dead letters", f"{sum(dead.values()):,}")
    for reason, count in sorted(dead.items(), key=lambda item: -item[1]):
        if count:
            table.add_row(f"  {reason}", f"{count:,}")
    return table


def dead_letter_table(summary: DeadLetterSummary) -> Table:
    table = Table(title=f"Dead letters: {summary.total:,}", title_justify="left")
    table.add_column("reason")
    table.add_column("count", justify="right")
    table.add_column("example source")
    table.add_column("example detail", overflow="fold")
    for reason, count in summary.by_reason.most_common():
        example = summary.examples[reason]
        table.add_row(reason, f"{count:,}", re.sub(r"[^:]*/", "", example.source), example.detail)
    return table


def format_ms(ms: int) -> str:
    """An event time in UTC milliseconds as ``YYYY-MM-DD HH:MM:SS`` (UTC)."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def fmt_metric(value: float | None, digits: int = 3) -> str:
    """A metric for a table: ``n/a`` when it has no value."""
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"
