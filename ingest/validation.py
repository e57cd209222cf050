"""Validation at the edge, of the events ingest takes in: transactions (card numbers stop here, events dated
too far ahead are refused) and labels, each a valid event or a dead letter with a machine-readable reason.

Errors are data: nothing here raises for bad input. The records themselves are judged by
``validation.parse.parse_event``, as everywhere else.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import orjson

from contracts.events import (
    DEFAULT_MAX_CLOCK_SKEW_MS,
    DeadLetter,
    LabelEvent,
    Reason,
    TransactionEvent,
    future_detail,
)
from contracts.privacy import mask_card_numbers
from ingest.tokens import TERMINAL_TOKEN_PREFIX, terminal_token
from validation.parse import parse_event

#: Detail of the dead letter of a transaction whose terminal id looks like a card number (no token key).
CARD_NUMBER_IN_TERMINAL_ID = "terminal_id: looks like a card number (13-19 digits, Luhn-valid); never stored"


def parse_transaction(
    raw: bytes, source: str, max_bytes: int, clock: Clock | None = None, token_key: bytes | None = None
) -> TransactionEvent | DeadLetter:
    """A transaction event, or the reason it is not one; with a ``clock``, an event dated further ahead
    of it than its skew is a ``future_event_time`` dead letter. Ingest is where card numbers stop: a
    terminal id a card number could be read in (``contracts.privacy``) becomes its terminal token with
    ``token_key`` (``ingest.tokens``; the event is then not ``raw``: :func:`event_bytes`), and without a
    key the event is an ``invalid_value``."""
    event = parse_event(TransactionEvent, raw, source, max_bytes)
    if isinstance(event, TransactionEvent) and mask_card_numbers(event.terminal_id) != event.terminal_id:
        # The terminal id is the event's one free text that is stored as it is (topics, job state, Redis):
        # a card number there would be kept everywhere.
        if token_key is None:
            return DeadLetter(
                raw=raw, source=source, reason=Reason.INVALID_VALUE, detail=CARD_NUMBER_IN_TERMINAL_ID
            )
        event = event.model_copy(update={"terminal_id": terminal_token(event.terminal_id, token_key)})
    if clock is not None and isinstance(event, TransactionEvent) and clock.too_far_ahead(event.event_time_ms):
        return DeadLetter(
            raw=raw,
            source=source,
            reason=Reason.FUTURE_EVENT_TIME,
            detail=future_detail(event.event_time_ms, clock.now_ms, "the clock of ingest"),
        )
    return event


def event_bytes(event: TransactionEvent, raw: bytes) -> bytes:
    """What to produce of an event :func:`parse_transaction` accepted from ``raw``: ``raw`` itself, or the
    event written anew when its terminal id is a token (``raw``'s may hold a card number; a token given as
    the terminal id is written anew too, the same event)."""
    if not event.terminal_id.startswith(TERMINAL_TOKEN_PREFIX):
        return raw
    return orjson.dumps(event.model_dump(exclude_none=True))


@dataclass(frozen=True)
class Clock:
    """The time events are checked against (ingest's wall clock when it starts) and the skew allowed."""

    now_ms: int
    max_skew_ms: int = DEFAULT_MAX_CLOCK_SKEW_MS

    @classmethod
    def wall(cls, max_skew_ms: int = DEFAULT_MAX_CLOCK_SKEW_MS) -> Clock:
        return cls(time.time_ns() // 1_000_000, max_skew_ms)

    def too_far_ahead(self, event_time_ms: int) -> bool:
        return event_time_ms > self.now_ms + self.max_skew_ms


def parse_label(raw: bytes, source: str, max_bytes: int) -> LabelEvent | DeadLetter:
    """A label event, or the reason it is not one."""
    return parse_event(LabelEvent, raw, source, max_bytes)
