"""Telling a Kafka outage from a mistake (pure logic: librdkafka's error objects, no broker)."""

from __future__ import annotations

import logging
import time
from typing import cast

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException

from contracts.errors import ServiceUnavailableError
from infra.kafka.log import check_deadline
from infra.kafka.outage import KafkaUnreachableError, cut_off, is_outage, outage_reason, wait_for_kafka
from tests.infra.test_retry import scripted


def failure(code: int, text: str = "", **flags: bool) -> KafkaException:
    return KafkaException(KafkaError(code, text, **flags))


@pytest.mark.parametrize(
    "error",
    [
        failure(KafkaError._TIMED_OUT, "Failed to get committed offsets: Local: Timed out"),
        failure(KafkaError._TRANSPORT, "Failed to get watermark offsets: Local: Broker transport failure"),
        failure(KafkaError._ALL_BROKERS_DOWN),
        failure(KafkaError.COORDINATOR_NOT_AVAILABLE),
        failure(KafkaError.CONCURRENT_TRANSACTIONS, retriable=True),
        KafkaUnreachableError("Kafka did not answer ...; start the embedded stack (`fraud up`)", "no answer"),
    ],
)
def test_a_broker_that_does_not_answer_is_an_outage(error: BaseException) -> None:
    assert is_outage(error)


@pytest.mark.parametrize(
    "error",
    [
        failure(KafkaError.TOPIC_AUTHORIZATION_FAILED),
        failure(KafkaError.SASL_AUTHENTICATION_FAILED),
        failure(KafkaError.UNKNOWN_TOPIC_OR_PART),
        failure(KafkaError._TIMED_OUT, fatal=True),
        failure(
            KafkaError._MSG_TIMED_OUT, txn_requires_abort=True
        ),  # the transaction is gone: write it again
        ServiceUnavailableError("no embedded stack is running"),
        ValueError("a bug"),
    ],
)
def test_a_wrong_request_is_not_an_outage(error: BaseException) -> None:
    assert not is_outage(error)


def test_a_transaction_cut_off_by_an_outage_is_written_again_others_are_not() -> None:
    assert cut_off(failure(KafkaError._MSG_TIMED_OUT, txn_requires_abort=True))
    assert cut_off(failure(KafkaError._TIMED_OUT, txn_requires_abort=True))
    assert not cut_off(failure(KafkaError.MSG_SIZE_TOO_LARGE, txn_requires_abort=True))
    assert not cut_off(failure(KafkaError._FENCED, fatal=True))
    assert not cut_off(None)


def test_the_outage_lines_say_what_happened_without_start_up_advice(caplog: pytest.LogCaptureFixture) -> None:
    unreachable = KafkaUnreachableError(
        "Kafka did not answer within 10 s (...); check FRAUD_BOOTSTRAP_SERVERS ..., or `fraud up`",
        "no answer within 10 s: Failed to get metadata: Local: Timed out",
    )
    assert outage_reason(unreachable) == "no answer within 10 s: Failed to get metadata: Local: Timed out"
    assert outage_reason(failure(KafkaError._TIMED_OUT, "Failed to get committed offsets")) == (
        "Failed to get committed offsets"
    )
    outcomes: list[object] = [unreachable, failure(KafkaError._TRANSPORT, "transport"), 7]

    call = scripted(outcomes)

    with caplog.at_level(logging.INFO, logger="infra.retry"):
        assert wait_for_kafka(call) == 7
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("Kafka unreachable (no answer within 10 s: Failed to get metadata")
    assert "fraud up" not in lines[0] and "FRAUD_BOOTSTRAP_SERVERS" not in lines[0]
    assert lines[1].startswith("Kafka answers again") and "2 failed attempts" in lines[1]


class SilentBroker:
    """A consumer whose metadata requests time out ``away`` times, then answer."""

    def __init__(self, away: int) -> None:
        self.away = away

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object:
        if self.away:
            self.away -= 1
            raise failure(KafkaError._TIMED_OUT, "Failed to get metadata: Local: Timed out")
        return object()


def broker(away: int) -> Consumer:
    return cast(Consumer, SilentBroker(away))


def test_a_reads_deadline_counts_only_the_time_the_broker_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its deadline, a read whose broker does not answer waits for it and gets a new deadline; one
    whose broker answers and still delivers nothing fails."""
    monkeypatch.setattr("infra.retry.time.sleep", lambda s: None)
    now = time.monotonic()
    assert check_deadline(now + 60, {"t/0"}, broker(0), 60) == now + 60  # not passed yet
    assert check_deadline(now - 1, set(), broker(0), 60) == now - 1  # nothing pending
    renewed = check_deadline(now - 1, {"t/0"}, broker(3), 60)
    assert renewed >= now + 60
    with pytest.raises(ServiceUnavailableError, match=r"no answer from Kafka for \['t/0'\]"):
        check_deadline(now - 1, {"t/0"}, broker(0), 60)
