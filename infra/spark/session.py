"""The Spark session every job uses: local mode by default, any cluster through ``FRAUD_SPARK_MASTER``.

Python workers run this interpreter (``PYSPARK_PYTHON``) and are forked by ``infra.spark.daemon``, which
imports their modules once; state lives in RocksDB with changelog checkpointing. In local mode the JVM
writes checkpoints through ``infra/spark/jvm/NoForkLocalFileSystem.java`` (compiled on first use when a JDK is
there), which spares two ``chmod`` processes per checkpoint file.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyspark
from py4j.protocol import Py4JError
from pyspark import RDD, InheritableThread, SparkConf
from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from contracts.errors import ConfigError
from contracts.settings import DEFAULT_EXECUTOR_START_TIMEOUT_S, Settings
from infra.maven import JVM_CACHE, SPARK_KAFKA, jar_paths
from infra.spark import daemon
from infra.spark.daemon import PRELOAD_ENV
from infra.spark.internals import jvm_started, use_gateway
from infra.spark.logs import WORKER_LOGS_ENV, launch_logged_gateway

#: Data source options whose values Spark hides (``spark.sql.redaction.options.regex``; Spark's default is
#: ``(?i)url``, and ``spark.redaction.regex`` adds passwords, secrets and tokens).
REDACTED_OPTIONS = r"(?i)url|jaas|keystore|truststore\.certificates|password"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: Checkpoints are local directories (``Settings.home``). Spark's default manager renames through Hadoop's
#: FileContext, which on the local file system forks ``readlink`` for every rename: 50-150 ms per state
#: store commit and per offset-log write from a JVM of this size. The FileSystem manager renames with
#: rename(2), atomic on a local file system.
CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
#: Hadoop's local file system with permissions set by a system call: without Hadoop's native library the
#: stock one forks ``chmod`` for each file it creates, twice per checkpoint file with its checksum file,
#: so every offset-log and commit-log entry and every state store's changelog cost process launches.
LOCAL_FILE_SYSTEM = "fraud.hadoop.NoForkLocalFileSystem"
LOCAL_FILE_SYSTEM_SOURCE = Path(__file__).parent / "jvm" / "NoForkLocalFileSystem.java"

#: The memory allocators of Spark's processes: the JVM's native memory (RocksDB's above all) and the Python
#: workers'. glibc's mapping threshold otherwise rises with every large block freed, up to 32 MiB, so the
#: workers' blocks come from a heap that fragments and grows with the micro-batches run; Arrow's jemalloc
#: pool keeps what it freed too. Fixed at 1 MiB (blocks above it mapped and given back when freed) with
#: Arrow on the system allocator and the 2 GiB driver heap (``Settings.spark_driver_memory``), the feature
#: job on 5,000 cards (the same 30 days of state throughout) took 2.9 GiB after 45 days and 3.9 after 90,
#: against 3.9 after 31 days, 4.6 after 62 and 5.5 after 124 with the defaults and a 4 GiB heap. A 128 KiB
#: threshold kept memory flatter (3.0 and 3.3 GiB) but cost the state's encoding a third more time: a
#: micro-batch at 2,000 tx/s took 0.9-1.1 s instead of 0.8 (bench/bench_microbatch.py). A variable already
#: set in the environment is kept.
ALLOCATOR_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(2 << 20),
    "ARROW_DEFAULT_MEMORY_POOL": "system",
}

#: The JVMs of a job, its driver and its executors, compile with C1 only. What they run is moving Arrow
#: batches between the Python workers, the shuffle and the state store: C2's compiler threads take more CPU
#: from the Python workers than its code saves, on few cores above all (docs/architecture.md, Spark).
JIT_OPTIONS = "-XX:TieredStopAtLevel=1"
#: The JVM says nothing of a class archive it cannot use (made for another JDK or classpath): it loads its
#: classes from the jars instead, as without one.
QUIET_CLASS_SHARING = "-Xlog:cds=off -Xlog:cds+dynamic=off"

_log = logging.getLogger(__name__)


def local_file_system_jar(cache: Path | None = None) -> Path | None:
    """The jar of ``LOCAL_FILE_SYSTEM``, compiled once per source version into ``cache`` (default: under
    this environment's prefix). None, with a warning, when there is no ``javac`` or it cannot build it:
    Spark then uses Hadoop's stock local file system, only slower."""
    cache = cache or JVM_CACHE
    source = LOCAL_FILE_SYSTEM_SOURCE.read_bytes()
    jar = cache / f"no-fork-local-fs-{hashlib.sha256(source).hexdigest()[:16]}.jar"
    if jar.exists():
        return jar
    javac = shutil.which("javac")
    if javac is None:
        _log.warning("no javac (a JDK): Spark writes checkpoints with a chmod process per file, slower")
        return None
    hadoop_api = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as build:
            classes = Path(build) / "classes"
            classpath = os.pathsep.join(map(str, hadoop_api))
            subprocess.run(  # noqa: S603 - javac from PATH on the project's own source
                [
                    javac,
                    "--release",
                    "17",
                    "-cp",
                    classpath,
                    "-d",
                    str(classes),
                    str(LOCAL_FILE_SYSTEM_SOURCE),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            built = Path(build) / jar.name
            with zipfile.ZipFile(built, "w") as archive:
                for path in sorted(classes.rglob("*.class")):
                    archive.write(path, path.relative_to(classes).as_posix())
            built.replace(jar)  # atomic: a concurrent build finds a whole jar or none
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr if isinstance(exc, subprocess.CalledProcessError) else exc
        _log.warning("cannot build %s (Spark uses Hadoop's stock one): %s", LOCAL_FILE_SYSTEM, detail)
        return None
    return jar


#: A class archive's file name: the prefix, a hash of what it was built for, the suffix.
ARCHIVE_PREFIX, ARCHIVE_SUFFIX = "spark-classes-", ".jsa"


def class_archive(jar: Path | None, cache: Path | None = None) -> Path | None:
    """Where the class archive of Spark's driver JVM is kept for this JDK, PySpark and local file system jar
    (``infra.spark.class_archive`` builds it); None without a ``java`` to run.

    A JVM started from the archive (class data sharing) maps the classes Spark loads at start instead of
    loading them from the jars: its session starts about 2 s sooner, and the mapped pages are shared by
    every JVM of the machine that uses it.
    """
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if java is None:
        return None
    try:
        binary = Path(java).resolve(strict=True)
        changed = binary.stat().st_mtime_ns
    except OSError:
        return None
    key = "\n".join([str(binary), str(changed), pyspark.__version__, jar.name if jar is not None else ""])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return (cache or JVM_CACHE) / f"{ARCHIVE_PREFIX}{digest}{ARCHIVE_SUFFIX}"


def driver_java_options(archive: Path | None, archive_classes_to: Path | None = None) -> str:
    """The driver JVM's options: ``JIT_OPTIONS``, and class data sharing: start from ``archive`` if it is
    there, or, with ``archive_classes_to``, write the classes it loaded to that file when it exits (building
    an archive)."""
    if archive_classes_to is not None:
        return f"{JIT_OPTIONS} -XX:ArchiveClassesAtExit={archive_classes_to} {QUIET_CLASS_SHARING}"
    if archive is not None and archive.is_file():
        return f"{JIT_OPTIONS} -XX:SharedArchiveFile={archive} {QUIET_CLASS_SHARING}"
    return JIT_OPTIONS


def spark_log(settings: Settings) -> Path:
    """Where the output of Spark's JVM and Python processes goes (``infra.spark.logs``)."""
    return settings.home / "logs" / "spark.log"


def session_config(
    settings: Settings,
    app_name: str = "fraud",
    shuffle_partitions: int | None = None,
    preload: tuple[str, ...] = (),
) -> dict[str, str]:
    """The configuration :func:`spark_session` starts Spark with, but for the local file system's jar
    (:func:`local_file_system_jar`, built on first use): the settings' entries (``Settings.spark``: master,
    UI, memory, driver host), their shuffle partitions unless given, and the project's own."""
    spark = settings.spark
    if shuffle_partitions:
        spark = spark.model_copy(update={"shuffle_partitions": shuffle_partitions})
    return {
        **spark.conf(),
        "spark.app.name": app_name,
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER,
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.python.worker.reuse": "true",
        # One daemon for every Python task: Spark keys its worker daemons by the workers' environment, and
        # the simplified tracebacks of Arrow UDFs (not of transformWithState's) set a variable of their own,
        # which would start a second daemon, importing the preload again. Worker tracebacks keep PySpark's
        # frames instead.
        "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled": "false",
        "spark.python.daemon.module": daemon.__name__,
        f"spark.executorEnv.{PRELOAD_ENV}": ",".join(preload),
        "spark.sql.session.timeZone": "UTC",
        # Data source options shown redacted in plans and the UI: besides Spark's defaults, the Kafka
        # connector's login (a JAAS line with the SASL password) and client key (PEM).
        "spark.sql.redaction.options.regex": REDACTED_OPTIONS,
        "spark.executor.extraJavaOptions": JIT_OPTIONS,
        f"spark.executorEnv.{WORKER_LOGS_ENV}": settings.log_level,
        **{f"spark.executorEnv.{name}": os.environ.get(name, value) for name, value in ALLOCATOR_ENV.items()},
    }


def spark_session(
    settings: Settings,
    app_name: str = "fraud",
    shuffle_partitions: int | None = None,
    preload: tuple[str, ...] = (),
    archive_classes_to: Path | None = None,
) -> SparkSession:
    """Get or create the session for ``settings.spark_master`` (:func:`session_config`); its Python workers
    start with the ``preload`` modules imported (``infra.spark.daemon``). Spark's own output goes to
    :func:`spark_log`, the project's warnings from Spark's Python processes to stderr (``infra.spark.logs``).
    The driver's JVM starts from the class archive when there is one (:func:`class_archive`), or writes
    one to ``archive_classes_to`` when it exits."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ[PRELOAD_ENV] = ",".join(preload)
    # Python workers inherit this: pandas FutureWarnings from PySpark's own row conversion are noise.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    for name, value in ALLOCATOR_ENV.items():  # the driver's JVM (in local mode, the executor) inherits them
        os.environ.setdefault(name, value)
    options = session_config(settings, app_name, shuffle_partitions, preload)
    # Spark's own Kafka connector, at exactly Spark's version (``infra.maven``), for the driver and executors.
    options["spark.jars"] = ",".join(str(path) for path in jar_paths(SPARK_KAFKA))
    jar = local_file_system_jar() if settings.spark.master.startswith("local") else None
    if jar is not None:  # local mode: the driver's JVM is the executor
        options["spark.driver.extraClassPath"] = str(jar)
        options["spark.hadoop.fs.file.impl"] = LOCAL_FILE_SYSTEM
    options["spark.driver.extraJavaOptions"] = driver_java_options(class_archive(jar), archive_classes_to)
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    if not jvm_started():  # the JVM starts now: its output into the log, not the terminal
        conf = SparkConf(loadDefaults=False)
        for key, value in options.items():
            conf.set(key, value)
        use_gateway(launch_logged_gateway(conf, spark_log(settings), settings.log_level), conf)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


T = TypeVar("T")


def stop_session(spark: SparkSession) -> None:
    """Stop Spark. When the driver cannot reach its JVM any more (a Ctrl-C cut a call to it short and broke
    the connection, or the JVM is gone), there is nothing to stop from here: the JVM ends with this
    process."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PySpark's own warning that it could not stop the JVM cleanly
        try:
            spark.stop()
        except (Py4JError, ConnectionError):
            _log.debug("Spark's JVM is out of reach; it stops with this process")


def check_executors(
    spark: SparkSession,
    modules: tuple[str, ...],
    directories: tuple[Path, ...],
    timeout_s: float = DEFAULT_EXECUTOR_START_TIMEOUT_S,
) -> None:
    """On a cluster, before a job starts: do executors start (within ``timeout_s``), can every one import the
    job's modules (the project installed, for the same Python) and see its checkpoint directories (storage
    the driver and the workers share)? Local mode shares the driver's process and disk: nothing to check.

    Raises:
        ConfigError: naming what the executors lack and what to do about it.
    """
    context = spark.sparkContext
    if (context.master or "local").startswith("local"):
        return
    wanted, paths = list(modules), [str(path) for path in directories]

    def probe(_: object) -> list[tuple[str, str, list[str], list[str]]]:
        # Runs in the executors; pickled by value with nothing of this module, which they may lack.
        import importlib
        import os
        import platform
        import socket

        missing = []
        for name in wanted:
            try:
                importlib.import_module(name)
            except Exception as exc:
                missing.append(f"{name} ({type(exc).__name__}: {exc})")
        unseen = [path for path in paths if not os.path.isdir(path)]
        return [(socket.gethostname(), platform.python_version(), missing, unseen)]

    tasks = max(1, context.defaultParallelism)
    try:
        reports = collect_within(context.parallelize(range(tasks), tasks).mapPartitions(probe), timeout_s)
    except TimeoutError:
        memory = context.getConf().get("spark.executor.memory", "1g")
        raise ConfigError(
            f"no Spark executor at {context.master} ran the job's first task within {timeout_s:.0f} s: a worker "
            f"must offer free cores and {memory} of memory for one (FRAUD_SPARK_EXECUTOR_MEMORY; a worker "
            "offers its --memory), and another application may hold the cores "
            "(FRAUD_SPARK_EXECUTOR_START_TIMEOUT_S waits longer)"
        ) from None
    except Exception as exc:
        first = next((line for line in str(exc).splitlines() if line.strip()), str(exc))
        raise ConfigError(
            f"the Spark executors at {context.master} cannot run this job's Python ({first.strip()}): they need "
            f"Python {platform.python_version()} at {sys.executable} with the project installed"
        ) from None
    for host, version, missing, unseen in reports:
        if missing:
            raise ConfigError(
                f"the Spark executors on {host} (Python {version}) cannot import {'; '.join(missing)}: install "
                f"the project, the same version, for Python {platform.python_version()} on every worker"
            )
        if unseen:
            raise ConfigError(
                f"the Spark executors on {host} do not see {', '.join(unseen)}: checkpoints must be on storage "
                "the driver and every worker share (set FRAUD_HOME or --checkpoint to such a path)"
            )


def collect_within(rows: RDD[T], timeout_s: float) -> list[T]:
    """``rows.collect()``, its job cancelled if it has not finished within ``timeout_s`` (raises
    TimeoutError then): a job whose tasks no executor takes waits for ever."""
    context = rows.context
    group = f"fraud-{uuid.uuid4().hex[:12]}"
    outcome: dict[str, Any] = {}

    def run() -> None:
        context.setJobGroup(group, "collect_within", interruptOnCancel=True)
        try:
            outcome["rows"] = rows.collect()
        except Exception as exc:  # handed to the caller
            outcome["error"] = exc

    thread = InheritableThread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        context.cancelJobGroup(group)
        thread.join(timeout_s)
        raise TimeoutError(f"the job did not finish within {timeout_s:.0f} s")
    if "error" in outcome:
        raise outcome["error"]
    return list(outcome["rows"])


@dataclass(frozen=True)
class Trigger:
    """When a query runs its micro-batches: ``once``, over everything available, then it stops; else one
    every ``interval_s`` (at once when the last took longer) until it is stopped."""

    once: bool = False
    interval_s: float = 1.0


#: Everything available, then stop.
ONCE = Trigger(once=True)


def start_stream(writer: DataStreamWriter, trigger: Trigger) -> StreamingQuery:
    """Start a query with its ``trigger``."""
    if trigger.once:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime=f"{trigger.interval_s} seconds").start()


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
