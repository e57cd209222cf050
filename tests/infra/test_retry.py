"""Waiting out an outage (pure logic, with a fake clock) and keeping passwords out of what is logged."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from contracts.privacy import redact_url
from infra.retry import Backoff, wait_out


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [Backoff(0.1, 1.0).wait_s(n) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def scripted(outcomes: list[object]) -> Callable[[], object]:
    """A call that raises or returns each of ``outcomes`` in turn."""

    def call() -> object:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return call


def test_a_call_is_retried_while_the_service_is_away_with_one_line_per_outage_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outcomes: list[object] = [ConnectionError("refused")] * 5 + ["done"]
    waits: list[float] = []
    call = scripted(outcomes)
    with caplog.at_level(logging.INFO, logger="infra.retry"):
        assert wait_out(call, "Redis at x", (ConnectionError,), Backoff(1.0, 4.0), waits.append) == "done"
    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0]
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("Redis at x unreachable (ConnectionError: refused)")
    assert "answers again" in lines[1] and "5 failed attempts" in lines[1]


def test_other_errors_are_not_retried() -> None:
    def call() -> None:
        raise ValueError("a bug, not an outage")

    with pytest.raises(ValueError, match="a bug"):
        wait_out(call, "Redis", (ConnectionError,), sleep=lambda s: None)


def test_passwords_are_kept_out_of_urls_that_are_logged() -> None:
    assert redact_url("redis://default:hunter2@cache:6379/0") == "redis://default:***@cache:6379/0"
    assert redact_url("rediss://:hunter2@cache:6380") == "rediss://***@cache:6380"
    assert redact_url("redis://cache:6379/0") == "redis://cache:6379/0"


def test_an_outage_met_by_several_calls_of_a_process_is_told_once(caplog: pytest.LogCaptureFixture) -> None:
    """Two calls waiting for the same service at once (two threads of a worker): one line when the first
    fails, one when the last gets through."""
    first_outcomes: list[object] = [ConnectionError("refused")] * 2 + ["first"]
    second_outcomes: list[object] = [ConnectionError("refused")] * 2 + ["second"]

    def inner_sleep(_: float) -> None:
        if len(second_outcomes) == 3:  # the first call waits: the second one meets the outage too
            assert (
                wait_out(scripted(second_outcomes), "Kafka", (ConnectionError,), sleep=lambda s: None)
                == "second"
            )

    with caplog.at_level(logging.INFO, logger="infra.retry"):
        assert wait_out(scripted(first_outcomes), "Kafka", (ConnectionError,), sleep=inner_sleep) == "first"
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("Kafka unreachable (ConnectionError: refused)")
    assert lines[1].startswith("Kafka answers again")


def test_a_test_of_the_error_decides_and_describe_says_what_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outcomes: list[object] = [OSError("timed out"), "done"]

    call = scripted(outcomes)

    with caplog.at_level(logging.INFO, logger="infra.retry"):
        done = wait_out(
            call, "Kafka", lambda error: "timed out" in str(error), sleep=lambda s: None, describe=str
        )
    assert done == "done"
    assert caplog.records[0].getMessage() == "Kafka unreachable (timed out); retrying until it answers"
    with pytest.raises(OSError, match="refused"):
        wait_out(lambda: (_ for _ in ()).throw(OSError("refused")), "Kafka", lambda e: "timed out" in str(e))


def test_a_permanent_error_of_a_transient_kind_is_not_retried() -> None:
    class Refused(ConnectionError):
        """A refused password, which redis-py makes a connection error."""

    waits: list[float] = []

    def call() -> None:
        raise Refused("WRONGPASS")

    with pytest.raises(Refused):
        wait_out(call, "Redis at x", (ConnectionError,), sleep=waits.append, permanent=(Refused,))
    assert waits == [], "no wait: waiting never makes a password right"
