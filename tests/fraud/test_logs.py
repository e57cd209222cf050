"""One logging configuration for the command: level, text or JSON lines, card numbers masked."""

import json
import logging
from collections.abc import Iterator

import pytest

from fraud.logs import configure_logging
from infra.kafka.connection import KAFKA_LOGGER
from infra.spark.logs import PROJECT_LOGGERS


@pytest.fixture(autouse=True)
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers, root.level = handlers, level
    for name in PROJECT_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)


def test_json_lines_carry_level_logger_and_time_and_mask_card_numbers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("info", "json")
    logging.getLogger("infra.retry").warning("Redis away; card %s seen", "4111 1111 1111 1111")
    logging.getLogger("scoring.job").info("model v%d", 3)
    logging.getLogger("scoring.job").debug("not shown at info")
    KAFKA_LOGGER.error("librdkafka: connection refused")  # the command says it in one line instead
    logging.getLogger("py4j.clientserver").info("Command to send: ... sasl.password=hunter2")  # not ours
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(line["levelname"], line["name"], line["message"]) for line in lines] == [
        ("WARNING", "infra.retry", "Redis away; card **** **** **** 1111 seen"),
        ("INFO", "scoring.job", "model v3"),
    ]
    assert all("timestamp" in line for line in lines)


def test_text_at_the_default_level_shows_warnings_once_however_often_configured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("warning", "text")
    configure_logging("warning", "text")
    logging.getLogger("fraud.demo").info("not shown")
    logging.getLogger("infra.retry").warning("Kafka away")
    assert capsys.readouterr().err == "WARNING infra.retry: Kafka away\n"


def test_py4j_reporting_a_ctrl_c_in_its_call_is_not_shown(capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C during a call to Spark's JVM: Py4J logs the KeyboardInterrupt with a traceback (through the
    root logger) before raising it; the command stops the job and says so itself."""
    configure_logging("warning", "text")
    py4j = logging.getLogger()
    record = py4j.makeRecord(
        "root",
        logging.ERROR,
        "/venv/site-packages/py4j/java_gateway.py",
        1070,
        "KeyboardInterrupt while sending command.",
        (),
        (KeyboardInterrupt, KeyboardInterrupt(), None),
    )
    py4j.handle(record)
    try:  # closing the interrupted connection then fails too: logged with the interrupt as its context
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise BrokenPipeError(32, "Broken pipe")  # noqa: B904 - as Py4J does
    except BrokenPipeError as exc:
        closing = py4j.makeRecord(
            "py4j.clientserver",
            logging.ERROR,
            "/venv/site-packages/py4j/clientserver.py",
            504,
            "Exception occurred while shutting down connection",
            (),
            (BrokenPipeError, exc, exc.__traceback__),
        )
    py4j.handle(closing)
    other = py4j.makeRecord(
        "root",
        logging.ERROR,
        "/venv/site-packages/py4j/java_gateway.py",
        1059,
        "Exception while sending command.",
        (),
        None,
    )
    py4j.handle(other)
    err = capsys.readouterr().err
    assert "KeyboardInterrupt" not in err and "Traceback" not in err
    assert "Exception while sending command." in err  # anything else Py4J reports still shows
