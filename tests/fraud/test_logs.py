"""One logging configuration for the command: level, text or JSON lines, card numbers masked."""

import json
import logging
from collections.abc import Iterator

import pytest

from fraud.logs import configure_logging
from infra.clients import KAFKA_LOGGER
from infra.spark_logs import PROJECT_LOGGERS


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
