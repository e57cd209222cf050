"""The running jobs as the live page's status strip shows them (``api.live.JobsView``).

``fraud serve`` shows the jobs registered under ``FRAUD_HOME`` (as ``fraud status`` finds them), through
their metrics endpoints; ``fraud demo --follow`` shows the jobs it runs itself, through their queries' last
progress report.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from api.live import JobStatus
from fraud.metrics import Samples, ended_at, records_behind, records_read, scrape
from fraud.running import running_jobs

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery


def metrics_status(name: str, samples: Samples | None) -> JobStatus:
    """What a job's metrics (``fraud.metrics.JobMetrics``) say of it; None: they did not answer."""
    if samples is None:
        return JobStatus(name=name, answering=False)  # no figures

    def values(metric: str) -> list[tuple[dict[str, str], float]]:
        return [(dict(labels), value) for (sample, labels), value in samples.items() if sample == metric]

    def total(metric: str) -> float:
        return sum(value for _, value in values(metric))

    last_at = total("fraud_last_batch_timestamp_seconds")
    return JobStatus(
        name=name,
        answering=True,
        records_per_s=total("fraud_input_records_per_second"),
        lag_records=int(total("fraud_lag_records")),
        last_batch_id=int(total("fraud_last_batch_id")) if last_at else None,
        last_batch_at_ms=int(last_at * 1000) if last_at else None,
        model_versions={
            labels.get("role", ""): int(value) for labels, value in values("fraud_model_version")
        },
    )


def progress_status(name: str, progress: Mapping[str, Any] | None) -> JobStatus:
    """What a query's last progress report (``StreamingQuery.lastProgress``) says of its job; None: no
    micro-batch yet."""
    if progress is None:
        return JobStatus(name=name, answering=True)  # no figures yet
    duration_s = progress.get("durationMs", {}).get("triggerExecution", 0) / 1000
    return JobStatus(
        name=name,
        answering=True,
        records_per_s=records_read(progress) / duration_s if duration_s else 0.0,
        lag_records=sum(records_behind(progress).values()),
        last_batch_id=int(progress["batchId"]),
        last_batch_at_ms=int(ended_at(progress) * 1000),
    )


class RegisteredJobs:
    """The jobs registered under ``home`` (``fraud.running``; read only, never pruned) and the jobs serving
    metrics at ``urls`` (elsewhere: another container), through their metrics endpoints."""

    def __init__(self, home: Path, urls: Sequence[str] = ()) -> None:
        self.home = home
        self.urls = list(urls)

    def jobs(self) -> list[JobStatus]:
        named = {job.metrics_url: job.name for job in running_jobs(self.home, prune=False)}
        named.update({url: url for url in self.urls if url not in named})
        return [metrics_status(name, scrape(url)) for url, name in named.items()]


class QueryJobs:
    """Jobs running in this process, added as they start, through their queries (a job started again
    replaces its earlier query)."""

    def __init__(self) -> None:
        self._queries: list[tuple[str, StreamingQuery]] = []
        self._lock = threading.Lock()

    def add(self, name: str, query: StreamingQuery) -> None:
        with self._lock:
            self._queries = [(known, q) for known, q in self._queries if known != name] + [(name, query)]

    def jobs(self) -> list[JobStatus]:
        with self._lock:
            queries = list(self._queries)
        shown = []
        for name, query in queries:
            try:
                active = query.isActive
                progress = query.lastProgress if active else None
            except Exception:  # the session stopping under the page: shown as not answering
                active, progress = False, None
            shown.append(progress_status(name, progress) if active else JobStatus(name=name, answering=False))
        return shown
