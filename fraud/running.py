"""The streaming jobs running under a ``FRAUD_HOME``, as ``fraud status`` finds them.

Each job (``fraud features run``, ``fraud score run``, ``fraud pipeline run``) writes a small file under
``FRAUD_HOME/jobs/`` while it runs: what it is, its process and where its metrics are served. A job killed
without its ``finally`` leaves its file behind; readers drop files whose process is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from infra.embedded.stack import pid_runs


@dataclass(frozen=True)
class RunningJob:
    """A job as it registered itself."""

    job: str  # features, scoring, pipeline
    namespace: str
    pid: int
    metrics_url: str
    group: (
        str  # the consumer group it commits its processed offsets to (infra.kafka.input_watch.observer_group)
    )
    started_at: float

    @property
    def name(self) -> str:
        return f"{self.namespace}.{self.job}" if self.namespace else self.job


def jobs_dir(home: Path) -> Path:
    return home / "jobs"


@contextlib.contextmanager
def registered(home: Path, job: RunningJob) -> Iterator[None]:
    """``job`` is listed under ``home`` for the duration of the block."""
    directory = jobs_dir(home)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{job.name}-{job.pid}.json"
    path.write_text(json.dumps(asdict(job)))
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def running_jobs(home: Path, prune: bool = True) -> list[RunningJob]:
    """The jobs registered under ``home`` whose process still runs this interpreter, oldest first;
    ``prune``: also remove the files of the others (a reader that must not write, or cannot, leaves them)."""
    found = []
    for path in sorted(jobs_dir(home).glob("*.json")):
        try:
            job = RunningJob(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if pid_runs(job.pid, sys.executable):
            found.append(job)
        elif prune:
            path.unlink(missing_ok=True)
    return sorted(found, key=lambda job: job.started_at)


def this_job(job: str, namespace: str, metrics_url: str, group: str) -> RunningJob:
    return RunningJob(job, namespace, os.getpid(), metrics_url, group, time.time())
