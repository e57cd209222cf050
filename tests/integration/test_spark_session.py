"""The Spark session's local file system (checkpoint files written without a chmod process each), the
environment of its processes, and the class archive its JVM starts from."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from infra.spark.class_archive import build
from infra.spark.session import ALLOCATOR_ENV, LOCAL_FILE_SYSTEM, collect_within, local_file_system_jar


def test_the_local_file_system_jar_is_built_once_per_source(tmp_path: Path) -> None:
    jar = local_file_system_jar(tmp_path)
    assert jar is not None, "javac is on this machine (see ../.library/env): the jar must build"
    built = jar.stat().st_mtime_ns
    assert local_file_system_jar(tmp_path) == jar
    assert jar.stat().st_mtime_ns == built, "the second call rebuilt the jar"
    assert [p.name for p in tmp_path.iterdir()] == [jar.name], "the build left files behind"


def test_the_session_writes_local_files_with_the_permissions_hadoop_asks_for(
    spark: SparkSession, tmp_path: Path
) -> None:
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    assert conf.get("fs.file.impl") == LOCAL_FILE_SYSTEM
    hadoop_fs = jvm.org.apache.hadoop.fs
    fs = hadoop_fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
    assert fs.getClass().getName() == LOCAL_FILE_SYSTEM

    created = tmp_path / "created"
    fs.create(hadoop_fs.Path(str(created)), True).close()
    umask = int(conf.get("fs.permissions.umask-mode", "022"), 8)
    assert stat.S_IMODE(created.stat().st_mode) == 0o666 & ~umask
    for mode in (0o600, 0o751, 0o044):
        fs.setPermission(hadoop_fs.Path(str(created)), jvm.org.apache.hadoop.fs.permission.FsPermission(mode))
        assert stat.S_IMODE(os.stat(created).st_mode) == mode


def test_the_jvm_and_the_python_workers_run_with_the_allocator_settings(spark: SparkSession) -> None:
    jvm_env = spark.sparkContext._jvm.java.lang.System.getenv()
    assert {name: jvm_env.get(name) for name in ALLOCATOR_ENV} == ALLOCATOR_ENV

    def environment(batches):  # type: ignore[no-untyped-def]
        import os

        import pandas as pd

        for _ in batches:
            yield pd.DataFrame(
                {"name": list(ALLOCATOR_ENV), "value": [os.environ.get(n) for n in ALLOCATOR_ENV]}
            )

    rows = spark.range(1, numPartitions=1).mapInPandas(environment, "name string, value string").collect()
    assert {row.name: row.value for row in rows} == ALLOCATOR_ENV


#: In a process of its own: a session's JVM, and whether it maps the class archive.
MAPS_ARCHIVE = """
import sys
from pathlib import Path
from pyspark import SparkContext
from contracts.settings import Settings
from infra.spark.session import spark_session
spark = spark_session(Settings(home=Path(sys.argv[2]), spark_master="local[1]"), "maps-archive")
maps = Path(f"/proc/{SparkContext._gateway.proc.pid}/maps").read_text()
print(sys.argv[1] in maps, spark.range(10).count())
"""


def test_a_session_starts_from_the_class_archive_built_for_it(tmp_path: Path) -> None:
    archive = build()
    assert archive is not None and archive.is_file(), "java is on this machine: the archive must build"
    assert build() == archive
    assert not list(archive.parent.glob("*.partial")), "the build left files behind"
    result = subprocess.run(
        [sys.executable, "-c", MAPS_ARCHIVE, str(archive), str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "10"], result.stdout


def test_a_job_that_does_not_finish_in_time_is_cancelled(spark: SparkSession) -> None:
    assert collect_within(spark.sparkContext.parallelize(range(4), 2), 60) == [0, 1, 2, 3]

    def slow(value: int) -> int:
        import time

        time.sleep(120)
        return value

    started = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 3 s"):
        collect_within(spark.sparkContext.parallelize(range(2), 2).map(slow), 3)
    assert time.monotonic() - started < 60, "the cancelled job's tasks ran on"
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []
    assert spark.range(3).count() == 3, "the session is usable after the cancel"
