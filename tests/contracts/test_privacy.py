"""Card numbers are masked wherever they could leak: the detector and the dead letters that use it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.events import DeadLetter, Reason
from contracts.privacy import luhn_valid, mask_card_numbers, mask_card_numbers_bytes
from tests.support.cards import card_numbers, formatted


@pytest.mark.parametrize(
    ("number", "valid"),
    [
        ("4111111111111111", True),
        ("5500000000000004", True),
        ("378282246310005", True),
        ("4111111111111112", False),
    ],
)
def test_luhn(number: str, valid: bool) -> None:
    assert luhn_valid(number) is valid


@given(
    number=card_numbers,
    separator=st.sampled_from(["", " ", "-"]),
    before=st.text(max_size=40).filter(lambda t: not t[-1:].isdigit()),
    after=st.text(max_size=40).filter(lambda t: not t[:1].isdigit()),
)
def test_a_card_number_anywhere_is_masked_but_its_last_four_digits(
    number: str, separator: str, before: str, after: str
) -> None:
    shown = formatted(number, separator)
    masked = mask_card_numbers(before + shown + after)
    assert number not in masked.replace(" ", "").replace("-", "")
    assert masked.startswith(before) and masked.endswith(after)
    middle = masked[len(before) : len(masked) - len(after)]
    assert len(middle) == len(shown), "separators and length are kept"
    assert middle.replace(separator or "*", "").replace("*", "") == number[-4:] or separator == "*"
    assert mask_card_numbers_bytes((before + shown + after).encode()) == masked.encode()


@given(st.binary(max_size=200))
def test_masking_garbage_never_fails_and_keeps_the_length(raw: bytes) -> None:
    assert len(mask_card_numbers_bytes(raw)) == len(raw)


def test_what_is_not_a_card_number_is_left_alone() -> None:
    text = '{"tx_id": 4111111111111112, "amount": 12.5, "when": "2018-04-01 12:00", "id": 123456789012}'
    assert mask_card_numbers(text) == text


def test_a_card_number_next_to_other_digits_is_found() -> None:
    assert mask_card_numbers("ref 9 4111 1111 1111 1111, ok") == "ref 9 **** **** **** 1111, ok"
    assert "41111111" not in mask_card_numbers("x123456784111111111111111")


def test_dead_letters_never_hold_a_card_number() -> None:
    letter = DeadLetter(
        raw=b'{"card_id": "4111-1111-1111-1111", "amount": -1}',
        source="file:x.jsonl:line 1",
        reason=Reason.INVALID_VALUE,
        detail="card_id: '4111111111111111' is not a card token",
    )
    assert letter.raw == b'{"card_id": "****-****-****-1111", "amount": -1}'
    assert letter.detail == "card_id: '************1111' is not a card token"
