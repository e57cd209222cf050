"""The Spark session every job uses: local mode by default, any cluster through ``FRAUD_SPARK_MASTER``.

Python workers run this interpreter (``PYSPARK_PYTHON``) and are forked by ``infra.spark_daemon``, which
imports their modules once; state lives in RocksDB with changelog checkpointing.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from infra.settings import Settings

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: Checkpoints are local directories (``Settings.home``). Spark's default manager renames through Hadoop's
#: FileContext, which on the local file system forks ``readlink`` for every rename: 50-150 ms per state
#: store commit and per offset-log write from a JVM of this size. The FileSystem manager renames with
#: rename(2), atomic on a local file system.
CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def spark_session(settings: Settings, app_name: str = "fraud", shuffle_partitions: int = 2) -> SparkSession:
    """Get or create the session for ``settings.spark_master``."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Python workers inherit this: pandas FutureWarnings from PySpark's own row conversion are noise.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    builder = (
        SparkSession.builder.master(settings.spark_master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.streaming.checkpointFileManagerClass", CHECKPOINT_FILE_MANAGER)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", "infra.spark_daemon")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "4g")
    )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def start_stream(writer: DataStreamWriter, once: bool, trigger_interval_s: float) -> StreamingQuery:
    """Start a query: ``once`` processes everything available then stops, else a micro-batch every interval."""
    trigger = (
        writer.trigger(availableNow=True)
        if once
        else writer.trigger(processingTime=f"{trigger_interval_s} seconds")
    )
    return trigger.start()


def stop_between_batches(query: StreamingQuery, timeout_s: float = 60.0) -> None:
    """Let ``query`` process what its sources hold now, then stop it (call it once they stop growing).

    Stopping a query in the middle of a micro-batch aborts the batch's writes (a restart re-runs them)
    and fills the log with the aborts. After ``timeout_s`` the query is stopped whatever it is doing.
    """
    drained = threading.Thread(target=_process_all_available, args=(query,), daemon=True)
    drained.start()
    drained.join(timeout_s)
    query.stop()


def _process_all_available(query: StreamingQuery) -> None:
    with contextlib.suppress(Exception):  # a failed query raises its error here; it is stopped next anyway
        query.processAllAvailable()
