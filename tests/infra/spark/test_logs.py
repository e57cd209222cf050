"""Spark's output in a log file; the project's marked lines from Spark's Python processes to the terminal."""

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contracts.errors import ServiceUnavailableError
from infra.spark.logs import MARK, WORKER_LOGS_ENV, MarkedLines, launch_logged_gateway, marked, relog


def test_only_marked_lines_are_shown_without_their_mark() -> None:
    lines = [
        "26/11/26 06:43:58 WARN Utils: Your hostname resolves to a loopback address",
        "Starting Streaming TransformWithStateInPandas Python worker.",
        f"{MARK}Kafka unreachable (timed out); retrying until it answers",
        "",
        f"PythonRunner: {MARK}Redis at redis://127.0.0.1:6379/0 answers again after 2.0 s",
    ]
    assert list(marked(lines)) == [
        "Kafka unreachable (timed out); retrying until it answers",
        "Redis at redis://127.0.0.1:6379/0 answers again after 2.0 s",
    ]


def test_the_copier_follows_the_log_from_where_it_stood(tmp_path: Path) -> None:
    log = tmp_path / "spark.log"
    log.write_text(f"{MARK}WARNING infra.retry from an earlier run\n")
    seen: list[str] = []
    copier = MarkedLines(log, seen.append)
    copier.start()
    with log.open("a") as spark:
        spark.write(f"log4j noise\n{MARK}WARNING infra.retry first\n{MARK}INFO scoring.job sec")
        spark.flush()
        time.sleep(0.5)
        spark.write("ond\n")
    deadline = time.monotonic() + 5
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seen == ["WARNING infra.retry first", "INFO scoring.job second"]


def test_a_marked_line_is_logged_again_by_its_logger_at_its_level(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG), caplog.at_level(logging.DEBUG, logger="infra"):
        relog("INFO infra.spark.kafka_sink.datasource features-1 batch 3: already written, skipping 9 rows")
        relog("not a level line")
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            "infra.spark.kafka_sink.datasource",
            logging.INFO,
            "features-1 batch 3: already written, skipping 9 rows",
        ),
        ("spark.worker", logging.WARNING, "not a level line"),
    ]


def test_a_spark_python_process_marks_its_lines_of_the_level_and_masks_card_numbers() -> None:
    script = (
        "import logging\n"
        "from infra.spark.logs import mark_worker_logs\n"
        "mark_worker_logs()\n"
        "mark_worker_logs()\n"  # once per process, however often it is called
        "logging.getLogger('scoring.job').info('not shown at warning')\n"
        "logging.getLogger('infra.retry').warning('Redis down; card 4111 1111 1111 1111 seen')\n"
    )
    env = {**os.environ, WORKER_LOGS_ENV: "warning"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stderr == f"{MARK}WARNING infra.retry Redis down; card **** **** **** 1111 seen\n"
    verbose = subprocess.run(
        [sys.executable, "-c", script],
        env={**env, WORKER_LOGS_ENV: "info"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"{MARK}INFO scoring.job not shown at warning" in verbose.stderr
    elsewhere = {k: v for k, v in env.items() if k != WORKER_LOGS_ENV}
    done = subprocess.run(
        [sys.executable, "-c", script], env=elsewhere, capture_output=True, text=True, check=True
    )
    assert MARK not in done.stderr, "a process Spark did not start logs as Python does by default"


def test_a_jvm_that_does_not_start_says_why_from_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PySpark's own error only says the gateway exited; the JVM's last words are in the log."""
    import pyspark.java_gateway

    def exits(conf: object, popen_kwargs: dict[str, object]) -> None:
        out = popen_kwargs["stdout"]
        out.write(b"Error: JAVA_HOME is not set and could not be found.\n")  # type: ignore[attr-defined]
        out.flush()  # type: ignore[attr-defined]
        raise RuntimeError("Java gateway process exited before sending its port number")

    monkeypatch.setattr(pyspark.java_gateway, "launch_gateway", exits)
    log = tmp_path / "logs" / "spark.log"
    with pytest.raises(ServiceUnavailableError, match="JAVA_HOME is not set") as failure:
        launch_logged_gateway(None, log)
    assert str(log) in str(failure.value)
    assert WORKER_LOGS_ENV not in os.environ
