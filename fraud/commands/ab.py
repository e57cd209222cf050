"""``fraud ab run``: a challenger judged against the champion on replayed history, with intervals, a
report and a promotion gate (``fraud.ab`` does the work)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from contracts.errors import ConfigError
from fraud.console import console, settings_of
from fraud.options import (
    FeatureSource,
    FromOption,
    KnownFraudsOption,
    LabelDelayOption,
    ToOption,
    check_namespace,
    time_range,
)
from models.ab_report import METRICS_TABLE_HEADER, metrics_table_rows
from models.comparison import DEFAULT_N_BOOT, gate_metric_names
from models.registry import CHALLENGER, CHAMPION
from models.splits import DEFAULT_KNOWN_FRAUDS

app = typer.Typer(help="A/B tests of models by replaying history.", no_args_is_help=True)


@app.command("run")
def run_command(
    ctx: typer.Context,
    from_time: FromOption = None,
    to_time: ToOption = None,
    champion: Annotated[
        str, typer.Option(help="Model A: an alias, a version number or models:/fraud-detector@ALIAS.")
    ] = CHAMPION,
    challenger: Annotated[str, typer.Option(help="Model B, the same forms.")] = CHALLENGER,
    shadow: Annotated[
        bool,
        typer.Option(
            "--shadow",
            help="Compare the live job's scores with its shadow scores (`fraud score run --shadow`).",
        ),
    ] = False,
    features: Annotated[
        FeatureSource,
        typer.Option(
            help="Where the features come from: the features topic, recomputed from the transactions and "
            "labels topics, or auto (the topic, unless it lacks a feature a model needs)."
        ),
    ] = FeatureSource.AUTO,
    known_frauds: KnownFraudsOption = DEFAULT_KNOWN_FRAUDS,
    label_delay_days: LabelDelayOption = None,
    namespace: Annotated[
        str,
        typer.Option(
            callback=check_namespace,
            help="Read the features (with --shadow: the scores) a job of this namespace wrote.",
        ),
    ] = "",
    report: Annotated[Path, typer.Option(help="Where the HTML report goes.")] = Path("ab-report.html"),
    alerts_per_day: Annotated[
        float | None,
        typer.Option(min=0.001, help="Alert budget of the equal-budget metrics (default: the champion's)."),
    ] = None,
    n_boot: Annotated[int, typer.Option(min=10, help="Bootstrap samples per interval.")] = DEFAULT_N_BOOT,
    seed: Annotated[
        int, typer.Option(min=0, help="Seed of the bootstrap: the same seed, the same numbers.")
    ] = 0,
    promote_if_better: Annotated[
        str | None,
        typer.Option(
            help=f"Make B the champion when both intervals of this metric's B - A lie above zero "
            f"({', '.join(gate_metric_names())})."
        ),
    ] = None,
    max_precision_drop: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, help="... and its alert precision at the equal budget falls by at most this."
        ),
    ] = 0.02,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the comparison as JSON (for scripts).")
    ] = False,
) -> None:
    """Score every transaction of --from..--to with both models and compare them as `fraud train` measures
    its test days: cards already known compromised left out each day (--known-frauds), labels known by
    --to plus the label delay."""
    if promote_if_better is not None and promote_if_better not in gate_metric_names():
        raise ConfigError(
            f"--promote-if-better: one of {', '.join(gate_metric_names())}, not {promote_if_better!r}"
        )
    start, end = time_range(from_time, to_time)
    if start is None or end is None:
        raise typer.BadParameter(
            "give the range to replay: --from and --to (ISO times, or relative like -7d)"
        )
    from fraud import ab  # heavy: PySpark and MLflow, imported once the options are known to be right

    request = ab.ABRequest(
        start,
        end,
        champion,
        challenger,
        shadow,
        report,
        n_boot,
        seed,
        alerts_per_day,
        promote_if_better,
        max_precision_drop,
        features,
        known_frauds,  # type: ignore[arg-type]
    )
    settings = settings_of(ctx)
    settings = settings.model_copy(update={"topics": settings.topics.in_namespace(namespace)})
    result = ab.run_ab(settings, request)
    if as_json:
        document = {
            "champion_version": result.versions[0],
            "challenger_version": result.versions[1],
            "run_id": result.run_id,
            "report": str(result.report),
            "decision": None if result.decision is None else result.decision.promote,
            "reason": None if result.decision is None else result.decision.reason,
            "promoted": result.promoted,
            **result.comparison.to_dict(),
        }
        typer.echo(json.dumps(document, indent=2))
        return
    comparison = result.comparison
    table = Table(
        title=f"A = {result.names[0]}, B = {result.names[1]}: {comparison.n_rows:,} transactions, "
        f"{comparison.n_frauds:,} frauds, {len(comparison.days)} days",
        title_justify="left",
    )
    for name in METRICS_TABLE_HEADER:
        table.add_column(name, justify="left" if name == "metric" else "right")
    for row in metrics_table_rows(comparison):
        table.add_row(*row)
    console.print(table)
    m, agree = comparison.mcnemar, comparison.agreement
    console.print(
        f"Alerts: by both {agree.both:,}, A only {agree.a_only:,}, B only {agree.b_only:,}. McNemar on the alert "
        f"decisions: {m.a_only_correct:,} right by A only, {m.b_only_correct:,} by B only, p = {m.p_value:.3g}."
    )
    console.print(
        f"Report: {result.report}   MLflow evaluation run: {result.run_id}   ({result.seconds:,.0f} s)"
    )
    if result.decision is not None:
        verdict = "promoted to champion" if result.promoted else "not promoted"
        console.print(
            f"Gate ({promote_if_better}): v{result.versions[1]} {verdict}: {result.decision.reason}"
        )
