"""``parse_event``: any input is a valid event or a dead letter with a reason and a detail, never an
exception, and a dead letter's detail never repeats a card number."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from contracts.events import (
    MAX_AMOUNT,
    MAX_EVENT_TIME_MS,
    MIN_EVENT_TIME_MS,
    DeadLetter,
    Reason,
    TransactionEvent,
)
from contracts.records import FeatureRecord
from features.definitions import FEATURE_COLUMNS
from tests.support.samples import FEATURE, GOOD, TOKEN
from validation.parse import parse_event

MAX_BYTES = 16_384
CARD_NUMBER = "4111111111111111"

#: JSON values of every kind, the edges included: huge and non-finite numbers, negative zero, the bounds of
#: amounts and event times, card numbers where tokens belong, long and odd strings, nulls, booleans.
ANY_VALUE = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        [1e39, -0.0, 0.0, 1e308, MAX_AMOUNT, MAX_AMOUNT * 2, MIN_EVENT_TIME_MS - 1, MAX_EVENT_TIME_MS, 1, 2]
    ),
    st.text(max_size=80),
    st.sampled_from([TOKEN, CARD_NUMBER, "A" * 32, "", "x" * 70_000]),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
)


def judged(model: type[BaseModel], raw: bytes) -> None:
    outcome = parse_event(model, raw, "fuzz", MAX_BYTES)
    if isinstance(outcome, DeadLetter):
        assert outcome.reason in Reason and outcome.detail
        assert CARD_NUMBER not in outcome.detail and CARD_NUMBER.encode() not in outcome.raw
    else:
        assert isinstance(outcome, model)


@given(
    fields=st.dictionaries(st.sampled_from([*GOOD, "merchant"]), ANY_VALUE, max_size=7),
    on_a_good_event=st.booleans(),
)
def test_any_transaction_object_is_an_event_or_a_dead_letter(
    fields: dict[str, Any], on_a_good_event: bool
) -> None:
    record = {**GOOD, **fields} if on_a_good_event else fields
    judged(TransactionEvent, json.dumps(record, allow_nan=True).encode())


@given(
    fields=st.dictionaries(st.sampled_from([*FEATURE, "extra"]), ANY_VALUE, max_size=5),
    features=st.dictionaries(st.sampled_from([*FEATURE_COLUMNS, "unknown"]), ANY_VALUE, max_size=4),
)
def test_any_feature_record_is_a_record_or_a_dead_letter(
    fields: dict[str, Any], features: dict[str, Any]
) -> None:
    record = {**FEATURE, **fields, "features": {**FEATURE["features"], **features}}
    judged(FeatureRecord, json.dumps(record, allow_nan=True).encode())


@given(st.binary(max_size=300))
def test_any_bytes_are_an_event_or_a_dead_letter(raw: bytes) -> None:
    judged(TransactionEvent, raw)


def test_an_oversized_record_is_a_dead_letter_before_it_is_parsed() -> None:
    letter = parse_event(TransactionEvent, b"{" + b" " * MAX_BYTES + b"}", "test", MAX_BYTES)
    assert isinstance(letter, DeadLetter) and letter.reason is Reason.OVERSIZED
