"""Where a Spark task's time goes: one debug-level line per task call with the wall time of its phases.

The project's work inside a micro-batch (decoding the records Spark's Kafka connector read, a stateful
stage's state reads and writes and its pure core, scoring, a sink transaction, the Redis writes) is timed
with ``time.perf_counter`` (a few hundred nanoseconds a phase, so it stays on) and, when the
``infra.spark.timing`` logger is enabled for debug, logged as one line::

    timing card-stage stage=12 task=3 batch=40 state-get=0.4 core=21.5 state-put=1.1

(phases in milliseconds, with a decimal point; ``stage``, ``task`` and ``batch``, whole numbers, are Spark's
stage id, partition id and micro-batch id in a task, or what the caller names). With ``--log-level debug``
the lines of Spark's Python workers reach the command's log (``infra.spark.logs``);
``bench/bench_microbatch.py`` adds them up per micro-batch.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from infra.spark.internals import task_batch_id

_log = logging.getLogger(__name__)

#: The first word of a timing line's message.
PREFIX = "timing"
T = TypeVar("T")


class Timings:
    """The phases of one task call, in milliseconds; logged by :meth:`log` when debug is on."""

    def __init__(self, what: str, **context: int) -> None:
        self.what = what
        self.context = context
        self.enabled = _log.isEnabledFor(logging.DEBUG)
        self.ms: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the time the block takes to phase ``name``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, started)

    def add(self, name: str, started: float) -> None:
        """Add the time since ``started`` (``time.perf_counter()``) to phase ``name``."""
        self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - started) * 1000

    def timed(self, name: str, items: Iterator[T]) -> Iterator[T]:
        """``items``, the time spent making each (not the caller's time between them) added to ``name``."""
        while True:
            started = time.perf_counter()
            try:
                item = next(items)
            except StopIteration:
                self.add(name, started)
                return
            self.add(name, started)
            yield item

    def log(self) -> None:
        """One line with the phases (and the task's stage, partition and micro-batch, in a Spark task)."""
        if not self.enabled:
            return
        where = dict(self.context)
        # In a Spark task PySpark is loaded; outside one (a pure core's tests, a bench) there is no task to
        # name, and timing does not load Spark for it.
        spark = sys.modules.get("pyspark")
        task = spark.TaskContext.get() if spark is not None else None
        if task is not None:
            batch = task_batch_id(task)
            where.update(stage=task.stageId(), task=task.partitionId())
            if batch is not None:
                where["batch"] = batch
        context = "".join(f" {name}={value}" for name, value in where.items())
        phases = " ".join(f"{name}={ms:.1f}" for name, ms in self.ms.items())
        _log.debug("%s %s%s %s", PREFIX, self.what, context, phases)
