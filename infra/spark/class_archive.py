"""Build the class archive Spark's driver JVM starts from (``infra.spark.session.class_archive``): once per
environment, JDK and PySpark version; ``make`` runs it after installing. Every later session's JVM maps the
classes instead of loading them from the jars.

A JVM in a process of its own starts a local session, runs a small job of the kind the project's jobs run
(Arrow batches through a Python worker) and writes the classes it loaded when it exits; the archive takes
its place atomically only once that JVM has exited whole (a JVM started from a cut-off archive crashes).
Without an archive, or with one another JDK or classpath made, jobs run as before, their JVM loading every
class from the jars. Archives made for another JDK build, PySpark version or classpath are removed (about
150 MiB each): a JVM that has one mapped keeps its pages until it exits.

Run: .venv/bin/python -m infra.spark.class_archive
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from contracts.settings import Settings
from infra.spark.internals import stop_jvm_and_wait
from infra.spark.session import (
    ARCHIVE_PREFIX,
    ARCHIVE_SUFFIX,
    class_archive,
    local_file_system_jar,
    spark_session,
)

#: How long the warm-up session may take, JVM start and exit included.
TIMEOUT_S = 300.0


def warm_up(archive_to: Path) -> None:
    """In this process: a session whose JVM writes the classes it loaded to ``archive_to`` when it exits,
    a small job through a Python worker, and the JVM stopped and waited for."""
    with tempfile.TemporaryDirectory() as home:
        spark = spark_session(Settings(home=Path(home)), "fraud-class-archive", archive_classes_to=archive_to)

        def doubled(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            for frame in frames:
                yield pd.DataFrame({"id": frame["id"] * 2})

        numbers = spark.range(1_000)
        numbers.groupBy((numbers.id % 4).alias("k")).count().collect()
        numbers.mapInPandas(doubled, "id long").collect()
        stop_jvm_and_wait(spark, TIMEOUT_S)


def build() -> Path | None:
    """The class archive of this environment's sessions, built if it is not there yet (None: no ``java``);
    the others in its directory are removed."""
    target = class_archive(local_file_system_jar())
    if target is None:
        return None
    if not target.is_file():
        _build(target)
    remove_others(target)
    return target


def remove_others(archive: Path) -> None:
    """Remove the class archives beside ``archive``: made for another JDK build, PySpark or classpath."""
    for other in archive.parent.glob(f"{ARCHIVE_PREFIX}*{ARCHIVE_SUFFIX}"):
        if other != archive:
            other.unlink(missing_ok=True)


def _build(target: Path) -> None:
    """Write ``target`` from a warm-up session in a process of its own (raises OSError when it fails)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        run = subprocess.run(  # noqa: S603 - this interpreter, this module
            [sys.executable, "-m", "infra.spark.class_archive", "--warm-up", str(partial)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        if run.returncode != 0:
            said = run.stderr.strip().splitlines()
            raise OSError(f"its warm-up session failed: {said[-1] if said else run.returncode}")
        if partial.stat().st_size == 0:
            raise OSError(f"{partial} is empty")
        partial.replace(target)  # atomic: a session finds a whole archive or none
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--warm-up", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.warm_up is not None:
        warm_up(args.warm_up)
        return
    try:
        archive = build()
    except (OSError, subprocess.SubprocessError) as exc:
        # Not fatal: the jobs run without it, their JVM loading its classes from the jars.
        print(f"no class archive for Spark's JVM ({exc}): jobs start about 2 s slower", file=sys.stderr)
        return
    if archive is None:
        print("no class archive for Spark's JVM: no java found", file=sys.stderr)
    else:
        print(f"Spark's JVM starts from {archive} ({archive.stat().st_size / 2**20:,.0f} MiB)")


if __name__ == "__main__":
    main()
