"""``fraud savepoint``: take a savepoint of a streaming job (it may keep running), list, inspect and delete
savepoints. A job starts from one with ``fraud features|score|pipeline run --from-savepoint PATH``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from contracts.settings import JobName
from fraud import savepoints
from fraud.console import console, settings_of
from fraud.options import CheckpointOption, check_namespace, checkpoint_dir

app = typer.Typer(
    help="Savepoints: a job's state, source offsets and event-time frontier at a committed micro-batch; "
    "`fraud features|score|pipeline run --from-savepoint PATH` starts a job from one.",
    no_args_is_help=True,
)

SavepointArgument = Annotated[Path, typer.Argument(help="The savepoint's directory.")]
JobNamespaceOption = Annotated[
    str,
    typer.Option(
        "--namespace",
        callback=check_namespace,
        help="The namespace the job runs in (as its run command's --namespace). Default: the live pipeline.",
    ),
]


@app.command("create")
def create_command(
    ctx: typer.Context,
    job: Annotated[JobName, typer.Argument(help="The job whose checkpoint is saved.")],
    to: Annotated[
        Path | None,
        typer.Option(
            "--to",
            help="A new (or empty) directory for the savepoint, local or a mount the Spark cluster sees "
            "(default: FRAUD_HOME/savepoints/[<namespace>.]<job>-<UTC time>).",
        ),
    ] = None,
    namespace: JobNamespaceOption = "",
    checkpoint: CheckpointOption = None,
) -> None:
    """Save a job's state, source offsets, frontier and layout as its last committed micro-batch left them.

    The job may keep running: what a later micro-batch writes meanwhile is left out."""
    settings = settings_of(ctx)
    source = checkpoint_dir(settings, checkpoint, job.value, namespace)
    target = (to or savepoints.default_location(settings.home, job.value, namespace)).resolve()
    with console.status(f"Copying {source} at its last committed micro-batch..."):
        savepoint = savepoints.take(job.value, namespace, source, target)
    console.print(
        f"Savepoint of the {job.value} job at micro-batch {savepoint.batch} (frontier "
        f"{savepoints.iso_ms(savepoint.frontier_ms)}; {savepoint.files:,} files, {_size(savepoint.size_bytes)}):"
    )
    console.print(str(savepoint.path), soft_wrap=True, highlight=False)


@app.command("list")
def list_command(
    ctx: typer.Context,
    under: Annotated[
        Path | None,
        typer.Option(
            help="Where to look: the savepoints in its directories (default: FRAUD_HOME/savepoints)."
        ),
    ] = None,
) -> None:
    """The savepoints under a directory, oldest first."""
    where = under or settings_of(ctx).home / "savepoints"
    found = savepoints.find(where)
    if not found:
        console.print(f"No savepoints under {where}.")
        return
    table = Table(title=f"Savepoints under {where}", title_justify="left")
    for name, justify in (
        ("path", "left"),
        ("job", "left"),
        ("namespace", "left"),
        ("batch", "right"),
        ("frontier (UTC)", "left"),
        ("created (UTC)", "left"),
        ("size", "right"),
    ):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for savepoint in found:
        table.add_row(
            str(savepoint.path),
            savepoint.job,
            savepoint.namespace or "-",
            str(savepoint.batch),
            savepoints.iso_ms(savepoint.frontier_ms),
            savepoint.created_at,
            _size(savepoint.size_bytes),
        )
    console.print(table)


@app.command("inspect")
def inspect_command(
    path: SavepointArgument,
    as_json: Annotated[bool, typer.Option("--json", help="Print savepoint.json as it is.")] = False,
) -> None:
    """What a savepoint holds: job, micro-batch, offsets, frontier, layout, feature specs."""
    savepoint = savepoints.read(path)
    if as_json:
        print(json.dumps(savepoint.to_json(), indent=1))
        return
    table = Table(title=f"Savepoint {path}", title_justify="left", show_header=False)
    table.add_column("", style="bold")
    table.add_column("", overflow="fold")
    features = savepoint.features
    rows = {
        "job": savepoint.job,
        "namespace": savepoint.namespace or "- (the live pipeline)",
        "created (UTC)": savepoint.created_at,
        "taken from": savepoint.checkpoint,
        "micro-batch": f"{savepoint.batch} (a job started from it in its layout runs {savepoint.batch + 1} next)",
        "frontier (UTC)": savepoints.iso_ms(savepoint.frontier_ms) + (" (final)" if savepoint.final else ""),
        "offsets": "\n".join(f"{name}: {offset:,}" for name, offset in savepoint.offsets.items()) or "-",
        "layout": "; ".join(
            [
                *(f"{name} {count}" for name, count in savepoint.layout.items()),
                *(
                    [f"shuffle partitions {savepoint.shuffle_partitions}"]
                    if savepoint.shuffle_partitions
                    else []
                ),
            ]
        )
        or "-",
        "features": "-"
        if features is None
        else f"{len(features['features'])}, fingerprint {features['fingerprint']}",
        "size": f"{savepoint.files:,} files, {_size(savepoint.size_bytes)}",
    }
    for name, value in rows.items():
        table.add_row(name, value)
    console.print(table)


@app.command("delete")
def delete_command(
    path: SavepointArgument,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete a savepoint (a directory that is not one is refused)."""
    savepoint = savepoints.read(path)
    if not yes:
        typer.confirm(f"Delete the savepoint of the {savepoint.job} job at {path}?", abort=True)
    savepoints.delete(path)
    console.print(f"Deleted {path}.")


def _size(size_bytes: int) -> str:
    return f"{size_bytes / 1e6:,.1f} MB"
