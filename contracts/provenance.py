"""Where a record written by the project's Kafka sink comes from.

Every record the sink writes in a micro-batch carries the header :data:`HEADER`, whose value is
``"{writer}/{batch}/{attempt}/{seq}"`` (ASCII): the transactional id of the write task (``{sink id}-{task}``),
the micro-batch id, a random id of this attempt at the batch's transaction, and the record's position
among the task's records of that batch (0, 1, ...). A write task's records are the same, in the same
order, on every attempt at its micro-batch (the sink's exactly-once protocol needs the same rows; the
stages make their order deterministic too), so ``(writer, batch, seq)`` names a record whatever the
attempt; a read_committed reader sees the records of the one attempt that committed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

#: The Kafka header of the sink's records.
HEADER = "fraud.provenance"

Headers = Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None


class Provenance(NamedTuple):
    writer: str
    batch: int
    attempt: str
    seq: int


def header_prefix(writer: str, batch: int, attempt: str) -> str:
    """The header value of a batch's records but their position: append ``str(seq)``."""
    return f"{writer}/{batch}/{attempt}/"


def parse(value: bytes | str | None) -> Provenance | None:
    """The provenance in a header value; None when it is not one."""
    if value is None:
        return None
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    parts = text.rsplit("/", 3)
    if len(parts) != 4 or not parts[1].isdigit() or not parts[3].isdigit():
        return None
    return Provenance(parts[0], int(parts[1]), parts[2], int(parts[3]))


def provenance_of(headers: Headers) -> Provenance | None:
    """The provenance among a record's headers (confluent-kafka's ``Message.headers()``), if any."""
    if not headers:
        return None
    if isinstance(headers, Mapping):
        return parse(headers.get(HEADER))
    for key, value in headers:
        if key == HEADER:
            return parse(value)
    return None
