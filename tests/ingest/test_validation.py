import orjson
import pytest

from contracts.events import DeadLetter, Reason, TransactionEvent
from contracts.privacy import mask_card_numbers_bytes
from ingest.validation import Clock, parse_label, parse_transaction
from tests.support.samples import GOOD, TOKEN


def parsed(raw: bytes) -> TransactionEvent | DeadLetter:
    return parse_transaction(raw, "test", max_bytes=16_384)


def with_(**changes: object) -> bytes:
    return orjson.dumps({**GOOD, **changes})


def test_good_event_is_accepted() -> None:
    event = parsed(orjson.dumps(GOOD))
    assert isinstance(event, TransactionEvent)
    assert event.tx_id == 17
    assert event.amount == 57.25


def test_integer_amount_and_coordinates_are_accepted() -> None:
    event = parsed(with_(amount=3, terminal_x=1.5, terminal_y=2))
    assert isinstance(event, TransactionEvent)
    assert event.amount == 3.0


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"schema_version": 1, "tx_id": 1', Reason.MALFORMED_JSON),
        (b"not json at all", Reason.MALFORMED_JSON),
        (b"[1, 2]", Reason.NOT_AN_OBJECT),
        (b'"a string"', Reason.NOT_AN_OBJECT),
        (with_(schema_version=2), Reason.UNKNOWN_SCHEMA_VERSION),
        (with_(schema_version="1"), Reason.UNKNOWN_SCHEMA_VERSION),
        (orjson.dumps({k: v for k, v in GOOD.items() if k != "terminal_id"}), Reason.MISSING_FIELD),
        (orjson.dumps({k: v for k, v in GOOD.items() if k != "schema_version"}), Reason.MISSING_FIELD),
        (with_(amount="57.25"), Reason.WRONG_TYPE),
        (with_(tx_id=1.5), Reason.WRONG_TYPE),
        (with_(tx_id=True), Reason.WRONG_TYPE),
        (with_(terminal_id=9), Reason.WRONG_TYPE),
        (with_(amount=-0.01), Reason.INVALID_VALUE),
        (with_(amount=2_000_000.0), Reason.INVALID_VALUE),
        (with_(amount=None), Reason.WRONG_TYPE),
        (with_(event_time_ms=99_999_999_999_999), Reason.INVALID_VALUE),
        (with_(card_id="4111111111111111"), Reason.INVALID_VALUE),
        (with_(tx_id=-1), Reason.INVALID_VALUE),
        (with_(merchant="x"), Reason.UNEXPECTED_FIELD),
    ],
)
def test_bad_records_get_their_reason(raw: bytes, reason: Reason) -> None:
    result = parsed(raw)
    assert isinstance(result, DeadLetter)
    assert result.reason == reason, result.detail
    assert result.raw == mask_card_numbers_bytes(raw), "the original bytes, card numbers masked"
    assert b"4111111111111111" not in result.raw and "4111111111111111" not in result.detail
    assert result.detail


@pytest.mark.parametrize("literal", [b"1e999", b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_amount_is_invalid(literal: bytes) -> None:
    raw = with_().replace(b'"amount":57.25', b'"amount":' + literal)
    result = parsed(raw)
    assert isinstance(result, DeadLetter)
    assert result.reason == Reason.INVALID_VALUE
    assert "finite" in result.detail


def test_oversized_record_is_rejected_before_parsing() -> None:
    raw = with_(terminal_id="T" * 20_000)
    result = parse_transaction(raw, "test", max_bytes=16_384)
    assert isinstance(result, DeadLetter)
    assert result.reason == Reason.OVERSIZED
    assert result.raw == raw


def test_label_validation_uses_its_own_schema() -> None:
    label = {
        "schema_version": 1,
        "tx_id": 1,
        "card_id": TOKEN,
        "terminal_id": "T",
        "tx_time_ms": 1_523_750_400_000,
        "known_at_ms": 1_524_355_200_000,
        "is_fraud": True,
    }
    assert not isinstance(parse_label(orjson.dumps(label), "t", 1000), DeadLetter)
    bad = parse_label(orjson.dumps({**label, "is_fraud": "yes"}), "t", 1000)
    assert isinstance(bad, DeadLetter)
    assert bad.reason == Reason.WRONG_TYPE


def test_an_event_dated_ahead_of_the_clock_is_a_future_event_time_dead_letter() -> None:
    now = GOOD["event_time_ms"]
    clock = Clock(now, max_skew_ms=60_000)
    ahead = parse_transaction(with_(event_time_ms=now + 60_001), "test", 16_384, clock)
    assert isinstance(ahead, DeadLetter) and ahead.reason == Reason.FUTURE_EVENT_TIME
    assert "60 s ahead of the clock of ingest" in ahead.detail
    assert isinstance(
        parse_transaction(with_(event_time_ms=now + 60_000), "test", 16_384, clock), TransactionEvent
    )
    year_2099 = with_(event_time_ms=4_070_908_800_000)
    assert isinstance(parse_transaction(year_2099, "test", 16_384), TransactionEvent), "no clock: no check"
    assert parse_transaction(year_2099, "test", 16_384, Clock.wall()).reason == Reason.FUTURE_EVENT_TIME  # type: ignore[union-attr]


@pytest.mark.parametrize("terminal_id", ["4111111111111111", "T 4111 1111 1111 1111", "5500-0000-0000-0004"])
def test_a_terminal_id_that_looks_like_a_card_number_is_dead_lettered_masked(terminal_id: str) -> None:
    letter = parsed(with_(terminal_id=terminal_id))
    assert isinstance(letter, DeadLetter) and letter.reason == Reason.INVALID_VALUE
    assert (
        letter.raw
        == mask_card_numbers_bytes(with_(terminal_id=terminal_id))
        != with_(terminal_id=terminal_id)
    )
    assert "card number" in letter.detail and terminal_id not in letter.detail


def test_terminal_ids_with_digits_that_are_no_card_number_are_kept() -> None:
    for terminal_id in ("4111111111111112", "T-123456789012", "3156"):
        assert isinstance(parsed(with_(terminal_id=terminal_id)), TransactionEvent), terminal_id
