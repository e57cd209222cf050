"""Alert consumers on the command line: ``fraud alerts tail|get``, ``fraud card`` and ``fraud serve``.

``alerts tail`` reads the alerts topic as a read_committed consumer with ``assign()`` and offsets it
manages (no consumer group to join or leave behind); the lookups read Redis.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterator
from typing import Annotated

import typer
from confluent_kafka import Message, TopicPartition
from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table

from api.app import create_app
from contracts.errors import ConfigError, NotFoundError
from contracts.events import CARD_TOKEN_PATTERN
from contracts.records import EXPLANATION_FIELDS, AlertRecord
from fraud.console import console, err_console, format_ms, settings_of
from fraud.live import RegisteredJobs
from fraud.options import MetricsUrlsOption, PrefixOption, check_namespace, parse_time
from fraud.state import StateService
from infra.clients import Clients
from infra.kafka.log import consumed, offset_bounds, offsets_for_time, read_topic
from infra.kafka.offsets import parse_tp, tp_name
from infra.redis.connection import check_access, client_for
from infra.redis.reads import card_known, card_summary, get_alert

app = typer.Typer(help="Read alerts: tail the alerts topic, look one up in Redis.", no_args_is_help=True)


def follow_topic(clients: Clients, topic: str, from_ms: int | None) -> Iterator[Message]:
    """Every record of ``topic`` from ``from_ms`` (or the beginning) on, waiting for new ones forever."""
    admin = clients.admin()
    if from_ms is None:
        starts = {tp_name(topic, p): first for p, (first, _) in offset_bounds(admin, topic).items()}
    else:
        starts = offsets_for_time(admin, (topic,), from_ms)
    consumer = clients.consumer()
    try:
        consumer.assign([TopicPartition(*parse_tp(name), offset) for name, offset in starts.items()])
        while True:
            for message, at_end in consumed(consumer, 1_000, timeout=0.5):
                if not at_end:
                    yield message
    finally:
        consumer.close()


def _at_or_after(message: Message, from_ms: int | None) -> bool:
    """Whether the record's Kafka timestamp is at or after ``from_ms``.

    A seek by time starts each partition at its first record stamped at or after ``from_ms``; alerts are
    stamped with their transaction's event time and written as they are scored, so records after it may be
    stamped earlier: those are skipped here.
    """
    return from_ms is None or message.timestamp()[1] >= from_ms


def _parse_alert(message: Message) -> AlertRecord | None:
    try:
        return AlertRecord.model_validate_json(message.value() or b"")
    except ValidationError as exc:
        where = f"{message.topic()}/{message.partition()}@{message.offset()}"
        err_console.print(
            f"[yellow]skipped a malformed alert at {escape(where)}: {escape(exc.errors()[0]['msg'])}[/yellow]",
            highlight=False,
        )
        return None


def _top_reasons(alert: AlertRecord) -> str:
    """The alert's top features with their signed contributions to the margin: ``amount +1.52, ...``."""
    return ", ".join(
        f"{name} {alert.contributions[name]:+.2f}" if name in alert.contributions else name
        for name in alert.top_features
    )


def _alert_line(alert: AlertRecord) -> str:
    return (
        f"{format_ms(alert.event_time_ms)}  tx {alert.tx_id}  card {alert.card_id}  "
        f"terminal {alert.terminal_id}  amount {alert.amount:,.2f}  "
        f"score {alert.score:.3f} >= {alert.threshold:.3f}  {alert.model_name} v{alert.model_version}"
        + (f"  [{_top_reasons(alert)}]" if alert.top_features else "")
    )


def _alerts_table(alerts: list[AlertRecord], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for name, justify in [
        ("event time (UTC)", "left"),
        ("tx", "right"),
        ("card", "left"),
        ("terminal", "left"),
        ("amount", "right"),
        ("score", "right"),
        ("model", "left"),
        ("top features", "left"),
    ]:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for a in alerts:
        table.add_row(
            format_ms(a.event_time_ms),
            str(a.tx_id),
            escape(a.card_id),
            escape(a.terminal_id),
            f"{a.amount:,.2f}",
            f"{a.score:.3f}",
            escape(f"{a.model_name} v{a.model_version}"),
            escape(_top_reasons(a)),
        )
    return table


@app.command("tail")
def tail_command(
    ctx: typer.Context,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep waiting for new alerts (Ctrl-C stops).")
    ] = False,
    from_time: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="Start at the first alert whose Kafka timestamp is at or after this time: ISO (UTC if no zone) "
            "or relative to now (-30m, -1h, -2d). Default: the beginning of the topic.",
        ),
    ] = None,
    namespace: Annotated[
        str,
        typer.Option(
            callback=check_namespace,
            help="Read the alerts topic of this namespace (<namespace>.alerts: a replay's, a demo's) instead "
            "of the live one.",
        ),
    ] = "",
) -> None:
    """Print the alerts of the alerts topic (read_committed); without --follow, stop at its end."""
    settings = settings_of(ctx)
    clients = Clients.from_settings(settings)
    topic = settings.topics.in_namespace(namespace).alerts
    from_ms = parse_time(from_time) if from_time else None
    if follow:
        try:
            for message in follow_topic(clients, topic, from_ms):
                alert = _parse_alert(message) if _at_or_after(message, from_ms) else None
                if alert is not None:
                    console.print(_alert_line(alert), markup=False, highlight=False, soft_wrap=True)
        except KeyboardInterrupt:
            return
        return
    alerts = [
        alert
        for message in read_topic(clients, topic, start_ms=from_ms)
        if _at_or_after(message, from_ms) and (alert := _parse_alert(message)) is not None
    ]
    alerts.sort(key=lambda a: (a.event_time_ms, a.tx_id))
    console.print(_alerts_table(alerts, f"Alerts on {topic}: {len(alerts):,}"))


@app.command("get")
def get_command(
    ctx: typer.Context,
    tx_id: Annotated[int, typer.Argument(min=0, help="Transaction id.")],
    prefix: PrefixOption = "",
) -> None:
    """Show the alert of one transaction from Redis (exit 4 if there is none)."""
    redis = Clients.from_settings(settings_of(ctx)).redis()
    alert = get_alert(redis, tx_id, prefix)
    if alert is None:
        raise NotFoundError(f"no alert stored for transaction {tx_id}{_under(prefix)}")
    table = Table(title=f"Alert for transaction {tx_id}", title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for name, value in alert.model_dump(exclude={"features", *EXPLANATION_FIELDS}).items():
        shown = format_ms(value) + f" UTC ({value})" if name.endswith("_ms") else str(value)
        table.add_row(name, escape(shown))
    table.add_row("top_features", escape(_top_reasons(alert)) or "-")
    console.print(table)
    console.print(_reasons_table(alert))


def _reasons_table(alert: AlertRecord) -> Table:
    """Each feature's value and its contribution to the model's margin, strongest first (the features
    without a contribution after them)."""
    if alert.contributions:
        base = "-" if alert.base_margin is None else f"{alert.base_margin:+.4f}"
        title = (
            f"Why: each feature's contribution to the model's margin ({alert.contribution_method}); "
            f"base margin {base} + contributions = margin"
        )
    else:
        title = "Features (the model gives no contributions)"
    table = Table(title=title, title_justify="left")
    table.add_column("feature")
    table.add_column("value", justify="right")
    table.add_column("contribution", justify="right")
    for name in [*alert.contributions, *(n for n in alert.features if n not in alert.contributions)]:
        value, contribution = alert.features.get(name), alert.contributions.get(name)
        table.add_row(
            escape(name),
            "-" if value is None else f"{value:,.4f}",
            "-" if contribution is None else f"{contribution:+.4f}",
        )
    return table


def _under(prefix: str) -> str:
    """`` under the Redis key prefix P`` for a message, nothing for the live pipeline's keys."""
    return f" under the Redis key prefix {prefix!r}" if prefix else ""


def _values_table(title: str, values: dict[str, float | None]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("feature")
    table.add_column("value", justify="right")
    for name, value in values.items():
        table.add_row(escape(name), "-" if value is None else f"{value:,.4f}")
    return table


def card_command(
    ctx: typer.Context,
    card_id: Annotated[str, typer.Argument(help="Card token (32 hex digits).")],
    prefix: PrefixOption = "",
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many alerts, newest first.")] = 20,
) -> None:
    """Show a card's latest features, latest score and alerts from Redis (exit 4 if nothing is stored)."""
    if not re.match(CARD_TOKEN_PATTERN, card_id):
        raise typer.BadParameter("a card token is 32 lower-case hex digits", param_hint="CARD_ID")
    redis = Clients.from_settings(settings_of(ctx)).redis()
    if not card_known(redis, card_id, prefix):
        raise NotFoundError(f"nothing stored for card {card_id}{_under(prefix)}")
    summary = card_summary(redis, card_id, prefix, limit)
    console.print(f"[bold]Card {card_id}[/bold]")
    features = summary["features"]
    if features is None:
        console.print("No features stored.")
    else:
        title = (
            f"Latest features: tx {features['tx_id']} at {format_ms(features['event_time_ms'])} UTC, "
            f"terminal {escape(str(features['terminal_id']))}, amount {features['amount']}"
        )
        console.print(_values_table(title, features["values"]))
    score = summary["score"]
    if score is None:
        console.print("No score stored.")
    else:
        console.print(
            f"Latest score: {score.score:.3f} (threshold {score.threshold:.3f}, {escape(score.model_name)} "
            f"v{score.model_version}) for tx {score.tx_id} at {format_ms(score.event_time_ms)} UTC"
            + ("  [bold red]ALERT[/bold red]" if score.alert else "")
        )
    console.print(_alerts_table(summary["alerts"], f"Alerts: {len(summary['alerts'])} shown"))


def is_loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any address


def check_can_listen(host: str, port: int) -> None:
    """Raise a ``ConfigError`` unless ``host:port`` can be listened on now (a port in use, an address not
    of this machine): said before the page's address is printed, not as a server's traceback after it."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            sock.bind((host, port))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            f"cannot listen on {host}:{port}: {reason}; give another --port (or --host), or stop what uses it"
        ) from None


def serve_command(
    ctx: typer.Context,
    host: Annotated[
        str | None, typer.Option(help="Listen address (default: FRAUD_API_HOST, 127.0.0.1).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(min=1, max=65_535, help="Port (default: FRAUD_API_PORT, 8000).")
    ] = None,
    prefix: PrefixOption = "",
    metrics: MetricsUrlsOption = None,
) -> None:
    """Serve the alert lookup API (OpenAPI at /docs) and the live alerts page at / (Ctrl-C stops); the
    page's status strip shows the jobs running under FRAUD_HOME and those given with --metrics."""
    import uvicorn

    settings = settings_of(ctx)
    host, port = host or settings.api_host, port or settings.api_port
    token = settings.bearer_token()
    if token is None and not is_loopback(host):
        raise ConfigError(
            f"--host {host} serves the alerts beyond this machine: set FRAUD_API_TOKEN (clients then send "
            "`Authorization: Bearer <token>`; the page takes it as /#token=<token>)"
        )
    check_can_listen(host, port)
    clients = Clients.from_settings(settings)
    url, options = clients.endpoints.redis_url, settings.redis
    check_access(client_for(url, options), url)  # refused credentials: one line now, not 503s later
    states = StateService(settings)
    app_ = create_app(
        clients.redis(),
        prefix,
        token,
        states,
        RegisteredJobs(settings.home, metrics or ()),
    )
    page = f"http://{host}:{port}/" + ("#token=<FRAUD_API_TOKEN>" if token else "")
    console.print(f"Live alerts page: {page}   API docs: http://{host}:{port}/docs")
    try:
        uvicorn.run(app_, host=host, port=port, log_level="warning")
    finally:
        states.close()
