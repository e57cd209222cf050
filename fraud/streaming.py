"""What the run commands of the streaming jobs (``fraud features run``, ``fraud score run``, ``fraud pipeline
run``) share: where a run reads and writes, from their common options, and the run itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from contracts.settings import JobName
from fraud.console import settings_of
from fraud.options import check_start, checkpoint_dir, time_range

if TYPE_CHECKING:  # PySpark and the jobs: imported only when a job runs
    from fraud.jobs import Job


@dataclass(frozen=True)
class RunOptions:
    """The options every run command takes: how it runs (``--once``, ``--trigger-interval-s``), where
    (``--namespace``, ``--checkpoint``), over what (``--from``, ``--to``) and from what
    (``--from-savepoint``)."""

    once: bool
    trigger_interval_s: float
    namespace: str
    checkpoint: Path | None
    from_time: str | None
    to_time: str | None
    from_savepoint: Path | None


def run_streaming_job(
    ctx: typer.Context,
    job: JobName,
    build: Callable[..., Job],  # fraud.jobs.*_config, the command's own options bound
    run: RunOptions,
) -> None:
    """Run ``job`` as its run command's options say: in its namespace (its topics, Redis keys and
    checkpoint), over ``--from``/``--to`` (a range ends the run at ``--to``), or from a savepoint. The
    settings and the service clients are made once, here; the job's config from them, without I/O; then
    ``fraud.jobs.run_job`` runs it."""
    from fraud import jobs  # heavy: PySpark and the jobs
    from infra.clients import Clients
    from infra.spark.session import Trigger

    settings = settings_of(ctx)
    clients = Clients.from_settings(settings)
    start, end = time_range(run.from_time, run.to_time)
    check_start(run.from_time, run.from_savepoint)
    config = build(
        settings,
        clients,
        topics=settings.topics.in_namespace(run.namespace),
        checkpoint=checkpoint_dir(settings, run.checkpoint, job, run.namespace),
        scope=jobs.Scope(run.namespace, start, end),
    )
    jobs.run_job(
        settings,
        clients,
        config,
        Trigger(run.once or end is not None, run.trigger_interval_s),
        namespace=run.namespace,
        from_savepoint=run.from_savepoint,
    )
