"""Event schemas on the wire and the canonical columns of transaction files, defined once.

Every producer and consumer imports these: the transaction and label events (JSON, explicit schema
version, event time in UTC milliseconds, card identifiers as tokens), dead letters and their encoding on
the dead-letter topic, and the column names of the tabular form used by the simulator, file import and
the batch feature path.

Dead-letter records keep the original bytes as the record value and the context in ``dlq.*`` headers, so
a fixed record can be re-produced, except that anything that looks like a card number is masked, in the
bytes and in the detail (``contracts.privacy``). Records over the broker's size limit keep their first
bytes only, and say so in the detail.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contracts.privacy import mask_card_numbers, mask_card_numbers_bytes

SCHEMA_VERSION: Literal[1] = 1

#: Milliseconds in an hour and in a day (event times are UTC milliseconds).
HOUR_MS = 3_600_000
DAY_MS = 86_400_000

#: Event times outside this range (2000-01-01 .. 2100-01-01 UTC) are absurd, not transactions.
MIN_EVENT_TIME_MS = 946_684_800_000
MAX_EVENT_TIME_MS = 4_102_444_800_000
#: How far an event time may run ahead of the clock that stamped it (ingest's wall clock, or the Kafka
#: timestamp a producer gave the record) before the event is dead-lettered as ``future_event_time``.
DEFAULT_MAX_CLOCK_SKEW_MS = 5 * 60 * 1000
#: Larger amounts are absurd for a card transaction and are dead-lettered.
MAX_AMOUNT = 1_000_000.0
#: Card tokens are the first 32 hex digits of a keyed hash (see ``ingest.tokens``).
CARD_TOKEN_PATTERN = r"^[0-9a-f]{32}$"  # noqa: S105 - a format, not a secret


FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
TxId = Annotated[int, Field(ge=0, lt=2**63)]
CardToken = Annotated[str, Field(pattern=CARD_TOKEN_PATTERN)]
#: A terminal id is any text but NUL: pandas, which the feature job groups by, ends a string at a NUL, so
#: ``"T1\x00x"`` would share ``"T1"``'s history.
TERMINAL_ID_PATTERN = r"^[^\x00]*$"
TerminalId = Annotated[str, Field(min_length=1, max_length=64, pattern=TERMINAL_ID_PATTERN)]
EventTimeMs = Annotated[int, Field(ge=MIN_EVENT_TIME_MS, lt=MAX_EVENT_TIME_MS)]


class TransactionEvent(BaseModel):
    """A card transaction, as produced to the transactions topic (keyed by ``card_id``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    schema_version: Literal[1]
    tx_id: TxId
    card_id: CardToken
    terminal_id: TerminalId
    amount: Annotated[FiniteFloat, Field(ge=0, le=MAX_AMOUNT)]
    event_time_ms: EventTimeMs
    terminal_x: FiniteFloat | None = None
    terminal_y: FiniteFloat | None = None


class LabelEvent(BaseModel):
    """A fraud confirmation that became known at ``known_at_ms`` (labels topic, keyed by ``card_id``).

    It repeats the transaction's card, terminal and event time so that per-terminal state can use it
    without a join.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    schema_version: Literal[1]
    tx_id: TxId
    card_id: CardToken
    terminal_id: TerminalId
    tx_time_ms: EventTimeMs
    known_at_ms: EventTimeMs
    is_fraud: bool


class Reason(StrEnum):
    """Machine-readable reasons a record was dead-lettered."""

    MALFORMED_JSON = "malformed_json"
    NOT_AN_OBJECT = "not_an_object"
    UNKNOWN_SCHEMA_VERSION = "unknown_schema_version"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    INVALID_VALUE = "invalid_value"
    UNEXPECTED_FIELD = "unexpected_field"
    OVERSIZED = "oversized"
    #: A valid feature record the model could not score (a value out of the model's range, say).
    UNSCORABLE = "unscorable"
    #: An event time further ahead of the clock than the allowed skew: it would move the event-time
    #: frontier and make every later event of its cards late.
    FUTURE_EVENT_TIME = "future_event_time"
    #: A transaction whose tx id the feature job has processed already (within its state's horizon): an
    #: at-least-once producer sent it again, or a file was imported twice.
    DUPLICATE_TX_ID = "duplicate_tx_id"


def future_detail(event_time_ms: int, clock_ms: int, clock: str) -> str:
    """The detail of a ``future_event_time`` dead letter."""
    ahead_s = (event_time_ms - clock_ms) / 1000
    return f"event_time_ms {event_time_ms} is {ahead_s:,.0f} s ahead of {clock} ({clock_ms})"


class DeadLetter(BaseModel):
    """A record that failed validation: the original bytes plus where it came from and why.

    On the dead-letter topic the record value is ``raw`` and the rest travels in the ``dlq.*`` headers.
    Card numbers are masked in ``raw`` and ``detail`` as the letter is made, so no copy of it (topic,
    logs, summaries) ever holds one.
    """

    model_config = ConfigDict(frozen=True)

    raw: bytes
    source: str = Field(description="Where it came from: 'file:<path>:<line>' or 'kafka:<topic>'.")
    reason: Reason
    detail: str
    partition: int | None = None
    offset: int | None = None

    @field_validator("raw", mode="after")
    @classmethod
    def _mask_raw(cls, raw: bytes) -> bytes:
        return mask_card_numbers_bytes(raw)

    @field_validator("detail", mode="after")
    @classmethod
    def _mask_detail(cls, detail: str) -> str:
        return mask_card_numbers(detail)


#: Header names of a dead-letter record.
DLQ_REASON_HEADER = "dlq.reason"
DLQ_DETAIL_HEADER = "dlq.detail"
DLQ_SOURCE_HEADER = "dlq.source"
DLQ_PARTITION_HEADER = "dlq.partition"
DLQ_OFFSET_HEADER = "dlq.offset"


class TxColumns:
    """Column names of the canonical transaction table (simulator output, file import, batch features)."""

    TX_ID = "tx_id"
    CARD_ID = "card_id"
    TERMINAL_ID = "terminal_id"
    AMOUNT = "amount"
    EVENT_TIME = "event_time"
    IS_FRAUD = "is_fraud"
    FRAUD_SCENARIO = "fraud_scenario"
    TERMINAL_X = "terminal_x"
    TERMINAL_Y = "terminal_y"

    REQUIRED = (TX_ID, CARD_ID, TERMINAL_ID, AMOUNT, EVENT_TIME)
    OPTIONAL = (IS_FRAUD, FRAUD_SCENARIO, TERMINAL_X, TERMINAL_Y)


#: The most of an original record the dead-letter topic keeps (stays under Kafka's 1 MB default).
MAX_KEPT_BYTES = 900_000


def to_record(letter: DeadLetter) -> tuple[bytes, list[tuple[str, str | bytes | None]]]:
    """Value and headers of the dead-letter record for ``letter``."""
    value = letter.raw
    detail = letter.detail
    if len(value) > MAX_KEPT_BYTES:
        detail = f"{detail} (value truncated to its first {MAX_KEPT_BYTES} of {len(value)} bytes)"
        value = value[:MAX_KEPT_BYTES]
    headers: list[tuple[str, str | bytes | None]] = [
        (DLQ_REASON_HEADER, letter.reason.value.encode()),
        (DLQ_DETAIL_HEADER, detail.encode()),
        (DLQ_SOURCE_HEADER, letter.source.encode()),
    ]
    if letter.partition is not None:
        headers.append((DLQ_PARTITION_HEADER, str(letter.partition).encode()))
    if letter.offset is not None:
        headers.append((DLQ_OFFSET_HEADER, str(letter.offset).encode()))
    return value, headers


class KafkaRecord(Protocol):
    """What a dead letter is read back from: a Kafka record (confluent-kafka's ``Message`` has these)."""

    def value(self) -> bytes | None: ...

    def headers(self) -> Sequence[tuple[str, Any]] | dict[str, Any] | None: ...


def from_message(message: KafkaRecord) -> DeadLetter:
    """The dead letter carried by a record of the dead-letter topic."""
    raw_headers = message.headers() or []
    pairs = raw_headers.items() if isinstance(raw_headers, dict) else raw_headers
    headers = {
        key: value.decode(errors="replace") if isinstance(value, bytes) else (value or "")
        for key, value in pairs
    }
    partition = headers.get(DLQ_PARTITION_HEADER)
    offset = headers.get(DLQ_OFFSET_HEADER)
    return DeadLetter(
        raw=message.value() or b"",
        source=headers.get(DLQ_SOURCE_HEADER, "unknown"),
        reason=Reason(headers.get(DLQ_REASON_HEADER, Reason.INVALID_VALUE.value)),
        detail=headers.get(DLQ_DETAIL_HEADER, ""),
        partition=int(partition) if partition is not None else None,
        offset=int(offset) if offset is not None else None,
    )
