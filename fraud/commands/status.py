"""``fraud status``: the embedded stack, the running jobs and how far behind they are, the topics' offsets.

Nothing here reads a topic in full. A running job is seen through its metrics endpoint (it registers
itself under ``FRAUD_HOME/jobs``; jobs elsewhere are given with ``--metrics``) and through the consumer
group it commits its processed offsets to, compared with the log's end.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Annotated

import typer
from confluent_kafka import ConsumerGroupTopicPartitions
from rich.table import Table

from contracts.settings import Settings
from fraud.commands.stack import stack_table
from fraud.console import console, settings_of
from fraud.metrics import Samples, scrape
from fraud.running import running_jobs
from infra.clients import Clients, NotConfiguredError
from infra.embedded.stack import EmbeddedStack
from infra.kafka.connection import cluster_metadata
from infra.kafka.input_watch import OBSERVER_GROUP_PREFIX
from infra.kafka.log import log_bounds


def status(
    ctx: typer.Context,
    metrics: Annotated[
        list[str] | None,
        typer.Option(
            "--metrics",
            help="Also show the job serving metrics at this URL (a job on another machine or in compose, "
            "e.g. http://localhost:9400/metrics); repeatable.",
        ),
    ] = None,
) -> None:
    """The embedded stack, each running job's rate, lag, last micro-batch and model version, the consumer
    groups' lag and each topic's offsets, without reading the topics."""
    settings = settings_of(ctx)
    info = EmbeddedStack(settings.home).running()
    if info is None:
        console.print(f"No embedded stack is running under {settings.home.resolve()}.")
    else:
        console.print(stack_table(info, "Embedded stack"))
    urls = {job.metrics_url: job.name for job in running_jobs(settings.home)}
    urls.update({url: url for url in metrics or () if url not in urls})
    console.print(jobs_table(urls))
    try:
        clients = Clients.from_settings(settings)
    except NotConfiguredError:
        return
    console.print(groups_table(clients))
    console.print(offsets_table(clients, settings))


def job_summary(samples: Samples, now: float) -> dict[str, str]:
    """What ``fraud status`` shows of one job's metrics."""

    def total(name: str) -> float:
        return sum(value for (sample, _), value in samples.items() if sample == name)

    def by_label(name: str, label: str) -> dict[str, float]:
        return {
            dict(labels).get(label, ""): value
            for (sample, labels), value in samples.items()
            if sample == name
        }

    last_at = total("fraud_last_batch_timestamp_seconds")
    versions = by_label("fraud_model_version", "role")
    return {
        "rate": f"{total('fraud_input_records_per_second'):,.0f}/s",
        "lag": f"{total('fraud_lag_records'):,.0f}",
        "last batch": (
            f"{total('fraud_last_batch_id'):.0f}, {now - last_at:,.0f} s ago" if last_at else "none yet"
        ),
        "model": ", ".join(f"{role} v{version:.0f}" for role, version in sorted(versions.items())) or "-",
        "records": f"{total('fraud_input_records_total'):,.0f}",
        "alerts": f"{total('fraud_alerts_total'):,.0f}",
        "dead letters": f"{total('fraud_dead_letters_total'):,.0f}",
    }


def jobs_table(urls: dict[str, str]) -> Table:
    """A row per job: its name and metrics URL, and what its metrics say (or that they do not answer)."""
    columns = ("rate", "lag", "last batch", "model", "records", "alerts", "dead letters")
    table = Table(title=f"Running jobs: {len(urls)}", title_justify="left")
    table.add_column("job")
    for column in columns:
        table.add_column(column, justify="left" if column in ("last batch", "model") else "right")
    table.add_column("metrics", overflow="fold")
    now = time.time()
    for url, name in urls.items():
        samples = scrape(url)
        if samples is None:
            table.add_row(name, *(["?"] * len(columns)), f"{url} (no answer)")
            continue
        shown = job_summary(samples, now)
        table.add_row(name, *(shown[column] for column in columns), url)
    return table


def groups_table(clients: Clients) -> Table:
    """The jobs' observer groups (``infra.kafka.input_watch.observer_group``): committed offsets against the log's end."""
    admin = clients.admin()
    groups = sorted(
        group.group_id
        for group in admin.list_consumer_groups().result().valid
        if group.group_id.startswith(OBSERVER_GROUP_PREFIX)
    )
    table = Table(title="Processed offsets (consumer groups)", title_justify="left")
    for column in ("group", "topic", "committed", "log end", "lag"):
        table.add_column(column, justify="left" if column in ("group", "topic") else "right")
    for group in groups:
        future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
        committed = {
            (tp.topic, tp.partition): tp.offset for tp in future.result().topic_partitions if tp.offset >= 0
        }
        ends = log_bounds(admin, sorted(committed))
        by_topic: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for (topic, partition), offset in committed.items():
            by_topic[topic][0] += offset
            by_topic[topic][1] += ends[f"{topic}/{partition}"][1]
        for topic, (done, end) in sorted(by_topic.items()):
            table.add_row(
                group.removeprefix(OBSERVER_GROUP_PREFIX),
                topic,
                f"{done:,}",
                f"{end:,}",
                f"{max(0, end - done):,}",
            )
    return table


def offsets_table(clients: Clients, settings: Settings) -> Table:
    """Each project topic's first and end offsets (records plus transaction markers between them); `fraud
    topics list` counts the records themselves, by reading."""
    table = Table(title="Topics (offsets)", title_justify="left")
    for column in ("topic", "partitions", "first", "end"):
        table.add_column(column, justify="left" if column == "topic" else "right")
    admin = clients.admin()
    found = cluster_metadata(admin).topics
    partitions = {topic: sorted(found[topic].partitions) for topic in settings.topics.all() if topic in found}
    bounds = log_bounds(admin, [(topic, p) for topic, ps in partitions.items() for p in ps])
    for topic, numbers in partitions.items():
        spans = [bounds[f"{topic}/{p}"] for p in numbers]
        firsts, ends = sum(first for first, _ in spans), sum(end for _, end in spans)
        table.add_row(topic, str(len(numbers)), f"{firsts:,}", f"{ends:,}")
    return table
