"""Dead-letter records: the original bytes as the record value, the context in ``dlq.*`` headers.

Keeping the value untouched means a fixed record can be re-produced byte for byte; the headers say where
it came from and why it was rejected. Records over the broker's size limit keep their first bytes only,
and say so in the detail.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from confluent_kafka import Message

from infra.clients import Clients, read_topic
from ingest.schemas import (
    DLQ_DETAIL_HEADER,
    DLQ_OFFSET_HEADER,
    DLQ_PARTITION_HEADER,
    DLQ_REASON_HEADER,
    DLQ_SOURCE_HEADER,
    DeadLetter,
    Reason,
)

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


def from_message(message: Message) -> DeadLetter:
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


@dataclass
class DeadLetterSummary:
    """Counts of dead letters by reason, with one example of each."""

    by_reason: Counter[str] = field(default_factory=Counter)
    examples: dict[str, DeadLetter] = field(default_factory=dict)

    def add(self, letter: DeadLetter) -> None:
        self.by_reason[letter.reason.value] += 1
        self.examples.setdefault(letter.reason.value, letter)

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())


def summarise_topic(clients: Clients, topic: str) -> DeadLetterSummary:
    """Counts by reason of every record on the dead-letter topic."""
    summary = DeadLetterSummary()
    for message in read_topic(clients, topic):
        summary.add(from_message(message))
    return summary
