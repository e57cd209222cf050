"""Spark's Python daemon with the workers' imports done once, before it forks them.

Spark starts this module (``spark.python.daemon.module``) and it forks one Python worker per task. A stock
worker imports PySpark (from ``pyspark.zip``, which ``infra.spark.pyspark_zip`` compiles), pandas, PyArrow and the
project's modules after the fork: seconds of CPU per worker, and a streaming query starts several workers
per micro-batch. Here the daemon imports all of that before serving (the jobs name their own modules
through ``PRELOAD_ENV``), so every forked worker starts with it in memory, and freezes it (``gc.freeze``):
PySpark runs a full garbage collection in each reused worker after every task, which would otherwise walk
all those modules' objects every time.

Forking is only safe from a single-threaded process: importing numpy starts OpenBLAS threads unless told
not to, and PyArrow's jemalloc starts a background purge thread; the daemon asks for one BLAS thread (the
stages do no linear algebra) and no jemalloc background thread. A test checks that the preloaded daemon
has exactly one thread.
"""

from __future__ import annotations

import gc
import importlib
import os

from infra.spark.internals import DAEMON_PRELOAD, serve_daemon

#: Environment that keeps the preloaded imports from starting threads (set before they run).
SINGLE_THREADED_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
}

#: Imported by the daemon, in order; each is in every worker's memory after the fork.
PRELOAD = (
    *DAEMON_PRELOAD,
    "pandas",
    "pyarrow",
    "infra.spark.frontier",
    "infra.spark.kafka_sink.datasource",
)
#: Environment variable with more modules to import, comma-separated: the jobs' own (``spark_session``
#: sets it from its ``preload`` argument, for the driver's workers and the executors').
PRELOAD_ENV = "KAPPA_FRAUD_SPARK_PRELOAD"


def preload() -> None:
    """Import ``PRELOAD``, then the modules named in ``PRELOAD_ENV``, single-threaded."""
    for name, value in SINGLE_THREADED_ENV.items():
        os.environ.setdefault(name, value)
    extra = [name.strip() for name in os.environ.get(PRELOAD_ENV, "").split(",") if name.strip()]
    for name in (*PRELOAD, *extra):
        importlib.import_module(name)


if __name__ == "__main__":
    preload()
    gc.freeze()
    serve_daemon()
